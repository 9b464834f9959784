//! A real OpenTelemetry Collector for the OTLP tests: `xtask/otelcol/` (the
//! OTLP receiver and the file exporter) built with Go into
//! `target/otelcol/` by `cargo xtask otelcol` (and `cargo xtask test`), or
//! here when missing. Each test starts its own on free ports of 127.0.0.1
//! with its own configuration, and reads back what it exported.

use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Mutex,
    thread,
    time::{Duration, Instant},
};

use super::{scratch_dir, workspace_root};

/// Where `cargo xtask otelcol` builds it (xtask/src/otelcol.rs).
const BINARY: &str = "target/otelcol/allocprof-otelcol";

/// A generous bound on the collector's start-up, and on an export's
/// arrival, on a loaded machine: a deadline for a wait, not a timed
/// assertion.
const START_DEADLINE: Duration = Duration::from_secs(120);

/// The collector binary; built with Go when missing, failing (never
/// skipping) with what is needed where Go or its module proxy is not there.
pub fn binary() -> PathBuf {
    static BUILD: Mutex<()> = Mutex::new(());
    let _once = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let binary = workspace_root().join(BINARY);
    if binary.exists() {
        return binary;
    }
    let go = ["/usr/local/go/bin/go", "go"]
        .into_iter()
        .find(|go| Command::new(go).arg("version").output().is_ok())
        .unwrap_or_else(|| {
            panic!(
                "the OTLP tests need an OpenTelemetry Collector built with Go >= 1.26, and no \
                 Go is installed (/usr/local/go/bin/go or `go` on PATH); with Go and the Go \
                 module proxy reachable, `cargo xtask otelcol` builds it"
            )
        });
    // Built beside and renamed: another test binary may be starting it.
    let partial = binary.with_extension(format!("partial-{}", std::process::id()));
    let status = Command::new(go)
        .current_dir(workspace_root().join("xtask/otelcol"))
        .args(["build", "-trimpath", "-o"])
        .arg(&partial)
        .arg(".")
        .status()
        .unwrap_or_else(|e| panic!("running {go}: {e}"));
    assert!(
        status.success(),
        "building the test OpenTelemetry Collector failed ({go} build in xtask/otelcol): it \
         needs Go >= 1.26 and the Go module proxy reachable (see the output above)"
    );
    std::fs::rename(&partial, &binary).unwrap();
    binary
}

/// A free TCP port of 127.0.0.1 (free when asked: the collector binds it
/// right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running collector: OTLP in (gRPC and HTTP, and over TLS if asked),
/// profiles to a file.
pub struct Collector {
    child: Option<Child>,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// gRPC and HTTP over TLS, with the certificate of [`Certs`].
    pub tls: Option<(SocketAddr, SocketAddr)>,
    output: PathBuf,
    log: PathBuf,
    config: PathBuf,
}

/// A CA and a server certificate it signed for 127.0.0.1 and localhost,
/// made with the `openssl` command.
pub struct Certs {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Certs {
    pub fn make(name: &str) -> Certs {
        let dir = scratch_dir(&format!("certs-{name}-{}", std::process::id()));
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .current_dir(&dir)
                .args(args)
                .output()
                .unwrap_or_else(|e| panic!("the TLS tests need the openssl command: {e}"));
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &[
                &["req", "-x509"][..],
                &ec,
                &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2"],
                &["-subj", &format!("/CN=allocprof test CA {name}")],
            ]
            .concat(),
        );
        openssl(
            &[
                &["req"][..],
                &ec,
                &["-keyout", "server.key", "-out", "server.csr"],
                &["-subj", "/CN=localhost"],
            ]
            .concat(),
        );
        std::fs::write(
            dir.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
        Certs {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        }
    }
}

impl Collector {
    /// Starts one with the profiles pipeline (OTLP receiver → file
    /// exporter, protobuf), and waits until both receivers listen.
    pub fn start(name: &str) -> Collector {
        Collector::start_with(name, None, None)
    }

    /// The same with a second OTLP receiver over TLS (`certs`), and/or on
    /// the given `(grpc, http)` ports.
    pub fn start_with(name: &str, certs: Option<&Certs>, ports: Option<(u16, u16)>) -> Collector {
        let dir = scratch_dir(&format!("otelcol-{name}-{}", std::process::id()));
        let output = dir.join("profiles.pb");
        let _ = std::fs::remove_file(&output);
        let (grpc, http) = ports.unwrap_or_else(|| (free_port(), free_port()));
        let grpc: SocketAddr = format!("127.0.0.1:{grpc}").parse().unwrap();
        let http: SocketAddr = format!("127.0.0.1:{http}").parse().unwrap();
        let tls = certs.map(|c| {
            let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            (grpc, http, c)
        });
        let config = dir.join("config.yaml");
        std::fs::write(&config, config_yaml(grpc, http, tls, &output)).unwrap();
        let mut collector = Collector {
            child: None,
            grpc,
            http,
            tls: tls.map(|(g, h, _)| (g, h)),
            output,
            log: dir.join("collector.log"),
            config,
        };
        collector.spawn();
        collector
    }

    fn spawn(&mut self) {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(binary())
            .arg(format!("--config={}", self.config.display()))
            .arg("--feature-gates=service.profilesSupport")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap();
        self.child = Some(child);
        self.wait_listening();
    }

    /// Stops it (SIGTERM: what it took is written out) and starts it again
    /// on the same ports, the same file appended to; `between` runs while
    /// it is down.
    pub fn restart(&mut self, between: impl FnOnce()) {
        self.stop();
        between();
        self.spawn();
    }

    /// `http://127.0.0.1:PORT`: the base OTLP/HTTP endpoint.
    pub fn http_endpoint(&self) -> String {
        format!("http://{}", self.http)
    }

    /// `http://127.0.0.1:PORT`: the OTLP/gRPC endpoint.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// `https://127.0.0.1:PORT` of the TLS receiver: gRPC and HTTP.
    pub fn tls_endpoints(&self) -> (String, String) {
        let (g, h) = self.tls.expect("a collector started with certificates");
        (format!("https://{g}"), format!("https://{h}"))
    }

    fn wait_listening(&mut self) {
        let start = Instant::now();
        loop {
            let tls_up = self.tls.is_none_or(|(g, h)| {
                TcpStream::connect(g).is_ok() && TcpStream::connect(h).is_ok()
            });
            if TcpStream::connect(self.grpc).is_ok()
                && TcpStream::connect(self.http).is_ok()
                && tls_up
            {
                return;
            }
            let child = self.child.as_mut().unwrap();
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "the collector exited ({status}) before listening:\n{}",
                    self.log_text()
                );
            }
            assert!(
                start.elapsed() < START_DEADLINE,
                "the collector does not listen on {} and {} after {START_DEADLINE:?}:\n{}",
                self.grpc,
                self.http,
                self.log_text()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exports written out so far (the exporter flushes its file every
    /// 100 ms).
    pub fn exports_so_far(&self) -> usize {
        read_messages(&self.output).map_or(0, |m| m.len())
    }

    /// Waits until at least `n` exports are written out; returns how many.
    pub fn wait_for_exports(&self, n: usize) -> usize {
        let start = Instant::now();
        loop {
            let written = self.exports_so_far();
            if written >= n {
                return written;
            }
            assert!(
                start.elapsed() < START_DEADLINE,
                "{written} exports written out, not {n}, after {START_DEADLINE:?}:\n{}",
                self.log_text()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// The exports written out so far (none while the last is half
    /// written: read again).
    pub fn read_so_far(&self) -> Vec<Vec<u8>> {
        read_messages(&self.output).unwrap_or_default()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops it (SIGTERM: it drains its pipeline and closes the file).
    fn stop(&mut self) {
        let mut child = self.child.take().unwrap();
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        // SAFETY: signals our own child, which has not been waited for.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let status = child.wait().unwrap();
        assert!(
            status.success(),
            "the collector failed ({status}):\n{}",
            self.log_text()
        );
    }

    /// Stops it and returns what it exported: one protobuf `ProfilesData`
    /// per export.
    pub fn stop_and_read(mut self) -> Vec<Vec<u8>> {
        self.stop();
        read_messages(&self.output)
            .unwrap_or_else(|e| panic!("{e}; the collector said:\n{}", self.log_text()))
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The file exporter's `proto` format: each message preceded by its length
/// (4 bytes, big-endian). No file: nothing was exported.
fn read_messages(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let mut rest = &bytes[..];
    let mut out = Vec::new();
    while !rest.is_empty() {
        let Some((len, tail)) = rest.split_first_chunk::<4>() else {
            return Err(format!("{}: a truncated length", path.display()));
        };
        let len = u32::from_be_bytes(*len) as usize;
        if tail.len() < len {
            return Err(format!("{}: a truncated message", path.display()));
        }
        out.push(tail[..len].to_vec());
        rest = &tail[len..];
    }
    Ok(out)
}

fn config_yaml(
    grpc: SocketAddr,
    http: SocketAddr,
    tls: Option<(SocketAddr, SocketAddr, &Certs)>,
    output: &Path,
) -> String {
    let (tls_receiver, receivers) = match tls {
        None => (String::new(), "[otlp]"),
        Some((g, h, c)) => (
            format!(
                "  otlp/tls:
    protocols:
      grpc:
        endpoint: {g}
        tls:
          cert_file: {cert}
          key_file: {key}
      http:
        endpoint: {h}
        tls:
          cert_file: {cert}
          key_file: {key}
",
                cert = c.cert.display(),
                key = c.key.display()
            ),
            "[otlp, otlp/tls]",
        ),
    };
    // The collector's own metrics off: their default port (8888) would be
    // shared by the tests' collectors.
    format!(
        "receivers:
  otlp:
    protocols:
      grpc:
        endpoint: {grpc}
      http:
        endpoint: {http}
{tls_receiver}exporters:
  file:
    path: {}
    format: proto
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    profiles:
      receivers: {receivers}
      exporters: [file]
",
        output.display()
    )
}

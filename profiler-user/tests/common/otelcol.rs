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
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running collector: OTLP in (gRPC and HTTP), profiles to a file.
pub struct Collector {
    child: Option<Child>,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    output: PathBuf,
    log: PathBuf,
}

impl Collector {
    /// Starts one with the profiles pipeline (OTLP receiver → file
    /// exporter, protobuf), and waits until both receivers listen.
    pub fn start(name: &str) -> Collector {
        let dir = scratch_dir(&format!("otelcol-{name}-{}", std::process::id()));
        let output = dir.join("profiles.pb");
        let _ = std::fs::remove_file(&output);
        let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let config = dir.join("config.yaml");
        std::fs::write(&config, config_yaml(grpc, http, &output)).unwrap();
        let log = dir.join("collector.log");
        let log_file = std::fs::File::create(&log).unwrap();
        let child = Command::new(binary())
            .arg(format!("--config={}", config.display()))
            .arg("--feature-gates=service.profilesSupport")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap();
        let mut collector = Collector {
            child: Some(child),
            grpc,
            http,
            output,
            log,
        };
        collector.wait_listening();
        collector
    }

    /// `http://127.0.0.1:PORT`: the base OTLP/HTTP endpoint.
    pub fn http_endpoint(&self) -> String {
        format!("http://{}", self.http)
    }

    fn wait_listening(&mut self) {
        let start = Instant::now();
        loop {
            if TcpStream::connect(self.grpc).is_ok() && TcpStream::connect(self.http).is_ok() {
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

    /// Stops it (SIGTERM: it drains its pipeline and closes the file) and
    /// returns what it exported: one protobuf `ProfilesData` per export.
    pub fn stop_and_read(mut self) -> Vec<Vec<u8>> {
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

fn config_yaml(grpc: SocketAddr, http: SocketAddr, output: &Path) -> String {
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
exporters:
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
      receivers: [otlp]
      exporters: [file]
",
        output.display()
    )
}

//! `allocprof agent` when the collector misbehaves: not there at start,
//! restarted mid-run, refusing with 503 and Retry-After or with
//! RESOURCE_EXHAUSTED and a RetryInfo, accepting connections and never
//! answering, or presenting a certificate the agent's CA did not sign. Each
//! shows that nothing is lost within the queue's bound (the alloc deltas add
//! up) and nothing is sent twice (every export's window is distinct). The
//! real collector is used where it can show the fault; the refusals come
//! from small servers here, since the collector cannot be made to refuse on
//! demand.

mod common;

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use allocprof::{
    agent::{retry::retry_info_details, stats::rss_of},
    output::export::otlp::{
        self, ATTR_PID,
        proto::{
            collector::ExportProfilesServiceResponse, common::any_value::Value,
            profiles::ProfilesData,
        },
    },
};
use prost::Message;

use common::{
    Workload,
    otelcol::{Certs, Collector, free_port},
};

/// site_large's 8 MiB, estimated exactly (see tests/otlp.rs).
const LARGE: i64 = 8 << 20;

/// A deadline for waits on a loaded machine, not a timed assertion.
const WAIT: Duration = Duration::from_secs(120);

/// What a test server received: each call's arrival, message, and whether
/// it was accepted.
type Calls = Arc<Mutex<Vec<(Instant, Vec<u8>, bool)>>>;

/// A running agent, its stderr collected line by line.
struct Agent {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<thread::JoinHandle<()>>,
}

impl Agent {
    fn start(pid: u32, endpoint: &str, extra: &[&str], env: &[(&str, &str)]) -> Agent {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_allocprof"));
        cmd.args(["agent", "--pid", &pid.to_string()])
            .args(["--otlp-endpoint", endpoint])
            .args(extra)
            .args(if extra.contains(&"--push-interval") {
                &[][..]
            } else {
                &["--push-interval", "1s"]
            })
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = lines.clone();
        let reader = thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                l.lock().unwrap().push(line);
            }
        });
        let agent = Agent {
            child,
            lines,
            reader: Some(reader),
        };
        agent.wait_for("pushing to");
        agent
    }

    fn text(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Waits for a line containing `needle`; returns it.
    fn wait_for(&self, needle: &str) -> String {
        let start = Instant::now();
        loop {
            if let Some(l) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return l.clone();
            }
            assert!(
                start.elapsed() < WAIT,
                "no line with {needle:?} after {WAIT:?}:\n{}",
                self.text()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for an exports line that counts at least `n` sent.
    fn wait_for_sent(&self, n: u64) {
        let start = Instant::now();
        loop {
            let sent = self.lines.lock().unwrap().iter().rev().find_map(|l| {
                let rest = l.split("exports: ").nth(1)?;
                rest.split(' ').next()?.parse::<u64>().ok()
            });
            if sent.is_some_and(|s| s >= n) {
                return;
            }
            assert!(
                start.elapsed() < WAIT,
                "not {n} exports sent after {WAIT:?}:\n{}",
                self.text()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for it to exit (its targets gone), or stops it with SIGTERM;
    /// returns its stderr.
    fn stop(mut self, signal: bool) -> String {
        if signal {
            let pid = libc::pid_t::try_from(self.child.id()).unwrap();
            // SAFETY: signals our own child, which has not been waited for.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        }
        let status = self.child.wait().unwrap();
        self.reader.take().unwrap().join().unwrap();
        let text = self.text();
        assert!(status.success(), "{status}:\n{text}");
        text
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("the agent said:\n{}", self.text());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_pid(data: &ProfilesData, r: &otlp::proto::profiles::ResourceProfiles, pid: u32) -> bool {
    let strings = &data.dictionary.as_ref().unwrap().string_table;
    r.resource.as_ref().is_some_and(|res| {
        res.attributes.iter().any(|a| {
            let key = if a.key_strindex != 0 {
                strings[a.key_strindex as usize].as_str()
            } else {
                a.key.as_str()
            };
            key == ATTR_PID
                && a.value.as_ref().and_then(|v| v.value.as_ref())
                    == Some(&Value::IntValue(i64::from(pid)))
        })
    })
}

/// Over the exports received: site_large's alloc deltas for `pid`, summed,
/// and each export's window start for it, which must all differ (an
/// export sent twice would repeat one).
fn deltas(exports: &[ProfilesData], pid: u32) -> (i64, usize) {
    let mut sum = 0;
    let mut windows = BTreeSet::new();
    let mut seen = 0;
    for data in exports {
        let dict = data.dictionary.as_ref().unwrap();
        for r in data
            .resource_profiles
            .iter()
            .filter(|r| is_pid(data, r, pid))
        {
            for p in r.scope_profiles.iter().flat_map(|s| &s.profiles) {
                let t = p.sample_type.unwrap().type_strindex as usize;
                if dict.string_table[t] != "alloc_space" {
                    continue;
                }
                seen += 1;
                assert!(
                    windows.insert(p.time_unix_nano),
                    "an export received twice (window {})",
                    p.time_unix_nano
                );
                sum += p
                    .samples
                    .iter()
                    .filter(|s| {
                        otlp::stack_functions(dict, s.stack_index)
                            .iter()
                            .any(|f| f == "site_large")
                    })
                    .map(|s| s.values[0])
                    .sum::<i64>();
            }
        }
    }
    (sum, seen)
}

fn decode(raw: &[Vec<u8>]) -> Vec<ProfilesData> {
    raw.iter()
        .map(|m| ProfilesData::decode(&m[..]).unwrap())
        .collect()
}

/// The exit's exports line says nothing was dropped.
fn assert_nothing_dropped(stderr: &str) {
    let last = stderr
        .lines()
        .rfind(|l| l.contains("exports: "))
        .unwrap_or_else(|| panic!("no exports line:\n{stderr}"));
    assert!(last.contains(" 0 dropped"), "{stderr}");
}

#[test]
fn exports_wait_for_a_collector_that_is_not_up_yet() {
    common::require_bpf();
    let (grpc, http) = (free_port(), free_port());
    let mut w = Workload::c(&[]);
    let pid = w.pid();
    let agent = Agent::start(pid, &format!("http://127.0.0.1:{http}"), &[], &[]);
    w.allocate();
    agent.wait_for("export failed, retrying with backoff: connect");
    // A few exports queue up meanwhile (a wait, not an assertion).
    thread::sleep(Duration::from_secs(3));
    let collector = Collector::start_with("late", None, Some((grpc, http)));
    collector.wait_for_exports(2);
    w.exit();
    let stderr = agent.stop(false);
    assert_nothing_dropped(&stderr);
    assert!(stderr.contains("exports go through again"), "{stderr}");
    let exports = decode(&collector.stop_and_read());
    let (sum, seen) = deltas(&exports, pid);
    assert!(seen >= 3, "{seen} exports of the workload:\n{stderr}");
    assert_eq!(sum, LARGE, "site_large's deltas:\n{stderr}");
}

#[test]
fn queued_exports_arrive_after_the_collector_restarts() {
    common::require_bpf();
    let mut collector = Collector::start("restart");
    let mut w = Workload::c(&[]);
    let pid = w.pid();
    // Over gRPC: tonic's channel must reconnect by itself.
    let agent = Agent::start(
        pid,
        &collector.grpc_endpoint(),
        &["--otlp-protocol", "grpc"],
        &[],
    );
    // Sent, though not written out: nothing allocated yet, nothing to write.
    agent.wait_for_sent(1);
    collector.restart(|| {
        agent.wait_for("export failed, retrying with backoff: gRPC UNAVAILABLE");
        // Allocated while the collector is down: its delta is queued.
        w.allocate();
        thread::sleep(Duration::from_secs(3));
    });
    let before = collector.exports_so_far();
    collector.wait_for_exports(before + 2);
    w.exit();
    let stderr = agent.stop(false);
    assert_nothing_dropped(&stderr);
    let exports = decode(&collector.stop_and_read());
    let (sum, _) = deltas(&exports, pid);
    assert_eq!(sum, LARGE, "site_large's deltas:\n{stderr}");
}

/// Reads one HTTP/1.1 request: its head and body.
fn read_request(stream: &mut std::net::TcpStream) -> (String, Vec<u8>) {
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map_or(0, |n| n.parse().unwrap());
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    (head, body)
}

#[test]
fn a_503_with_retry_after_is_retried_no_earlier_than_it_says() {
    common::require_bpf();
    const REFUSALS: usize = 3;
    const AFTER: Duration = Duration::from_secs(2);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    // (arrival, body, accepted)
    let log: Calls = Arc::default();
    let l = log.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            let (_, body) = read_request(&mut stream);
            let mut log = l.lock().unwrap();
            let refuse = log.len() < REFUSALS;
            log.push((Instant::now(), body, !refuse));
            let response = if refuse {
                format!(
                    "HTTP/1.1 503 Service Unavailable\r\nRetry-After: {}\r\nContent-Length: 4\r\n\r\nbusy",
                    AFTER.as_secs()
                )
                .into_bytes()
            } else {
                let body = ExportProfilesServiceResponse::default().encode_to_vec();
                let mut r = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len())
                    .into_bytes();
                r.extend(body);
                r
            };
            let _ = stream.write_all(&response);
        }
    });
    let mut w = Workload::c(&[]);
    let pid = w.pid();
    let agent = Agent::start(pid, &endpoint, &[], &[]);
    w.allocate();
    let start = Instant::now();
    while log.lock().unwrap().iter().filter(|(_, _, ok)| *ok).count() < 2 {
        assert!(start.elapsed() < WAIT, "{}", agent.text());
        thread::sleep(Duration::from_millis(50));
    }
    w.exit();
    let stderr = agent.stop(false);
    assert_nothing_dropped(&stderr);
    let log = log.lock().unwrap();
    // Each attempt after a refusal came no earlier than Retry-After.
    for pair in log.windows(2).take(REFUSALS) {
        let gap = pair[1].0.duration_since(pair[0].0);
        assert!(gap >= AFTER, "retried after {gap:?}, not {AFTER:?}");
    }
    // The refusals were one export, tried again; logged once.
    assert!(log[..=REFUSALS].windows(2).all(|p| p[0].1 == p[1].1));
    assert_eq!(stderr.matches("HTTP 503").count(), 1, "{stderr}");
    let accepted: Vec<ProfilesData> = log
        .iter()
        .filter(|(_, _, ok)| *ok)
        .map(|(_, body, _)| ProfilesData::decode(&body[..]).unwrap())
        .collect();
    let (sum, _) = deltas(&accepted, pid);
    assert_eq!(sum, LARGE, "site_large's deltas:\n{stderr}");
}

/// A gRPC server (h2, by hand) that answers the first `refusals` calls
/// RESOURCE_EXHAUSTED with a RetryInfo of `after`, then OK; it records
/// each call's arrival, message and verdict.
fn grpc_refuser(refusals: usize, after: Duration) -> (String, Calls) {
    use base64::Engine;
    let log: Calls = Arc::default();
    let l = log.clone();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    listener.set_nonblocking(true).unwrap();
    thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let (socket, _) = listener.accept().await.unwrap();
                let l = l.clone();
                tokio::spawn(async move {
                    let mut conn = h2::server::handshake(socket).await.unwrap();
                    while let Some(Ok((request, mut respond))) = conn.accept().await {
                        // A task per call: the connection must be polled
                        // for the call's body to arrive.
                        let l = l.clone();
                        tokio::spawn(async move {
                            let mut body = request.into_body();
                            let mut data = Vec::new();
                            while let Some(Ok(chunk)) = body.data().await {
                                let _ = body.flow_control().release_capacity(chunk.len());
                                data.extend_from_slice(&chunk);
                            }
                            // The 5-byte gRPC frame header (uncompressed here).
                            let message = data.get(5..).unwrap_or_default().to_vec();
                            let refuse = {
                                let mut log = l.lock().unwrap();
                                let refuse = log.len() < refusals;
                                log.push((Instant::now(), message, !refuse));
                                refuse
                            };
                            let head = http::Response::builder()
                                .status(200)
                                .header("content-type", "application/grpc");
                            if refuse {
                                let details = base64::engine::general_purpose::STANDARD_NO_PAD
                                    .encode(retry_info_details(8, after));
                                let response = head
                                    .header("grpc-status", "8")
                                    .header("grpc-message", "slow down")
                                    .header("grpc-status-details-bin", details)
                                    .body(())
                                    .unwrap();
                                let _ = respond.send_response(response, true);
                            } else {
                                let reply =
                                    ExportProfilesServiceResponse::default().encode_to_vec();
                                let mut framed = vec![0];
                                framed.extend_from_slice(&(reply.len() as u32).to_be_bytes());
                                framed.extend(reply);
                                let mut stream = respond
                                    .send_response(head.body(()).unwrap(), false)
                                    .unwrap();
                                let _ = stream.send_data(framed.into(), false);
                                let mut trailers = http::HeaderMap::new();
                                trailers.insert("grpc-status", "0".parse().unwrap());
                                let _ = stream.send_trailers(trailers);
                            }
                        });
                    }
                });
            }
        });
    });
    (endpoint, log)
}

#[test]
fn resource_exhausted_with_retry_info_is_retried_no_earlier_than_it_says() {
    common::require_bpf();
    const REFUSALS: usize = 2;
    const AFTER: Duration = Duration::from_millis(2500);
    let (endpoint, log) = grpc_refuser(REFUSALS, AFTER);
    let mut w = Workload::c(&[]);
    let pid = w.pid();
    let agent = Agent::start(pid, &endpoint, &["--otlp-protocol", "grpc"], &[]);
    w.allocate();
    let start = Instant::now();
    while log.lock().unwrap().iter().filter(|(_, _, ok)| *ok).count() < 2 {
        assert!(start.elapsed() < WAIT, "{}", agent.text());
        thread::sleep(Duration::from_millis(50));
    }
    w.exit();
    let stderr = agent.stop(false);
    assert_nothing_dropped(&stderr);
    let log = log.lock().unwrap();
    for pair in log.windows(2).take(REFUSALS) {
        let gap = pair[1].0.duration_since(pair[0].0);
        assert!(gap >= AFTER, "retried after {gap:?}, not {AFTER:?}");
    }
    assert!(log[..=REFUSALS].windows(2).all(|p| p[0].1 == p[1].1));
    assert_eq!(stderr.matches("RESOURCE_EXHAUSTED").count(), 1, "{stderr}");
    let accepted: Vec<ProfilesData> = log
        .iter()
        .filter(|(_, _, ok)| *ok)
        .map(|(_, m, _)| ProfilesData::decode(&m[..]).unwrap())
        .collect();
    let (sum, _) = deltas(&accepted, pid);
    assert_eq!(sum, LARGE, "site_large's deltas:\n{stderr}");
}

/// An endpoint that accepts connections and reads, and never answers: each
/// attempt ends at the timeout and is not resent; exports pile up in the
/// queue, which drops the oldest; allocprof's memory stays bounded.
#[test]
fn an_endpoint_that_never_answers_times_out_and_memory_stays_bounded() {
    common::require_bpf();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            let mut sink = vec![0; 1 << 16];
            let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
            let _ = stream.read(&mut sink);
            held.push(stream);
        }
    });
    let mut w = Workload::c(&[]);
    w.allocate();
    let pid = w.pid();
    let agent = Agent::start(
        pid,
        &endpoint,
        &["--push-interval", "100ms", "--otlp-queue-bytes", "64K"],
        &[("OTEL_EXPORTER_OTLP_TIMEOUT", "3000")],
    );
    agent.wait_for("export dropped: no response");
    agent.wait_for("the export queue is full");
    // RSS sampled while the queue is full, over several timeouts.
    let mut max_rss = 0;
    for _ in 0..40 {
        max_rss = max_rss.max(rss_of(&agent.child.id().to_string()).unwrap_or(0));
        thread::sleep(Duration::from_millis(250));
    }
    w.exit();
    let stderr = agent.stop(false);
    assert!(max_rss < 256 << 20, "allocprof's RSS reached {max_rss} B");
    assert_eq!(
        stderr.matches("no response").count(),
        1,
        "one line per kind:\n{stderr}"
    );
    let last = stderr.lines().rfind(|l| l.contains("exports: ")).unwrap();
    assert!(last.contains("queue full"), "{stderr}");
}

/// A collector whose certificate the agent's CA did not sign: one clear
/// error, over both protocols.
#[test]
fn a_wrong_certificate_is_a_clear_error() {
    common::require_bpf();
    let certs = Certs::make("right");
    let other = Certs::make("other");
    let collector = Collector::start_with("wrong-cert", Some(&certs), None);
    let (grpcs, https) = collector.tls_endpoints();
    let mut w = Workload::c(&[]);
    w.allocate();
    for (endpoint, protocol) in [(https, "http/protobuf"), (grpcs, "grpc")] {
        let agent = Agent::start(
            w.pid(),
            &endpoint,
            &["--otlp-protocol", protocol],
            &[("OTEL_EXPORTER_OTLP_CERTIFICATE", other.ca.to_str().unwrap())],
        );
        let line = agent.wait_for("certificate");
        assert!(line.contains("export dropped"), "{line}");
        assert!(line.contains("invalid peer certificate"), "{line}");
        let stderr = agent.stop(true);
        assert_eq!(stderr.matches("certificate").count(), 1, "once:\n{stderr}");
    }
    w.exit();
    assert!(collector.stop_and_read().is_empty());
}

/// A variable allocprof cannot read is an error naming it; a start that
/// fails once the transport is made (no such process) is that error, over
/// either protocol, not a panic of the gRPC runtime torn down inside the
/// driver's.
#[test]
fn a_bad_variable_and_a_failed_start_are_errors_not_panics() {
    common::require_bpf();
    let out = Command::new(env!("CARGO_BIN_EXE_allocprof"))
        .args(["agent", "--pid", "1"])
        .env("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "http/json")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL=\"http/json\": not grpc or http/protobuf"
        ),
        "{stderr}"
    );
    // Above any pid_max (2^22).
    for protocol in ["grpc", "http/protobuf"] {
        let out = Command::new(env!("CARGO_BIN_EXE_allocprof"))
            .args(["agent", "--pid", "999999999", "--otlp-protocol", protocol])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{protocol}: {stderr}");
        assert!(!stderr.contains("panicked"), "{protocol}: {stderr}");
    }
}

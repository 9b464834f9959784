//! `cargo xtask bench otlp`: `allocprof agent` at fleet scale on one host.
//! 500 processes (`xtask/bench/otlp_workload.c` under liballocprof.so, every
//! allocation sampled) each hold 80 live blocks from 40 call stacks, then
//! idle; one real OpenTelemetry Collector (`xtask/otelcol/`, its file
//! exporter writing what it receives) and one system-wide `allocprof agent`
//! pushing every 15 s for several intervals. System-wide, as a fleet runs
//! it: the probes are attached once per library, where `--pid` attaches
//! them once per process (4,000 perf events for 500 processes, whose
//! release at exit took the kernel minutes). Other profiled processes on
//! the machine join the exports: the resources per export say how many. Reports the bytes per
//! export (the file exporter's messages: the collector's re-encoding of each
//! request, uncompressed), allocprof's CPU (utime + stime from
//! /proc/PID/stat) at start-up, then over the intervals once started (from
//! half an interval after attach: one export per interval) and from attach
//! on, its peak resident
//! memory (VmHWM) and descriptors; then the encode time per export, from
//! the library's encoder run on the same processes' profile
//! (`profiler-user/tests/otlp_load.rs`) once the agent has stopped.
//! `--quick`: 3 intervals instead of 6.

use std::{
    fs,
    io::{BufRead, BufReader, PipeWriter},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{bench_pipeline::cpu_ticks, otelcol, shell};

const PROCESSES: usize = 500;
const PUSH_INTERVAL: Duration = Duration::from_secs(15);
/// Targets (issue 28).
const CPU_TARGET: f64 = 0.02;
const RSS_TARGET_KIB: u64 = 100 << 10;
/// A deadline for waits (start-up, exits) on a loaded machine, not a figure.
const DEADLINE: Duration = Duration::from_secs(120);

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let intervals: u32 = if args.iter().any(|a| a == "--quick") {
        3
    } else {
        6
    };
    shell::cargo(root, &["build", "--release"])?;
    // Built now, run once the agent has stopped: no compiler beside it.
    shell::cargo(
        root,
        &[
            "test",
            "--release",
            "-p",
            "allocprof",
            "--test",
            "otlp_load",
            "--no-run",
        ],
    )?;
    let collector_bin = otelcol::ensure(root)?;
    let dir = root.join("target/bench/otlp");
    fs::create_dir_all(&dir)?;
    let workload = dir.join("otlp_workload");
    shell::run(
        root,
        "gcc",
        &[
            "-O2",
            "-fno-builtin",
            "-fno-omit-frame-pointer",
            "-o",
            &workload.to_string_lossy(),
            &root.join("xtask/bench/otlp_workload.c").to_string_lossy(),
        ],
    )?;
    let nofile = raise_nofile()?;
    check_pid_room()?;

    println!(
        "\n## allocprof agent: {PROCESSES} processes x 40 live stacks, pushed every {}s for {intervals} intervals",
        PUSH_INTERVAL.as_secs()
    );
    println!("machine load before: {}", loadavg());
    println!("RLIMIT_NOFILE (soft, raised to hard): {nofile}");

    let collector = Collector::start(&collector_bin, &dir)?;
    let procs = Workloads::start(&workload, &root.join("target/release/liballocprof.so"))?;
    println!("{PROCESSES} processes ready, each 80 live samples from 40 stacks (ALLOCPROF_RATE=1)");

    let started = Instant::now();
    let mut agent = Agent::start(
        &root.join("target/release/allocprof"),
        &collector.endpoint(),
    )?;
    let attach_secs = started.elapsed().as_secs_f64();
    let (t0, c0) = (Instant::now(), cpu_ticks(agent.pid())?);
    // The steady state starts half an interval after attach: the start-up's
    // reads (ledgers, symbols) are done, the first export is still ahead;
    // from there, each interval holds exactly one export.
    thread::sleep(PUSH_INTERVAL / 2);
    let (t_warm, c_warm) = (Instant::now(), cpu_ticks(agent.pid())?);
    thread::sleep(PUSH_INTERVAL * intervals);
    let (t1, c1) = (Instant::now(), cpu_ticks(agent.pid())?);
    let status = fs::read_to_string(format!("/proc/{}/status", agent.pid()))?;
    let hwm = status_kib(&status, "VmHWM:")?;
    let rss = status_kib(&status, "VmRSS:")?;
    let fds = fs::read_dir(format!("/proc/{}/fd", agent.pid()))?.count();
    let stderr = agent.stop()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = (c1 - c_warm) as f64 / hz / (t1 - t_warm).as_secs_f64();
    let cpu_from_attach = (c1 - c0) as f64 / hz / (t1 - t0).as_secs_f64();
    let startup_cpu = c0 as f64 / hz;
    let warmup_cpu = (c_warm - c0) as f64 / hz;
    println!("machine load during: {}", loadavg());

    // The file exporter flushes every 100 ms; stopping it closes the file.
    thread::sleep(Duration::from_secs(1));
    let exports = collector.stop_and_read()?;
    // Its failures and statistics, whatever their wording: shown as they
    // came, counted here.
    let said = stderr.len().saturating_sub(1);

    let encode = encode_figures(root, &procs.pids())?;
    procs.stop()?;

    let sizes: Vec<usize> = exports.iter().map(|m| m.len()).collect();
    let shapes: Vec<(usize, usize)> = exports
        .iter()
        .map(|m| top_level(m))
        .collect::<Result<_>>()?;
    if sizes.is_empty() {
        bail!(
            "the collector wrote no export; the agent said:\n{}",
            stderr.join("\n")
        );
    }
    let mut sorted = sizes.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2];
    let full = shapes.iter().filter(|s| s.0 >= PROCESSES).count();
    println!("\n| figure | value |");
    println!("|---|---|");
    println!(
        "| exports written by the collector | {} ({full} with at least {PROCESSES} processes); the agent wrote {said} lines after attaching (above) |",
        sizes.len()
    );
    println!(
        "| bytes per export (collector's file exporter, uncompressed) | median {} KiB, min {} KiB, max {} KiB |",
        median / 1024,
        sorted[0] / 1024,
        sorted[sorted.len() - 1] / 1024
    );
    let (resources, dict) = shapes[sizes.iter().position(|&s| s == median).unwrap_or(0)];
    println!(
        "| of which the shared dictionary (median export) | {} KiB; {resources} resources (processes) in it |",
        dict / 1024
    );
    println!(
        "| request size from the encoder (same profile) | {} KiB; gzip'd {} KiB ({} ms to compress) |",
        encode.value("request_bytes")? as u64 / 1024,
        encode.value("gzip_bytes")? as u64 / 1024,
        encode.value("gzip_ms")?
    );
    println!(
        "| encode time per export (Encoder::encode + protobuf, median of 9) | {:.1} ms (max {:.1} ms) |",
        encode.value("encode_ms_median")?,
        encode.value("encode_ms_max")?
    );
    println!(
        "| reading the profile from the kernel and symbolizing (first export of a fresh session) | {:.1} ms |",
        encode.value("profile_read_ms")?
    );
    println!(
        "| allocprof CPU over the {intervals} intervals (steady: from half an interval after attach, one export each) | {:.2}% of one core (target < {:.0}%) {} |",
        cpu * 100.0,
        CPU_TARGET * 100.0,
        verdict(cpu < CPU_TARGET)
    );
    println!(
        "| allocprof CPU at start-up (attach to {PROCESSES} processes) | {startup_cpu:.2} s of CPU in {attach_secs:.1} s; then {warmup_cpu:.2} s in the next {:.1} s (ledgers read, stacks symbolized) |",
        (t_warm - t0).as_secs_f64()
    );
    println!(
        "| allocprof CPU from attach to the end (start-up reads and {intervals} exports) | {:.2}% of one core |",
        cpu_from_attach * 100.0
    );
    println!(
        "| allocprof peak resident (VmHWM) | {:.1} MiB (target < {} MiB) {}; VmRSS at the end {:.1} MiB |",
        hwm as f64 / 1024.0,
        RSS_TARGET_KIB >> 10,
        verdict(hwm < RSS_TARGET_KIB),
        rss as f64 / 1024.0
    );
    println!("| allocprof open descriptors at the end | {fds} |");
    println!("machine load after: {}", loadavg());
    Ok(())
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "**missed**" }
}

/// Raises our soft RLIMIT_NOFILE to the hard limit (the agent inherits
/// it: it keeps each process's mapped files open); returns it.
fn raise_nofile() -> Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit to write into.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        bail!("getrlimit: {}", std::io::Error::last_os_error());
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: `lim` is a valid rlimit; raising the soft limit to the hard
    // one needs no privilege.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        bail!("setrlimit: {}", std::io::Error::last_os_error());
    }
    Ok(lim.rlim_cur)
}

/// Fails clearly when the machine has no room for our processes under
/// `kernel.pid_max` (a global setting: never changed here).
fn check_pid_room() -> Result<()> {
    let max: usize = fs::read_to_string("/proc/sys/kernel/pid_max")?
        .trim()
        .parse()?;
    // The 4th field of /proc/loadavg: running/total scheduling entities.
    let load = fs::read_to_string("/proc/loadavg")?;
    let total: usize = load
        .split_whitespace()
        .nth(3)
        .and_then(|f| f.split('/').nth(1))
        .and_then(|n| n.parse().ok())
        .context("reading /proc/loadavg")?;
    if total + PROCESSES + 100 > max {
        bail!("kernel.pid_max is {max} and {total} tasks run: no room for {PROCESSES} more");
    }
    Ok(())
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn status_kib(status: &str, key: &str) -> Result<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {key} in /proc/PID/status"))
}

/// The idle processes, sharing one stdin pipe whose end of file (our
/// writer closed, by us or by our exit) lets every one exit.
struct Workloads {
    children: Vec<Child>,
    writer: Option<PipeWriter>,
}

impl Workloads {
    fn start(exe: &Path, preload: &Path) -> Result<Workloads> {
        let (reader, writer) = std::io::pipe()?;
        let mut w = Workloads {
            children: Vec::with_capacity(PROCESSES),
            writer: Some(writer),
        };
        for _ in 0..PROCESSES {
            let mut child = Command::new(exe)
                .env("LD_PRELOAD", preload)
                .env("ALLOCPROF_RATE", "1")
                .stdin(reader.try_clone()?)
                .stdout(Stdio::piped())
                .spawn()
                .context("starting the benchmark workload")?;
            let stdout = child.stdout.take().expect("piped");
            w.children.push(child);
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line)?;
            if line.trim() != "ready" {
                bail!("a benchmark workload did not start: {line:?}");
            }
        }
        Ok(w)
    }

    fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Lets them all exit; fails if one did not exit cleanly.
    fn stop(mut self) -> Result<()> {
        self.writer.take();
        for child in &mut self.children {
            let status = child.wait()?;
            if !status.success() {
                bail!("a benchmark workload failed: {status}");
            }
        }
        self.children.clear();
        Ok(())
    }
}

impl Drop for Workloads {
    fn drop(&mut self) {
        self.writer.take();
        let deadline = Instant::now() + Duration::from_secs(10);
        for child in &mut self.children {
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The running agent, its stderr lines collected.
struct Agent {
    child: Option<Child>,
    stderr: Arc<Mutex<Vec<String>>>,
    reader: Option<thread::JoinHandle<()>>,
}

impl Agent {
    /// Starts it system-wide (it arms the liballocprof.so beside it, the
    /// workloads'); returns once it has attached.
    fn start(allocprof: &Path, endpoint: &str) -> Result<Agent> {
        let mut child = Command::new(allocprof)
            .args(["agent", "--otlp-endpoint", endpoint, "--push-interval"])
            .arg(format!("{}s", PUSH_INTERVAL.as_secs()))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting allocprof agent")?;
        let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut agent = Agent {
            child: Some(child),
            stderr: stderr.clone(),
            reader: None,
        };
        loop {
            match lines.next() {
                Some(line) => {
                    let line = line?;
                    eprintln!("{line}");
                    let attached = line.contains("attached");
                    stderr.lock().expect("not poisoned").push(line);
                    if attached {
                        break;
                    }
                }
                None => bail!(
                    "allocprof agent exited before attaching:\n{}",
                    stderr.lock().expect("not poisoned").join("\n")
                ),
            }
        }
        agent.reader = Some(thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                eprintln!("{line}");
                stderr.lock().expect("not poisoned").push(line);
            }
        }));
        Ok(agent)
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGTERM (one last export, then exit); returns what it said.
    fn stop(&mut self) -> Result<Vec<String>> {
        let mut child = self.child.take().expect("running");
        terminate(&mut child, "allocprof agent")?;
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        Ok(self.stderr.lock().expect("not poisoned").clone())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// SIGTERM to our child `child`, then its exit (killed past the deadline);
/// fails unless it exited cleanly.
fn terminate(child: &mut Child, what: &str) -> Result<()> {
    let pid = libc::pid_t::try_from(child.id())?;
    // SAFETY: signals our own child, not yet waited for: the pid is its.
    if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
        bail!("signalling {what}: {}", std::io::Error::last_os_error());
    }
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            if !status.success() {
                bail!("{what} failed: {status}");
            }
            return Ok(());
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} did not exit within {DEADLINE:?} of SIGTERM");
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// The collector: OTLP in on free ports of 127.0.0.1, profiles to a file.
struct Collector {
    child: Option<Child>,
    http: SocketAddr,
    output: PathBuf,
    log: PathBuf,
}

impl Collector {
    fn start(binary: &Path, dir: &Path) -> Result<Collector> {
        let output = dir.join("profiles.pb");
        let _ = fs::remove_file(&output);
        let grpc = free_port()?;
        let http = free_port()?;
        let config = dir.join("otelcol.yaml");
        // Its own metrics off: their default port may be another's.
        fs::write(
            &config,
            format!(
                "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: {grpc}\n      \
                 http:\n        endpoint: {http}\nexporters:\n  file:\n    path: {}\n    \
                 format: proto\n    flush_interval: 100ms\nservice:\n  telemetry:\n    \
                 metrics:\n      level: none\n  pipelines:\n    profiles:\n      \
                 receivers: [otlp]\n      exporters: [file]\n",
                output.display()
            ),
        )?;
        let log = dir.join("otelcol.log");
        let log_file = fs::File::create(&log)?;
        let child = Command::new(binary)
            .arg(format!("--config={}", config.display()))
            .arg("--feature-gates=service.profilesSupport")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .context("starting the collector")?;
        let mut c = Collector {
            child: Some(child),
            http,
            output,
            log,
        };
        let start = Instant::now();
        while TcpStream::connect(grpc).is_err() || TcpStream::connect(http).is_err() {
            if let Some(status) = c.child.as_mut().expect("running").try_wait()? {
                bail!("the collector exited ({status}):\n{}", c.log_text());
            }
            if start.elapsed() > DEADLINE {
                bail!("the collector does not listen:\n{}", c.log_text());
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(c)
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.http)
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops it (it closes its file) and returns the messages written: the
    /// file exporter's `proto` format, each preceded by its length (4
    /// bytes, big-endian).
    fn stop_and_read(mut self) -> Result<Vec<Vec<u8>>> {
        let mut child = self.child.take().expect("running");
        terminate(&mut child, "the collector").with_context(|| self.log_text())?;
        let bytes = fs::read(&self.output)
            .with_context(|| format!("reading {}:\n{}", self.output.display(), self.log_text()))?;
        let mut rest = &bytes[..];
        let mut out = Vec::new();
        while let Some((len, tail)) = rest.split_first_chunk::<4>() {
            let len = u32::from_be_bytes(*len) as usize;
            if tail.len() < len {
                bail!("{}: a truncated message", self.output.display());
            }
            out.push(tail[..len].to_vec());
            rest = &tail[len..];
        }
        if !rest.is_empty() {
            bail!("{}: a truncated length", self.output.display());
        }
        Ok(out)
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

fn free_port() -> Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// A `ProfilesData` message's resources (field 1) and its dictionary's
/// size (field 2), from its top-level fields: no protobuf library here.
fn top_level(mut m: &[u8]) -> Result<(usize, usize)> {
    fn varint(m: &mut &[u8]) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = m.split_first().context("a truncated varint")?;
            *m = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        bail!("a varint too long")
    }
    let (mut resources, mut dictionary) = (0, 0);
    while !m.is_empty() {
        let key = varint(&mut m)?;
        if key & 7 != 2 {
            bail!("ProfilesData field {} is not length-delimited", key >> 3);
        }
        let len = usize::try_from(varint(&mut m)?)?;
        if len > m.len() {
            bail!("a truncated field");
        }
        match key >> 3 {
            1 => resources += 1,
            2 => dictionary += len,
            _ => {}
        }
        m = &m[len..];
    }
    Ok((resources, dictionary))
}

/// The `key value` lines of the encoder's run on the same processes.
struct Figures(String);

impl Figures {
    fn value(&self, key: &str) -> Result<f64> {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("no `{key}` in the encoder's output:\n{}", self.0))
    }
}

fn encode_figures(root: &Path, pids: &[u32]) -> Result<Figures> {
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let out = Command::new("cargo")
        .current_dir(root)
        .args([
            "test",
            "--release",
            "-p",
            "allocprof",
            "--test",
            "otlp_load",
            "--",
            "--ignored",
            "--nocapture",
        ])
        .env("ALLOCPROF_BENCH_PIDS", pids.join(","))
        .stderr(Stdio::inherit())
        .output()
        .context("running the encoder's bench (profiler-user/tests/otlp_load.rs)")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!("the encoder's bench failed ({}):\n{text}", out.status);
    }
    Ok(Figures(text))
}

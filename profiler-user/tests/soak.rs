//! Soak: the real `allocprof record`, system-wide, over a steady churn and a
//! slow leak the test drives (so the leak's truth is known at every
//! snapshot). Nothing may grow without bound (allocprof's RSS, the kernel's
//! tables) and the leak's estimate must stay within σ bounds.
//!
//! `cargo xtask test` runs it for `ALLOCPROF_SOAK_SECONDS` (default 40 s);
//! `cargo xtask soak` runs it for an hour and records the table it prints
//! (between the `soak:begin`/`soak:end` markers) in docs/reliability.md.

mod common;

use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command},
    time::{Duration, Instant},
};

use allocprof::{
    model::profile::{ProcessState, Profile},
    output::export::pprof,
};

/// Bytes of one leaked block (`LEAK_SIZE` in soak.c).
const LEAK_SIZE: u64 = 16384;
/// Blocks leaked before the first snapshot.
const INITIAL_LEAK: u64 = 256;
/// Ring slots of the churn (`RING` in soak.c): at most this many churn
/// blocks are live.
const CHURN_RING: u64 = 4096;
/// Kernel tables whose occupancy is recorded.
const TABLES: [&str; 4] = ["LIVE", "AGGS", "STACKS", "PROCS"];
const MIB: f64 = 1_048_576.0;
/// `--max-gone-memory` of the soak's allocprof: on a shared machine it
/// profiles every probed process that comes and goes (test suites...), and
/// keeps what they held, up to this.
const GONE_MEMORY_KIB: u64 = 16 * 1024;
/// RSS allocprof may gain from start to end: what it keeps of gone
/// processes (the cap is on an estimate: twice it), and 16 MiB for the
/// processes running at the end.
const RSS_GROWTH_KIB: u64 = 2 * GONE_MEMORY_KIB + 16 * 1024;

fn env_seconds(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number of seconds")),
        Err(_) => default,
    }
}

/// What was measured when one snapshot appeared.
struct Reading {
    at: Duration,
    rss_kib: u64,
    cpu_ticks: u64,
    tables: Vec<usize>,
    /// Leaked blocks the snapshot saw (the truth).
    leaked: u64,
    estimate: f64,
    sigma: f64,
}

impl Reading {
    fn z(&self) -> f64 {
        (self.estimate - (self.leaked * LEAK_SIZE) as f64) / self.sigma
    }
}

struct Workload {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Workload {
    fn command(&mut self, line: &str) -> String {
        writeln!(self.stdin, "{line}").unwrap();
        let mut reply = String::new();
        self.stdout.read_line(&mut reply).unwrap();
        reply.trim().to_string()
    }

    fn leak(&mut self, blocks: u64) -> u64 {
        let reply = self.command(&format!("leak {blocks}"));
        reply
            .strip_prefix("leaked ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected reply {reply:?}"))
    }
}

#[test]
fn a_churn_and_a_slow_leak_stay_bounded_and_unbiased() {
    common::require_bpf();
    let seconds = env_seconds("ALLOCPROF_SOAK_SECONDS", 40);
    let interval = env_seconds("ALLOCPROF_SOAK_INTERVAL", 5);
    assert!(
        seconds >= 3 * interval,
        "a soak needs at least three snapshots"
    );
    let lib = common::preload_library();
    let exe = common::compile_c("soak.c", &["-pthread"]);
    let dir = common::scratch_dir(&format!("soak-{}", std::process::id()));
    let mut profiler = common::spawn_attached(
        Command::new(env!("CARGO_BIN_EXE_allocprof"))
            .args(["record", "-d", &format!("{seconds}s")])
            .args(["--interval", &format!("{interval}s"), "-o"])
            .arg(dir.join("heap.pb.gz"))
            .arg(format!("--max-gone-memory={GONE_MEMORY_KIB}KiB"))
            .arg("--probe-file")
            .arg(&lib),
    );
    let started = Instant::now();
    let mut child = common::preloaded(&mut Command::new(&exe)).spawn().unwrap();
    let mut workload = Workload {
        stdin: child.stdin.take().unwrap(),
        stdout: BufReader::new(child.stdout.take().unwrap()),
        child,
    };
    let pid = workload.child.id();
    let mut leaked = workload.leak(INITIAL_LEAK);

    // Snapshot k sees the leak as it was when snapshot k-1 appeared (the
    // step is taken right after): the truth of each snapshot is exact.
    let snapshots = seconds / interval;
    let mut readings = Vec::new();
    for k in 1..snapshots {
        let file = dir.join(format!("heap.{k:04}.pb.gz"));
        wait_for(&file, Duration::from_secs(seconds + 60));
        let profile = pprof::decode(&std::fs::read(&file).unwrap())
            .unwrap_or_else(|e| panic!("snapshot {k}: {e}"));
        let estimate = leak_estimate(&profile, pid);
        let (truth, sigma) = common::truth_and_sigma(leaked, LEAK_SIZE, common::RATE);
        assert_eq!(truth, (leaked * LEAK_SIZE) as f64);
        readings.push(Reading {
            at: started.elapsed(),
            rss_kib: common::memory_kib(profiler.id(), "VmRSS"),
            cpu_ticks: common::cpu_ticks(profiler.id()),
            tables: TABLES
                .iter()
                .map(|t| common::table_entries(profiler.id(), t))
                .collect(),
            leaked,
            estimate,
            sigma,
        });
        let r = readings.last().unwrap();
        // The trend, for a long run's log (`cargo xtask soak` shows it).
        eprintln!(
            "soak: snapshot {k} at {:.0} s: allocprof RSS {} KiB, tables {:?}, leak z {:+.2}",
            r.at.as_secs_f64(),
            r.rss_kib,
            r.tables,
            r.z()
        );
        leaked = workload.leak(interval);
    }
    assert!(profiler.wait().unwrap().success(), "allocprof failed");
    let churn_reply = workload.command("exit");
    assert!(workload.child.wait().unwrap().success());

    let (start, end) = (&readings[0], readings.last().unwrap());
    println!("{}", table(seconds, interval, &readings, &churn_reply));
    for r in [start, end] {
        assert!(
            r.z().abs() <= 4.0,
            "leak estimate {:.0} vs truth {} (z {:.2}) at {:?}",
            r.estimate,
            r.leaked * LEAK_SIZE,
            r.z(),
            r.at
        );
    }
    assert!(
        end.rss_kib <= start.rss_kib + RSS_GROWTH_KIB,
        "allocprof's RSS grew from {} KiB to {} KiB",
        start.rss_kib,
        end.rss_kib
    );
    let (stacks, aggs, live) = (2, 1, 0);
    for t in [stacks, aggs] {
        assert!(
            end.tables[t] <= start.tables[t] + 256,
            "{} grew from {} to {} entries over a fixed set of call sites",
            TABLES[t],
            start.tables[t],
            end.tables[t]
        );
    }
    assert!(
        end.tables[live] as u64 <= CHURN_RING + end.leaked + 64,
        "more live samples ({}) than live blocks",
        end.tables[live]
    );
}

/// The leak's estimated live bytes in `pid`'s live image.
fn leak_estimate(profile: &Profile, pid: u32) -> f64 {
    let process = profile
        .processes
        .iter()
        .find(|p| p.key.pid.0 == pid && p.state == ProcessState::Live)
        .unwrap_or_else(|| panic!("process {pid} missing from the snapshot"));
    process
        .stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| &*f.function == "leak_block"))
        .map(|s| s.totals.live_bytes)
        .sum()
}

fn wait_for(file: &Path, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !file.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn table(seconds: u64, interval: u64, readings: &[Reading], churn: &str) -> String {
    let (start, end) = (&readings[0], readings.last().unwrap());
    let span = (end.at - start.at).as_secs_f64();
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = (end.cpu_ticks - start.cpu_ticks) as f64 / ticks_per_second / span * 100.0;
    let ops: f64 = churn
        .strip_prefix("churn ")
        .and_then(|n| n.parse().ok())
        .unwrap_or(f64::NAN);
    let mut t = format!(
        "<!-- soak:begin -->\n\
         Soak of {seconds} s (snapshots every {interval} s): system-wide `allocprof record` over \
         a churn ({:.0} malloc/free per second, 16 B–64 KiB, {CHURN_RING} live slots) and a leak \
         of one 16 KiB block per second, at R = {} KiB. Start: the first snapshot \
         ({:.0} s in); end: the last interval snapshot ({:.0} s in).\n\n\
         | measure | start | end |\n|---|---|---|\n",
        ops / end.at.as_secs_f64(),
        common::RATE / 1024,
        start.at.as_secs_f64(),
        end.at.as_secs_f64(),
    );
    t += &format!(
        "| allocprof RSS | {:.1} MiB | {:.1} MiB |\n",
        start.rss_kib as f64 / 1024.0,
        end.rss_kib as f64 / 1024.0
    );
    t += &format!("| allocprof CPU (start to end) | | {cpu:.1} % of a core |\n");
    for (i, name) in TABLES.iter().enumerate() {
        t += &format!(
            "| kernel `{name}` entries | {} | {} |\n",
            start.tables[i], end.tables[i]
        );
    }
    t += &format!(
        "| leak truth | {:.2} MiB | {:.2} MiB |\n",
        (start.leaked * LEAK_SIZE) as f64 / MIB,
        (end.leaked * LEAK_SIZE) as f64 / MIB
    );
    t += &format!(
        "| leak estimate (z) | {:.2} MiB ({:+.2}) | {:.2} MiB ({:+.2}) |\n",
        start.estimate / MIB,
        start.z(),
        end.estimate / MIB,
        end.z()
    );
    let worst = readings.iter().map(|r| r.z().abs()).fold(0.0, f64::max);
    t += &format!(
        "\nOver all {} snapshots the largest |z| of the leak estimate was {worst:.2}.\n\
         <!-- soak:end -->",
        readings.len()
    );
    t
}

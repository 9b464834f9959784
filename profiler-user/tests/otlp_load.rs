//! The encoder's share of `cargo xtask bench otlp` (xtask/src/bench_otlp.rs):
//! the processes the bench started (`ALLOCPROF_BENCH_PIDS`, 500 of them, 40
//! live stacks each), profiled by a system-wide session of its own after the
//! agent stopped (as the agent runs: `--pid` of 500 processes would attach
//! their probes 500 times), their profile encoded as the agent encodes each
//! export. Ignored: the bench runs it, with the processes it names; it prints
//! figures and checks only the profile's shape.

use std::{
    collections::HashSet,
    time::{Instant, SystemTime},
};

use allocprof::{
    ids::Pid,
    kernel::Limits,
    output::export::otlp,
    session::{Session, Target},
};
use flate2::{Compression, write::GzEncoder};
use prost::Message;

/// Exports encoded in a row, as the agent's successive pushes are.
const RUNS: usize = 9;
/// The bench workload's sites (xtask/bench/otlp_workload.c).
const SITES: usize = 40;

#[test]
#[ignore = "run by `cargo xtask bench otlp`, which starts the processes it names"]
fn encode_time_of_the_bench_profile() {
    let pids: HashSet<Pid> = std::env::var("ALLOCPROF_BENCH_PIDS")
        .expect("ALLOCPROF_BENCH_PIDS: the pids `cargo xtask bench otlp` started")
        .split(',')
        .map(|p| Pid(p.parse().expect("a pid")))
        .collect();
    let mut session =
        Session::start(Target::All, Limits::default()).expect("a session (root, or CAP_SYS_ADMIN)");
    let read = Instant::now();
    let mut profile = session.complete_profile().expect("the profile");
    let read = read.elapsed();
    // Other profiled processes on the machine are not the bench's.
    profile.processes.retain(|p| pids.contains(&p.key.pid));

    // The shape the bench's figures stand for: every process, every site.
    assert_eq!(profile.processes.len(), pids.len(), "one entry per process");
    for p in &profile.processes {
        assert!(
            p.stacks.len() >= SITES,
            "pid {} has {} stacks, not {SITES}",
            p.key.pid.0,
            p.stacks.len()
        );
    }

    let mut encoder = otlp::Encoder::new();
    let mut times = Vec::with_capacity(RUNS);
    let mut bytes = Vec::new();
    for _ in 0..RUNS {
        let start = Instant::now();
        // ProfilesData and the request share their wire format (proto.rs).
        bytes = encoder.encode(&profile, SystemTime::now()).encode_to_vec();
        times.push(start.elapsed());
    }
    times.sort();
    let gzip_start = Instant::now();
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    std::io::Write::write_all(&mut gz, &bytes).unwrap();
    let gzipped = gz.finish().unwrap().len();
    let gzip_time = gzip_start.elapsed();

    // `key value` lines, read by the bench.
    println!("processes {}", profile.processes.len());
    println!(
        "stacks {}",
        profile
            .processes
            .iter()
            .map(|p| p.stacks.len())
            .sum::<usize>()
    );
    println!("profile_read_ms {:.1}", read.as_secs_f64() * 1e3);
    println!(
        "encode_ms_median {:.1}",
        times[RUNS / 2].as_secs_f64() * 1e3
    );
    println!("encode_ms_max {:.1}", times[RUNS - 1].as_secs_f64() * 1e3);
    println!("request_bytes {}", bytes.len());
    println!("gzip_bytes {gzipped}");
    println!("gzip_ms {:.1}", gzip_time.as_secs_f64() * 1e3);
}

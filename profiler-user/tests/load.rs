//! Load: a storm of a thousand short-lived profiled processes, profiled
//! system-wide by the real binary. Every process is accounted, and
//! allocprof's memory and the kernel's tables stay bounded: a process that
//! exited leaves nothing in the kernel once its image is frozen.

mod common;

use std::{
    process::Command,
    time::{Duration, Instant},
};

const PROCESSES: usize = 1000;
/// Started at a time, so the storm is as fast as the machine allows.
const CONCURRENT: usize = 16;
const HELD_AT_EXIT: f64 = (2 << 20) as f64;

#[test]
fn a_storm_of_a_thousand_short_lived_processes_is_all_accounted() {
    common::require_bpf();
    let lib = common::preload_library();
    let exe = common::compile_c("short_lived.c", &[]);
    let out = common::scratch_dir("load").join(format!("storm-{}.json", std::process::id()));
    let mut profiler = common::spawn_attached(
        Command::new(env!("CARGO_BIN_EXE_allocprof"))
            .args(["-f", "json", "--interval", "200ms", "-o"])
            .arg(&out)
            .arg("--probe-file")
            .arg(&lib)
            .stdout(std::process::Stdio::null()),
    );

    let mut pids = Vec::with_capacity(PROCESSES);
    let mut running = Vec::new();
    while pids.len() < PROCESSES || !running.is_empty() {
        while running.len() < CONCURRENT && pids.len() < PROCESSES {
            let child = Command::new(&exe)
                .env("LD_PRELOAD", &lib)
                .env("ALLOCPROF_RATE", common::RATE.to_string())
                .spawn()
                .unwrap();
            pids.push(child.id());
            running.push(child);
        }
        let mut still = Vec::new();
        for mut child in running {
            match child.try_wait().unwrap() {
                Some(status) => assert!(status.success()),
                None => still.push(child),
            }
        }
        running = still;
        std::thread::sleep(Duration::from_millis(1));
    }

    // Every exit retired: the kernel forgets each process once frozen
    // (other processes with the probes may run meanwhile: only the storm's
    // count).
    let deadline = Instant::now() + Duration::from_secs(20);
    let remaining = || {
        let mut left: Vec<u32> = ["PROCS", "AGGS"]
            .iter()
            .flat_map(|t| common::table_pids(profiler.id(), t))
            .filter(|p| pids.contains(p))
            .collect();
        left.sort_unstable();
        left.dedup();
        left
    };
    while !remaining().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the kernel still tracks storm processes {:?}",
            remaining()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let peak_kib = common::memory_kib(profiler.id(), "VmHWM");
    // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
    unsafe { libc::kill(profiler.id() as i32, libc::SIGINT) };
    assert!(profiler.wait().unwrap().success());

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let processes = report["processes"].as_array().unwrap();
    let mut missed = Vec::new();
    for pid in &pids {
        let held: f64 = processes
            .iter()
            .filter(|p| p["pid"] == *pid && p["state"] == "exited")
            .map(|p| p["totals"]["live_bytes"].as_f64().unwrap())
            .sum();
        if (held - HELD_AT_EXIT).abs() > HELD_AT_EXIT * 0.01 {
            missed.push((pid, held));
        }
    }
    assert!(
        missed.is_empty(),
        "{} of {PROCESSES} processes not accounted (pid, bytes held at exit): {:?}",
        missed.len(),
        &missed[..missed.len().min(20)]
    );
    // Each keeps its name, gone before a scan or not: the kernel's.
    let unnamed: Vec<&serde_json::Value> = processes
        .iter()
        .filter(|p| pids.iter().any(|pid| p["pid"] == *pid) && p["name"] != "short_lived")
        .map(|p| &p["name"])
        .collect();
    assert!(unnamed.is_empty(), "storm processes misnamed: {unnamed:?}");
    assert!(
        peak_kib < 128 * 1024,
        "allocprof peaked at {peak_kib} KiB over {PROCESSES} processes"
    );
    println!(
        "allocprof peak RSS over the storm: {:.1} MiB",
        peak_kib as f64 / 1024.0
    );
}

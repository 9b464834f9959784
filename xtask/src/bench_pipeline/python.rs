//! `cargo xtask bench pipeline`'s Python row (issue 30; `--python` runs it
//! alone): what walking a CPython thread's frames adds to a sampled
//! allocation. Debian's `/usr/bin/python3` runs `xtask/bench/python_deep.py`
//! (bytearrays allocated under 20 Python frames) under liballocprof.so with
//! `PYTHONMALLOC=malloc` and `ALLOCPROF_RATE=1`, attached by `allocprof
//! --python on` and `--python off` in turn, round after round, with
//! `kernel.bpf_stats_enabled` on in both. Per sampled allocation: the
//! target's CPU time (user and system: the uprobe and the program run in
//! its context; less inflated by other work on the shared cores than wall
//! time, also shown) and the eBPF alloc program's own, medians; the
//! difference is the Python walk's, against the target of ≤ +1.5 µs.

use std::{
    path::Path,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use super::{Bench, BpfStats, RUNS, attached, medians, start, stop, value};

pub(crate) const PYTHON: &str = "/usr/bin/python3";
const SCRIPT: &str = "xtask/bench/python_deep.py";
const STEPS: &str = "20000";
/// `deep`'s levels: with `<module>` and `cost`, 20 Python frames.
const LEVELS: &str = "17";
const FRAMES: usize = 20;
/// The target for the walk, µs per sampled allocation.
const TARGET_US: f64 = 1.5;

/// One run, per sampled allocation: the target's CPU ns and wall ns, and
/// the alloc program's ns per run.
#[derive(Clone, Copy)]
struct PyRun {
    cpu: f64,
    wall: f64,
    kernel: f64,
}

pub(crate) fn run(root: &Path, bench: &Bench) -> Result<()> {
    println!(
        "\n## Python: a sampled alloc under {FRAMES} Python frames ({PYTHON}, \
         PYTHONMALLOC=malloc, ALLOCPROF_RATE=1), median of {RUNS}"
    );
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for round in 0..RUNS {
        // Alternating which goes first, so neither always runs on a machine
        // warmed (or loaded) by the other.
        for python in if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        } {
            let r = deep(root, bench, python)?;
            if python { &mut on } else { &mut off }.push(r);
        }
    }
    let median = |runs: &[PyRun], pick: fn(&PyRun) -> f64| {
        medians(&runs.iter().map(|r| (pick(r), 0.0)).collect::<Vec<_>>()).0
    };
    let figures = |runs: &[PyRun]| {
        (
            median(runs, |r| r.cpu),
            median(runs, |r| r.wall),
            median(runs, |r| r.kernel),
        )
    };
    let (off_cpu, off_wall, off_kernel) = figures(&off);
    let (on_cpu, on_wall, on_kernel) = figures(&on);
    println!(
        "| walk | target CPU ns per sampled alloc | target wall ns | eBPF alloc program µs per run |"
    );
    println!("|---|---|---|---|");
    for (walk, cpu, wall, kernel) in [
        (
            "native only (`--python off`)",
            off_cpu,
            off_wall,
            off_kernel,
        ),
        (
            "native + Python (`--python on`)",
            on_cpu,
            on_wall,
            on_kernel,
        ),
    ] {
        println!("| {walk} | {cpu:.0} | {wall:.0} | {:.2} |", kernel / 1e3);
    }
    let verdict = |added: f64| {
        if added <= TARGET_US { "met" } else { "MISSED" }
    };
    for (what, unit, added) in [
        ("target CPU", "per sampled alloc", (on_cpu - off_cpu) / 1e3),
        (
            "eBPF alloc program",
            "per run",
            (on_kernel - off_kernel) / 1e3,
        ),
    ] {
        println!(
            "Python walk, {what}: {added:+.2} µs {unit} (target ≤ +{TARGET_US} µs: {})",
            verdict(added)
        );
    }
    println!(
        "(target wall time: {:+.2} µs per sampled alloc; it counts other work on the shared cores)",
        (on_wall - off_wall) / 1e3
    );
    Ok(())
}

/// One run of the script, attached with `--python on` or `off`.
fn deep(root: &Path, bench: &Bench, python: bool) -> Result<PyRun> {
    let stats = BpfStats::enable();
    let mut w = Command::new(PYTHON)
        .arg(root.join(SCRIPT))
        .args([STEPS, LEVELS])
        .env("PYTHONMALLOC", "malloc")
        .env("LD_PRELOAD", &bench.preload)
        .env("ALLOCPROF_RATE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting python3")?;
    let profiler = attached(
        Command::new(&bench.allocprof)
            .args(["--pid", &w.id().to_string(), "--duration", "600s"])
            .args(["--python", if python { "on" } else { "off" }])
            .stdout(Stdio::piped()),
    )?;
    // Its files' unwind tables and its interpreter's offsets are loaded
    // after attach.
    thread::sleep(Duration::from_secs(1));
    let out = start(&mut w)?;
    let kernel = stats
        .as_ref()
        .and_then(|s| s.alloc_program_of(profiler.id()));
    stop(&mut w)?;
    let report = super::report_of(profiler)?;
    // The run measured what it says: Python frames in the stacks with the
    // walk on, none with it off. (The script has exited when the report is
    // written: its code objects are named, or, gone before they were read,
    // shown unreadable.)
    let frames = report.contains("(python_deep.py:") || report.contains("[python code");
    if frames != python {
        bail!(
            "with --python {}, the report {} Python frames: {report}",
            if python { "on" } else { "off" },
            if frames { "has" } else { "has no" }
        );
    }
    let steps = value(&out, "steps")?;
    // Sampled allocations per step from the program's run count (the
    // bytearray and its buffer, the list's growth, and the few of the
    // script's reading and printing).
    let (per_run, runs) = kernel.context("no statistics of the alloc program (bpftool)")?;
    let per_step = runs / steps;
    if per_step < 1.0 {
        bail!("{runs} alloc program runs for {steps} steps: are its allocations sampled?");
    }
    Ok(PyRun {
        cpu: value(&out, "step_cpu_ns")? / per_step,
        wall: value(&out, "step_ns")? / per_step,
        kernel: per_run,
    })
}

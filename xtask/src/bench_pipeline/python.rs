//! `cargo xtask bench pipeline`'s Python row (issue 30; `--python` runs it
//! alone): what walking a CPython thread's frames adds to a sampled
//! allocation. Debian's `/usr/bin/python3` runs `xtask/bench/python_deep.py`
//! (bytearrays allocated under 20 Python frames: one function recursing,
//! and a function per frame, each a code object the walk prints) under
//! liballocprof.so with `PYTHONMALLOC=malloc` and `ALLOCPROF_RATE=1`,
//! attached by `allocprof --python off` and `--python on` in turn, round
//! after round, with `kernel.bpf_stats_enabled` on in both. Per sampled
//! allocation: the
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

use super::{Bench, BpfStats, attached, medians, start, stop, value};

pub(crate) const PYTHON: &str = "/usr/bin/python3";
const SCRIPT: &str = "xtask/bench/python_deep.py";
const STEPS: &str = "20000";
/// `deep`'s levels: with `<module>` and `cost`, 20 Python frames.
const LEVELS: &str = "17";
const FRAMES: usize = 20;
/// Rounds of every walk and shape: more than the other rows' runs, as the
/// figures compared differ by tenths of a µs.
const RUNS: usize = 9;
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

/// How a run is attached.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// `--python off`.
    Native,
    /// `--python on`: every frame's code object printed too.
    Python,
}

impl Walk {
    const ALL: [Walk; 2] = [Walk::Native, Walk::Python];

    fn label(self) -> &'static str {
        match self {
            Walk::Native => "native only (`--python off`)",
            Walk::Python => "native + Python (`--python on`)",
        }
    }

    fn args(self) -> &'static [&'static str] {
        match self {
            Walk::Native => &["--python", "off"],
            Walk::Python => &["--python", "on"],
        }
    }
}

/// The Python stack's shape: the same function's frames, or a function of
/// its own per frame (each its own code object to print).
#[derive(Clone, Copy)]
enum Shape {
    Recursive,
    Distinct,
}

impl Shape {
    fn arg(self) -> &'static str {
        match self {
            Shape::Recursive => "recursive",
            Shape::Distinct => "distinct",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Shape::Recursive => "one function, recursing",
            Shape::Distinct => "a function per frame",
        }
    }
}

pub(crate) fn run(root: &Path, bench: &Bench) -> Result<()> {
    println!(
        "\n## Python: a sampled alloc under {FRAMES} Python frames ({PYTHON}, \
         PYTHONMALLOC=malloc, ALLOCPROF_RATE=1), median of {RUNS}"
    );
    println!(
        "| frames | walk | target CPU ns per sampled alloc | target wall ns | eBPF alloc program µs per run |"
    );
    println!("|---|---|---|---|---|");
    let mut added = Vec::new();
    for shape in [Shape::Recursive, Shape::Distinct] {
        let mut runs: Vec<Vec<PyRun>> = vec![Vec::new(); Walk::ALL.len()];
        for round in 0..RUNS {
            // Rotating which goes first, so none always runs on a machine
            // warmed (or loaded) by the others.
            for i in 0..Walk::ALL.len() {
                let at = (i + round) % Walk::ALL.len();
                runs[at].push(deep(root, bench, Walk::ALL[at], shape)?);
            }
        }
        let median = |runs: &[PyRun], pick: fn(&PyRun) -> f64| {
            medians(&runs.iter().map(|r| (pick(r), 0.0)).collect::<Vec<_>>()).0
        };
        // Per walk: target CPU, target wall, eBPF program (ns).
        let figures: Vec<(f64, f64, f64)> = runs
            .iter()
            .map(|runs| {
                (
                    median(runs, |r| r.cpu),
                    median(runs, |r| r.wall),
                    median(runs, |r| r.kernel),
                )
            })
            .collect();
        for (walk, (cpu, wall, kernel)) in Walk::ALL.iter().zip(&figures) {
            println!(
                "| {} | {} | {cpu:.0} | {wall:.0} | {:.2} |",
                shape.label(),
                walk.label(),
                kernel / 1e3
            );
        }
        let (off_cpu, off_wall, off_kernel) = figures[0];
        for (cpu, wall, kernel) in figures.iter().skip(1) {
            added.push((shape, cpu - off_cpu, kernel - off_kernel, wall - off_wall));
        }
    }
    let verdict = |added: f64| {
        if added <= TARGET_US { "met" } else { "MISSED" }
    };
    for (shape, cpu, kernel, wall) in added {
        let name = "Python walk";
        for (what, unit, added) in [
            ("target CPU", "per sampled alloc", cpu / 1e3),
            ("eBPF alloc program", "per run", kernel / 1e3),
        ] {
            println!(
                "{name} ({}), {what}: {added:+.2} µs {unit} (target ≤ +{TARGET_US} µs: {})",
                shape.label(),
                verdict(added)
            );
        }
        println!(
            "({name} ({}), target wall time: {:+.2} µs per sampled alloc; it counts other work on the shared cores)",
            shape.label(),
            wall / 1e3
        );
    }
    Ok(())
}

/// One run of the script, its stack of `shape`, attached as `walk` says.
fn deep(root: &Path, bench: &Bench, walk: Walk, shape: Shape) -> Result<PyRun> {
    let python = walk != Walk::Native;
    let stats = BpfStats::enable();
    let mut w = Command::new(PYTHON)
        .arg(root.join(SCRIPT))
        .args([STEPS, LEVELS, shape.arg()])
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
            .args(walk.args())
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

//! `cargo xtask bench python`: what a Python user pays (issue 30).
//!
//! Debian's `/usr/bin/python3` on two scripts, `bench peers`' python3
//! workload and a small web service's request handling
//! (`xtask/bench/python_service.py`), under:
//!
//! - plain `python3` (glibc, pymalloc): the baseline;
//! - `liballocprof.so`, pymalloc on: what allocprof sees of a default
//!   interpreter (objects of 512 bytes and less come from pymalloc's arenas,
//!   which no `malloc` sampler sees);
//! - `liballocprof.so` with `PYTHONMALLOC=malloc`: every object through
//!   `malloc`, the price of seeing everything;
//! - the same with `allocprof --pid` attached, with Python frames (the
//!   default) and with `--python off` (native frames only).
//!
//! Setups are interleaved within each round; each figure is the median of
//! the per-round ratios with their min–max, of wall times and of the
//! workload's own CPU time (user and system: the uprobe handlers run on its
//! threads; less swayed by the machine's other load). The target: attached
//! with Python frames ≤ 1.03 against the same process unattached, printed
//! as a verdict per workload and measure beside the native-only row.
//!
//! Arguments: `--quick` (smaller runs, 2 rounds), `--rounds N`.

use std::path::Path;

use anyhow::{Context, Result};

use crate::bench_alloc::median;
use crate::bench_peers::{
    cell, load, machine, ratios, rounds_of,
    runner::{Runner, Setup, Tool},
    table_head,
    targets::ratio_verdict,
    workloads::{self, Invocation, Workload},
};

const PLAIN: &str = "python3 (glibc, pymalloc)";
const PYMALLOC: &str = "liballocprof.so, pymalloc on, unattached";
const MALLOC: &str = "liballocprof.so + PYTHONMALLOC=malloc, unattached";
const PY_FRAMES: &str = "liballocprof.so + PYTHONMALLOC=malloc + allocprof --pid";
const NATIVE_ONLY: &str = "liballocprof.so + PYTHONMALLOC=malloc + allocprof --pid --python off";
const PYMALLOC_ATTACHED: &str = "liballocprof.so, pymalloc on + allocprof --pid";
/// Attached with Python frames against the same process unattached.
const TARGET: f64 = 1.03;

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let rounds: usize = match args.iter().position(|a| a == "--rounds") {
        Some(i) => args
            .get(i + 1)
            .context("--rounds N")?
            .parse()
            .context("--rounds N")?,
        None if quick => 2,
        None => 5,
    };
    crate::shell::cargo(
        root,
        &[
            "build",
            "--release",
            "-p",
            "allocprof",
            "-p",
            "liballocprof",
        ],
    )?;
    let dir = workloads::dir(root)?;
    let release = dir.parent().expect("under the target dir").join("release");
    let runner = Runner {
        allocprof: release.join("allocprof"),
        dir,
    };
    let lib = release.join("liballocprof.so");
    let setups = setups(&lib);
    let (steps, requests) = if quick {
        (60_000, 10_000)
    } else {
        (300_000, 40_000)
    };
    let script = |name: &str, n: u64| Invocation {
        program: "/usr/bin/python3".into(),
        args: vec![
            root.join("xtask/bench")
                .join(name)
                .to_string_lossy()
                .into_owned(),
            n.to_string(),
        ],
        input: b"go\n".to_vec(),
    };
    let workload = |name, full: Invocation, small: Invocation| Workload {
        name,
        churn: false,
        baseline: PLAIN,
        full,
        small,
        scale: String::new(),
    };
    let chosen = [
        workload(
            "python3 script (bench peers)",
            script("peers_alloc.py", steps),
            script("peers_alloc.py", steps),
        ),
        workload(
            "web service requests",
            script("python_service.py", requests),
            script("python_service.py", requests),
        ),
    ];

    println!(
        "# cargo xtask bench python{}",
        if quick { " --quick" } else { "" }
    );
    println!();
    println!("{}", machine());
    println!("load average at the start: {}", load());
    println!("{rounds} rounds, setups interleaved in each; /usr/bin/python3");
    let mut columns = Vec::new();
    for w in &chosen {
        eprintln!("python: {}", w.name);
        columns.push(rounds_of(&runner, w, &w.full, &setups, rounds)?);
    }
    println!("load average at the end: {}", load());
    println!();
    let baselines: Vec<f64> = columns.iter().map(|t| median(&t.wall[0])).collect();
    table_head(&chosen.iter().collect::<Vec<_>>(), &baselines);
    for (i, s) in setups.iter().enumerate().skip(1) {
        print!("| {} |", s.name);
        for times in &columns {
            print!(" {} |", cell(&ratios(&times.wall[i], &times.wall[0])));
        }
        println!();
    }
    println!();
    let index = |name| setups.iter().position(|s| s.name == name).expect("a setup");
    for (over, under) in [
        (MALLOC, PYMALLOC),
        (PY_FRAMES, MALLOC),
        (NATIVE_ONLY, MALLOC),
        (PY_FRAMES, NATIVE_ONLY),
        (PYMALLOC_ATTACHED, PYMALLOC),
    ] {
        let (a, b) = (index(over), index(under));
        let cells: Vec<String> = chosen
            .iter()
            .zip(&columns)
            .map(|(w, t)| format!("{} {}", w.name, cell(&ratios(&t.wall[a], &t.wall[b]))))
            .collect();
        println!("- {over} / {under}: {}", cells.join("; "));
    }
    println!();
    // The workloads' own CPU time (user and system, uprobe handlers
    // included), the same ratios: on a loaded machine, wall time measures
    // the neighbours as much as the setup.
    println!("The workload's own CPU time (user + system), median (min–max) over the rounds:");
    println!();
    let cpu_baselines: Vec<f64> = columns.iter().map(|t| median(&t.workload_cpu[0])).collect();
    print!("| setup |");
    for w in &chosen {
        print!(" {} |", w.name);
    }
    println!();
    println!("|---|{}", "---|".repeat(chosen.len()));
    print!("| baseline: CPU time, median |");
    for (w, secs) in chosen.iter().zip(&cpu_baselines) {
        print!(" {} {secs:.2} s |", w.baseline);
    }
    println!();
    for (i, s) in setups.iter().enumerate().skip(1) {
        print!("| {} |", s.name);
        for times in &columns {
            print!(
                " {} |",
                cell(&ratios(&times.workload_cpu[i], &times.workload_cpu[0]))
            );
        }
        println!();
    }
    println!();
    // The target, per workload and measure: the median of the
    // per-round ratios with their min–max, and the native-only attached row
    // beside it (what the Python walk adds is the difference).
    for (w, t) in chosen.iter().zip(&columns) {
        for (measure, times) in [("wall time", &t.wall), ("CPU time", &t.workload_cpu)] {
            let unattached = &times[index(MALLOC)];
            let python = ratios(&times[index(PY_FRAMES)], unattached);
            let native = ratios(&times[index(NATIVE_ONLY)], unattached);
            let m = median(&python);
            println!(
                "- {}, {measure}: attached with Python frames / unattached {}: target ≤ {TARGET} {}{}; \
                 attached with native frames only / unattached {}",
                w.name,
                cell(&python),
                ratio_verdict(m, TARGET),
                spread_note(&python, TARGET),
                cell(&native),
            );
        }
    }
    Ok(())
}

/// When the rounds fall on both sides of `target`, the median's verdict is
/// the noise's as much as the tool's: say so.
fn spread_note(r: &[f64], target: f64) -> &'static str {
    let below = r.iter().any(|&x| x <= target);
    let above = r.iter().any(|&x| x > target);
    if below && above {
        " (the rounds fall on both sides of the target)"
    } else {
        ""
    }
}

fn setups(lib: &Path) -> Vec<Setup> {
    let setup = |name, preload: bool, malloc: bool, tool| Setup {
        name,
        preload: preload.then(|| lib.to_path_buf()),
        env: if malloc {
            vec![("PYTHONMALLOC", "malloc".to_string())]
        } else {
            Vec::new()
        },
        tool,
        churn_only: false,
    };
    vec![
        setup(PLAIN, false, false, Tool::None),
        setup(PYMALLOC, true, false, Tool::None),
        setup(MALLOC, true, true, Tool::None),
        setup(PY_FRAMES, true, true, Tool::AllocprofPid(&[])),
        setup(
            NATIVE_ONLY,
            true,
            true,
            Tool::AllocprofPid(&["--python", "off"]),
        ),
        setup(PYMALLOC_ATTACHED, true, false, Tool::AllocprofPid(&[])),
    ]
}

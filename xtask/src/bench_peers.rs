//! `cargo xtask bench peers`: the same workloads under glibc, the allocators
//! people preload instead (mimalloc, jemalloc, jemalloc and tcmalloc with
//! heap-profile sampling), the heap profilers that intercept every malloc and
//! free (heaptrack, memleak-style bpftrace uprobes), and allocprof: its
//! `liballocprof.so` at the default rate alone, with `allocprof --pid`
//! attached, and with a system-wide `allocprof` attached.
//!
//! Each setup's figure is its wall time over the baseline's (glibc, the
//! programs' normal allocator) in the same round; setups are interleaved
//! within each round, and the median ratio over the rounds is reported with
//! its min–max. heaptrack and bpftrace cost hundreds of times the baseline,
//! so they run on scaled-down sizes of the same workloads, against the
//! baseline at that size in their own rounds.
//! Arguments: `--quick` (smaller workloads, 2 rounds), `--rounds N`,
//! `--only TEXT` (the workloads whose name contains TEXT).

mod runner;
mod workloads;

use std::{path::Path, process::Command};

use anyhow::{Context, Result, bail};

use runner::{Runner, Setup, Tool};

use crate::bench_alloc::median;
use workloads::Workload;

const MIMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2";
const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
const TCMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4";

/// The allocprof row the ≤ 1.02 target applies to.
const TARGET_ROW: &str = "liballocprof.so + allocprof --pid";
const TARGET: f64 = 1.02;

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let rounds: usize = match arg("--rounds") {
        Some(n) => n.parse().context("--rounds N")?,
        None if quick => 2,
        None => 5,
    };
    let slow_rounds = rounds.min(3);
    let only = arg("--only");

    shell_build(root)?;
    let dir = workloads::dir(root)?;
    let release = dir.parent().expect("under the target dir").join("release");
    let lib = release.join("liballocprof.so");
    let runner = Runner {
        allocprof: release.join("allocprof"),
        dir: dir.clone(),
    };
    let setups = setups(&lib);
    let slow_setups = slow_setups();
    let all = workloads::all(root, &dir, quick)?;
    let chosen: Vec<&Workload> = all
        .iter()
        .filter(|w| only.is_none_or(|o| w.name.contains(o.as_str())))
        .collect();
    if chosen.is_empty() {
        bail!("no workload's name contains {only:?}");
    }

    println!(
        "# cargo xtask bench peers{}",
        if quick { " --quick" } else { "" }
    );
    println!();
    println!("{}", machine());
    println!("load average at the start: {}", load());
    println!("{rounds} rounds (heaptrack and bpftrace: {slow_rounds}), setups interleaved in each");

    let mut columns = Vec::new();
    for w in &chosen {
        eprintln!("peers: {}", w.name);
        let fast = rounds_of(&runner, &w.full, &setups, rounds, w.name)?;
        let slow = rounds_of(&runner, &w.small, &slow_setups, slow_rounds, w.name)?;
        columns.push((fast, slow));
    }
    println!("load average at the end: {}", load());
    println!();

    // The table: a row per setup, a column per workload; each cell is the
    // median ratio to the baseline and its min–max over the rounds.
    print!("| setup |");
    for w in &chosen {
        print!(" {} |", w.name);
    }
    println!();
    println!("|---|{}", "---|".repeat(chosen.len()));
    print!("| baseline: wall time, median |");
    for (w, (fast, _)) in chosen.iter().zip(&columns) {
        print!(" {} {:.2} s |", w.baseline, median(&fast.wall[0]));
    }
    println!();
    for (i, s) in setups.iter().enumerate().skip(1) {
        print!("| {} |", s.name);
        for (fast, _) in &columns {
            print!(" {} |", cell(&ratios(&fast.wall[i], &fast.wall[0])));
        }
        println!();
    }
    for (i, s) in slow_setups.iter().enumerate().skip(1) {
        print!("| {} |", s.name);
        for (w, (_, slow)) in chosen.iter().zip(&columns) {
            print!(
                " {} (at {} size, baseline {:.2} s) |",
                cell(&ratios(&slow.wall[i], &slow.wall[0])),
                w.scale,
                median(&slow.wall[0])
            );
        }
        println!();
    }
    println!();
    println!("allocprof's own CPU while the workload ran, median (user + system, 10 ms ticks):");
    println!();
    for (i, s) in setups.iter().enumerate() {
        if columns
            .iter()
            .all(|(fast, _)| fast.allocprof_cpu[i].is_empty())
        {
            continue;
        }
        let cells: Vec<String> = chosen
            .iter()
            .zip(&columns)
            .map(|(w, (fast, _))| format!("{} {:.2} s", w.name, median(&fast.allocprof_cpu[i])))
            .collect();
        println!("- {}: {}", s.name, cells.join(", "));
    }
    println!();
    let row = setups
        .iter()
        .position(|s| s.name == TARGET_ROW)
        .expect("the target row");
    for (w, (fast, _)) in chosen.iter().zip(&columns) {
        let m = median(&ratios(&fast.wall[row], &fast.wall[0]));
        println!(
            "- {}: {TARGET_ROW} {m:.3} against {}: target ≤ {TARGET} {}",
            w.name,
            w.baseline,
            if m <= TARGET {
                "met".to_string()
            } else {
                format!("missed by {:.1}%", (m - TARGET) * 100.0)
            }
        );
    }
    Ok(())
}

fn shell_build(root: &Path) -> Result<()> {
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
    )
}

fn setups(lib: &Path) -> Vec<Setup> {
    let setup = |name, preload: Option<&str>, env: &[(&'static str, &'static str)], tool| Setup {
        name,
        preload: preload.map(Into::into),
        env: env.to_vec(),
        tool,
    };
    let lib = lib.to_str().expect("a UTF-8 target path");
    vec![
        setup("glibc", None, &[], Tool::None),
        setup("mimalloc (Debian 2.0)", Some(MIMALLOC), &[], Tool::None),
        setup("jemalloc", Some(JEMALLOC), &[], Tool::None),
        setup(
            "jemalloc `prof:true,lg_prof_sample:19`",
            Some(JEMALLOC),
            &[("MALLOC_CONF", "prof:true,lg_prof_sample:19")],
            Tool::None,
        ),
        setup(
            "tcmalloc, 512 KiB sampling",
            Some(TCMALLOC),
            &[("TCMALLOC_SAMPLE_PARAMETER", "524288")],
            Tool::None,
        ),
        setup("liballocprof.so, unattached", Some(lib), &[], Tool::None),
        setup(TARGET_ROW, Some(lib), &[], Tool::AllocprofPid),
        setup(
            "liballocprof.so + allocprof system-wide",
            Some(lib),
            &[],
            Tool::AllocprofAll,
        ),
    ]
}

/// The tools that see every malloc and free, after their baseline.
fn slow_setups() -> Vec<Setup> {
    let setup = |name, tool| Setup {
        name,
        preload: None,
        env: Vec::new(),
        tool,
    };
    let v = vec![
        setup("glibc", Tool::None),
        setup("heaptrack", Tool::Heaptrack),
        setup("bpftrace uprobes, memleak-style", Tool::Bpftrace),
    ];
    debug_assert!(v.iter().skip(1).all(Setup::slow));
    v
}

/// Per setup, over `rounds` rounds of every setup in turn: the wall times
/// and allocprof's CPU seconds in each (when it ran).
struct Times {
    wall: Vec<Vec<f64>>,
    allocprof_cpu: Vec<Vec<f64>>,
}

fn rounds_of(
    runner: &Runner,
    inv: &workloads::Invocation,
    setups: &[Setup],
    rounds: usize,
    name: &str,
) -> Result<Times> {
    let mut times = Times {
        wall: vec![Vec::new(); setups.len()],
        allocprof_cpu: vec![Vec::new(); setups.len()],
    };
    for round in 0..rounds {
        for (i, s) in setups.iter().enumerate() {
            let (secs, cpu) = runner
                .once(inv, s)
                .with_context(|| format!("{name} under {}", s.name))?;
            eprintln!(
                "peers: {name}, round {}, {}: {secs:.3} s",
                round + 1,
                s.name
            );
            times.wall[i].push(secs);
            times.allocprof_cpu[i].extend(cpu);
        }
    }
    Ok(times)
}

/// A setup's time over the baseline's, round by round.
fn ratios(times: &[f64], base: &[f64]) -> Vec<f64> {
    times.iter().zip(base).map(|(t, b)| t / b).collect()
}

/// `median (min–max)`, with as many digits as the size of the ratio needs.
fn cell(r: &[f64]) -> String {
    let (lo, hi) = r.iter().fold((f64::INFINITY, 0.0_f64), |(lo, hi), &x| {
        (lo.min(x), hi.max(x))
    });
    let m = median(r);
    if m >= 20.0 {
        format!("{m:.0}× ({lo:.0}–{hi:.0})")
    } else {
        format!("{m:.3} ({lo:.3}–{hi:.3})")
    }
}

/// CPU, cores, kernel and date, for the table's heading.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let output = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    format!(
        "machine: {model}, {cores} cores, Linux {}; {}",
        output("uname", &["-r"]),
        output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
    )
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

//! `cargo xtask bench peers`: the same workloads under glibc, the allocators
//! people preload instead (mimalloc, jemalloc, jemalloc and tcmalloc with
//! heap-profile sampling), the heap profilers that intercept every malloc and
//! free (heaptrack, memleak-style bpftrace uprobes), and allocprof: its
//! `liballocprof.so` at the default rate alone, with `allocprof --pid`
//! attached, and with a system-wide `allocprof` attached; next to them
//! liballocprof's own backends (the vendored mimalloc built as a plain
//! override library, as `bench alloc` builds it, and `liballocprof_glibc.so`
//! unattached), and, on the churns only, `liballocprof.so` at an
//! `ALLOCPROF_RATE` at which the 2-thread churn makes ≈ 45k sampled events/s
//! alone and with `allocprof --pid`. That rate depends on the machine's
//! speed (`bench pipeline --churn`'s 6m made ≈ 40k events/s on one 2-vCPU VM
//! and ≈ 15k on another), so it is calibrated first: the churn's events/s at
//! the default rate, from three runs unattached (the median wall time) and
//! one with `allocprof --pid` (the events, from its JSON report), scaled.
//!
//! Each setup's figure is its wall time over the baseline's (glibc, the
//! programs' normal allocator) in the same round; setups are interleaved
//! within each round, and the median ratio over the rounds is reported with
//! its min–max. heaptrack and bpftrace cost hundreds of times the baseline,
//! so they run on scaled-down sizes of the same workloads, against the
//! baseline at that size in their own rounds.
//!
//! Then, so that one run gives every issue-12 target a verdict (the table
//! "Issue-12 targets" at the end):
//!
//! - the fast path: `bench alloc`'s per-operation section at the default
//!   rate only (each library and `SamplingAllocator<System>` against its
//!   plain backend, in fewer rounds), target ≤ 1.02, with each one's
//!   instructions per malloc/free pair under callgrind;
//! - the attached cost per sampled alloc and free: `bench pipeline`'s cost
//!   loop in one thread and in two at once, targets ≤ 2 µs and ≤ 0.8 µs;
//! - from the table above: attached / unattached wall time on the 2-thread
//!   churn, per round, at the default rate and at the calibrated one, with
//!   the sampled events/s (allocprof's JSON report), target ≤ 1.10 at ≥ 40k
//!   events/s; and the real programs with `allocprof --pid` against their
//!   normal allocator, target ≤ 1.02.
//!
//! Arguments: `--quick` (smaller workloads, 2 rounds; the fast path in 3
//! rounds of 300k pairs), `--rounds N`, `--only TEXT` (the workloads whose
//! name contains TEXT, and neither the fast-path nor the cost section).

pub(crate) mod runner;
pub(crate) mod targets;
pub(crate) mod workloads;

use std::{path::Path, process::Command};

use anyhow::{Context, Result, bail};

use runner::{Runner, Setup, Tool};
use targets::{Measured, Pair, print_targets, ratio_verdict};

use crate::{
    bench_alloc::{self, DEFAULT_RATE, Group, PER_OPERATION_HEAD, Programs, median},
    bench_pipeline::{self, SampledCost},
};
use workloads::Workload;

const MIMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2";
const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
const TCMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4";

/// The allocprof row the ≤ 1.02 target applies to.
const TARGET_ROW: &str = "liballocprof.so + allocprof --pid";
const TARGET: f64 = 1.02;
const UNATTACHED: &str = "liballocprof.so, unattached";
/// Sampled events/s the churn-only setups' `ALLOCPROF_RATE` aims at on the
/// 2-thread churn: the ≤ 1.10 attached/unattached target is for at least
/// 40k; the margin covers the spread of the runs.
const LOW_AIM: f64 = 45e3;
const LOW_UNATTACHED: &str = "liballocprof.so, ALLOCPROF_RATE for ≈ 45k events/s, unattached";
const LOW_ATTACHED: &str = "liballocprof.so, ALLOCPROF_RATE for ≈ 45k events/s + allocprof --pid";
/// The (unattached, attached) setups whose per-round ratio is reported.
const PAIRS: [(&str, &str); 2] = [(UNATTACHED, TARGET_ROW), (LOW_UNATTACHED, LOW_ATTACHED)];

/// The fast-path section's (pairs per run, rounds): fewer rounds than
/// `bench alloc`'s 21, at one rate, ≈ 1–2 minutes.
const FAST_PATH: (&str, usize) = ("5000000", 15);
const FAST_PATH_QUICK: (&str, usize) = ("300000", 3);

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

    crate::shell::cargo(root, &["build", "--release", "-p", "allocprof"])?;
    // The preload libraries, the plain vendored mimalloc and the fast path's
    // programs.
    let programs = Programs::build(root)?;
    let dir = workloads::dir(root)?;
    let release = dir.parent().expect("under the target dir").join("release");
    let runner = Runner {
        allocprof: release.join("allocprof"),
        dir: dir.clone(),
    };
    let mut setups = setups(&programs);
    let slow_setups = slow_setups();
    let all = workloads::all(root, &dir, quick)?;
    let chosen: Vec<&Workload> = all
        .iter()
        .filter(|w| only.is_none_or(|o| w.name.contains(o.as_str())))
        .collect();
    if chosen.is_empty() {
        bail!("no workload's name contains {only:?}");
    }
    let index = |setups: &[Setup], name: &str| {
        setups
            .iter()
            .position(|s| s.name == name)
            .expect("a setup of that name")
    };
    // The churn-only setups' rate, when they run.
    let mut low_rate = None;
    if chosen.iter().any(|w| w.churn) {
        let churn = all
            .iter()
            .find(|w| w.name == workloads::CHURN_2T)
            .expect("the 2-thread churn");
        let calibration = [UNATTACHED, TARGET_ROW].map(|name| &setups[index(&setups, name)]);
        let (rate, default_eps) = calibrate(&runner, &churn.full, calibration)?;
        for s in setups.iter_mut().filter(|s| s.churn_only) {
            s.env.push(("ALLOCPROF_RATE", rate.clone()));
        }
        low_rate = Some((rate, default_eps));
    }

    println!(
        "# cargo xtask bench peers{}",
        if quick { " --quick" } else { "" }
    );
    println!();
    println!("{}", machine());
    println!("load average at the start: {}", load());
    println!("{rounds} rounds (heaptrack and bpftrace: {slow_rounds}), setups interleaved in each");
    if let Some((rate, default_eps)) = &low_rate {
        println!(
            "ALLOCPROF_RATE for ≈ {:.0}k sampled events/s on the 2-thread churn: {rate} \
             (calibration: the default rate made {:.0}k events/s)",
            LOW_AIM / 1e3,
            default_eps / 1e3
        );
    }

    let mut columns = Vec::new();
    for w in &chosen {
        eprintln!("peers: {}", w.name);
        let fast = rounds_of(&runner, w, &w.full, &setups, rounds)?;
        let slow = rounds_of(&runner, w, &w.small, &slow_setups, slow_rounds)?;
        columns.push((fast, slow));
    }
    println!("load average at the end: {}", load());
    println!();

    // The table: a row per setup, a column per workload; each cell is the
    // median ratio to the baseline and its min–max over the rounds.
    let baselines: Vec<f64> = columns.iter().map(|(f, _)| median(&f.wall[0])).collect();
    table_head(&chosen, &baselines);
    for (i, s) in setups.iter().enumerate().skip(1) {
        print!("| {} |", s.name);
        for (fast, _) in &columns {
            if fast.wall[i].is_empty() {
                print!(" – |");
            } else {
                print!(" {} |", cell(&ratios(&fast.wall[i], &fast.wall[0])));
            }
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
            .filter(|(_, (fast, _))| !fast.allocprof_cpu[i].is_empty())
            .map(|(w, (fast, _))| format!("{} {:.2} s", w.name, median(&fast.allocprof_cpu[i])))
            .collect();
        println!("- {}: {}", s.name, cells.join(", "));
    }
    println!();
    println!(
        "attached / unattached wall time, per round (median, min–max), and sampled events/s \
         (allocprof --pid's JSON report: allocations + frees, over the unattached median wall time):"
    );
    println!();
    let mut pairs = Vec::new();
    for (unattached, attached) in PAIRS {
        let (u, a) = (index(&setups, unattached), index(&setups, attached));
        let rate = match &low_rate {
            Some((rate, _)) if attached == LOW_ATTACHED => format!("ALLOCPROF_RATE={rate}"),
            _ => "the default rate".to_string(),
        };
        let mut cells = Vec::new();
        for (w, (fast, _)) in chosen.iter().zip(&columns) {
            if fast.wall[a].is_empty() {
                continue;
            }
            let pair = Pair {
                rate: rate.clone(),
                ratios: ratios(&fast.wall[a], &fast.wall[u]),
                events_per_sec: median(&fast.events[a]) / median(&fast.wall[u]),
            };
            cells.push(format!(
                "{} {}, {:.1}k events/s",
                w.name,
                cell(&pair.ratios),
                pair.events_per_sec / 1e3
            ));
            pairs.push((*w, pair));
        }
        if !cells.is_empty() {
            println!("- {attached}: {}", cells.join("; "));
        }
    }
    println!();
    let row = index(&setups, TARGET_ROW);
    let mut programs_rows = Vec::new();
    for (w, (fast, _)) in chosen.iter().zip(&columns) {
        let r = ratios(&fast.wall[row], &fast.wall[0]);
        let m = median(&r);
        println!(
            "- {}: {TARGET_ROW} {m:.3} against {}: target ≤ {TARGET} {}",
            w.name,
            w.baseline,
            ratio_verdict(m, TARGET)
        );
        programs_rows.push((*w, r));
    }
    println!();

    let (fast_path, instructions, costs) = match only {
        Some(_) => (Vec::new(), Vec::new(), Vec::new()),
        None => {
            let groups = fast_path(&programs, quick)?;
            eprintln!("peers: the fast path's instructions (callgrind)");
            let instructions = bench_alloc::instructions(&programs, quick)?;
            bench_alloc::print_instructions(&instructions);
            println!();
            (groups, instructions, sampled_costs(root)?)
        }
    };
    print_targets(&Measured {
        fast_path: &fast_path,
        instructions: &instructions,
        costs: &costs,
        pairs: &pairs,
        programs: &programs_rows,
    });
    Ok(())
}

/// The `ALLOCPROF_RATE` (in KiB) at which `churn` makes ≈ `LOW_AIM`
/// sampled events/s, and its events/s at the default rate: the median wall
/// time of 3 runs under `unattached`, the events of one under `attached`
/// (their number does not depend on the time they take), scaled.
fn calibrate(
    runner: &Runner,
    churn: &workloads::Invocation,
    [unattached, attached]: [&Setup; 2],
) -> Result<(String, f64)> {
    eprintln!(
        "peers: calibrating the rate for ≈ {:.0}k events/s",
        LOW_AIM / 1e3
    );
    // The default rate's events/s without the allocator's default budget
    // (which an explicit ALLOCPROF_RATE turns off, as in the setups this
    // calibrates): what scales with the rate.
    let unbudgeted = |s: &Setup| {
        let mut s = s.clone();
        s.env.push(("ALLOCPROF_MAX_EVENT_RATE", "0".into()));
        s
    };
    let (unattached, attached) = (&unbudgeted(unattached), &unbudgeted(attached));
    let walls = (0..3)
        .map(|_| Ok(runner.once(churn, unattached)?.secs))
        .collect::<Result<Vec<f64>>>()?;
    let wall = median(&walls);
    let events = runner
        .once(churn, attached)?
        .events
        .context("no events from allocprof")?;
    let default_eps = events as f64 / wall;
    let default_rate: f64 = DEFAULT_RATE.1.parse()?;
    let kib = (default_rate * default_eps / LOW_AIM / 1024.0)
        .round()
        .max(1.0);
    Ok((format!("{kib:.0}k"), default_eps))
}

/// The fast-path target's figures: `bench alloc`'s per-operation section
/// at the default rate alone.
fn fast_path(programs: &Programs, quick: bool) -> Result<Vec<Group>> {
    let (iters, rounds) = if quick { FAST_PATH_QUICK } else { FAST_PATH };
    eprintln!("peers: the fast path ({rounds} rounds of {iters} pairs)");
    println!(
        "## Fast path: ratio to the plain backend at the default rate \
         (`bench alloc`'s per-operation section: median of {rounds} interleaved rounds, \
         min-max of the per-round ratios; {iters} pairs per run)"
    );
    println!();
    println!("Plain mimalloc reference: {}", programs.plain_cmd);
    println!("load average at the start: {}", load());
    println!();
    println!("{PER_OPERATION_HEAD}");
    let rates = [DEFAULT_RATE];
    let pairs: f64 = iters.parse()?;
    let groups =
        bench_alloc::per_operation(programs, &rates, iters, rounds, |g| g.print(&rates, pairs))?;
    println!();
    println!("load average at the end: {}", load());
    println!();
    Ok(groups)
}

/// The attached-cost targets' figures: `bench pipeline`'s cost loop in one
/// thread and in two at once, every allocation sampled.
fn sampled_costs(root: &Path) -> Result<Vec<(&'static str, SampledCost)>> {
    eprintln!("peers: the sampled alloc/free cost");
    let bench = bench_pipeline::Bench::new(root)?;
    let mut costs = Vec::new();
    for (threads, mode) in bench_pipeline::COST_LOOPS {
        costs.push((
            threads,
            bench_pipeline::sampled_cost(&bench, threads, mode)?,
        ));
    }
    println!("load average at the end: {}", load());
    println!();
    Ok(costs)
}

fn setups(programs: &Programs) -> Vec<Setup> {
    let setup = |name, preload: Option<&Path>, env: &[(&'static str, &str)], tool| Setup {
        name,
        preload: preload.map(Into::into),
        env: env.iter().map(|&(k, v)| (k, v.to_string())).collect(),
        tool,
        churn_only: false,
    };
    let lib = Some(programs.lib_mi.as_path());
    vec![
        setup("glibc", None, &[], Tool::None),
        setup(
            "mimalloc (Debian 2.0)",
            Some(Path::new(MIMALLOC)),
            &[],
            Tool::None,
        ),
        setup(
            "mimalloc (plain, vendored 2.3: liballocprof.so's backend)",
            Some(&programs.plain_mi),
            &[],
            Tool::None,
        ),
        setup("jemalloc", Some(Path::new(JEMALLOC)), &[], Tool::None),
        setup(
            "jemalloc `prof:true,lg_prof_sample:19`",
            Some(Path::new(JEMALLOC)),
            &[("MALLOC_CONF", "prof:true,lg_prof_sample:19")],
            Tool::None,
        ),
        setup(
            "tcmalloc, 512 KiB sampling",
            Some(Path::new(TCMALLOC)),
            &[("TCMALLOC_SAMPLE_PARAMETER", "524288")],
            Tool::None,
        ),
        setup(UNATTACHED, lib, &[], Tool::None),
        setup(
            "liballocprof_glibc.so, unattached",
            Some(&programs.lib_gl),
            &[],
            Tool::None,
        ),
        setup(TARGET_ROW, lib, &[], Tool::AllocprofPid(&[])),
        setup(
            "liballocprof.so + allocprof system-wide",
            lib,
            &[],
            Tool::AllocprofAll,
        ),
        // Their ALLOCPROF_RATE is calibrated (`calibrate`).
        Setup {
            churn_only: true,
            ..setup(LOW_UNATTACHED, lib, &[], Tool::None)
        },
        Setup {
            churn_only: true,
            ..setup(LOW_ATTACHED, lib, &[], Tool::AllocprofPid(&[]))
        },
    ]
}

/// The tools that see every malloc and free, after their baseline.
fn slow_setups() -> Vec<Setup> {
    let setup = |name, tool| Setup {
        name,
        preload: None,
        env: Vec::new(),
        tool,
        churn_only: false,
    };
    let v = vec![
        setup("glibc", Tool::None),
        setup("heaptrack", Tool::Heaptrack),
        setup("bpftrace uprobes, memleak-style", Tool::Bpftrace),
    ];
    debug_assert!(v.iter().skip(1).all(Setup::slow));
    v
}

/// Per setup, over `rounds` rounds of every setup in turn: the wall times,
/// allocprof's CPU seconds (when it ran) and the sampled events allocprof
/// `--pid` saw in each (none for a setup not run on the workload).
pub(crate) struct Times {
    pub(crate) wall: Vec<Vec<f64>>,
    /// The workload's own CPU seconds, where measured.
    pub(crate) workload_cpu: Vec<Vec<f64>>,
    allocprof_cpu: Vec<Vec<f64>>,
    events: Vec<Vec<f64>>,
}

pub(crate) fn rounds_of(
    runner: &Runner,
    w: &Workload,
    inv: &workloads::Invocation,
    setups: &[Setup],
    rounds: usize,
) -> Result<Times> {
    let name = w.name;
    let mut times = Times {
        wall: vec![Vec::new(); setups.len()],
        workload_cpu: vec![Vec::new(); setups.len()],
        allocprof_cpu: vec![Vec::new(); setups.len()],
        events: vec![Vec::new(); setups.len()],
    };
    for round in 0..rounds {
        for (i, s) in setups.iter().enumerate() {
            if s.churn_only && !w.churn {
                continue;
            }
            let run = runner
                .once(inv, s)
                .with_context(|| format!("{name} under {}", s.name))?;
            let own = run
                .workload_cpu
                .map(|c| format!(" (its CPU {c:.3} s)"))
                .unwrap_or_default();
            eprintln!(
                "peers: {name}, round {}, {}: {:.3} s{own}",
                round + 1,
                s.name,
                run.secs
            );
            times.wall[i].push(run.secs);
            times.workload_cpu[i].extend(run.workload_cpu);
            times.allocprof_cpu[i].extend(run.cpu);
            times.events[i].extend(run.events.map(|e| e as f64));
        }
    }
    Ok(times)
}

/// The table's head: a column per workload, and the baselines' median wall
/// times.
pub(crate) fn table_head(workloads: &[&Workload], baselines: &[f64]) {
    print!("| setup |");
    for w in workloads {
        print!(" {} |", w.name);
    }
    println!();
    println!("|---|{}", "---|".repeat(workloads.len()));
    print!("| baseline: wall time, median |");
    for (w, secs) in workloads.iter().zip(baselines) {
        print!(" {} {secs:.2} s |", w.baseline);
    }
    println!();
}

/// A setup's time over the baseline's, round by round.
pub(crate) fn ratios(times: &[f64], base: &[f64]) -> Vec<f64> {
    times.iter().zip(base).map(|(t, b)| t / b).collect()
}

/// `median (min–max)`, with as many digits as the size of the ratio needs.
pub(crate) fn cell(r: &[f64]) -> String {
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
pub(crate) fn machine() -> String {
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

pub(crate) fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

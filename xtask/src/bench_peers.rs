//! `cargo xtask bench peers`: the same workloads under glibc, the allocators
//! people preload instead (mimalloc, jemalloc, jemalloc and tcmalloc with
//! heap-profile sampling), the heap profilers that intercept every malloc and
//! free (heaptrack, memleak-style bpftrace uprobes), and allocprof: its
//! `liballocprof.so` at the default settings alone, with `allocprof --pid`
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
//! Then, so that one run gives every issue-31 target a verdict (the table
//! "Issue-31 targets" at the end, `bench_peers/targets.rs`; the sections in
//! `bench_peers/sections.rs`):
//!
//! 1. the fast path: `bench alloc`'s per-operation section at the default
//!    settings only (each library and `SamplingAllocator<System>` against
//!    its plain backend, in fewer rounds), target ≤ 1.02, with each one's
//!    instructions per malloc/free pair under callgrind;
//! 2. big blocks: `bench alloc`'s 1–64 MiB malloc/memset/free loop, each
//!    library against its plain backend, target ≤ 1.05;
//! 3. from the table above: `allocprof --pid` over unattached, both at the
//!    default settings, on every workload, with the sampled events/s
//!    (allocprof's JSON report), target ≤ 1.05; and the attached cost per
//!    sampled alloc and free: `bench pipeline`'s cost loop in one thread and
//!    in two at once, targets ≤ 1 µs and ≤ 0.3 µs;
//! 4. from the table: the real programs with `allocprof --pid` against
//!    their usual allocator, target ≤ 1.02;
//! 5. from the table: `liballocprof.so` with `allocprof --pid` faster than
//!    jemalloc's and tcmalloc's heap-profile sampling on every workload.
//!
//! The default settings' setups set no `ALLOCPROF_RATE` (a test checks it):
//! the library's defaults, a default sample budget included, are what
//! they measure.
//!
//! Arguments: `--quick` (smaller workloads, 2 rounds; the fast path in 3
//! rounds of 300k pairs), `--rounds N`, `--only TEXT` (the workloads and
//! sections whose name contains TEXT: e.g. `sqlite`, or one of the
//! sections `fast path`, `instructions`, `big blocks`, `sampled cost`;
//! the closing table says "not run" for the rest).

pub(crate) mod runner;
pub(crate) mod sections;
pub(crate) mod targets;
pub(crate) mod workloads;

use std::{path::Path, process::Command};

use anyhow::{Context, Result, bail};

use runner::{Runner, Setup, Tool};
use sections::section;
use targets::{Measured, Pair, SAMPLERS, WorkloadFigures, print_targets};

use crate::bench_alloc::{DEFAULT_RATE_BYTES, Programs, median};
use workloads::Workload;

const MIMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2";
const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
const TCMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4";

/// The allocprof row the real-program and sampler targets apply to.
const TARGET_ROW: &str = "liballocprof.so + allocprof --pid";
const UNATTACHED: &str = "liballocprof.so, unattached";
/// Sampled events/s the churn-only setups' `ALLOCPROF_RATE` aims at on the
/// 2-thread churn (issue 12's ≤ 1.10 attached/unattached target was for at
/// least 40k; the margin covers the spread of the runs).
const LOW_AIM: f64 = 45e3;
const LOW_UNATTACHED: &str = "liballocprof.so, ALLOCPROF_RATE for ≈ 45k events/s, unattached";
const LOW_ATTACHED: &str = "liballocprof.so, ALLOCPROF_RATE for ≈ 45k events/s + allocprof --pid";
/// The (unattached, attached) setups whose per-round ratio is reported.
const PAIRS: [(&str, &str); 2] = [(UNATTACHED, TARGET_ROW), (LOW_UNATTACHED, LOW_ATTACHED)];

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
    let only = arg("--only").map(String::as_str);

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
    let mut setups = setups(&programs.lib_mi, &programs.lib_gl, &programs.plain_mi);
    let slow_setups = slow_setups();
    let all = workloads::all(root, &dir, quick)?;
    let chosen: Vec<&Workload> = all
        .iter()
        .filter(|w| only.is_none_or(|o| w.name.contains(o)))
        .collect();
    if chosen.is_empty() && only.is_some_and(|o| !sections::ALL.iter().any(|s| s.contains(o))) {
        bail!("no workload's or section's name contains {only:?}");
    }
    // The churn-only setups' rate, when they run.
    let mut low_rate = None;
    if chosen.iter().any(|w| w.churn) {
        let churn = all
            .iter()
            .find(|w| w.name == workloads::CHURN_2T)
            .expect("the 2-thread churn");
        let (rate, default_eps) = calibrate(&runner, &churn.full, &programs.lib_mi)?;
        for s in setups.iter_mut().filter(|s| s.churn_only) {
            s.env.push(("ALLOCPROF_RATE", rate.clone()));
        }
        low_rate = Some((rate, default_eps));
    }

    println!(
        "# cargo xtask bench peers{}{}",
        if quick { " --quick" } else { "" },
        only.map(|o| format!(" --only {o}")).unwrap_or_default()
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
    if !chosen.is_empty() {
        print_workloads(&chosen, &columns, &setups, &slow_setups, &low_rate);
    }

    let index = |name: &str| {
        setups
            .iter()
            .position(|s| s.name == name)
            .expect("a setup of that name")
    };
    let (unattached, ours) = (index(UNATTACHED), index(TARGET_ROW));
    let samplers = SAMPLERS.map(index);
    let figures: Vec<(&Workload, sections::Section<WorkloadFigures>)> = all
        .iter()
        .map(|w| {
            let Some(i) = chosen.iter().position(|c| c.name == w.name) else {
                let o = only.unwrap_or_default();
                return (w, Err(format!("`--only {o}` left it out")));
            };
            let fast = &columns[i].0;
            let base = &fast.wall[0];
            (
                w,
                Ok(WorkloadFigures {
                    attached: Pair {
                        ratios: ratios(&fast.wall[ours], &fast.wall[unattached]),
                        events_per_sec: median(&fast.events[ours]) / median(&fast.wall[unattached]),
                    },
                    ours: ratios(&fast.wall[ours], base),
                    samplers: samplers.map(|s| ratios(&fast.wall[s], base)),
                }),
            )
        })
        .collect();

    let fast_path = section(sections::FAST_PATH, only, || {
        sections::fast_path(&programs, quick)
    });
    let instructions = section(sections::INSTRUCTIONS, only, || {
        sections::instructions(&programs, quick)
    });
    let big_blocks = section(sections::BIG_BLOCKS, only, || {
        sections::big_blocks(&programs, quick)
    });
    let costs = section(sections::COSTS, only, || sections::sampled_costs(root));
    print_targets(&Measured {
        fast_path: &fast_path,
        instructions: &instructions,
        big_blocks: &big_blocks,
        costs: &costs,
        workloads: &figures,
    });
    Ok(())
}

/// The workloads' table (a row per setup, a column per workload; each cell
/// the median ratio to the baseline and its min–max over the rounds),
/// allocprof's CPU, and the attached/unattached ratios per round.
fn print_workloads(
    chosen: &[&Workload],
    columns: &[(Times, Times)],
    setups: &[Setup],
    slow_setups: &[Setup],
    low_rate: &Option<(String, f64)>,
) {
    let index = |name: &str| {
        setups
            .iter()
            .position(|s| s.name == name)
            .expect("a setup of that name")
    };
    let baselines: Vec<f64> = columns.iter().map(|(f, _)| median(&f.wall[0])).collect();
    table_head(chosen, &baselines);
    for (i, s) in setups.iter().enumerate().skip(1) {
        print!("| {} |", s.name);
        for (fast, _) in columns {
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
        for (w, (_, slow)) in chosen.iter().zip(columns) {
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
            .zip(columns)
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
    for (unattached, attached) in PAIRS {
        let (u, a) = (index(unattached), index(attached));
        let rate = match low_rate {
            Some((rate, _)) if attached == LOW_ATTACHED => format!("ALLOCPROF_RATE={rate}"),
            _ => "the default settings".to_string(),
        };
        let cells: Vec<String> = chosen
            .iter()
            .zip(columns)
            .filter(|(_, (fast, _))| !fast.wall[a].is_empty())
            .map(|(w, (fast, _))| {
                format!(
                    "{} {}, {:.1}k events/s",
                    w.name,
                    cell(&ratios(&fast.wall[a], &fast.wall[u])),
                    median(&fast.events[a]) / median(&fast.wall[u]) / 1e3
                )
            })
            .collect();
        if !cells.is_empty() {
            println!("- {attached} ({rate}): {}", cells.join("; "));
        }
    }
    println!();
}

/// The `ALLOCPROF_RATE` (in KiB) at which `churn` makes ≈ `LOW_AIM`
/// sampled events/s under `liballocprof.so` (`lib`), and its events/s at
/// the default rate: the median wall time of 3 runs unattached, the events
/// of one with `allocprof --pid` (their number does not depend on the time
/// they take), scaled. The default rate is set explicitly here, so that a
/// default sample budget, which applies only when `ALLOCPROF_RATE` is
/// unset, does not thin the events the rate is scaled from.
fn calibrate(runner: &Runner, churn: &workloads::Invocation, lib: &Path) -> Result<(String, f64)> {
    eprintln!(
        "peers: calibrating the rate for ≈ {:.0}k events/s",
        LOW_AIM / 1e3
    );
    let setup = |name, tool| Setup {
        name,
        preload: Some(lib.to_path_buf()),
        env: vec![("ALLOCPROF_RATE", format!("{DEFAULT_RATE_BYTES:.0}"))],
        tool,
        churn_only: true,
    };
    let unattached = setup("calibration, unattached", Tool::None);
    let attached = setup("calibration, allocprof --pid", Tool::AllocprofPid(&[]));
    let walls = (0..3)
        .map(|_| Ok(runner.once(churn, &unattached)?.secs))
        .collect::<Result<Vec<f64>>>()?;
    let wall = median(&walls);
    let events = runner
        .once(churn, &attached)?
        .events
        .context("no events from allocprof")?;
    let default_eps = events as f64 / wall;
    let kib = (DEFAULT_RATE_BYTES * default_eps / LOW_AIM / 1024.0)
        .round()
        .max(1.0);
    Ok((format!("{kib:.0}k"), default_eps))
}

/// The setups of the table, glibc (the baseline) first; `lib_mi`,
/// `lib_gl`: the two preload libraries, `plain_mi` the vendored mimalloc
/// built plain.
fn setups(lib_mi: &Path, lib_gl: &Path, plain_mi: &Path) -> Vec<Setup> {
    let setup = |name, preload: Option<&Path>, env: &[(&'static str, &str)], tool| Setup {
        name,
        preload: preload.map(Into::into),
        env: env.iter().map(|&(k, v)| (k, v.to_string())).collect(),
        tool,
        churn_only: false,
    };
    let lib = Some(lib_mi);
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
            Some(plain_mi),
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
            Some(lib_gl),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The default settings' rows (every setup but the calibrated
    /// churn-only ones) must measure the library's defaults: no
    /// `ALLOCPROF_RATE` of theirs, none inherited, none in the fast path.
    #[test]
    fn the_default_settings_rows_set_no_allocprof_rate() {
        let p = Path::new("/nonexistent");
        let setups = setups(p, p, p);
        for s in setups.iter().filter(|s| !s.churn_only) {
            assert!(
                s.env.iter().all(|(k, _)| *k != "ALLOCPROF_RATE"),
                "{} sets ALLOCPROF_RATE",
                s.name
            );
        }
        for name in [UNATTACHED, TARGET_ROW].iter().chain(&SAMPLERS) {
            let s = setups
                .iter()
                .find(|s| s.name == *name)
                .unwrap_or_else(|| panic!("no setup {name}"));
            assert!(!s.churn_only, "{name} runs on the churns only");
        }
        assert!(runner::CLEARED.contains(&"ALLOCPROF_RATE"));
        assert_eq!(crate::bench_alloc::DEFAULT_RATE.1, None);
    }
}

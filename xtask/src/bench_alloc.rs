//! `cargo xtask bench alloc`: cost of the sampling layer.
//!
//! Builds the preload libraries, the Rust benchmark binaries and a small C
//! benchmark, and the *plain reference* for each backend: glibc itself;
//! the vendored mimalloc of the locked libmimalloc-sys (found through
//! `cargo metadata`) built here as a plain override library with the flags
//! and defines liballocprof.so's mimalloc gets; `System` for
//! `SamplingAllocator<System>`. Then reports
//! (1) per workload (small-block churn, mixed sizes, 2 threads with
//! cross-thread frees, churn over 20,000 live blocks per thread on 1 and 2
//! threads), each setup at R = off / default / 64k as a ratio to its plain
//! backend: median over interleaved rounds (the reference and every setup
//! once per round, the order alternating), with the min-max of the
//! per-round ratios, so a burst of load from elsewhere skews a round, not
//! a row;
//! (2) the cost of one sample, measured with every allocation sampled, in
//! the warm-cache and cache-overflow regimes;
//! (3) whole-program wall time of the 2-thread churn under glibc, plain
//! and Debian mimalloc, jemalloc with heap profiling, and both allocprof
//! libraries;
//! (4) memory cost of sampled blocks (a page per live sample) and what
//! stays resident after everything is freed;
//! (5) big-block churn (malloc, memset, free of 1-64 MiB blocks, nearly all
//! sampled at the default rate) against the plain backend, for issues 26
//! and 31's target (within 5%), with the same library at
//! `ALLOCPROF_RATE=0` beside it.
//! Right after (1) and its verdict: (6) instructions per malloc/free pair of
//! each workload and backend under callgrind, plain and with the layer at
//! the default rate ([`instructions`]: the stable figure behind (1)'s
//! timings).
//! Arguments: `--quick` for fewer rounds and iterations; `--big` for
//! section (5) alone, `--instructions` for (6) alone, `--fast-path` for
//! (1) at the default rate alone.
//!
//! The default rate's rows leave `ALLOCPROF_RATE` unset (the default
//! settings). `bench peers` builds the same [`Programs`] and runs (1) at the
//! default rate alone ([`per_operation`]), (5) and (6) for issue 31's
//! targets.

mod programs;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

pub(crate) use self::programs::Programs;

/// One way of running a benchmark program.
struct Setup {
    name: String,
    exe: PathBuf,
    preload: Option<PathBuf>,
    env: Vec<(&'static str, &'static str)>,
}

fn setup(
    name: &str,
    exe: &Path,
    preload: Option<&Path>,
    env: &[(&'static str, &'static str)],
) -> Setup {
    Setup {
        name: name.to_string(),
        exe: exe.to_path_buf(),
        preload: preload.map(Path::to_path_buf),
        env: env.to_vec(),
    }
}

fn command(s: &Setup, args: &[&str]) -> Command {
    let mut c = Command::new(&s.exe);
    c.args(args)
        .env_remove("LD_PRELOAD")
        .env_remove("ALLOCPROF_RATE")
        .env_remove("MALLOC_CONF")
        .env_remove("ALLOCPROF_LEDGER");
    if let Some(p) = &s.preload {
        c.env("LD_PRELOAD", p);
    }
    for (k, v) in &s.env {
        c.env(k, v);
    }
    c
}

/// One run of a benchmark program: (ns per pair, allocations sampled).
fn run_once(s: &Setup, mode: &str, iters: &str) -> Result<(f64, u64)> {
    let out = command(s, &[mode, iters]).output()?;
    if !out.status.success() {
        bail!(
            "{} {mode} failed: {}",
            s.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut fields = text.split_whitespace();
    let v: f64 = fields.next().unwrap_or("").parse().context("parse ns")?;
    let n: u64 = fields
        .next()
        .unwrap_or("")
        .parse()
        .context("parse samples")?;
    Ok((v, n))
}

/// The median of `v` (the mean of the middle two for an even count).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A setup's figures against the reference of its rounds.
pub(crate) struct Row {
    pub(crate) ns: f64,
    /// The median of its per-round ratios to the reference, their min and max.
    pub(crate) ratio: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    /// Allocations sampled per run (median).
    pub(crate) samples: u64,
}

/// `rounds` interleaved rounds: in each, `reference` then every setup
/// once, in reverse order every other round. Returns the reference's
/// median ns/pair and, per setup, the median of its per-round ratios to
/// that round's reference run (with their min and max).
fn interleaved(
    reference: &Setup,
    setups: &[Setup],
    mode: &str,
    iters: &str,
    rounds: usize,
) -> Result<(f64, Vec<Row>)> {
    let mut ref_ns = Vec::new();
    let mut ns = vec![Vec::new(); setups.len()];
    let mut ratios = vec![Vec::new(); setups.len()];
    let mut samples = vec![Vec::new(); setups.len()];
    let all: Vec<&Setup> = std::iter::once(reference).chain(setups).collect();
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..all.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut got = vec![(0.0, 0); all.len()];
        for i in order {
            got[i] = run_once(all[i], mode, iters)?;
        }
        ref_ns.push(got[0].0);
        for (j, &(v, n)) in got[1..].iter().enumerate() {
            ns[j].push(v);
            ratios[j].push(v / got[0].0);
            samples[j].push(n as f64);
        }
    }
    let rows = (0..setups.len())
        .map(|j| Row {
            ns: median(&ns[j]),
            ratio: median(&ratios[j]),
            min: ratios[j].iter().copied().fold(f64::INFINITY, f64::min),
            max: ratios[j].iter().copied().fold(0.0, f64::max),
            samples: median(&samples[j]) as u64,
        })
        .collect();
    Ok((median(&ref_ns), rows))
}

/// The workloads of the per-operation section.
pub(crate) const MODES: [&str; 5] = ["small", "mixed", "threads2", "churn-1t", "churn-2t"];
/// A rate of the per-operation section: (label, `ALLOCPROF_RATE`, or
/// `None` for the variable unset: the default settings).
pub(crate) type Rate = (&'static str, Option<&'static str>);
/// The default settings, the fast-path target's: `ALLOCPROF_RATE` unset,
/// so whatever the library does by default (its rate, and any default
/// sample budget that applies only when the variable is unset) is measured.
pub(crate) const DEFAULT_RATE: Rate = ("512k (default: ALLOCPROF_RATE unset)", None);
/// The library's default rate in bytes (`DEFAULT_RATE`'s).
pub(crate) const DEFAULT_RATE_BYTES: f64 = 524288.0;
/// The fast-path target (issue 31): at the default rate, at most this
/// times the plain backend's time.
pub(crate) const FAST_PATH_TARGET: f64 = 1.02;
/// The per-operation section's backends: (the sampling layer, its plain
/// backend), as the rows name them.
pub(crate) const BACKENDS: [(&str, &str); 3] = [
    ("allocprof/glibc", "glibc (plain)"),
    ("allocprof/mimalloc", "mimalloc (plain, vendored)"),
    ("SamplingAllocator<System>", "System (plain)"),
];

/// The per-operation section's table head.
pub(crate) const PER_OPERATION_HEAD: &str = "| workload | setup | R | ns/pair | vs plain backend | samples per 1M pairs |\n|---|---|---|---|---|---|";

/// One workload on one backend: the plain backend's ns/pair and, per rate,
/// the sampling layer against it.
pub(crate) struct Group {
    pub(crate) mode: &'static str,
    /// The plain backend, e.g. `mimalloc (plain, vendored)`.
    pub(crate) reference: String,
    /// The sampling layer over it, e.g. `allocprof/mimalloc`.
    pub(crate) setup: String,
    base_ns: f64,
    /// One per rate, in the order of the rates asked for.
    pub(crate) rows: Vec<Row>,
}

impl Group {
    /// Its rows of the per-operation table; `rates` as measured, `pairs`
    /// per run.
    pub(crate) fn print(&self, rates: &[Rate], pairs: f64) {
        let mode = self.mode;
        println!(
            "| {mode} | {} | - | {:.2} | 1 | |",
            self.reference, self.base_ns
        );
        // Per thread in the threaded workloads: the programs report
        // ns per pair per thread and count samples of all threads.
        let threads = if matches!(mode, "threads2" | "churn-2t") {
            2.0
        } else {
            1.0
        };
        for ((label, _), r) in rates.iter().zip(&self.rows) {
            println!(
                "| {mode} | {} | {label} | {:.2} | {:.3} ({:.3}-{:.3}) | {:.0} |",
                self.setup,
                r.ns,
                r.ratio,
                r.min,
                r.max,
                r.samples as f64 * 1e6 / pairs / threads,
            );
        }
    }
}

/// The per-operation section: every workload (small-block churn, mixed
/// sizes, 2 threads with cross-thread frees, churn over 20,000 live blocks
/// on 1 and 2 threads) on every backend (glibc, the plain vendored
/// mimalloc, Rust's `System`), the sampling layer at each of `rates`
/// (label, `ALLOCPROF_RATE`) against the plain backend, in `rounds`
/// interleaved rounds of `iters` pairs. `each` sees every group once
/// measured.
pub(crate) fn per_operation(
    p: &Programs,
    rates: &[Rate],
    iters: &str,
    rounds: usize,
    mut each: impl FnMut(&Group),
) -> Result<Vec<Group>> {
    let mut groups = Vec::new();
    for mode in MODES {
        let [gl, mi, sys] = BACKENDS;
        let backends = [
            (
                setup(gl.1, &p.exe, None, &[]),
                &p.exe,
                Some(&p.lib_gl),
                gl.0,
            ),
            (
                setup(mi.1, &p.exe, Some(&p.plain_mi), &[]),
                &p.exe,
                Some(&p.lib_mi),
                mi.0,
            ),
            (
                setup(sys.1, &p.rust_system, None, &[]),
                &p.rust_sampling,
                None,
                sys.0,
            ),
        ];
        for (reference, sampled_exe, lib, setup_name) in backends {
            let setups: Vec<Setup> = rates
                .iter()
                .map(|&(_, rate)| {
                    let env: &[_] = match rate {
                        Some(rate) => &[("ALLOCPROF_RATE", rate)],
                        None => &[],
                    };
                    setup("allocprof", sampled_exe, lib.map(PathBuf::as_path), env)
                })
                .collect();
            let (base_ns, rows) = interleaved(&reference, &setups, mode, iters, rounds)?;
            let group = Group {
                mode,
                reference: reference.name,
                setup: setup_name.to_string(),
                base_ns,
                rows,
            };
            each(&group);
            groups.push(group);
        }
    }
    Ok(groups)
}

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let (iters, rounds) = if quick {
        ("1000000", 7)
    } else {
        ("5000000", 21)
    };
    let programs = Programs::build(root)?;
    if args.iter().any(|a| a == "--instructions") {
        print_instructions(&instructions(&programs, quick)?);
        return Ok(());
    }
    if args.iter().any(|a| a == "--big") {
        println!("Load average at start: {}", load_average());
        big_blocks(&programs, quick)?;
        println!("\nLoad average at the end: {}", load_average());
        return Ok(());
    }
    let Programs {
        exe,
        lib_mi,
        lib_gl,
        plain_mi,
        ..
    } = &programs;
    let deb_mi = Path::new("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2");
    let deb_je = Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");

    println!("Plain mimalloc reference: {}\n", programs.plain_cmd);
    println!("Load average at start: {}\n", load_average());
    println!(
        "## Per-operation cost: ratio to the plain backend (median of {rounds} interleaved rounds, min-max of the per-round ratios; {iters} pairs per run)\n"
    );
    println!("{PER_OPERATION_HEAD}");
    // `--fast-path`: the default rate alone, then the verdict and the end.
    let fast_path_only = args.iter().any(|a| a == "--fast-path");
    let rates: &[Rate] = if fast_path_only {
        &[DEFAULT_RATE]
    } else {
        &[("off", Some("0")), DEFAULT_RATE, ("64k", Some("65536"))]
    };
    let pairs: f64 = iters.parse()?;
    let groups = per_operation(&programs, rates, iters, rounds, |g| g.print(rates, pairs))?;
    let mut missed = Vec::new();
    for g in &groups {
        for (rate, r) in rates.iter().zip(&g.rows) {
            if *rate == DEFAULT_RATE && r.ratio > FAST_PATH_TARGET {
                missed.push(format!("{} {} {:.3}", g.mode, g.setup, r.ratio));
            }
        }
    }
    if missed.is_empty() {
        println!(
            "\nTarget (default rate <= {FAST_PATH_TARGET}x the plain backend): met in every row."
        );
    } else {
        println!(
            "\nTarget (default rate <= {FAST_PATH_TARGET}x the plain backend) missed: {}",
            missed.join(", ")
        );
    }
    if fast_path_only {
        println!("\nLoad average at the end: {}", load_average());
        return Ok(());
    }
    print_instructions(&instructions(&programs, quick)?);

    // Every allocation sampled is ~50x slower (and ~100x in bursts): a
    // twentieth of the pairs keeps this section short.
    let sample_iters = (iters.parse::<u64>()? / 20).to_string();
    let sample_pairs = sample_iters.parse::<f64>()?;
    let reps = rounds.min(7);
    println!(
        "\n## Cost of one sample: every allocation sampled (R = 1) vs off, 8-256 B blocks (median of {reps} interleaved rounds, {sample_iters} pairs)\n"
    );
    println!(
        "| setup | pattern | ns/pair off | ns/pair R=1 | samples per pair | cost per sample | of which the ledger (vs ALLOCPROF_LEDGER=0) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (backend, lib) in [("glibc", &lib_gl), ("mimalloc", &lib_mi)] {
        for (mode, window) in [
            ("small-w4", "churn, 4 live blocks (slots reused warm)"),
            ("small", "churn, 256 live blocks (slots reused warm)"),
            (
                "burst",
                "64 mallocs then 64 frees (the last 16 frees overflow the warm cache: madvise + fault)",
            ),
        ] {
            let off = setup("allocprof", exe, Some(lib), &[("ALLOCPROF_RATE", "0")]);
            let all = setup("allocprof", exe, Some(lib), &[("ALLOCPROF_RATE", "1")]);
            // The same with the live-sample ledger off, in the same rounds:
            // the difference is the ledger's capture and record per sample.
            let no_ledger = setup(
                "allocprof, no ledger",
                exe,
                Some(lib),
                &[("ALLOCPROF_RATE", "1"), ("ALLOCPROF_LEDGER", "0")],
            );
            let (v0, r) = interleaved(&off, &[all, no_ledger], mode, &sample_iters, reps)?;
            let (v1, n) = (r[0].ns, r[0].samples);
            let per_pair = n as f64 / sample_pairs;
            println!(
                "| allocprof/{backend} | {window} | {v0:.2} | {v1:.2} | {per_pair:.3} | {:.0} ns | {:.0} ns |",
                (v1 - v0) / per_pair,
                (v1 - r[1].ns) / per_pair
            );
        }
    }

    println!("\n## Whole program: 2-thread churn (`threads2`), wall time (median of {reps})\n");
    println!("| allocator | wall ms |");
    println!("|---|---|");
    let wholes = [
        setup("glibc", exe, None, &[]),
        setup("mimalloc (plain, vendored 2.3.x)", exe, Some(plain_mi), &[]),
        setup("mimalloc (Debian libmimalloc2.0)", exe, Some(deb_mi), &[]),
        setup(
            "jemalloc prof:true,lg_prof_sample:19",
            exe,
            Some(deb_je),
            &[("MALLOC_CONF", "prof:true,lg_prof_sample:19")],
        ),
        setup("allocprof (mimalloc), default R", exe, Some(lib_mi), &[]),
        setup("allocprof (glibc), default R", exe, Some(lib_gl), &[]),
    ];
    let mut times = vec![Vec::new(); wholes.len()];
    for _ in 0..reps {
        for (s, t) in wholes.iter().zip(&mut times) {
            let t0 = Instant::now();
            let st = command(s, &["threads2", iters])
                .stdout(std::process::Stdio::null())
                .status()?;
            if !st.success() {
                bail!("{} failed", s.name);
            }
            t.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    for (s, t) in wholes.iter().zip(&mut times) {
        println!("| {} | {:.1} |", s.name, median(t));
    }

    println!("\n## Memory: live set of 200k x 64 B + 2000 x 8 KiB + 20 x 1 MiB\n");
    for (label, rate) in [
        ("off", "0"),
        ("512k", "524288"),
        ("64k", "65536"),
        ("4k", "4096"),
    ] {
        let s = setup("allocprof", exe, Some(lib_mi), &[("ALLOCPROF_RATE", rate)]);
        let out = command(&s, &["live"]).output()?;
        println!(
            "- R={label}: {}",
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    big_blocks(&programs, quick)?;
    println!("\nLoad average at the end: {}", load_average());
    Ok(())
}

/// One workload on one backend under callgrind: instructions per
/// malloc/free pair of the plain backend and of the sampling layer over it
/// at the default rate (what load does not move, unlike the timings).
pub(crate) struct Instructions {
    pub(crate) mode: &'static str,
    pub(crate) reference: &'static str,
    pub(crate) setup: &'static str,
    pub(crate) plain: f64,
    pub(crate) layer: f64,
}

/// Instructions (callgrind's `Ir`) the whole program executes for `pairs`
/// pairs.
fn instructions_of(s: &Setup, mode: &str, pairs: u64) -> Result<u64> {
    let out_file = std::env::temp_dir().join(format!(
        "allocprof-callgrind-{}-{mode}-{pairs}",
        std::process::id()
    ));
    let c = command(s, &[]);
    let prog = c.get_program().to_owned();
    let mut vg = Command::new("valgrind");
    let mut out_arg = std::ffi::OsString::from("--callgrind-out-file=");
    out_arg.push(&out_file);
    vg.arg("--tool=callgrind")
        .arg(out_arg)
        .arg(prog)
        .args([mode, &pairs.to_string()])
        .stdout(std::process::Stdio::null());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => vg.env(k, v),
            None => vg.env_remove(k),
        };
    }
    let out = vg.output().context("valgrind (apt-get install valgrind)")?;
    let text = std::fs::read_to_string(&out_file).unwrap_or_default();
    let _ = std::fs::remove_file(&out_file);
    if !out.status.success() {
        bail!(
            "callgrind {} {mode}: {}",
            s.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    text.lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no summary in callgrind's output for {} {mode}", s.name))
}

/// Instructions per pair: the difference of two runs of different lengths,
/// so start-up, set-up and teardown cancel out. Per pair of one thread in
/// the 2-thread workloads (each thread runs that many pairs), as the
/// timings are.
fn instructions_per_pair(s: &Setup, mode: &str, quick: bool) -> Result<f64> {
    let (short, long) = if quick {
        (100_000, 300_000)
    } else {
        (200_000, 600_000)
    };
    let threads = if matches!(mode, "threads2" | "churn-2t") {
        2.0
    } else {
        1.0
    };
    let a = instructions_of(s, mode, short)?;
    let b = instructions_of(s, mode, long)?;
    Ok((b as f64 - a as f64) / (long - short) as f64 / threads)
}

/// Every workload on every backend under callgrind (threads run one at a
/// time there: the threaded workloads count the same instructions, not
/// their contention).
pub(crate) fn instructions(p: &Programs, quick: bool) -> Result<Vec<Instructions>> {
    let mut rows = Vec::new();
    let [gl, mi, sys] = BACKENDS;
    for mode in MODES {
        for ((setup_name, reference), plain, layer) in [
            (
                gl,
                setup("glibc", &p.exe, None, &[]),
                setup("allocprof", &p.exe, Some(&p.lib_gl), &[]),
            ),
            (
                mi,
                setup("mimalloc", &p.exe, Some(&p.plain_mi), &[]),
                setup("allocprof", &p.exe, Some(&p.lib_mi), &[]),
            ),
            (
                sys,
                setup("System", &p.rust_system, None, &[]),
                setup("allocprof", &p.rust_sampling, None, &[]),
            ),
        ] {
            rows.push(Instructions {
                mode,
                reference,
                setup: setup_name,
                plain: instructions_per_pair(&plain, mode, quick)?,
                layer: instructions_per_pair(&layer, mode, quick)?,
            });
        }
    }
    Ok(rows)
}

/// The instruction-count table.
pub(crate) fn print_instructions(rows: &[Instructions]) {
    println!(
        "\n## Instructions per malloc/free pair at the default rate (callgrind; difference of two run lengths)\n"
    );
    println!("| workload | setup | plain backend | with the layer | added | ratio |");
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} vs {} | {:.1} | {:.1} | {:+.1} | {:.3} |",
            r.mode,
            r.setup,
            r.reference,
            r.plain,
            r.layer,
            r.layer - r.plain,
            r.layer / r.plain
        );
    }
}

/// Block sizes of the big-block section, MiB.
const BIG_MIB: [u64; 6] = [1, 2, 4, 8, 16, 64];
/// The big-block target (issues 26 and 31): at the default settings, at
/// most this times the plain backend.
pub(crate) const BIG_TARGET: f64 = 1.05;

/// One block size on one library in the big-block section.
pub(crate) struct BigBlocks {
    pub(crate) mib: u64,
    /// The library, e.g. `allocprof/mimalloc`.
    pub(crate) setup: &'static str,
    /// Its plain backend, e.g. `mimalloc (plain, vendored)`.
    pub(crate) reference: &'static str,
    /// The plain backend's CPU ns per iteration (median).
    pub(crate) plain_ns: f64,
    /// The library with `ALLOCPROF_RATE=0`, against the plain backend.
    pub(crate) off: Row,
    /// The library at the default settings (`ALLOCPROF_RATE` unset),
    /// against the plain backend.
    pub(crate) on: Row,
}

/// Section (5): malloc + memset + free of big blocks, each library at the
/// default settings and with `ALLOCPROF_RATE=0` against its plain backend
/// (glibc; the vendored mimalloc built plain), in interleaved rounds;
/// about 2 GiB written per run (a quarter with `--quick`). CPU time (user +
/// system, so page faults count) rather than wall time, which on a shared
/// machine mostly measures the neighbours.
pub(crate) fn big_blocks(p: &Programs, quick: bool) -> Result<Vec<BigBlocks>> {
    let rounds = if quick { 5 } else { 11 };
    let bytes: u64 = if quick { 512 << 20 } else { 2 << 30 };
    println!(
        "\n## Big blocks: malloc + memset + free, each library at the default settings and with ALLOCPROF_RATE=0 against its plain backend (median of {rounds} interleaved rounds, min-max of the per-round ratios)\n"
    );
    println!(
        "| block | setup vs plain backend | CPU ns/iteration plain | ALLOCPROF_RATE=0 | default | RATE=0 vs plain | default vs plain | default vs RATE=0 (medians) | samples per run |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let [gl, mi, _] = BACKENDS;
    let mut figures = Vec::new();
    let mut missed = Vec::new();
    for mib in BIG_MIB {
        let mode = format!("big-{mib}");
        let iters = (bytes / (mib << 20)).to_string();
        for ((name, reference), plain_lib, lib) in
            [(gl, None, &p.lib_gl), (mi, Some(&p.plain_mi), &p.lib_mi)]
        {
            let plain = setup(reference, &p.exe, plain_lib.map(PathBuf::as_path), &[]);
            let off = setup(name, &p.exe, Some(lib), &[("ALLOCPROF_RATE", "0")]);
            let on = setup(name, &p.exe, Some(lib), &[]);
            let (plain_ns, rows) = interleaved(&plain, &[off, on], &mode, &iters, rounds)?;
            let [off, on] = <[Row; 2]>::try_from(rows)
                .ok()
                .expect("two setups, two rows");
            println!(
                "| {mib} MiB | {name} vs {reference} | {plain_ns:.0} | {:.0} | {:.0} | {:.3} ({:.3}-{:.3}) | {:.3} ({:.3}-{:.3}) | {:.3} | {} |",
                off.ns,
                on.ns,
                off.ratio,
                off.min,
                off.max,
                on.ratio,
                on.min,
                on.max,
                on.ns / off.ns,
                on.samples
            );
            if on.ratio > BIG_TARGET {
                missed.push(format!("{mib} MiB {name} {:.3}", on.ratio));
            }
            figures.push(BigBlocks {
                mib,
                setup: name,
                reference,
                plain_ns,
                off,
                on,
            });
        }
    }
    if missed.is_empty() {
        println!(
            "\nTarget (big blocks at the default settings <= {BIG_TARGET}x the plain backend): met in every row."
        );
    } else {
        println!(
            "\nTarget (big blocks at the default settings <= {BIG_TARGET}x the plain backend) missed: {}",
            missed.join(", ")
        );
    }
    Ok(figures)
}

/// `/proc/loadavg`'s 1, 5 and 15 minute figures: how busy the machine was.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

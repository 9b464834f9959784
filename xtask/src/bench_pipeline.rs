//! `cargo xtask bench pipeline`: what profiling costs, seen from the target
//! (time per sampled alloc and free with allocprof attached, against the same
//! run without it), the highest sampled-event rate sustained without drops,
//! allocprof's own CPU and memory at 10k events/s, and the unwinder's cost:
//! a ~20-frame stack walked with unwind tables (built without frame
//! pointers) against the same stack walked by frame pointers, and
//! (`churn.rs`) the attached cost per sample on the peers bench's 2-thread
//! churn, in parts, and (`python.rs`) what walking a CPython thread's
//! frames adds to a sampled allocation. `--quick`: shorter runs; `--churn`,
//! `--python`: that section alone.

mod churn;
mod python;

use std::{
    fs,
    io::{BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::shell;

const RUNS: usize = 5;

/// A figure per sampled alloc and per sampled free (ns, unless said).
type AllocFree = (f64, f64);
const COST_N: &str = "20000";
/// The cost loop's runs: (threads, as the tables say; the workload's mode).
pub(crate) const COST_LOOPS: [(&str, &str); 2] =
    [("1 thread", "cost"), ("2 threads at once", "cost2")];
/// Nested calls above the allocations of the unwinder's bench: with main,
/// the C runtime's frames and `cost`, about 20 frames.
const DEEP: &str = "16";

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    shell::cargo(root, &["build", "--release"])?;
    let bench = Bench::new(root)?;
    if args.iter().any(|a| a == "--churn") {
        return churn::run(root, &bench.preload, &bench.allocprof, quick);
    }
    if args.iter().any(|a| a == "--python") {
        return python::run(root, &bench);
    }

    for (threads, mode) in COST_LOOPS {
        sampled_cost(&bench, threads, mode)?;
    }

    println!("\n## the unwinder: sampled alloc {DEEP} calls deep (~20 frames), median of {RUNS}");
    let (mut fp, mut tables, mut fp_tables) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        fp.push(bench.deep(&bench.workload, &["--max-unwind-rows", "0"])?);
        tables.push(bench.deep(&bench.workload_nofp, &[])?);
        fp_tables.push(bench.deep(&bench.workload, &[])?);
    }
    println!("| build | walk | target ns per sampled alloc | eBPF alloc program µs per run |");
    println!("|---|---|---|---|");
    let mut kernel_of = Vec::new();
    for (build, walk, runs) in [
        (
            "frame pointers",
            "frame pointers (`--max-unwind-rows 0`)",
            &fp,
        ),
        ("`-fomit-frame-pointer`", "unwind tables", &tables),
        ("frame pointers", "unwind tables", &fp_tables),
    ] {
        let target = medians(&runs.iter().map(|r| (r.0, 0.0)).collect::<Vec<_>>()).0;
        let kernel: Vec<(f64, f64)> = runs.iter().filter_map(|r| r.1).map(|k| (k, 0.0)).collect();
        let kernel = (!kernel.is_empty()).then(|| medians(&kernel).0);
        kernel_of.push((target, kernel));
        println!(
            "| {build} | {walk} | {target:.0} | {} |",
            kernel.map_or("n/a".into(), |k| format!("{:.2}", k / 1e3))
        );
    }
    let ((fp_target, fp_kernel), (t_target, t_kernel)) = (kernel_of[0], kernel_of[1]);
    if let (Some(f), Some(ft)) = (fp_kernel, kernel_of[2].1) {
        // The frame-pointer fast path: a build that keeps frame pointers
        // should cost about what `bpf_get_stack` does, tables or not.
        println!(
            "frame-pointer build, tables (fast path) vs bpf_get_stack: eBPF program {:+.2} µs \
             per sampled alloc ({:.2}x)",
            (ft - f) / 1e3,
            ft / f
        );
    }
    println!(
        "unwind tables vs frame pointers: {:+.2} µs per sampled alloc in the target ({:.2}x)",
        (t_target - fp_target) / 1e3,
        t_target / fp_target
    );
    if let (Some(f), Some(t)) = (fp_kernel, t_kernel) {
        println!(
            "eBPF program: {:+.2} µs per sampled alloc ({:.2}x)",
            (t - f) / 1e3,
            t / f
        );
    }

    python::run(root, &bench)?;

    let secs = if quick { "3" } else { "10" };
    println!(
        "\n## highest sampled-event rate, 2 threads flat out for {secs} s, allocprof attached"
    );
    let (out, report) = bench.with_profiler(&["max", secs, "2"], None)?;
    let eps = value(&out, "events_per_sec")?;
    let drops = dropped(&report)?;
    println!("{eps:.0} sampled events/s sustained, {drops} dropped");

    let window = if quick { 10 } else { 30 };
    println!(
        "\n## allocprof's own cost at 10k sampled events/s ({window} s window after 5 s warm-up)"
    );
    let total = (window + 8).to_string();
    let (out, _) = bench.with_profiler(&["rate", "10000", &total], Some(window))?;
    println!(
        "target ran at {:.0} events/s",
        value(&out, "events_per_sec")?
    );
    churn::run(root, &bench.preload, &bench.allocprof, quick)
}

pub(crate) struct Bench {
    workload: PathBuf,
    /// The same built with `-fomit-frame-pointer`.
    workload_nofp: PathBuf,
    preload: PathBuf,
    allocprof: PathBuf,
}

impl Bench {
    /// Builds the cost workload; liballocprof.so and allocprof are expected
    /// built (release).
    pub(crate) fn new(root: &Path) -> Result<Bench> {
        let dir = root.join("target/bench");
        fs::create_dir_all(&dir)?;
        let workload = dir.join("pipeline_workload");
        let workload_nofp = dir.join("pipeline_workload_nofp");
        let source = root.join("xtask/bench/pipeline_workload.c");
        for (out, frame_pointers) in [
            (&workload, "-fno-omit-frame-pointer"),
            (&workload_nofp, "-fomit-frame-pointer"),
        ] {
            shell::run(
                root,
                "gcc",
                &[
                    "-O2",
                    "-fno-builtin",
                    frame_pointers,
                    "-pthread",
                    "-o",
                    &out.to_string_lossy(),
                    &source.to_string_lossy(),
                ],
            )?;
        }
        Ok(Bench {
            workload,
            workload_nofp,
            preload: root.join("target/release/liballocprof.so"),
            allocprof: root.join("target/release/allocprof"),
        })
    }

    fn spawn_workload(&self, args: &[&str]) -> Result<Child> {
        self.spawn(&self.workload, args)
    }

    fn spawn(&self, exe: &Path, args: &[&str]) -> Result<Child> {
        Command::new(exe)
            .args(args)
            .env("LD_PRELOAD", &self.preload)
            .env("ALLOCPROF_RATE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the benchmark workload")
    }

    /// (ns per sampled alloc, ns per sampled free).
    /// With `stats`, also the eBPF programs' own time (when bpftool can tell).
    fn cost(
        &self,
        mode: &str,
        profiled: bool,
        stats: bool,
    ) -> Result<(AllocFree, Option<AllocFree>)> {
        let (out, kernel) = if profiled {
            let (out, _, kernel) = self.run_profiled(&[mode, COST_N], None, stats)?;
            (out, kernel)
        } else {
            let mut w = self.spawn_workload(&[mode, COST_N])?;
            let out = start(&mut w)?;
            stop(&mut w)?;
            (out, None)
        };
        Ok(((value(&out, "alloc_ns")?, value(&out, "free_ns")?), kernel))
    }

    /// `deep` under allocprof (with `allocprof_args`), once the unwind
    /// tables are loaded: (target ns per sampled alloc, eBPF alloc program
    /// ns per run when bpftool can tell).
    fn deep(&self, exe: &Path, allocprof_args: &[&str]) -> Result<(f64, Option<f64>)> {
        let stats = BpfStats::enable();
        let mut w = self.spawn(exe, &["deep", COST_N, DEEP])?;
        let mut profiler = attached(
            Command::new(&self.allocprof)
                .args(["--pid", &w.id().to_string(), "--duration", "600s"])
                .args(allocprof_args)
                .stdout(Stdio::null()),
        )?;
        // The tables of its files take milliseconds to build and load.
        thread::sleep(Duration::from_secs(1));
        let out = start(&mut w)?;
        let kernel = stats
            .as_ref()
            .and_then(|s| s.per_run_of(Some(profiler.id())))
            .map(|k| k.0);
        stop(&mut w)?;
        let status = profiler.wait()?;
        if !status.success() {
            bail!("allocprof failed: {status}");
        }
        Ok((value(&out, "alloc_ns")?, kernel))
    }

    fn with_profiler(&self, args: &[&str], window: Option<u64>) -> Result<(String, String)> {
        let (out, report, _) = self.run_profiled(args, window, false)?;
        Ok((out, report))
    }

    /// Runs the workload with allocprof attached; returns the workload's
    /// output, allocprof's report, and with `stats` the eBPF programs' own
    /// ns per run (alloc, free) when bpftool can tell. With `window`, samples
    /// allocprof's CPU and memory over that many seconds after a 5 s warm-up.
    fn run_profiled(
        &self,
        args: &[&str],
        window: Option<u64>,
        stats: bool,
    ) -> Result<(String, String, Option<AllocFree>)> {
        let stats = if stats { BpfStats::enable() } else { None };
        let mut w = self.spawn_workload(args)?;
        let profiler = attached(
            Command::new(&self.allocprof)
                .args(["--pid", &w.id().to_string(), "--duration", "600s"])
                .stdout(Stdio::piped()),
        )?;
        let sampler = window.map(|secs| {
            let pid = profiler.id();
            thread::spawn(move || sample_usage(pid, secs))
        });
        let out = start(&mut w)?;
        // This allocprof's programs only: other engineers' sessions on the
        // machine load programs of the same names.
        let kernel = stats
            .as_ref()
            .and_then(|s| s.per_run_of(Some(profiler.id())));
        stop(&mut w)?;
        if let Some(sampler) = sampler {
            let (cpu, rss) = sampler.join().expect("usage sampler")?;
            println!(
                "allocprof: {:.2}% of one core, {:.1} MiB resident",
                cpu * 100.0,
                rss as f64 / 1024.0
            );
        }
        // allocprof stops once its target has exited.
        let report = report_of(profiler)?;
        Ok((out, report, kernel))
    }
}

/// Lets the workload run and collects its results (up to its `end` line).
/// Starts allocprof as `cmd` says; returns once it has attached, its
/// stderr drained from then on so it never blocks on it.
fn attached(cmd: &mut Command) -> Result<Child> {
    let mut profiler = cmd
        .stderr(Stdio::piped())
        .spawn()
        .context("starting allocprof")?;
    let mut stderr = BufReader::new(profiler.stderr.take().expect("piped"));
    let mut line = String::new();
    stderr.read_line(&mut line)?;
    if !line.contains("attached") {
        bail!("allocprof did not attach: {line}");
    }
    thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    Ok(profiler)
}

fn start(w: &mut Child) -> Result<String> {
    writeln!(w.stdin.as_mut().expect("piped"), "go")?;
    let mut out = String::new();
    let mut lines = BufReader::new(w.stdout.as_mut().expect("piped"));
    loop {
        let mut line = String::new();
        if lines.read_line(&mut line)? == 0 {
            bail!("the benchmark workload stopped early: {out}");
        }
        if line.trim() == "end" {
            return Ok(out);
        }
        out.push_str(&line);
    }
}

/// Lets the workload exit.
fn stop(w: &mut Child) -> Result<()> {
    writeln!(w.stdin.take().expect("piped"), "exit")?;
    let status = w.wait()?;
    if !status.success() {
        bail!("the benchmark workload failed: {status}");
    }
    Ok(())
}

/// The kernel's per-program run-time statistics, on for the duration.
struct BpfStats;

impl BpfStats {
    const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

    fn enable() -> Option<BpfStats> {
        fs::write(Self::SYSCTL, "1").ok().map(|()| BpfStats)
    }

    /// ns per run of the alloc and free programs, from `bpftool prog show`,
    /// of the programs `holder` (a process id) holds open, if given: other
    /// allocprof instances on the machine are not counted.
    fn per_run_of(&self, holder: Option<u32>) -> Option<AllocFree> {
        let programs = Programs::of(holder)?;
        let per_run = |name| programs.stats(name).map(|(ns, runs)| ns / runs);
        Some((
            per_run("name otel_memory_all")?,
            per_run("name otel_memory_fre")?,
        ))
    }

    /// The alloc program `holder` holds: (ns per run, runs).
    fn alloc_program_of(&self, holder: u32) -> Option<(f64, f64)> {
        let (ns, runs) = Programs::of(Some(holder))?.stats("name otel_memory_all")?;
        Some((ns / runs, runs))
    }
}

/// `bpftool prog show`, of the programs one process holds if given.
struct Programs {
    text: String,
    held: Option<Vec<u64>>,
}

impl Programs {
    fn of(holder: Option<u32>) -> Option<Programs> {
        let out = Command::new("bpftool")
            .args(["prog", "show"])
            .output()
            .ok()?;
        Some(Programs {
            text: String::from_utf8_lossy(&out.stdout).into_owned(),
            held: holder.map(prog_ids),
        })
    }

    /// (run_time_ns, run_cnt) of the program named `name`.
    fn stats(&self, name: &str) -> Option<(f64, f64)> {
        // Lines like `12: kprobe  name otel_memory_all  tag … run_time_ns 123 run_cnt 4`.
        self.text
            .lines()
            .filter(|l| l.contains(name))
            .filter(|l| {
                self.held.as_ref().is_none_or(|ids| {
                    l.split(':')
                        .next()
                        .and_then(|id| id.trim().parse::<u64>().ok())
                        .is_some_and(|id| ids.contains(&id))
                })
            })
            .find_map(|l| {
                let field = |key: &str| {
                    l.split_whitespace()
                        .skip_while(|w| *w != key)
                        .nth(1)
                        .and_then(|v| v.parse::<f64>().ok())
                };
                Some((field("run_time_ns")?, field("run_cnt")?))
            })
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = fs::write(Self::SYSCTL, "0");
    }
}

/// The ids of the BPF programs process `pid` holds open.
fn prog_ids(pid: u32) -> Vec<u64> {
    let mut ids = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .into_iter()
        .flatten()
    {
        let info = entry.map(|e| fs::read_to_string(e.path()).unwrap_or_default());
        for line in info.iter().flat_map(|i| i.lines()) {
            if let Some(id) = line.strip_prefix("prog_id:") {
                ids.extend(id.trim().parse::<u64>().ok());
            }
        }
    }
    ids
}

/// allocprof's CPU (fraction of one core) and resident KiB over `secs`
/// seconds, after a 5 s warm-up.
fn sample_usage(pid: u32, secs: u64) -> Result<(f64, u64)> {
    thread::sleep(Duration::from_secs(5));
    let (t0, c0) = (Instant::now(), cpu_ticks(pid)?);
    thread::sleep(Duration::from_secs(secs));
    let (t1, c1) = (Instant::now(), cpu_ticks(pid)?);
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(((c1 - c0) as f64 / hz / (t1 - t0).as_secs_f64(), rss))
}

/// User plus system CPU time of process `pid`, in clock ticks.
pub(crate) fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat
        .rsplit_once(") ")
        .context("malformed /proc/PID/stat")?
        .1;
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of stat; 12 and 13 after the comm.
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

fn value(out: &str, key: &str) -> Result<f64> {
    out.lines()
        .find_map(|l| l.strip_prefix(key).map(str::trim))
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no `{key}` in the workload's output: {out}"))
}

/// The drop count from the header line of allocprof's report.
fn dropped(report: &str) -> Result<u64> {
    let header = report.lines().next().unwrap_or_default();
    header
        .rsplit_once(", ")
        .and_then(|(_, tail)| tail.strip_suffix(" dropped"))
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("unexpected report header: {header}"))
}

/// What allocprof adds per sampled alloc and free, seen from the target.
pub(crate) struct SampledCost {
    /// µs per sampled (alloc, free): the median with allocprof minus the
    /// median without.
    pub(crate) added: AllocFree,
    /// The least and most µs added in one run (a run with allocprof less
    /// the run without it just before).
    pub(crate) added_min: AllocFree,
    pub(crate) added_max: AllocFree,
    /// The eBPF programs' own µs per run (alloc, free), median, when
    /// bpftool can tell.
    pub(crate) programs: Option<AllocFree>,
}

/// Target ns per sampled alloc and free, with and without allocprof, and
/// the eBPF programs' own time, for `mode` (`cost` or `cost2`): prints them
/// and returns what allocprof added.
pub(crate) fn sampled_cost(bench: &Bench, threads: &str, mode: &str) -> Result<SampledCost> {
    println!(
        "## sampled alloc/free cost, {threads}, ALLOCPROF_RATE=1 (every allocation sampled), median of {RUNS}"
    );
    let mut bare = Vec::new();
    let mut attached = Vec::new();
    for _ in 0..RUNS {
        bare.push(bench.cost(mode, false, false)?.0);
        attached.push(bench.cost(mode, true, false)?.0);
    }
    // Separate runs: the kernel's run-time statistics slow each program run.
    let mut kernel = Vec::new();
    for _ in 0..RUNS {
        kernel.extend(bench.cost(mode, true, true)?.1);
    }
    let (b_alloc, b_free) = medians(&bare);
    let (a_alloc, a_free) = medians(&attached);
    println!("| | without allocprof | with allocprof | added by allocprof |");
    println!("|---|---|---|---|");
    println!(
        "| sampled alloc | {b_alloc:.0} ns | {a_alloc:.0} ns | {:.2} µs |",
        (a_alloc - b_alloc) / 1e3
    );
    println!(
        "| sampled free | {b_free:.0} ns | {a_free:.0} ns | {:.2} µs |",
        (a_free - b_free) / 1e3
    );

    let programs = (!kernel.is_empty()).then(|| {
        let (k_alloc, k_free) = medians(&kernel);
        (k_alloc / 1e3, k_free / 1e3)
    });
    if let Some((k_alloc, k_free)) = programs {
        println!(
            "eBPF program time alone (kernel.bpf_stats_enabled): alloc {k_alloc:.2} µs, free {k_free:.2} µs"
        );
    }
    println!();
    let per_run: Vec<AllocFree> = bare
        .iter()
        .zip(&attached)
        .map(|(b, a)| ((a.0 - b.0) / 1e3, (a.1 - b.1) / 1e3))
        .collect();
    let fold = |pick: fn(f64, f64) -> f64, start: f64| {
        per_run.iter().fold((start, start), |acc, r| {
            (pick(acc.0, r.0), pick(acc.1, r.1))
        })
    };
    Ok(SampledCost {
        added: ((a_alloc - b_alloc) / 1e3, (a_free - b_free) / 1e3),
        added_min: fold(f64::min, f64::INFINITY),
        added_max: fold(f64::max, f64::NEG_INFINITY),
        programs,
    })
}

fn medians(runs: &[(f64, f64)]) -> (f64, f64) {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (
        median(runs.iter().map(|r| r.0).collect()),
        median(runs.iter().map(|r| r.1).collect()),
    )
}

/// What an `allocprof` run with piped stdout printed (its report), once it
/// has exited successfully.
fn report_of(mut profiler: Child) -> Result<String> {
    let mut report = String::new();
    profiler
        .stdout
        .take()
        .expect("piped")
        .read_to_string(&mut report)?;
    let status = profiler.wait()?;
    if !status.success() {
        bail!("allocprof failed: {status}");
    }
    Ok(report)
}

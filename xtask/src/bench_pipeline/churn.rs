//! `cargo xtask bench pipeline`'s churn section (`--churn` runs it alone):
//! what `allocprof --pid` costs per sample on the peers bench's 2-thread
//! churn (`xtask/bench/peers_churn.c`: mixed sizes, 20,000 live blocks per
//! thread, libc without frame pointers on every stack), and where that cost
//! goes, so the issue-12 breakdown can be repeated. The cost is the
//! target's CPU time (all threads, user + system: uprobes and programs run
//! in its context), which other processes on the shared cores do not
//! inflate as they do wall time; wall time is shown too. Its parts:
//!
//! - the uprobe floor: the same two USDT probes with empty bpftrace programs
//!   (the kernel's optimized uprobe path and a trivial program);
//! - the eBPF alloc and free programs' own time (`kernel.bpf_stats_enabled`,
//!   separate runs: the statistics slow every program run);
//! - the rest: what the target's own code loses to the kernel work between
//!   its instructions (caches, TLB, branch predictors), by difference;
//!
//! and, apart, allocprof's own CPU, which competes for the two cores.
//!
//! Each round runs bare, floor and attached in turn, at the default rate
//! (≈ 440k sampled events/s on this machine), at 2 MiB (≈ 117k) and at
//! 6 MiB (≈ 40k, the ratio target's rate).

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{BpfStats, attached, cpu_ticks, prog_ids};
use crate::shell;

/// Steps per thread (one free and one malloc each): 4× the peers bench's,
/// ≈ 1.2 s a run, so that bursts of other work on the shared machine
/// average out within a run.
const STEPS: &str = "120000000";
const QUICK_STEPS: &str = "30000000";
/// `ALLOCPROF_RATE`s of the other sections: ≈ 117k and ≈ 40k sampled
/// events/s (the default gives ≈ 440k), down to the ratio target's
/// 40k.
const LOW_RATES: [&str; 2] = ["2m", "6m"];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tool {
    Bare,
    /// Empty bpftrace programs on the alloc and free probes.
    Floor,
    Allocprof,
}

/// One run: wall seconds, the target's CPU seconds, and for tools, their
/// CPU seconds and (with the statistics on) the programs they hold: (name,
/// runs, ns per run).
struct Run {
    wall: f64,
    target_cpu: f64,
    cpu: f64,
    progs: Vec<(String, f64, f64)>,
}

struct Churn {
    program: PathBuf,
    preload: PathBuf,
    allocprof: PathBuf,
    steps: &'static str,
}

pub fn run(root: &Path, preload: &Path, allocprof: &Path, quick: bool) -> Result<()> {
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let program = dir.join("peers_churn");
    // The peers bench's build: the C library's frames are walked with
    // unwind tables (Debian builds it without frame pointers).
    shell::run(
        root,
        "gcc",
        &[
            "-O2",
            "-pthread",
            "-o",
            &program.to_string_lossy(),
            &root.join("xtask/bench/peers_churn.c").to_string_lossy(),
        ],
    )?;
    let churn = Churn {
        program,
        preload: preload.to_path_buf(),
        allocprof: allocprof.to_path_buf(),
        steps: if quick { QUICK_STEPS } else { STEPS },
    };
    let rounds = if quick { 3 } else { 9 };
    churn.section(None, "default rate (512 KiB)", rounds, true)?;
    // Fewer samples: the ratio is the figure; per sample, the wall times'
    // noise would swamp the parts.
    for rate in LOW_RATES {
        churn.section(Some(rate), rate, rounds, false)?;
    }
    Ok(())
}

impl Churn {
    fn section(&self, rate: Option<&str>, label: &str, rounds: usize, parts: bool) -> Result<()> {
        println!(
            "\n## attached cost per sample: 2-thread churn ({} steps per thread), \
             ALLOCPROF_RATE {label}, {rounds} rounds, median (min–max)",
            self.steps
        );
        let mut walls: [Vec<f64>; 3] = Default::default();
        let mut cpus: [Vec<f64>; 3] = Default::default();
        let mut tool_cpu = Vec::new();
        let tools = [Tool::Bare, Tool::Floor, Tool::Allocprof];
        for _ in 0..rounds {
            for (i, tool) in tools.into_iter().enumerate() {
                let r = self.once(rate, tool, false)?;
                walls[i].push(r.wall);
                cpus[i].push(r.target_cpu);
                if tool == Tool::Allocprof {
                    tool_cpu.push(r.cpu);
                }
            }
        }
        // Separate runs for the programs' own time (and the sample count).
        let mut alloc = Vec::new();
        let mut free = Vec::new();
        let mut floor_prog = Vec::new();
        for _ in 0..rounds.min(3) {
            let r = self.once(rate, Tool::Allocprof, true)?;
            for (name, runs, ns) in r.progs {
                if name.starts_with("otel_memory_all") {
                    alloc.push((runs, ns));
                } else if name.starts_with("otel_memory_fre") {
                    free.push((runs, ns));
                }
            }
            let r = self.once(rate, Tool::Floor, true)?;
            let (runs, ns) = r
                .progs
                .iter()
                .fold((0.0, 0.0), |(n, t), p| (n + p.1, t + p.1 * p.2));
            if runs > 0.0 {
                floor_prog.push(ns / runs);
            }
        }
        let Some(samples) = median(alloc.iter().map(|a| a.0).collect()) else {
            bail!("no statistics for the alloc program (bpftool missing?)");
        };
        let alloc_ns = median(alloc.iter().map(|a| a.1).collect()).unwrap_or(f64::NAN);
        let free_ns = median(free.iter().map(|a| a.1).collect()).unwrap_or(f64::NAN);
        let floor_prog_ns = median(floor_prog).unwrap_or(f64::NAN);

        let [bare, floor, att] = walls.map(|w| spread(&w));
        let [bare_cpu, floor_cpu, att_cpu] = cpus.map(|c| spread(&c));
        // The target's CPU time (both threads, user and system: the uprobes
        // and programs run in its context) is what profiling adds to it;
        // unlike wall time it does not count other processes' time on the
        // shared cores.
        let per_sample = |cpu: f64| (cpu - bare_cpu.0) / samples * 1e6;
        println!(
            "{samples:.0} sampled allocations (and as many frees) per run: {:.0}k sampled \
             events/s bare",
            2.0 * samples / bare.0 / 1e3
        );
        println!(
            "| setup | wall s | wall ratio | target CPU s | CPU ratio | CPU added per sample |"
        );
        println!("|---|---|---|---|---|---|");
        for (name, w, c) in [
            ("liballocprof.so alone", bare, bare_cpu),
            (
                "+ empty bpftrace programs on both probes (uprobe floor)",
                floor,
                floor_cpu,
            ),
            ("+ allocprof --pid", att, att_cpu),
        ] {
            println!(
                "| {name} | {:.3} ({:.3}–{:.3}) | {:.3} | {:.3} ({:.3}–{:.3}) | {:.3} | {:.2} µs |",
                w.0,
                w.1,
                w.2,
                w.0 / bare.0,
                c.0,
                c.1,
                c.2,
                c.0 / bare_cpu.0,
                per_sample(c.0)
            );
        }
        if !parts {
            return Ok(());
        }
        let added = per_sample(att_cpu.0);
        let uprobes = per_sample(floor_cpu.0) - 2.0 * floor_prog_ns / 1e3;
        let rest = added - uprobes - (alloc_ns + free_ns) / 1e3;
        println!("the target's CPU added per sample (one alloc and one free), in parts:");
        println!("| part | µs |");
        println!("|---|---|");
        println!(
            "| uprobe entry and exit, alloc and free (floor minus its programs) | {uprobes:.2} |"
        );
        println!(
            "| eBPF alloc program (stack walk included) | {:.2} |",
            alloc_ns / 1e3
        );
        println!("| eBPF free program | {:.2} |", free_ns / 1e3);
        println!("| the rest: the target's own code slowed (by difference) | {rest:.2} |");
        println!("| **total added to the target** | **{added:.2}** |");
        println!(
            "allocprof's own CPU, on the same two cores: {:.2} µs per sample",
            median(tool_cpu).unwrap_or(0.0) / samples * 1e6
        );
        Ok(())
    }

    fn once(&self, rate: Option<&str>, tool: Tool, stats: bool) -> Result<Run> {
        let mut cmd = Command::new(&self.program);
        cmd.args(["2", self.steps])
            .env("LD_PRELOAD", &self.preload)
            .env_remove("ALLOCPROF_RATE")
            .stdin(Stdio::piped())
            .stdout(Stdio::null());
        if let Some(rate) = rate {
            cmd.env("ALLOCPROF_RATE", rate);
        }
        let mut w = cmd.spawn().context("starting peers_churn")?;
        let pid = w.id().to_string();
        let holder = match tool {
            Tool::Bare => None,
            Tool::Floor => Some(self.floor(&pid)?),
            Tool::Allocprof => Some(attached(
                Command::new(&self.allocprof)
                    .args(["--pid", &pid, "-f", "json", "-o"])
                    .arg(self.program.with_extension("json"))
                    .stdout(Stdio::null()),
            )?),
        };
        // The tables of the churn's files take milliseconds to load.
        thread::sleep(Duration::from_millis(500));
        let stats = if stats { BpfStats::enable() } else { None };
        let before = holder.as_ref().map(|h| held(h.id())).unwrap_or_default();
        let cpu0 = holder.as_ref().map_or(Ok(0), |h| cpu_ticks(h.id()))?;
        let t0 = Instant::now();
        writeln!(w.stdin.take().expect("piped"), "go")?;
        let (ok, target_cpu) = wait_cpu(&w)?;
        let wall = t0.elapsed().as_secs_f64();
        let mut run = Run {
            wall,
            target_cpu,
            cpu: 0.0,
            progs: Vec::new(),
        };
        if let Some(mut h) = holder {
            run.cpu = ticks_secs(cpu_ticks(h.id())? - cpu0);
            if stats.is_some() {
                let after = held(h.id());
                for (name, t1, n1) in after {
                    let (t0, n0) = before
                        .iter()
                        .find(|b| b.0 == name)
                        .map_or((0.0, 0.0), |b| (b.1, b.2));
                    if n1 > n0 {
                        run.progs.push((name, n1 - n0, (t1 - t0) / (n1 - n0)));
                    }
                }
            }
            drop(stats);
            if tool == Tool::Floor {
                // SAFETY: kill has no memory-safety preconditions; the pid
                // is our child's, not yet reaped.
                unsafe { libc::kill(h.id() as libc::pid_t, libc::SIGINT) };
            }
            // allocprof --pid stops once its target has exited.
            h.wait()?;
        }
        if !ok {
            bail!("peers_churn failed");
        }
        Ok(run)
    }

    /// Empty programs on the library's alloc and free probes, for `pid`.
    fn floor(&self, pid: &str) -> Result<Child> {
        let lib = self.preload.to_string_lossy();
        let script = format!(
            "BEGIN {{ printf(\"attached\\n\"); }} \
             usdt:{lib}:otel_memory:alloc {{ }} usdt:{lib}:otel_memory:free {{ }}"
        );
        let mut child = Command::new("bpftrace")
            .args(["-B", "none", "-p", pid, "-e", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting bpftrace")?;
        let mut out = std::io::BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        while !line.contains("attached") {
            line.clear();
            if std::io::BufRead::read_line(&mut out, &mut line)? == 0 {
                let _ = child.kill();
                let _ = child.wait();
                bail!("bpftrace did not attach");
            }
        }
        thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        Ok(child)
    }
}

/// (name, run_time_ns, run_cnt) of every program `pid` holds open, from
/// `bpftool prog show` (the counters are there while the statistics are on).
fn held(pid: u32) -> Vec<(String, f64, f64)> {
    let ids = prog_ids(pid);
    let Ok(out) = Command::new("bpftool").args(["prog", "show"]).output() else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| {
            l.split(':')
                .next()
                .and_then(|id| id.trim().parse::<u64>().ok())
                .is_some_and(|id| ids.contains(&id))
        })
        .filter_map(|l| {
            let field = |key: &str| {
                l.split_whitespace()
                    .skip_while(|w| *w != key)
                    .nth(1)
                    .map(str::to_owned)
            };
            let num = |key: &str| field(key).and_then(|v| v.parse::<f64>().ok());
            Some((
                field("name")?,
                num("run_time_ns").unwrap_or(0.0),
                num("run_cnt").unwrap_or(0.0),
            ))
        })
        .collect()
}

/// Reaps `child` (never waited for otherwise): whether it exited with
/// status 0, and its CPU seconds (all threads, user + system).
fn wait_cpu(child: &Child) -> Result<(bool, f64)> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, not yet reaped; both pointers are
    // to locals that outlive the call.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    if pid < 0 {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    Ok((ok, secs(usage.ru_utime) + secs(usage.ru_stime)))
}

fn ticks_secs(ticks: u64) -> f64 {
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn median(v: Vec<f64>) -> Option<f64> {
    (!v.is_empty()).then(|| crate::bench_alloc::median(&v))
}

/// (median, min, max).
fn spread(v: &[f64]) -> (f64, f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (median(v.to_vec()).unwrap_or(f64::NAN), min, max)
}

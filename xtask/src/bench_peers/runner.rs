//! Running one workload once under one setup: the allocator preloaded, the
//! tool (allocprof, heaptrack, bpftrace) started and attached, and the wall
//! time from the workload's input to its exit.

use std::{
    fs::{self, File},
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::workloads::Invocation;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    None,
    /// `allocprof --pid` with these arguments too, attached once the
    /// workload waits for its input.
    AllocprofPid(&'static [&'static str]),
    /// `allocprof` system-wide, attached before the workload starts.
    AllocprofAll,
    /// `heaptrack -o FILE program`.
    Heaptrack,
    /// bpftrace uprobes on the workload's libc malloc/calloc/realloc/free.
    Bpftrace,
}

pub struct Setup {
    pub name: &'static str,
    pub preload: Option<PathBuf>,
    pub env: Vec<(&'static str, String)>,
    pub tool: Tool,
    /// Run on the churns only (elsewhere its cells read "–").
    pub churn_only: bool,
}

impl Setup {
    /// Whether it intercepts every malloc and free (run on the small sizes).
    pub fn slow(&self) -> bool {
        matches!(self.tool, Tool::Heaptrack | Tool::Bpftrace)
    }
}

/// What the runs share: allocprof's binary and a directory for outputs.
pub struct Runner {
    pub allocprof: PathBuf,
    pub dir: PathBuf,
}

/// Variables of ours or of the peers that must not leak into a run.
pub(super) const CLEARED: &[&str] = &[
    "LD_PRELOAD",
    "ALLOCPROF_RATE",
    "ALLOCPROF_MAX_EVENT_RATE",
    "MALLOC_CONF",
    "TCMALLOC_SAMPLE_PARAMETER",
    "PYTHONMALLOC",
];

/// A memleak-style tracer: the size of each live block, by pointer.
const BPFTRACE: &str = r#"
BEGIN { printf("attached\n"); }
uprobe:LIBC:malloc /pid == PID/ { @size[tid] = arg0; }
uprobe:LIBC:calloc /pid == PID/ { @size[tid] = arg0 * arg1; }
uprobe:LIBC:realloc /pid == PID/ { delete(@live[arg0]); @size[tid] = arg1; }
uretprobe:LIBC:malloc, uretprobe:LIBC:calloc, uretprobe:LIBC:realloc /pid == PID/ {
    @live[retval] = @size[tid];
    delete(@size[tid]);
}
uprobe:LIBC:free /pid == PID/ { delete(@live[arg0]); }
END { clear(@live); clear(@size); }
"#;

/// One run of a workload under a setup.
pub struct Run {
    /// Seconds from writing the workload's input to its exit.
    pub secs: f64,
    /// The CPU seconds allocprof used meanwhile (when it ran).
    pub cpu: Option<f64>,
    /// Sampled events (allocations and frees) allocprof `--pid` saw, from
    /// its JSON report.
    pub events: Option<u64>,
    /// The workload's own CPU seconds (user and system) over the same span,
    /// when the workload is the child itself: what attaching costs it,
    /// uprobe handlers included (they run on its threads), less swayed by
    /// the machine's other load than its wall time.
    pub workload_cpu: Option<f64>,
}

impl Runner {
    /// Runs `inv` under `s` once.
    pub fn once(&self, inv: &Invocation, s: &Setup) -> Result<Run> {
        let system_wide = match s.tool {
            Tool::AllocprofAll => Some(self.allocprof(&[])?),
            _ => None,
        };
        let log = self.dir.join("workload.stderr");
        let mut cmd = match s.tool {
            Tool::Heaptrack => {
                let mut c = Command::new("heaptrack");
                c.arg("-o").arg(self.dir.join("heaptrack.data"));
                c.arg(&inv.program);
                c
            }
            _ => Command::new(&inv.program),
        };
        cmd.args(&inv.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(File::create(&log)?);
        for v in CLEARED {
            cmd.env_remove(v);
        }
        if let Some(p) = &s.preload {
            cmd.env("LD_PRELOAD", p);
        }
        for (k, v) in &s.env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", inv.program.display()))?;
        let pid = match waiting_for_input(child.id(), &inv.program) {
            Ok(pid) => pid,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        let tool = match s.tool {
            Tool::AllocprofPid(extra) => {
                let pid = pid.to_string();
                let mut args = vec!["--pid", &pid];
                args.extend(extra);
                Some(self.allocprof(&args)?)
            }
            Tool::Bpftrace => Some(self.bpftrace(pid)?),
            _ => None,
        };
        let profiler = match s.tool {
            Tool::AllocprofPid(_) => tool.as_ref(),
            _ => system_wide.as_ref(),
        };
        let cpu0 = profiler.and_then(|p| cpu_secs(p.id()).ok());
        let own = (pid == child.id()).then(|| cpu_secs(pid).ok()).flatten();
        let t0 = Instant::now();
        let mut stdin = child.stdin.take().expect("piped");
        stdin
            .write_all(&inv.input)
            .context("feeding the workload")?;
        drop(stdin);
        // Its CPU is read from its /proc entry once it exited and before
        // it is reaped.
        let workload_cpu = match own {
            Some(c0) => exited(pid)
                .ok()
                .and_then(|()| cpu_secs(pid).ok())
                .map(|c1| c1 - c0),
            None => None,
        };
        let status = child.wait()?;
        let secs = t0.elapsed().as_secs_f64();
        // allocprof's CPU while the workload ran (its start-up excluded).
        let cpu = match (&profiler, cpu0) {
            (Some(p), Some(c0)) => cpu_secs(p.id()).ok().map(|c1| c1 - c0),
            _ => None,
        };
        if let Some(tool) = tool {
            stop(tool, s.tool == Tool::Bpftrace, "the tool")?;
        }
        let events = match s.tool {
            Tool::AllocprofPid(_) => Some(sampled_events(&self.dir.join("allocprof.json"))?),
            _ => None,
        };
        if let Some(p) = system_wide {
            stop(p, true, "allocprof")?;
        }
        if !status.success() {
            let err = fs::read_to_string(&log).unwrap_or_default();
            bail!(
                "{} under {} failed: {status}: {err}",
                inv.program.display(),
                s.name
            );
        }
        if s.tool == Tool::Heaptrack {
            for e in fs::read_dir(&self.dir)?.flatten() {
                if e.file_name()
                    .to_string_lossy()
                    .starts_with("heaptrack.data")
                {
                    fs::remove_file(e.path())?;
                }
            }
        }
        Ok(Run {
            secs,
            cpu,
            events,
            workload_cpu,
        })
    }

    /// allocprof, headless, once it says it attached.
    fn allocprof(&self, args: &[&str]) -> Result<Child> {
        let out = self.dir.join("allocprof.json");
        // Not an earlier run's report, should this one write none.
        let _ = fs::remove_file(&out);
        let mut cmd = Command::new(&self.allocprof);
        cmd.args(args).args(["-f", "json", "-o"]).arg(out);
        attached(cmd, true, "allocprof")
    }

    /// bpftrace on the libc that process `pid` maps, once it attached.
    fn bpftrace(&self, pid: u32) -> Result<Child> {
        let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
        let libc = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.ends_with("/libc.so.6"))
            .context("the workload maps no libc.so.6")?;
        let script = self.dir.join("memleak.bt");
        let text = BPFTRACE
            .replace("LIBC", libc)
            .replace("PID", &pid.to_string());
        fs::write(&script, text)?;
        let mut cmd = Command::new("bpftrace");
        cmd.args(["-B", "none", "-p", &pid.to_string()])
            .arg(&script)
            // Room for every live block of the workloads (the default is 4096).
            .env("BPFTRACE_MAP_KEYS_MAX", "1048576")
            .stderr(File::create(self.dir.join("bpftrace.stderr"))?);
        attached(cmd, false, "bpftrace")
    }
}

type Pipe = Box<dyn std::io::Read + Send>;

/// Starts `cmd` with stdout (and with `on_stderr`, stderr) piped, reads that
/// stream until a line says `attached`, then drains the pipes in the
/// background so the tool never blocks on them.
fn attached(mut cmd: Command, on_stderr: bool, what: &str) -> Result<Child> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    if on_stderr {
        cmd.stderr(Stdio::piped());
    }
    let mut child = cmd.spawn().with_context(|| format!("starting {what}"))?;
    let stream: Pipe = if on_stderr {
        Box::new(child.stderr.take().expect("piped"))
    } else {
        Box::new(child.stdout.take().expect("piped"))
    };
    let mut lines = BufReader::new(stream);
    let mut said = String::new();
    loop {
        let mut line = String::new();
        if lines.read_line(&mut line)? == 0 {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} did not attach: {said}");
        }
        said.push_str(&line);
        if line.contains("attached") {
            break;
        }
    }
    thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
    if let Some(mut out) = child.stdout.take() {
        thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    }
    Ok(child)
}

/// Waits for a tool to finish: after SIGINT if `interrupt`, else on its own
/// (allocprof `--pid` stops when its target exits).
fn stop(mut child: Child, interrupt: bool, what: &str) -> Result<()> {
    if interrupt {
        // SAFETY: kill has no memory-safety preconditions; the pid is our
        // child's, not yet reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{what} failed: {status}");
    }
    Ok(())
}

/// The sampled allocations and frees an allocprof JSON report saw, all its
/// processes together (`alloc_events` + `free_events` of each,
/// docs/json-schema.md). xtask has no JSON crate: the keys are unique to
/// `Process` and their values plain integers.
fn sampled_events(report: &Path) -> Result<u64> {
    let text = fs::read_to_string(report)
        .with_context(|| format!("reading allocprof's report {}", report.display()))?;
    let mut sum = 0;
    for key in ["\"alloc_events\":", "\"free_events\":"] {
        let values: Vec<u64> = text
            .split(key)
            .skip(1)
            .map(|rest| {
                let rest = rest.trim_start();
                let end = rest
                    .find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(rest.len());
                rest[..end].parse::<u64>()
            })
            .collect::<Result<_, _>>()
            .with_context(|| format!("{key} in {}", report.display()))?;
        if values.is_empty() {
            bail!("no {key} in {}", report.display());
        }
        sum += values.iter().sum::<u64>();
    }
    Ok(sum)
}

/// CPU seconds (user + system) process `pid` has used so far.
/// Waits for child `pid` to exit, leaving it unreaped (a zombie whose
/// /proc entry still holds its CPU times).
fn exited(pid: u32) -> Result<()> {
    loop {
        // SAFETY: an all-zero siginfo_t is a valid value for waitid to fill.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid, writable siginfo_t; WNOWAIT leaves the
        // child for `Child::wait` to reap.
        let r = unsafe { libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).context("waiting for the workload");
        }
    }
}

fn cpu_secs(pid: u32) -> Result<f64> {
    let ticks = crate::bench_pipeline::cpu_ticks(pid)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks as f64 / hz)
}

/// The process, `root` or one of its descendants, running `program` and
/// blocked reading its stdin: ready for its input.
fn waiting_for_input(root: u32, program: &Path) -> Result<u32> {
    let exe = fs::canonicalize(program)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for pid in tree(root) {
            let runs = fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e == exe);
            let reading = fs::read_to_string(format!("/proc/{pid}/syscall"))
                .is_ok_and(|s| s.starts_with("0 0x0 "));
            if runs && reading {
                return Ok(pid);
            }
        }
        if Instant::now() > deadline {
            bail!("{} never waited for its input", program.display());
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// `root` and its descendants.
fn tree(root: u32) -> Vec<u32> {
    let mut parent = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split(' ').nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent.push((pid, ppid));
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found
}

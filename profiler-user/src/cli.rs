//! Command line and the checks that precede any kernel work.

use std::{path::PathBuf, time::Duration};

pub use allocprof::output::export::Format;
use allocprof::{
    kernel::Limits, model::stats::Quantity, output::export, output::report::ReportOptions,
    session::Target,
};
use clap::{
    Args, CommandFactory, Parser, Subcommand, ValueEnum,
    builder::{PossibleValue, PossibleValuesParser, TypedValueParser},
    error::ErrorKind,
};
use thiserror::Error;

/// allocprof: a heap profiler for processes that carry the `otel_memory`
/// (or `ddheap`) USDT probes (run them with LD_PRELOAD=liballocprof.so, or
/// build them with the allocprof Rust global allocator).
///
/// With no --pid, every process carrying the probes is profiled, including
/// processes started later. When stdout is not a terminal, or with
/// --duration or --output, allocprof runs headless and prints a report (or
/// the chosen format) at the end.
#[derive(Parser, Debug)]
#[command(name = "allocprof", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub targets: TargetArgs,

    /// Stop after this long (e.g. 30s, 2m) and report.
    #[arg(short, long, value_name = "D", value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// How often to read the kernel's aggregates (and refresh the live view).
    #[arg(long, value_name = "D", default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,

    /// Output format; in the live view, what its export key writes.
    #[arg(short, long, default_value = "report", value_parser = choice(&Format::ALL, Format::name, Format::summary))]
    pub format: Format,

    /// Write the output to this file instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// The quantity folded stacks and flamegraphs are weighted by.
    #[arg(long, default_value = "inuse-bytes", value_parser = choice(&Quantity::ALL, Quantity::name, Quantity::summary))]
    pub value: Quantity,

    /// Stacks shown per process in the report.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,

    /// Exports merge each --pid tree into one profile (the same stack in
    /// every worker adds up) instead of one per process.
    #[arg(long)]
    pub merge_tree: bool,
}

/// Above this the preallocated live table (GiBs of kernel memory) fails to
/// load with an error that reads like a missing kernel feature.
const MAX_LIVE_SAMPLES: u32 = 1 << 24;

/// Which processes to profile, and the kernel's memory caps.
#[derive(Args, Debug)]
pub struct TargetArgs {
    /// Profile this process and its descendants, those running now and
    /// those it forks or spawns later (repeatable: each brings its own
    /// tree); by default every process carrying the probes, including those
    /// started later.
    #[arg(short, long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// With --pid: profile the named processes only, not their children.
    #[arg(long, requires = "pids")]
    pub no_children: bool,

    /// System-wide: a library or program carrying the probes to arm at
    /// start (repeatable), so processes that load it later are covered from
    /// their first allocation. The liballocprof libraries next to allocprof
    /// are armed by default.
    #[arg(long, value_name = "PATH", conflicts_with = "pids")]
    pub probe_file: Vec<PathBuf>,

    /// Cap on live samples kept in the kernel, over all processes (the
    /// table is preallocated: about 100 bytes of kernel memory each);
    /// samples over it are counted as drops.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_live_samples,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LIVE_SAMPLES)))]
    pub max_live_samples: u32,

    /// Cap on live samples kept in the kernel per process; samples over it
    /// are counted as drops.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_live_per_process,
          value_parser = clap::value_parser!(u64).range(1..=u64::from(MAX_LIVE_SAMPLES)))]
    pub max_live_per_process: u64,

    /// Per process, new distinct stacks the kernel files per second past
    /// a start-up burst; samples of further new stacks are kept under the
    /// process's "[stack flood]" stack and counted. A stack seen before
    /// always resolves. Bounds what code without frame pointers (whose
    /// unwinds yield garbage stacks) can take of the shared stack table.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_new_stacks_per_second,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub max_new_stacks_per_second: u64,

    /// The start-up burst of `--max-new-stacks-per-second`.
    #[arg(long, value_name = "N", default_value_t = Limits::default().new_stacks_burst,
          value_parser = clap::value_parser!(u64).range(1..=profiler_common::MAX_NEW_STACKS_BURST))]
    pub new_stacks_burst: u64,

    /// Back-pressure: per process, at most about N sampled allocations a
    /// second go through the kernel's stack walk and tables; past that, one
    /// in a power of two is kept and counts for the others (estimates stay
    /// unbiased, intervals widen). 0 (the default): no limit.
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000_000))]
    pub max_event_rate: u64,

    /// Rows of unwind tables the kernel holds for all files (16 bytes each,
    /// preallocated); a file whose table does not fit is named in a warning
    /// and walked by frame pointers. 0 turns unwind tables off: stacks are
    /// walked by frame pointers only, cheaper per sample for programs built
    /// with them, but code built without them loses its callers.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_unwind_rows,
          value_parser = clap::value_parser!(u32).range(0..=1 << 24))]
    pub max_unwind_rows: u32,

    /// Python frames in the stacks of CPython processes (3.11, 3.12, 3.13;
    /// later ones untested): each allocating thread's own interpreter
    /// frames, walked by the kernel. Off: native frames only.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub python: Switch,

    /// Memory allocprof keeps for processes that exited or exec'ed (their
    /// figures and symbolized stacks, estimated); past it the oldest are no
    /// longer shown.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    pub max_gone_memory: u64,

    /// Live figures, in every view and export, count only allocations live
    /// for at least this long (e.g. 5s, 10m): a leak's bytes stay, a
    /// churning cache's go. Exited processes keep what they held.
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    pub min_age: Option<Duration>,

    /// OOM flight recorder: when the kernel's OOM killer kills a profiled
    /// process, write its heap at that moment (pprof and the text report)
    /// into this directory, named by process, pid and time.
    #[arg(long, value_name = "DIR")]
    pub oom_dir: Option<PathBuf>,

    /// Profiles --oom-dir keeps: the newest N (the oldest are removed).
    #[arg(long, value_name = "N", default_value_t = allocprof::oom::DEFAULT_KEEP,
          value_parser = clap::value_parser!(u64).range(1..=100_000).map(|n| n as usize))]
    pub oom_keep: usize,

    /// Show the kernel programs' diagnostics as warnings: where the stack
    /// unwinder cuts a walk short (no table for the code, a rule it cannot
    /// apply), logged for a process's 1st, 2nd, 4th, 8th... such walk.
    #[arg(short, long)]
    pub verbose: bool,
}

/// The libraries armed in system-wide mode without `--probe-file`.
pub const DEFAULT_PROBE_FILES: [&str; 2] = ["liballocprof.so", "liballocprof_glibc.so"];

impl TargetArgs {
    /// Explicit probe files, then the default ones next to our executable.
    pub fn probe_files(&self) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let beside = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(std::path::Path::to_path_buf));
        let defaults = beside
            .map(|dir| DEFAULT_PROBE_FILES.iter().map(|f| dir.join(f)).collect())
            .unwrap_or_default();
        (self.probe_file.clone(), defaults)
    }

    pub fn target(&self) -> Target {
        if self.pids.is_empty() {
            Target::All
        } else {
            // The command line's numbers become our pids here.
            let pids = self.pids.iter().map(|&p| allocprof::ids::Pid(p)).collect();
            if self.no_children {
                Target::Pids(pids)
            } else {
                Target::Trees(pids)
            }
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_live_samples: self.max_live_samples,
            max_live_per_process: self.max_live_per_process,
            max_new_stacks_per_second: self.max_new_stacks_per_second,
            new_stacks_burst: self.new_stacks_burst,
            max_event_rate: self.max_event_rate,
            max_unwind_rows: self.max_unwind_rows,
            diagnostics: self.verbose,
            python: self.python == Switch::On,
            ..Limits::default()
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    Record(RecordArgs),
    Diff(DiffArgs),
    Agent(AgentArgs),
}

/// Run headless until stopped, pushing heap profiles over OTLP (HTTP or
/// gRPC) to an OpenTelemetry Collector.
///
/// Every --push-interval, one export: per process, the live heap
/// (inuse_space, inuse_objects) and what it allocated since the previous
/// export (alloc_space, alloc_objects). Exports are queued and sent apart
/// from profiling, retried when the collector says so; SIGTERM and SIGINT
/// push one last export, drain the queue for up to the export timeout, then
/// exit. The OTEL_EXPORTER_OTLP_* variables (endpoint, protocol, headers,
/// compression, timeout, certificates) apply; the flags override them.
#[derive(Args, Debug)]
pub struct AgentArgs {
    #[command(flatten)]
    pub targets: TargetArgs,

    /// The collector's base endpoint (e.g. http://127.0.0.1:4318, or
    /// https://); OTLP/HTTP posts to its /v1development/profiles. Overrides
    /// OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT
    /// [default: http://localhost:4318, or :4317 for gRPC].
    #[arg(long, value_name = "URL", value_parser = parse_endpoint)]
    pub otlp_endpoint: Option<String>,

    /// How often to export.
    #[arg(long, value_name = "D", default_value = "15s", value_parser = parse_duration)]
    pub push_interval: Duration,

    /// Stop after this long (one last export first); otherwise at Ctrl-C,
    /// SIGTERM, or when every --pid target has exited.
    #[arg(short, long, value_name = "D", value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Export each process's command line (process.command_line); off by
    /// default, as command lines hold secrets.
    #[arg(long)]
    pub otlp_command_line: bool,

    /// Send addresses, mappings and GNU build ids only, no function names,
    /// for backends that symbolize server-side (allocprof then symbolizes
    /// nothing).
    #[arg(long)]
    pub no_symbolize: bool,

    #[command(flatten)]
    pub otlp: OtlpArgs,
}

/// The agent's transport flags (overriding the `OTEL_EXPORTER_OTLP_*`
/// variables).
#[derive(Args, Debug)]
pub struct OtlpArgs {
    /// The OTLP protocol; overrides OTEL_EXPORTER_OTLP_PROTOCOL [default:
    /// http/protobuf].
    #[arg(long, value_parser = ["grpc", "http/protobuf"])]
    pub otlp_protocol: Option<String>,

    /// A header (gRPC metadata) sent with each export, e.g.
    /// authorization=Bearer%20TOKEN (repeatable; the value percent-decoded);
    /// added to OTEL_EXPORTER_OTLP_HEADERS, replacing the same keys.
    #[arg(long, value_name = "K=V")]
    pub otlp_header: Vec<String>,

    /// Memory for exports waiting to be sent; when full, the oldest is
    /// dropped (and counted).
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    pub otlp_queue_bytes: u64,
}

fn parse_endpoint(s: &str) -> Result<String, String> {
    allocprof::agent::config::parse_url(s)
        .map(|_| s.to_owned())
        .map_err(|why| format!("{s}: {why}"))
}

/// Profile, then write pprof heap profiles (for `go tool pprof`).
///
/// With --interval, numbered snapshots, to compare with
/// `go tool pprof -base A B` or `allocprof diff A B`.
#[derive(Args, Debug)]
pub struct RecordArgs {
    #[command(flatten)]
    pub targets: TargetArgs,

    /// Stop after this long (e.g. 30s, 2m); otherwise at Ctrl-C, SIGTERM, or
    /// when every --pid target has exited.
    #[arg(short, long, value_name = "D", value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Write a snapshot this often, numbered: -o heap.pb.gz writes
    /// heap.0001.pb.gz, heap.0002.pb.gz, ... and one at the stop; no longer
    /// than --duration.
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    pub interval: Option<Duration>,

    /// The pprof file to write (gzip'd profile.proto).
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
}

/// The growth between two pprof profiles written by allocprof (B minus A).
///
/// Per process and stack. The flamegraph and folded stacks show the stacks
/// that grew, widths proportional to the growth; pprof keeps negative growth
/// too. Needs no privileges.
#[derive(Args, Debug)]
pub struct DiffArgs {
    /// The earlier profile (e.g. heap.0001.pb.gz).
    #[arg(value_name = "A")]
    pub base: PathBuf,

    /// The later profile (e.g. heap.0002.pb.gz).
    #[arg(value_name = "B")]
    pub profile: PathBuf,

    /// Output format.
    #[arg(short, long, value_enum, default_value_t = DiffFormat::Svg)]
    pub format: DiffFormat,

    /// The quantity whose growth is shown (svg, collapsed).
    #[arg(long, default_value = "inuse-bytes", value_parser = choice(&Quantity::ALL, Quantity::name, Quantity::summary))]
    pub value: Quantity,

    /// Write the output to this file instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Refuse profiles larger than this uncompressed (e.g. 64MiB, 512M,
    /// 1G); raise it for a profile too large for the default. Decoding
    /// takes a few times this much memory at worst.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    pub max_profile_bytes: u64,
}

/// A feature on or off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DiffFormat {
    /// Flamegraph of the stacks that grew.
    Svg,
    /// Folded stacks of the stacks that grew.
    Collapsed,
    /// pprof profile of the differences (negative where memory shrank).
    Pprof,
}

impl From<DiffFormat> for Format {
    fn from(f: DiffFormat) -> Format {
        match f {
            DiffFormat::Svg => Format::Svg,
            DiffFormat::Collapsed => Format::Collapsed,
            DiffFormat::Pprof => Format::Pprof,
        }
    }
}

/// `heap.pb.gz`, 3 → `heap.0003.pb.gz`; `heap.pprof` → `heap.0003.pprof`;
/// `heap` → `heap.0003`. Four digits keep the names sorted for a day of
/// 30 s snapshots; more digits are used past 9999.
pub fn numbered(path: &std::path::Path, n: u32) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let split = name
        .strip_suffix(".pb.gz")
        .map(|stem| (stem, ".pb.gz"))
        .or_else(|| {
            name.rfind('.')
                .filter(|&i| i > 0)
                .map(|i| (&name[..i], &name[i..]))
        })
        .unwrap_or((name.as_str(), ""));
    path.with_file_name(format!("{}.{n:04}{}", split.0, split.1))
}

/// Refuses, as a usage error (exit 2), binary output to a terminal.
/// `record --interval` longer than `--duration` would never take a snapshot
/// in between: a usage error.
pub fn refuse_interval_beyond_duration(interval: Duration, duration: Option<Duration>) {
    if let Some(d) = duration
        && interval > d
    {
        Cli::command()
            .error(
                ErrorKind::ArgumentConflict,
                format!(
                    "--interval {} is longer than --duration {}: no snapshot would be taken in between",
                    humantime::format_duration(interval),
                    humantime::format_duration(d)
                ),
            )
            .exit();
    }
}

pub fn refuse_binary_to_terminal(format: Format, output: Option<&std::path::Path>) {
    use std::io::IsTerminal;
    if format.is_binary() && output.is_none() && std::io::stdout().is_terminal() {
        Cli::command()
            .error(
                ErrorKind::ArgumentConflict,
                "--format pprof writes binary data: give --output FILE or redirect stdout",
            )
            .exit();
    }
}

impl Cli {
    pub fn export_options(&self) -> export::Options {
        export::Options {
            value: self.value,
            report: self.report_options(),
            merge_tree: self.merge_tree,
            ..Default::default()
        }
    }

    pub fn report_options(&self) -> ReportOptions {
        ReportOptions {
            top: self.top,
            ..ReportOptions::default()
        }
    }
}

/// Durations and intervals are bounded so timers and deadlines cannot
/// overflow or spin: from 1 ms to 100 years.
const MIN_DURATION: Duration = Duration::from_millis(1);
/// 100 years as humantime counts them (365.25 days).
const MAX_DURATION: Duration = Duration::from_secs(3_155_760_000);

/// A parser over the names of a library enum's values, each with its help:
/// clap stays in the binary.
fn choice<T: Copy + Send + Sync + 'static>(
    all: &'static [T],
    name: fn(T) -> &'static str,
    help: fn(T) -> &'static str,
) -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(
        all.iter()
            .map(|&v| PossibleValue::new(name(v)).help(help(v))),
    )
    .map(move |s| {
        *all.iter()
            .find(|&&v| name(v) == s)
            .expect("clap passes only listed names")
    })
}

/// `4096`, `64K`, `64KiB`, `512M`, `1G`: bytes, binary multiples.
fn parse_size(s: &str) -> Result<u64, String> {
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(format!("{s}: not a size (examples: 64MiB, 512M, 1G)")),
    };
    number
        .parse::<u64>()
        .ok()
        .filter(|&n| n > 0)
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("{s}: not a size (examples: 64MiB, 512M, 1G)"))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let parsed = match s.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 => {
            Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
        }
        Ok(_) => return Err(format!("{s}: a duration must be positive")),
        Err(_) => humantime::parse_duration(s)
            .map_err(|e| format!("{s}: {e} (examples: 30s, 2m, 500ms)"))?,
    };
    if parsed < MIN_DURATION {
        return Err(format!("{s}: too short; the shortest is 1ms"));
    }
    if parsed > MAX_DURATION {
        return Err(format!("{s}: too long; the longest is 100 years"));
    }
    Ok(parsed)
}

#[derive(Debug, Error)]
pub enum Precondition {
    #[error(
        "allocprof needs root, or the capabilities CAP_BPF and CAP_PERFMON, to load its \
         kernel programs: run it with sudo"
    )]
    Privileges,
    #[error("this kernel lacks {0}; allocprof needs a kernel with BPF, BTF and uprobes")]
    Kernel(&'static str),
}

/// Fails early, with the cause, where profiling cannot work at all.
pub fn check_preconditions() -> Result<(), Precondition> {
    if !std::path::Path::new("/sys/bus/event_source/devices/uprobe/type").exists() {
        return Err(Precondition::Kernel(
            "the uprobe perf PMU (CONFIG_UPROBE_EVENTS)",
        ));
    }
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err(Precondition::Kernel("BTF (CONFIG_DEBUG_INFO_BTF)"));
    }
    if !has_bpf_privileges() {
        return Err(Precondition::Privileges);
    }
    Ok(())
}

fn has_bpf_privileges() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let eff = std::fs::read_to_string("/proc/self/status")
        .map_or(0, |s| allocprof::process::discover::effective_caps(&s));
    let has = |cap: u32| eff & (1 << cap) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

#[cfg(test)]
mod tests;

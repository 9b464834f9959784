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
}

/// Above this the preallocated live table (GiBs of kernel memory) fails to
/// load with an error that reads like a missing kernel feature.
const MAX_LIVE_SAMPLES: u32 = 1 << 24;

/// Which processes to profile, and the kernel's memory caps.
#[derive(Args, Debug)]
pub struct TargetArgs {
    /// Profile only this process (repeatable); by default every process
    /// carrying the probes, including those started later.
    #[arg(short, long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

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
            Target::Pids(self.pids.iter().map(|&p| allocprof::ids::Pid(p)).collect())
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

/// Run headless until stopped, pushing heap profiles over OTLP/HTTP
/// (protobuf) to an OpenTelemetry Collector.
///
/// Every --push-interval, one export: per process, the live heap
/// (inuse_space, inuse_objects) and what it allocated since the previous
/// export (alloc_space, alloc_objects). SIGTERM and SIGINT push one last
/// export, then exit. No TLS, retries or queue yet: a failed export is
/// reported and dropped.
#[derive(Args, Debug)]
pub struct AgentArgs {
    #[command(flatten)]
    pub targets: TargetArgs,

    /// The collector's OTLP/HTTP endpoint (e.g. http://127.0.0.1:4318);
    /// profiles go to its /v1development/profiles.
    #[arg(long, value_name = "URL", value_parser = parse_http_endpoint)]
    pub otlp_endpoint: String,

    /// How often to export.
    #[arg(long, value_name = "D", default_value = "15s", value_parser = parse_duration)]
    pub push_interval: Duration,

    /// Stop after this long (one last export first); otherwise at Ctrl-C,
    /// SIGTERM, or when every --pid target has exited.
    #[arg(short, long, value_name = "D", value_parser = parse_duration)]
    pub duration: Option<Duration>,
}

fn parse_http_endpoint(s: &str) -> Result<String, String> {
    match s.strip_prefix("http://") {
        Some(rest) if !rest.is_empty() => Ok(s.to_owned()),
        _ => Err("an http:// URL (TLS is not supported yet)".into()),
    }
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
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("soon").unwrap_err().contains("examples"));
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("8 KiB"), Ok(8 << 10));
        for bad in ["", "0", "-1", "1T", "MiB", "99999999999999999999G"] {
            assert!(parse_size(bad).unwrap_err().contains("examples"), "{bad}");
        }
        let cli = Cli::try_parse_from(["allocprof", "diff", "a", "b"]).unwrap();
        let Some(Command::Diff(d)) = cli.command else {
            panic!("diff")
        };
        assert_eq!(d.max_profile_bytes, export::pprof::MAX_PROFILE_BYTES);
        let cli = Cli::try_parse_from(["allocprof", "-v"]).unwrap();
        assert!(cli.targets.limits().diagnostics);
        let cli = Cli::try_parse_from(["allocprof"]).unwrap();
        assert!(!cli.targets.limits().diagnostics);
        assert_eq!(
            cli.targets.max_gone_memory,
            allocprof::session::MAX_GONE_MEMORY
        );
    }

    #[test]
    fn durations_out_of_range_are_usage_errors_not_panics() {
        use clap::error::ErrorKind;
        for s in [
            "1e30",
            "1e-10",
            "NaN",
            "inf",
            "-5",
            "0ns",
            "500us",
            "1000000000y",
        ] {
            assert!(parse_duration(s).is_err(), "{s}");
        }
        assert_eq!(parse_duration("1ms"), Ok(Duration::from_millis(1)));
        for caps in [
            ["--max-live-samples", "0"],
            ["--max-live-per-process", "0"],
            ["--max-new-stacks-per-second", "0"],
            ["--new-stacks-burst", "0"],
        ] {
            let err = Cli::try_parse_from(["allocprof", caps[0], caps[1]]).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{caps:?}");
        }
        let huge = Cli::try_parse_from(["allocprof", "--max-live-samples", "4000000000"]);
        assert!(huge.is_err());
        assert_eq!(parse_duration("100y").map(|d| d <= MAX_DURATION), Ok(true));
    }

    #[test]
    fn snapshot_names() {
        let n = |p: &str, i| numbered(std::path::Path::new(p), i);
        assert_eq!(
            n("/tmp/heap.pb.gz", 1),
            PathBuf::from("/tmp/heap.0001.pb.gz")
        );
        assert_eq!(n("heap.pprof", 12), PathBuf::from("heap.0012.pprof"));
        assert_eq!(n("heap", 3), PathBuf::from("heap.0003"));
        assert_eq!(n(".hidden", 3), PathBuf::from(".hidden.0003"));
        assert_eq!(n("h.pb.gz", 12345), PathBuf::from("h.12345.pb.gz"));
    }

    #[test]
    fn subcommands_and_the_plain_form_parse() {
        let cli = Cli::try_parse_from(["allocprof", "--pid", "1", "-f", "svg"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.format, Format::Svg);
        let cli = Cli::try_parse_from([
            "allocprof",
            "record",
            "--pid",
            "1",
            "-d",
            "30s",
            "--interval",
            "10s",
            "-o",
            "h.pb.gz",
        ])
        .unwrap();
        let Some(Command::Record(r)) = cli.command else {
            panic!("not record")
        };
        assert_eq!(r.interval, Some(Duration::from_secs(10)));
        let cli = Cli::try_parse_from(["allocprof", "diff", "a", "b", "-f", "collapsed"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Diff(d)) if d.format == DiffFormat::Collapsed));
        // Top-level options do not mix with subcommands; diff has no json.
        assert!(Cli::try_parse_from(["allocprof", "--pid", "1", "record", "-o", "x"]).is_err());
        assert!(Cli::try_parse_from(["allocprof", "diff", "a", "b", "-f", "json"]).is_err());
        assert!(Cli::try_parse_from(["allocprof", "record", "--pid", "1"]).is_err());
    }

    #[test]
    fn agent_takes_an_http_endpoint_and_pushes_every_15s_by_default() {
        let agent = |args: &[&str]| {
            let mut all = vec!["allocprof", "agent"];
            all.extend(args);
            Cli::try_parse_from(all).map(|cli| match cli.command {
                Some(Command::Agent(a)) => a,
                _ => panic!("not agent"),
            })
        };
        let a = agent(&["--otlp-endpoint", "http://127.0.0.1:4318"]).unwrap();
        assert_eq!(a.push_interval, Duration::from_secs(15));
        assert_eq!(a.otlp_endpoint, "http://127.0.0.1:4318");
        assert!(a.targets.pids.is_empty());
        let a = agent(&[
            "--otlp-endpoint",
            "http://c:4318",
            "-p",
            "7",
            "--push-interval",
            "1m",
        ]);
        assert_eq!(a.unwrap().push_interval, Duration::from_secs(60));
        for refused in [
            &[][..],
            &["--otlp-endpoint", "https://c:4318"],
            &["--otlp-endpoint", "c:4318"],
        ] {
            assert!(agent(refused).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// One row of an option table in docs/usage.md, or one clap argument
    /// written as such a row: `-f, --format report|collapsed` | `report`.
    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
    struct OptionRow {
        /// The long name, or for a positional argument its value name.
        name: String,
        short: Option<char>,
        /// The value's name, or its possible values joined by `|`.
        value: String,
        /// Default values joined by `,`; empty when there is none.
        default: String,
    }

    /// A table's cells: split at `|` but not at `\|`, which is unescaped.
    fn cells(line: &str) -> Vec<String> {
        let mut cells = vec![String::new()];
        let mut chars = line.trim().chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&'|') => {
                    cells.last_mut().unwrap().push('|');
                    chars.next();
                }
                '|' => cells.push(String::new()),
                c => cells.last_mut().unwrap().push(c),
            }
        }
        // The empty text before the first and after the last `|`.
        cells.remove(0);
        cells.pop();
        cells.iter().map(|c| c.trim().to_string()).collect()
    }

    fn code(cell: &str) -> Option<&str> {
        cell.strip_prefix('`')?
            .strip_suffix('`')
            .filter(|c| !c.contains('`'))
    }

    /// `-f, --format A|B` `report` → its row; panics with the line otherwise.
    fn parse_row(line: &str) -> OptionRow {
        let cells = cells(line);
        assert_eq!(cells.len(), 3, "not an option row: {line}");
        let option =
            code(&cells[0]).unwrap_or_else(|| panic!("the option is not one code span: {line}"));
        let default = if cells[1].is_empty() {
            ""
        } else {
            code(&cells[1]).unwrap_or_else(|| panic!("the default is not code: {line}"))
        };
        let (mut long, mut short, mut value) = (None, None, vec![]);
        for token in option.split_whitespace() {
            let token = token.trim_end_matches(',');
            if let Some(l) = token.strip_prefix("--") {
                assert!(long.replace(l.to_string()).is_none(), "two longs: {line}");
            } else if let Some(s) = token.strip_prefix('-') {
                let mut s = s.chars();
                let (Some(c), None) = (s.next(), s.next()) else {
                    panic!("a short option is one character: {line}");
                };
                assert!(short.replace(c).is_none(), "two shorts: {line}");
            } else {
                value.push(token);
            }
        }
        let value = value.join(" ");
        OptionRow {
            name: long.unwrap_or_else(|| value.clone()),
            short,
            value,
            default: default.to_string(),
        }
    }

    /// The rows of docs/usage.md's option tables, by command: a table
    /// belongs to every command its heading names (`allocprof`,
    /// `allocprof record`). Tables under other headings are not options.
    fn documented_options(doc: &str) -> std::collections::BTreeMap<String, Vec<OptionRow>> {
        let mut tables = std::collections::BTreeMap::<String, Vec<OptionRow>>::new();
        let mut commands: Vec<String> = vec![];
        for line in doc.lines() {
            if line.starts_with('#') {
                commands = line
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .filter(|c| *c == "allocprof" || c.starts_with("allocprof "))
                    .map(String::from)
                    .collect();
                for c in &commands {
                    tables.entry(c.clone()).or_default();
                }
            } else if line.starts_with('|') && !commands.is_empty() {
                let first = cells(line).into_iter().next().unwrap_or_default();
                if first == "option" || first.starts_with("---") {
                    continue;
                }
                let row = parse_row(line);
                for c in &commands {
                    tables.get_mut(c).unwrap().push(row.clone());
                }
            }
        }
        tables
    }

    /// clap's arguments of `cmd`, written as the table writes them.
    fn clap_options(cmd: &clap::Command) -> Vec<OptionRow> {
        use clap::ArgAction;
        cmd.get_arguments()
            .filter(|a| {
                !matches!(
                    a.get_action(),
                    ArgAction::Help
                        | ArgAction::HelpShort
                        | ArgAction::HelpLong
                        | ArgAction::Version
                )
            })
            .map(|a| {
                let takes_values = a.get_action().takes_values();
                let possible: Vec<_> = a
                    .get_possible_values()
                    .iter()
                    .map(|v| v.get_name().to_string())
                    .collect();
                let value = if !takes_values {
                    String::new()
                } else if !possible.is_empty() {
                    possible.join("|")
                } else {
                    let names = a.get_value_names().unwrap_or_default();
                    names
                        .iter()
                        .map(|n| n.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                let default = if takes_values {
                    let d: Vec<_> = a
                        .get_default_values()
                        .iter()
                        .map(|v| v.to_string_lossy().into_owned())
                        .collect();
                    d.join(",")
                } else {
                    String::new()
                };
                OptionRow {
                    name: a.get_long().map_or_else(|| value.clone(), String::from),
                    short: a.get_short(),
                    value,
                    default,
                }
            })
            .collect()
    }

    /// What differs between the documented rows and clap's, as a message.
    fn table_differences(
        documented: &std::collections::BTreeMap<String, Vec<OptionRow>>,
    ) -> Vec<String> {
        let mut root = Cli::command();
        root.build();
        let mut commands = vec![("allocprof".to_string(), clap_options(&root))];
        for sub in root.get_subcommands().filter(|s| s.get_name() != "help") {
            commands.push((format!("allocprof {}", sub.get_name()), clap_options(sub)));
        }
        let mut problems = vec![];
        for name in documented.keys() {
            if !commands.iter().any(|(c, _)| c == name) {
                problems.push(format!(
                    "docs/usage.md has options of `{name}`, no such command"
                ));
            }
        }
        for (name, clap_rows) in commands {
            let Some(doc_rows) = documented.get(&name) else {
                problems.push(format!("docs/usage.md has no option table of `{name}`"));
                continue;
            };
            for row in &clap_rows {
                match doc_rows.iter().find(|d| d.name == row.name) {
                    None => problems.push(format!("`{name}`: {row:?} is not in the table")),
                    Some(d) if d != row => {
                        problems.push(format!("`{name}`: the table has {d:?}, clap {row:?}"));
                    }
                    Some(_) => {}
                }
            }
            for d in doc_rows {
                if !clap_rows.iter().any(|r| r.name == d.name) {
                    problems.push(format!("`{name}`: {d:?} in the table is no option of it"));
                }
            }
            let mut names: Vec<_> = doc_rows.iter().map(|d| &d.name).collect();
            names.sort();
            names.dedup();
            if names.len() != doc_rows.len() {
                problems.push(format!("`{name}`: an option is in the table twice"));
            }
        }
        problems
    }

    const USAGE: &str = include_str!("../../docs/usage.md");

    #[test]
    fn the_option_tables_of_docs_usage_are_clap_s_options() {
        let documented = documented_options(USAGE);
        let problems = table_differences(&documented);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    /// The check itself: a row taken out, a bogus row, or a wrong default
    /// is found.
    #[test]
    fn the_option_table_check_finds_missing_bogus_and_wrong_rows() {
        let doc = USAGE;
        let without_top = doc.replace(
            "| `--top N` | `10` | stacks shown per process in the report |\n",
            "",
        );
        assert_ne!(without_top, doc, "the --top row moved: update this test");
        let problems = table_differences(&documented_options(&without_top));
        assert!(
            problems.len() == 1
                && problems[0].contains("\"top\"")
                && problems[0].contains("not in the table"),
            "{problems:?}"
        );

        let bogus = doc.replace(
            "| `--top N` |",
            "| `--bogus` | | no such option |\n| `--top N` |",
        );
        let problems = table_differences(&documented_options(&bogus));
        assert!(
            problems.len() == 1
                && problems[0].contains("bogus")
                && problems[0].contains("no option"),
            "{problems:?}"
        );

        let wrong = doc.replace("| `--top N` | `10` |", "| `--top N` | `20` |");
        let problems = table_differences(&documented_options(&wrong));
        assert!(
            problems.len() == 1 && problems[0].contains("\"20\""),
            "{problems:?}"
        );
    }
}

//! Command line and the checks that precede any kernel work.

use std::{path::PathBuf, time::Duration};

use clap::{Parser, ValueEnum};
use profiler_user::{kernel::Limits, report::ReportOptions, session::Target, stats::Value};
use thiserror::Error;

/// allocprof: a heap profiler for processes that carry the `otel_memory`
/// USDT probes (run them with LD_PRELOAD=liballocprof.so, or build them with
/// the allocprof Rust global allocator).
///
/// With no --pid, every process carrying the probes is profiled, including
/// processes started later. When stdout is not a terminal, or with
/// --duration or --output, allocprof runs headless and prints a report (or
/// the chosen format) at the end.
#[derive(Parser, Debug)]
#[command(name = "allocprof", version)]
pub struct Cli {
    /// Profile only this process (repeatable).
    #[arg(short, long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// Stop after this long (e.g. 30s, 2m) and report.
    #[arg(short, long, value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// How often to read the kernel's aggregates.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,

    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Report)]
    pub format: Format,

    /// Write the output to this file instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// The quantity exported stacks are weighted by.
    #[arg(long, value_enum, default_value_t = Value::InuseBytes)]
    pub value: Value,

    /// Stacks shown per process in the report.
    #[arg(long, default_value_t = 10)]
    pub top: usize,

    /// Cap on live samples kept in the kernel, over all processes.
    #[arg(long, default_value_t = Limits::default().max_live_samples)]
    pub max_live_samples: u32,

    /// Cap on live samples kept in the kernel per process.
    #[arg(long, default_value_t = Limits::default().max_live_per_process)]
    pub max_live_per_process: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Human-readable top-N report.
    Report,
    /// Folded stacks (`frame;frame;leaf VALUE`) for flamegraph.pl / inferno.
    Collapsed,
}

impl Format {
    pub fn describe(self, value: Value) -> String {
        match self {
            Format::Report => "report".into(),
            Format::Collapsed => format!("collapsed stacks of {}", value.describe()),
        }
    }
}

impl Cli {
    pub fn target(&self) -> Target {
        if self.pids.is_empty() {
            Target::All
        } else {
            Target::Pids(self.pids.clone())
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_live_samples: self.max_live_samples,
            max_live_per_process: self.max_live_per_process,
            ..Limits::default()
        }
    }

    pub fn report_options(&self) -> ReportOptions {
        ReportOptions {
            top: self.top,
            ..ReportOptions::default()
        }
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.parse::<f64>() {
        if secs.is_finite() && secs > 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(format!("{s}: a duration must be positive"));
    }
    match humantime::parse_duration(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(format!("{s}: a duration must be positive")),
        Err(e) => Err(format!("{s}: {e} (examples: 30s, 2m, 500ms)")),
    }
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
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0);
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
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

//! What delivery did, for the agent's periodic log line: exports sent,
//! retried and dropped (by cause), the queue, and allocprof's own CPU and
//! RSS from `/proc/self`.

use std::time::Instant;

/// Counters since start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub enqueued: u64,
    pub sent: u64,
    /// Attempts that failed and were retried.
    pub retried: u64,
    /// Dropped because the queue was full (the oldest first).
    pub dropped_overflow: u64,
    /// Dropped because the attempt failed for good.
    pub dropped_failed: u64,
    /// Still queued when the drain at exit ran out of time.
    pub dropped_at_exit: u64,
    /// Profiles the collector said it rejected (partial successes).
    pub rejected_profiles: u64,
    pub queued: usize,
    pub queue_bytes: usize,
}

impl Counts {
    pub fn dropped(&self) -> u64 {
        self.dropped_overflow + self.dropped_failed + self.dropped_at_exit
    }
}

/// allocprof's CPU time since the previous reading, as a share of one core.
pub struct CpuMeter {
    last: Option<(Instant, f64)>,
}

impl Default for CpuMeter {
    fn default() -> Self {
        CpuMeter::new()
    }
}

impl CpuMeter {
    pub fn new() -> CpuMeter {
        CpuMeter {
            last: cpu_seconds().map(|s| (Instant::now(), s)),
        }
    }

    /// Percent of one core since the last call (or since creation).
    pub fn percent(&mut self) -> Option<f64> {
        let now = (Instant::now(), cpu_seconds()?);
        let (then, before) = self.last.replace(now)?;
        let wall = now.0.duration_since(then).as_secs_f64();
        (wall > 0.0).then(|| 100.0 * (now.1 - before) / wall)
    }
}

/// User + system CPU seconds of this process (`/proc/self/stat` fields 14
/// and 15, after the parenthesised name).
pub fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_cpu_ticks(&stat).map(|ticks| ticks as f64 / clock_ticks())
}

fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    // The name may hold spaces and parentheses: fields count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// Resident set size in bytes (`/proc/self/statm`'s second field, pages).
pub fn rss_bytes() -> Option<u64> {
    rss_of("self")
}

/// The same for any process (tests watch the agent's).
pub fn rss_of(pid: &str) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).unwrap_or(4096))
}

/// The log line: `exports: 12 sent, 3 retried, 1 dropped (1 queue full);
/// queue 0 exports, 0 B; allocprof: CPU 0.4% of a core, RSS 31.2 MiB`.
pub fn line(c: &Counts, cpu_percent: Option<f64>, rss: Option<u64>) -> String {
    let mut causes = Vec::new();
    for (n, what) in [
        (c.dropped_overflow, "queue full"),
        (c.dropped_failed, "failed"),
        (c.dropped_at_exit, "left at exit"),
    ] {
        if n > 0 {
            causes.push(format!("{n} {what}"));
        }
    }
    let causes = if causes.is_empty() {
        String::new()
    } else {
        format!(" ({})", causes.join(", "))
    };
    let rejected = if c.rejected_profiles > 0 {
        format!(
            ", {} profiles rejected by the collector",
            c.rejected_profiles
        )
    } else {
        String::new()
    };
    let cpu = cpu_percent.map_or_else(|| "?".into(), |p| format!("{p:.1}%"));
    let rss = rss.map_or_else(
        || "?".into(),
        |b| format!("{:.1} MiB", b as f64 / 1048576.0),
    );
    format!(
        "exports: {} sent, {} retried, {} dropped{causes}{rejected}; queue {} exports, {} B; \
         allocprof: CPU {cpu} of a core, RSS {rss}",
        c.sent,
        c.retried,
        c.dropped(),
        c.queued,
        c.queue_bytes
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_read_after_the_name() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0 5 1000 50";
        assert_eq!(parse_cpu_ticks(stat), Some(325));
        assert_eq!(parse_cpu_ticks("42 (x) S 1"), None);
        assert!(cpu_seconds().is_some());
        assert!(rss_bytes().unwrap() > 0);
    }

    #[test]
    fn the_line_names_every_count() {
        let c = Counts {
            sent: 12,
            retried: 3,
            dropped_overflow: 1,
            dropped_at_exit: 2,
            queued: 1,
            queue_bytes: 4096,
            ..Default::default()
        };
        assert_eq!(
            line(&c, Some(0.42), Some(32 << 20)),
            "exports: 12 sent, 3 retried, 3 dropped (1 queue full, 2 left at exit); queue 1 \
             exports, 4096 B; allocprof: CPU 0.4% of a core, RSS 32.0 MiB"
        );
    }
}

//! The report as JSON, for scripts and dashboards. The schema is documented
//! in docs/json-schema.md; these types are it. Bump [`SCHEMA_VERSION`] on
//! any change that is not a pure addition of fields.

use std::collections::BTreeMap;

use profiler_common::{DROP_REASONS, DropReason, WeightForm};
use serde::{Deserialize, Serialize};

use crate::{
    model::profile::{ProcessState, Profile},
    model::stats::Totals,
    python::runtime::ObjectAllocator,
    symbolize::{Frame, FrameKind},
};

/// 2: `*_ci95` may be null (unavailable); `contracts`, `weight_form`,
/// `weight_interval_bytes`, `mapped_bytes` added; top-level `totals` are the
/// live processes' (gone images are in `gone_totals`).
/// 3: `drops` and `dropped` count losses only: a free that matched no live
/// sample is no drop but `unmatched_frees`.
pub const SCHEMA_VERSION: u32 = 3;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema_version: u32,
    /// `allocprof VERSION`.
    pub generator: String,
    pub elapsed_seconds: f64,
    /// Of every `*_ci95` half-width.
    pub confidence_level: f64,
    /// The processes still running summed: the live heap (version 2; before,
    /// every process image, gone ones included).
    pub totals: Estimates,
    /// The images that are gone (exited or exec'ed) summed: what they held
    /// when they went.
    #[serde(default)]
    pub gone_totals: Estimates,
    /// Sampled events not accounted, over all processes (including events
    /// that could not be tied to a process).
    pub dropped: u64,
    pub drops: BTreeMap<String, u64>,
    /// Frees that matched no live sample, over all processes: nothing lost
    /// (version 3; before, drop `unmatched_free`).
    pub unmatched_frees: u64,
    /// Over all processes: see `Process::lost_live_bytes`.
    pub lost_live_bytes: u64,
    /// Largest live bytes first.
    pub processes: Vec<Process>,
    /// Where the unwind tables stand (added within version 1).
    #[serde(default)]
    pub unwind: Unwind,
    /// `--min-age`: live figures of running processes count only
    /// allocations live at least this long (0: all; added within version 2).
    #[serde(default)]
    pub min_age_seconds: f64,
    /// When allocprof attached (RFC 3339, UTC); null for profiles read back
    /// from files (added within version 2).
    #[serde(default)]
    pub attached_at: Option<String>,
}

/// Files mapped executable by the profiled processes, by the state of their
/// unwind table, and the kernel's free table rows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Unwind {
    pub files_ready: u64,
    pub files_loading: u64,
    /// Tables that could not be built or did not fit: those files' code is
    /// walked by frame pointers (see the session's warnings for which).
    pub files_unavailable: u64,
    pub free_rows: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Process {
    pub pid: u32,
    /// Its parent's pid, where known (`--pid`'s trees; added within
    /// version 3).
    #[serde(default)]
    pub parent_pid: Option<u32>,
    /// Which exec of the pid this image is (0 until it execs).
    pub generation: u32,
    pub name: String,
    /// `live`, `exited` or `replaced` (exec'ed another program).
    pub state: String,
    pub sampling_rate_bytes: u64,
    pub totals: Estimates,
    pub alloc_events: u64,
    pub free_events: u64,
    pub dropped: u64,
    pub drops: BTreeMap<String, u64>,
    /// Its frees that matched no live sample (version 3).
    pub unmatched_frees: u64,
    /// Unbiased bytes of samples missing from the live sums; when nonzero,
    /// `totals.live_bytes` is a lower bound, short by at most this.
    pub lost_live_bytes: u64,
    /// The probe providers the process fired alloc probes of:
    /// `"otel_memory"`, `"ddheap"`, or both; empty before its first.
    pub contracts: Vec<String>,
    /// `"inverse_probability"` (`size / p`), `"points_times_interval"`
    /// (`nsamples × R`), `"unrecognized"` (its `*_ci95` are null), or null
    /// before its first sample.
    pub weight_form: Option<String>,
    /// R of `"points_times_interval"` weights, else null.
    pub weight_interval_bytes: Option<u64>,
    /// Bytes the emitter mapped on its own account (`mmap` minus `munmap`
    /// probes), beside the heap; 0 without such probes.
    pub mapped_bytes: i64,
    /// Back-pressure (`--max-event-rate`): its alloc events not kept (the
    /// kept ones count for them; estimates stay unbiased), and the factor
    /// last in force (1 in `thin_factor` kept). 0 and 1 without it (added
    /// within version 2).
    /// It ran before allocprof attached: its live figures count only what
    /// it allocated since and still holds (added within version 2).
    #[serde(default)]
    pub since_attach: bool,
    #[serde(default)]
    pub thinned_events: u64,
    #[serde(default = "one")]
    pub thin_factor: u64,
    /// The allocator's sample budget (`ALLOCPROF_MAX_EVENT_RATE`, thinned
    /// before the probe): sampled allocations it dropped since the process
    /// started (the kept ones count for them), the factor last in force,
    /// and the budget (sampled allocations per second; null where unknown).
    /// 0, 1 and null without it (added within version 3).
    #[serde(default)]
    pub alloc_thinned_events: u64,
    #[serde(default = "one")]
    pub alloc_thin_factor: u64,
    #[serde(default)]
    pub alloc_max_event_rate: Option<u64>,
    /// Its samples were thinned (by the allocator's budget or the kernel's
    /// back-pressure): its `*_ci95` are wider for it (added within version 3).
    #[serde(default)]
    pub thinned: bool,
    /// What the running process had resident (`/proc/PID/status`), to set
    /// the heap against; null for gone processes (added within version 2).
    #[serde(default)]
    pub resident: Option<ResidentBytes>,
    /// What the backend allocator of a running `liballocprof*.so` process
    /// says of its heap; null otherwise (added within version 2).
    #[serde(default)]
    pub allocator: Option<AllocatorFigures>,
    /// Its live-sample ledger, when allocprof looked for one; null for
    /// profiles read back (added within version 2).
    #[serde(default)]
    pub ledger: Option<Ledger>,
    /// Its CPython, if it runs one; null otherwise (added within version 3).
    #[serde(default)]
    pub python: Option<Python>,
    /// Largest live bytes first.
    pub stacks: Vec<Stack>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Python {
    /// `"3.11.2"`.
    pub version: String,
    /// What serves its objects: `"pymalloc"` (those of 512 bytes and less
    /// come from its arenas, which no sample sees), `"malloc"`
    /// (`PYTHONMALLOC=malloc`: all are sampled), or null (unreadable).
    pub objects: Option<ObjectAllocator>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stack {
    pub totals: Estimates,
    /// Its live bytes by age (absent in profiles that do not know them).
    #[serde(default)]
    pub age: Age,
    /// Innermost first, allocator frames removed.
    pub frames: Vec<StackFrame>,
}

/// What reading a process's live-sample ledger gave (see
/// `crate::process::ledger::LedgerStatus`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// A ledger was read: the live figures include the heap from before
    /// attach. False: none (another emitter, an older library) or unreadable.
    pub read: bool,
    /// Blocks from before attach found live, and freed since.
    pub seeded_blocks: u64,
    pub freed_since: u64,
    /// Live records the kernel had seen itself (not counted twice).
    pub seen_blocks: u64,
    /// Records skipped: being rewritten, garbage, past the read cap.
    pub torn_records: u64,
    pub garbage_records: u64,
    pub unread_records: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResidentBytes {
    pub anon_bytes: u64,
    pub file_bytes: u64,
    pub shmem_bytes: u64,
}

fn one() -> u64 {
    1
}

/// The backend allocator's own figures; null where it does not keep one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocatorFigures {
    /// `"mimalloc"` or `"glibc"`.
    pub backend: String,
    pub reserved_bytes: Option<u64>,
    pub committed_bytes: Option<u64>,
    pub in_use_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    pub mmapped_bytes: Option<u64>,
    /// How old the figures are (refreshed after sampled allocations).
    pub age_seconds: f64,
}

/// Live bytes by how long they have been live (unbiased estimates): a
/// leak's are all old, a cache's mostly young.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Age {
    pub live_bytes_older_than_1m: f64,
    pub live_bytes_older_than_10m: f64,
    /// The oldest live sample's age.
    pub oldest_seconds: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StackFrame {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// The executable or library the code is in.
    pub module: Option<String>,
    /// Inlined into the next frame (same machine address).
    pub inlined: bool,
    /// `"native"` or `"python"` (added within version 3: absent reads as
    /// native).
    #[serde(default = "native_kind")]
    pub kind: String,
}

fn native_kind() -> String {
    "native".into()
}

/// Unbiased estimates; `x_ci95` is the half-width of the 95% confidence
/// interval of `x`, null when unavailable (weights of no known form).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Estimates {
    pub live_bytes: f64,
    pub live_bytes_ci95: Option<f64>,
    pub live_objects: f64,
    pub live_samples: u64,
    pub alloc_bytes: f64,
    pub alloc_bytes_ci95: Option<f64>,
    pub alloc_objects: f64,
    pub alloc_samples: u64,
    /// Of `live_bytes`, those of blocks allocated before allocprof attached,
    /// read from the process's live-sample ledger (added within version 2).
    #[serde(default)]
    pub live_before_attach_bytes: f64,
}

impl From<&Totals> for Estimates {
    fn from(t: &Totals) -> Estimates {
        Estimates {
            live_bytes: t.live_bytes,
            live_bytes_ci95: t.live_ci95_known(),
            live_objects: t.live_objects,
            live_samples: t.live_samples,
            alloc_bytes: t.alloc_bytes,
            alloc_bytes_ci95: t.alloc_ci95_known(),
            alloc_objects: t.alloc_objects,
            alloc_samples: t.alloc_samples,
            live_before_attach_bytes: t.before_attach_bytes,
        }
    }
}

/// Stable machine names of the drop causes (the enum's order may change).
pub(crate) fn drop_name(reason: DropReason) -> &'static str {
    match reason {
        DropReason::LiveMapFull => "live_map_full",
        DropReason::ProcessCap => "process_cap",
        DropReason::StackFailed => "stack_failed",
        DropReason::StackMapFull => "stack_map_full",
        DropReason::AggMapFull => "agg_map_full",
        DropReason::ArgReadFailed => "arg_read_failed",
        DropReason::UnmatchedFree => "unmatched_free",
        DropReason::ReplacedLive => "replaced_live",
        DropReason::ProcMapFull => "proc_map_full",
        DropReason::Unplaced => "unplaced",
        DropReason::ScratchBusy => "scratch_busy",
        DropReason::StackRateLimited => "stack_rate_limited",
        DropReason::StackTruncated => "stack_truncated",
        DropReason::StackBeforeTables => "stack_before_tables",
        DropReason::StackTooDeep => "stack_too_deep",
    }
}

/// The losses by cause (every cause that is one: see
/// [`crate::model::profile::is_loss`]).
fn drops(counts: &[u64; DROP_REASONS]) -> BTreeMap<String, u64> {
    DropReason::ALL
        .iter()
        .filter(|&&r| crate::model::profile::is_loss(r))
        .map(|&r| (drop_name(r).to_string(), counts[r as usize]))
        .collect()
}

fn frame(f: &Frame) -> StackFrame {
    let (file, line) = match f.location.as_deref().map(|l| (l, l.rsplit_once(':'))) {
        None => (None, None),
        Some((l, Some((file, line)))) => match line.parse::<u32>() {
            Ok(n) => (Some(file.to_string()), Some(n)),
            Err(_) => (Some(l.to_string()), None),
        },
        Some((l, None)) => (Some(l.to_string()), None),
    };
    StackFrame {
        function: f.function.to_string(),
        file,
        line,
        module: f.module.as_deref().map(str::to_string),
        inlined: f.inlined,
        kind: match f.kind {
            FrameKind::Native => native_kind(),
            FrameKind::Python => "python".into(),
        },
    }
}

pub fn report(profile: &Profile) -> Report {
    let processes = profile
        .processes
        .iter()
        .map(|p| Process {
            pid: p.key.pid.0,
            parent_pid: p.parent.map(|p| p.0),
            generation: p.key.generation,
            name: p.name.clone(),
            state: match p.state {
                ProcessState::Live => "live",
                ProcessState::Exited => "exited",
                ProcessState::OomKilled => "oom_killed",
                ProcessState::Replaced => "replaced",
            }
            .into(),
            sampling_rate_bytes: p.rate,
            totals: (&p.totals).into(),
            alloc_events: p.alloc_events,
            free_events: p.free_events,
            dropped: p.dropped(),
            drops: drops(&p.drops),
            unmatched_frees: p.unmatched_frees(),
            lost_live_bytes: p.lost_live_bytes,
            contracts: crate::process::discover::contract_names(p.contracts)
                .into_iter()
                .map(String::from)
                .collect(),
            weight_form: match p.weight_form {
                WeightForm::NoSamples => None,
                WeightForm::InverseProbability => Some("inverse_probability".into()),
                WeightForm::PointsTimesInterval { .. } => Some("points_times_interval".into()),
                WeightForm::Unrecognized => Some("unrecognized".into()),
            },
            weight_interval_bytes: match p.weight_form {
                WeightForm::PointsTimesInterval { interval } => Some(interval),
                _ => None,
            },
            mapped_bytes: p.mapped_bytes,
            since_attach: p.since_attach,
            thinned_events: p.thinned_events,
            thin_factor: p.thin_factor,
            alloc_thinned_events: p.alloc_thinned(),
            alloc_thin_factor: p.alloc_thinning.map_or(1, |t| t.factor),
            alloc_max_event_rate: p.alloc_thinning.and_then(|t| t.max_event_rate),
            thinned: p.thinned(),
            resident: p.resident.map(|r| ResidentBytes {
                anon_bytes: r.anon,
                file_bytes: r.file,
                shmem_bytes: r.shmem,
            }),
            allocator: p.backend_heap.map(|b| AllocatorFigures {
                backend: b.backend.into(),
                reserved_bytes: b.reserved,
                committed_bytes: b.committed,
                in_use_bytes: b.in_use,
                free_bytes: b.free,
                mmapped_bytes: b.mmapped,
                age_seconds: b.age.as_secs_f64(),
            }),
            ledger: p.ledger.map(|l| Ledger {
                read: l.read,
                seeded_blocks: l.seeded,
                freed_since: l.retired,
                seen_blocks: l.seen,
                torn_records: l.torn,
                garbage_records: l.garbage,
                unread_records: l.unread,
            }),
            python: p.python.map(|py| Python {
                version: py.version.to_string(),
                objects: py.objects,
            }),
            stacks: p
                .stacks
                .iter()
                .map(|s| Stack {
                    totals: (&s.totals).into(),
                    age: Age {
                        live_bytes_older_than_1m: s.totals.ages.over_old,
                        live_bytes_older_than_10m: s.totals.ages.over_very_old,
                        oldest_seconds: s.totals.ages.oldest.as_secs_f64(),
                    },
                    frames: s.frames.iter().map(frame).collect(),
                })
                .collect(),
        })
        .collect();
    Report {
        schema_version: SCHEMA_VERSION,
        generator: format!("allocprof {}", env!("CARGO_PKG_VERSION")),
        elapsed_seconds: profile.elapsed.as_secs_f64(),
        // The level of `stats::Z95`.
        confidence_level: 0.95,
        totals: (&profile.live_totals()).into(),
        gone_totals: (&profile.held_at_exit()).into(),
        dropped: profile.dropped(),
        drops: drops(&profile.drops),
        unmatched_frees: profile.unmatched_frees(),
        lost_live_bytes: profile.lost_live_bytes(),
        processes,
        unwind: Unwind {
            files_ready: profile.unwind.ready as u64,
            files_loading: profile.unwind.loading as u64,
            files_unavailable: profile.unwind.unavailable as u64,
            free_rows: profile.unwind.free_rows,
        },
        min_age_seconds: profile.min_age.as_secs_f64(),
        attached_at: profile
            .attached_at
            .map(|t| humantime::format_rfc3339_seconds(t).to_string()),
    }
}

pub fn render(profile: &Profile) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(&report(profile)).expect("plain data serializes");
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::export::tests::hand_made;

    #[test]
    fn numbers_and_shape() {
        let profile = hand_made();
        let text = render(&profile);
        let r: Report = serde_json::from_slice(&text).unwrap();
        assert_eq!(r.schema_version, SCHEMA_VERSION);
        assert_eq!(r.processes.len(), 2);
        let p = &r.processes[0];
        assert_eq!(
            (p.pid, p.name.as_str(), p.state.as_str()),
            (7, "demo", "live")
        );
        assert_eq!(p.totals.live_bytes, profile.processes[0].totals.live_bytes);
        assert_eq!(
            p.totals.live_bytes_ci95,
            Some(profile.processes[0].totals.live_ci95())
        );
        // A free that matched nothing lost nothing: apart from the drops.
        assert_eq!(p.unmatched_frees, 3);
        assert!(!p.drops.contains_key("unmatched_free"));
        assert_eq!(p.dropped, 0);
        assert_eq!(r.drops.len(), DROP_REASONS - 1);
        assert_eq!(r.dropped, r.drops.values().sum::<u64>());
        let a = p.allocator.as_ref().expect("the backend's figures");
        assert_eq!(a.backend, "glibc");
        assert_eq!(
            (a.in_use_bytes, a.free_bytes, a.committed_bytes),
            (Some(2 << 20), Some(1 << 20), None)
        );
        assert!(r.processes[1].allocator.is_none());
        // The tree: the second is the first's child, the first's parent unknown.
        assert_eq!((p.parent_pid, r.processes[1].parent_pid), (None, Some(7)));
        let large = &p.stacks[0];
        assert_eq!(large.totals.live_bytes, 8.0 * 1048576.0);
        let f = &large.frames[0];
        assert_eq!(f.function, "inlined_helper");
        assert!(f.inlined);
        assert_eq!(f.file.as_deref(), Some("/src/demo.c"));
        assert_eq!(f.line, Some(40));
        assert_eq!(large.frames[1].module.as_deref(), Some("/usr/bin/demo"));
        // The live heap is the running processes'; gone images apart.
        assert_eq!(r.totals.live_bytes, profile.live_totals().live_bytes);
        assert_eq!(
            r.totals.live_bytes + r.gone_totals.live_bytes,
            profile.totals().live_bytes
        );
        assert!(
            r.gone_totals.live_bytes > 0.0,
            "the sample has a gone image"
        );
        // Plain JSON with the documented top-level keys.
        let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        for k in [
            "schema_version",
            "processes",
            "totals",
            "gone_totals",
            "drops",
            "unwind",
        ] {
            assert!(keys.contains(&k), "{keys:?}");
        }
    }

    #[test]
    fn frames_without_lines() {
        let mut f = Frame {
            function: "f".into(),
            location: Some("/a/b.rs".into()),
            module: None,
            inlined: false,
            offset: None,
            kind: FrameKind::Native,
        };
        assert_eq!(
            (frame(&f).file.as_deref(), frame(&f).line),
            (Some("/a/b.rs"), None)
        );
        f.location = None;
        assert_eq!(frame(&f).file, None);
    }

    #[test]
    fn unwind_tables_are_counted_and_older_documents_still_read() {
        let mut profile = hand_made();
        profile.unwind.ready = 4;
        profile.unwind.loading = 1;
        profile.unwind.unavailable = 2;
        profile.unwind.free_rows = 1000;
        let v: serde_json::Value = serde_json::from_slice(&render(&profile)).unwrap();
        assert_eq!(
            v["unwind"],
            serde_json::json!({
                "files_ready": 4, "files_loading": 1, "files_unavailable": 2, "free_rows": 1000
            })
        );
        let mut old = v;
        old.as_object_mut().unwrap().remove("unwind");
        let r: Report = serde_json::from_value(old).unwrap();
        assert_eq!(r.unwind, Unwind::default());
    }
}

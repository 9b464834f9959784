//! The JSON export against docs/json-schema.md, written out independently of the exporter's own types.

use super::*;

// Unknown or missing fields fail the test.

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct Report {
    pub(crate) schema_version: u32,
    pub(crate) generator: String,
    pub(crate) elapsed_seconds: f64,
    pub(crate) confidence_level: f64,
    pub(crate) totals: Estimates,
    pub(crate) gone_totals: Estimates,
    pub(crate) dropped: u64,
    pub(crate) drops: BTreeMap<String, u64>,
    pub(crate) unmatched_frees: u64,
    pub(crate) lost_live_bytes: u64,
    pub(crate) processes: Vec<Process>,
    pub(crate) unwind: Unwind,
    pub(crate) min_age_seconds: f64,
    pub(crate) attached_at: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct Unwind {
    pub(crate) files_ready: u64,
    pub(crate) files_loading: u64,
    pub(crate) files_unavailable: u64,
    pub(crate) free_rows: u64,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct Process {
    pub(crate) pid: u32,
    pub(crate) parent_pid: Option<u32>,
    pub(crate) generation: u32,
    pub(crate) name: String,
    pub(crate) state: String,
    pub(crate) sampling_rate_bytes: u64,
    pub(crate) totals: Estimates,
    pub(crate) alloc_events: u64,
    pub(crate) free_events: u64,
    pub(crate) dropped: u64,
    pub(crate) drops: BTreeMap<String, u64>,
    pub(crate) unmatched_frees: u64,
    pub(crate) lost_live_bytes: u64,
    pub(crate) contracts: Vec<String>,
    pub(crate) weight_form: Option<String>,
    pub(crate) weight_interval_bytes: Option<u64>,
    pub(crate) mapped_bytes: i64,
    pub(crate) since_attach: bool,
    pub(crate) thinned_events: u64,
    pub(crate) thin_factor: u64,
    pub(crate) alloc_thinned_events: u64,
    pub(crate) alloc_thin_factor: u64,
    pub(crate) alloc_max_event_rate: Option<u64>,
    pub(crate) thinned: bool,
    pub(crate) resident: Option<Resident>,
    pub(crate) allocator: Option<Allocator>,
    pub(crate) ledger: Option<Ledger>,
    /// A CPython process's version and object allocator.
    pub(crate) python: Option<Python>,
    pub(crate) stacks: Vec<Stack>,
}

/// Its fields are the schema's: checked by deserializing (the workloads
/// here are C programs, with none).
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub(crate) struct Python {
    pub(crate) version: String,
    /// `"pymalloc"`, `"malloc"` or null.
    pub(crate) objects: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct Ledger {
    pub(crate) read: bool,
    pub(crate) seeded_blocks: u64,
    pub(crate) freed_since: u64,
    pub(crate) seen_blocks: u64,
    pub(crate) torn_records: u64,
    pub(crate) garbage_records: u64,
    pub(crate) unread_records: u64,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct Allocator {
    pub(crate) backend: String,
    pub(crate) reserved_bytes: Option<u64>,
    pub(crate) committed_bytes: Option<u64>,
    pub(crate) in_use_bytes: Option<u64>,
    pub(crate) free_bytes: Option<u64>,
    pub(crate) mmapped_bytes: Option<u64>,
    pub(crate) age_seconds: f64,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct Stack {
    pub(crate) totals: Estimates,
    pub(crate) age: Age,
    pub(crate) frames: Vec<Frame>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct Resident {
    pub(crate) anon_bytes: u64,
    pub(crate) file_bytes: u64,
    pub(crate) shmem_bytes: u64,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct Age {
    pub(crate) live_bytes_older_than_1m: f64,
    pub(crate) live_bytes_older_than_10m: f64,
    pub(crate) oldest_seconds: f64,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct Frame {
    pub(crate) function: String,
    pub(crate) file: Option<String>,
    pub(crate) line: Option<u32>,
    pub(crate) module: Option<String>,
    pub(crate) inlined: bool,
    pub(crate) kind: String,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(crate) struct Estimates {
    pub(crate) live_bytes: f64,
    pub(crate) live_bytes_ci95: Option<f64>,
    pub(crate) live_objects: f64,
    pub(crate) live_samples: u64,
    pub(crate) alloc_bytes: f64,
    pub(crate) alloc_bytes_ci95: Option<f64>,
    pub(crate) alloc_objects: f64,
    pub(crate) alloc_samples: u64,
    pub(crate) live_before_attach_bytes: f64,
}

const DROP_KEYS: [&str; 14] = [
    "live_map_full",
    "process_cap",
    "stack_failed",
    "stack_map_full",
    "agg_map_full",
    "arg_read_failed",
    "replaced_live",
    "proc_map_full",
    "unplaced",
    "scratch_busy",
    "stack_rate_limited",
    "stack_truncated",
    "stack_before_tables",
    "stack_too_deep",
];

#[test]
fn json_follows_the_documented_schema() {
    common::require_bpf();
    let mut w = Workload::c(&[]);
    let pid = w.pid().to_string();
    let (out, _) = headless_export(&mut w, "json", "json");
    let exe = workload_exe();
    w.exit();

    let r: Report = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(r.schema_version, 3);
    assert!(r.generator.starts_with("allocprof "));
    assert_eq!(r.confidence_level, 0.95);
    assert!(r.elapsed_seconds >= 2.5, "{}", r.elapsed_seconds);
    let keys: Vec<&str> = r.drops.keys().map(String::as_str).collect();
    let mut expected = DROP_KEYS.to_vec();
    expected.sort_unstable();
    assert_eq!(keys, expected);
    assert_eq!(r.dropped, r.drops.values().sum::<u64>());
    // Frees that matched no live sample lose nothing: apart from the drops.
    assert!(r.unmatched_frees >= r.processes.iter().map(|p| p.unmatched_frees).sum::<u64>());
    // The workload's files (itself, liballocprof.so, libc, the loader...)
    // have their unwind tables, none missing.
    let u = &r.unwind;
    assert!(u.files_ready >= 3 && u.files_unavailable == 0, "{u:?}");
    assert!(u.free_rows > 0 && u.free_rows < 1 << 20, "{u:?}");
    let _ = u.files_loading;

    assert_eq!(r.processes.len(), 1);
    let p = &r.processes[0];
    assert_eq!((p.pid.to_string(), p.generation), (pid, 0));
    // A C program: no CPython in it.
    assert!(p.python.is_none(), "{:?}", p.python);
    // `--pid` profiles its tree: the root's parent is this test.
    assert_eq!(p.parent_pid, Some(std::process::id()));
    assert_eq!((p.name.as_str(), p.state.as_str()), ("alloc_sites", "live"));
    assert_eq!(p.sampling_rate_bytes, RATE);
    assert_eq!(p.contracts, ["otel_memory"]);
    assert_eq!(p.weight_form.as_deref(), Some("inverse_probability"));
    assert_eq!(p.weight_interval_bytes, None);
    // It ran before allocprof attached, its ledger was read: its figures
    // are its whole heap. Before attach it only started up (stdio buffers:
    // a few KiB, rarely a sample at this rate). Nothing thinned.
    assert!(!p.since_attach);
    let l = p.ledger.as_ref().expect("its ledger was looked for");
    assert!(l.read, "{l:?}");
    assert!(l.seeded_blocks <= 3, "{l:?}");
    assert_eq!(
        (l.torn_records, l.garbage_records, l.unread_records),
        (0, 0, 0)
    );
    let _ = (l.seen_blocks, l.freed_since);
    assert!(p.totals.live_before_attach_bytes <= p.totals.live_bytes);
    assert_eq!((p.thinned_events, p.thin_factor), (0, 1));
    // liballocprof.so publishes its budget; this workload's is not thinned.
    assert!(
        p.alloc_max_event_rate.is_some(),
        "{:?}",
        p.alloc_max_event_rate
    );
    assert_eq!((p.alloc_thinned_events, p.alloc_thin_factor), (0, 1));
    assert!(!p.thinned);
    let attached = r.attached_at.as_deref().expect("when allocprof attached");
    assert!(humantime::parse_rfc3339(attached).is_ok(), "{attached}");
    // liballocprof.so's own figures: mimalloc keeps reserved and committed.
    let a = p.allocator.as_ref().expect("the allocator's figures");
    assert_eq!(a.backend, "mimalloc");
    // What mimalloc mapped since allocprof attached (its first arena, if
    // the workload had not needed it before): part of what it reserved.
    assert!(
        p.mapped_bytes >= 0 && p.mapped_bytes as u64 <= a.reserved_bytes.unwrap_or(0),
        "mapped {} vs {a:?}",
        p.mapped_bytes
    );
    assert!(
        a.committed_bytes.is_some() && a.reserved_bytes >= a.committed_bytes,
        "{a:?}"
    );
    assert_eq!(
        (a.in_use_bytes, a.free_bytes, a.mmapped_bytes),
        (None, None, None)
    );
    assert!(a.age_seconds >= 0.0, "{a:?}");
    // A running process: what it had resident, the heap within its
    // anonymous memory.
    let res = p
        .resident
        .as_ref()
        .expect("a running process's resident memory");
    assert!(
        res.anon_bytes as f64 >= p.totals.live_bytes * 0.9,
        "{res:?}"
    );
    assert!(res.file_bytes > 0, "its code is file-backed: {res:?}");
    let _ = res.shmem_bytes;
    assert!(p.alloc_events >= p.totals.alloc_samples);
    assert!(p.free_events > 0, "site_freed frees sampled blocks");
    assert_eq!(p.dropped, p.drops.values().sum::<u64>());
    // Nothing was lost to the live sums here, and the sum agrees.
    assert_eq!((p.lost_live_bytes, r.lost_live_bytes), (0, 0));
    // Totals are sums: stacks → process → report.
    let sum = |f: fn(&Estimates) -> f64| p.stacks.iter().map(|s| f(&s.totals)).sum::<f64>();
    assert!((sum(|e| e.live_bytes) - p.totals.live_bytes).abs() < 1e-6);
    assert!((sum(|e| e.alloc_objects) - p.totals.alloc_objects).abs() < 1e-6);
    assert_eq!(r.totals.live_bytes, p.totals.live_bytes);
    // Its one process is still running: nothing is gone.
    assert_eq!(r.gone_totals.live_bytes, 0.0);
    assert_eq!(
        p.stacks.iter().map(|s| s.totals.live_samples).sum::<u64>(),
        p.totals.live_samples
    );
    // Largest live bytes first.
    for pair in p.stacks.windows(2) {
        assert!(pair[0].totals.live_bytes >= pair[1].totals.live_bytes);
    }
    let site = |name: &str| {
        p.stacks
            .iter()
            .find(|s| s.frames.first().is_some_and(|f| f.function == name))
            .unwrap_or_else(|| panic!("no stack at {name}: {p:#?}"))
    };
    let large = site("site_large");
    // A 3 s run: nothing is a minute old yet, and no --min-age.
    assert_eq!(r.min_age_seconds, 0.0);
    assert_eq!(large.age.live_bytes_older_than_1m, 0.0);
    assert_eq!(large.age.live_bytes_older_than_10m, 0.0);
    assert!(
        large.age.oldest_seconds > 0.0 && large.age.oldest_seconds < 60.0,
        "{:?}",
        large.age
    );
    assert_eq!(large.totals.live_bytes, LARGE as f64);
    assert_eq!(large.totals.live_objects, 8.0);
    assert_eq!(large.totals.live_samples, 8);
    // Sampled surely (an HT term of 0): only the unseen mass's ± 3.9R.
    let floor = allocprof::model::stats::Z95
        * (allocprof::model::stats::UNSEEN_SAMPLES).sqrt()
        * RATE as f64;
    let ci = large.totals.live_bytes_ci95.unwrap();
    assert!(
        (ci - floor).abs() < 1e-6 * floor,
        "sampled surely: {ci} vs {floor}"
    );
    let leaf = &large.frames[0];
    assert!(
        leaf.file
            .as_deref()
            .is_some_and(|f| f.ends_with("alloc_sites.c"))
    );
    assert!(leaf.line.is_some_and(|l| l > 0));
    assert_eq!(leaf.module.as_deref(), exe.to_str());
    assert!(!leaf.inlined);
    assert_eq!(leaf.kind, "native");
    assert_eq!(large.frames[1].function, "main", "innermost first");
    let small = site("site_small");
    assert!(small.totals.live_bytes_ci95 > Some(0.0), "{small:?}");
    assert!(small.totals.live_bytes > 0.0);
    let freed = site("site_freed");
    assert_eq!(freed.totals.live_bytes, 0.0);
    assert!(freed.totals.alloc_bytes > 0.0);
    assert!(freed.totals.alloc_bytes_ci95 > Some(0.0));
}

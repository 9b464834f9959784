//! The export formats with real eBPF and real workloads, checked by the
//! tools people open them with: pprof in `go tool pprof` (-top, -traces,
//! -base), the flamegraph as XML (and through rsvg-convert), JSON against
//! the schema in docs/json-schema.md; `allocprof record` snapshots and
//! `allocprof diff`.

mod common;

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use allocprof::ids::Pid;
use allocprof::{
    kernel::Limits,
    model::stats::human_bytes,
    output::export::{self, Format},
    session::{Session, Target},
};
use serde::Deserialize;

use common::{RATE, Workload};

/// site_large: 8 blocks of 1 MiB, sampled with probability 1 - e^-16 each,
/// so its estimate is exact.
const LARGE: u64 = 8 << 20;

fn allocprof() -> Command {
    Command::new(env!("CARGO_BIN_EXE_allocprof"))
}

/// A 3-second headless run on the workload (which allocates meanwhile),
/// written in `format` to a fresh file; returns the file and allocprof's
/// output (its report on stdout).
fn headless_export(w: &mut Workload, format: &str, ext: &str) -> (PathBuf, std::process::Output) {
    let out = scratch(&format!("heap-{}.{ext}", w.pid()));
    let pid = w.pid().to_string();
    let args = [
        "--pid",
        &pid,
        "-d",
        "3s",
        "-f",
        format,
        "-o",
        out.to_str().unwrap(),
    ];
    let (profiler, _stderr) = start(&args);
    w.allocate();
    let result = profiler.wait_with_output().unwrap();
    assert!(result.status.success());
    (out, result)
}

/// allocprof started with `args`, once it has attached; its stderr lines
/// keep arriving on the returned channel.
fn start(args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = allocprof()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    assert!(
        first.contains("attached"),
        "allocprof did not attach: {first}"
    );
    (child, rx)
}

fn go_tool_pprof(args: &[&str]) -> String {
    assert!(
        Path::new("/usr/bin/go").exists(),
        "go tool pprof comes from apt-get install golang-go (cargo xtask test installs it)"
    );
    let out = Command::new("/usr/bin/go")
        .args(["tool", "pprof"])
        .args(args)
        .env("PPROF_TMPDIR", common::scratch_dir("pprof-tmp"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed:\n{stderr}\n{stdout}"
    );
    stdout
}

/// "Total samples = 37270697B" from `go tool pprof -top -unit=B`.
fn pprof_total(top: &str) -> i64 {
    let total = top
        .lines()
        .find_map(|l| l.split_once("Total samples = ").map(|(_, t)| t.trim()))
        .unwrap_or_else(|| panic!("no total in:\n{top}"));
    total
        .trim_end_matches('B')
        .parse()
        .unwrap_or_else(|_| panic!("total {total:?} in:\n{top}"))
}

/// Flat value of `function` in `go tool pprof -top -unit=B` output.
fn pprof_flat(top: &str, function: &str) -> i64 {
    top.lines()
        .find_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() == 6 && cols[5] == function).then(|| cols[0].trim_end_matches('B'))
        })
        .unwrap_or_else(|| panic!("no {function} in:\n{top}"))
        .parse()
        .unwrap()
}

/// Per trace of `go tool pprof -traces -unit=B`: the value and the frames.
fn pprof_traces(traces: &str) -> Vec<(i64, Vec<String>)> {
    let mut out = Vec::new();
    for block in traces.split("-----------+").skip(1) {
        let mut value = None;
        let mut frames = Vec::new();
        for line in block.lines().skip(1) {
            let line = line.trim();
            if line.is_empty() || line.contains(": ") {
                continue; // labels ("pid: 123")
            }
            match value {
                None => {
                    let (v, f) = line.split_once(char::is_whitespace).unwrap();
                    value = Some(v.trim_end_matches('B').parse::<i64>().unwrap());
                    frames.push(f.trim().to_string());
                }
                Some(_) => frames.push(line.to_string()),
            }
        }
        if let Some(v) = value {
            out.push((v, frames));
        }
    }
    out
}

/// The workload's executable (built once per test binary).
fn workload_exe() -> PathBuf {
    common::compile_c("alloc_sites.c", &["-ldl"])
}

fn scratch(name: &str) -> PathBuf {
    common::scratch_dir("export").join(name)
}

#[test]
fn pprof_totals_in_go_tool_pprof_equal_the_json_export_of_the_same_profile() {
    common::require_bpf();
    let mut w = Workload::c(&[]);
    let mut session = Session::start(Target::Pids(vec![Pid(w.pid())]), Limits::default()).unwrap();
    w.allocate();
    let profile = session.complete_profile().unwrap();
    let opts = export::Options::default();
    let pprof = export::render(&profile, Format::Pprof, &opts).unwrap();
    let json: Report =
        serde_json::from_slice(&export::render(&profile, Format::Json, &opts).unwrap()).unwrap();
    let path = scratch(&format!("same-profile-{}.pb.gz", w.pid()));
    std::fs::write(&path, pprof).unwrap();
    let file = path.to_str().unwrap();

    // Every sample type: pprof's total is allocprof's total, rounded.
    let t = &json.totals;
    for (index, expected) in [
        ("inuse_space", t.live_bytes),
        ("inuse_objects", t.live_objects),
        ("alloc_space", t.alloc_bytes),
        ("alloc_objects", t.alloc_objects),
    ] {
        let top = go_tool_pprof(&["-top", "-unit=B", &format!("-sample_index={index}"), file]);
        assert_eq!(
            pprof_total(&top),
            expected.round() as i64,
            "{index}:\n{top}"
        );
    }
    let top = go_tool_pprof(&["-top", "-unit=B", file]);
    assert!(top.contains("Type: inuse_space"), "the default: {top}");
    assert_eq!(pprof_flat(&top, "site_large"), LARGE as i64, "{top}");

    // Mappings carry the workload's build id, as readelf sees it.
    let raw = go_tool_pprof(&["-raw", file]);
    let exe = workload_exe();
    let notes = Command::new("readelf")
        .arg("-n")
        .arg(&exe)
        .output()
        .unwrap();
    let notes = String::from_utf8_lossy(&notes.stdout);
    let build_id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("gcc links a build id");
    let mapping = raw
        .lines()
        .find(|l| l.contains(exe.to_str().unwrap()))
        .unwrap_or_else(|| panic!("no mapping of {exe:?} in:\n{raw}"));
    assert!(mapping.contains(build_id), "{mapping}");
    assert!(mapping.contains("[FN][FL][LN]"), "{mapping}");
    w.exit();
}

#[test]
fn headless_pprof_opens_in_go_tool_pprof_with_the_reports_totals() {
    common::require_bpf();
    let mut w = Workload::c(&[]);
    let pid = w.pid().to_string();
    let (out, result) = headless_export(&mut w, "pprof", "pb.gz");
    let report = String::from_utf8_lossy(&result.stdout).into_owned();
    w.exit();

    let file = out.to_str().unwrap();
    let top = go_tool_pprof(&["-top", "-unit=B", file]);
    let total = pprof_total(&top);
    // The report printed by the same run shows the same total.
    // The workload ran before allocprof attached but allocated after: its
    // ledger held nothing from before, so the figure is its whole heap.
    assert!(
        report.contains(&format!(
            "estimated live heap {} ±",
            human_bytes(total as f64)
        )),
        "pprof total {total} vs the report:\n{report}\n{top}"
    );
    assert_eq!(pprof_flat(&top, "site_large"), LARGE as i64, "{top}");
    for site in ["site_small", "site_medium"] {
        assert!(pprof_flat(&top, site) > 0, "{top}");
    }
    // The comments name the process; the labels carry the pid.
    assert!(
        top.contains(&format!("alloc_sites ({pid}) [live]")),
        "{top}"
    );

    let traces = go_tool_pprof(&["-traces", "-unit=B", file]);
    assert!(traces.contains(&format!("pid:  {pid}")), "{traces}");
    assert!(traces.contains("process:  alloc_sites"), "{traces}");
    let traces = pprof_traces(&traces);
    assert_eq!(traces.iter().map(|(v, _)| v).sum::<i64>(), total);
    let large: Vec<_> = traces
        .iter()
        .filter(|(_, frames)| frames.first().is_some_and(|f| f == "site_large"))
        .collect();
    assert_eq!(large.len(), 1, "{traces:?}");
    assert_eq!(large[0].0, LARGE as i64);
    assert_eq!(large[0].1[1], "main", "innermost first: {traces:?}");
}

/// Waits for two "wrote" lines: the second snapshot is taken entirely
/// after whatever happened before the call.
fn snapshot_after_next(stderr: &mpsc::Receiver<String>, written: &mut Vec<PathBuf>) -> PathBuf {
    for _ in 0..2 {
        let line = stderr.recv_timeout(Duration::from_secs(30)).unwrap();
        let path = line
            .strip_prefix("allocprof: wrote ")
            .and_then(|l| l.split(" (").next())
            .unwrap_or_else(|| panic!("unexpected: {line}"));
        written.push(PathBuf::from(path));
    }
    written.last().unwrap().clone()
}

#[test]
fn record_writes_one_pprof_file_when_the_target_exits() {
    common::require_bpf();
    let mut w = Workload::c(&[]);
    let out = scratch(&format!("record-{}.pb.gz", w.pid()));
    let pid = w.pid().to_string();
    let (profiler, _stderr) = start(&["record", "--pid", &pid, "-o", out.to_str().unwrap()]);
    w.allocate();
    std::thread::sleep(Duration::from_millis(1500));
    w.exit();
    // No -d: it stops by itself once its only target is gone.
    let result = profiler.wait_with_output().unwrap();
    assert!(result.status.success());
    assert!(result.stdout.is_empty(), "record prints nothing on stdout");
    let top = go_tool_pprof(&["-top", "-unit=B", out.to_str().unwrap()]);
    assert_eq!(pprof_flat(&top, "site_large"), LARGE as i64, "{top}");
    assert!(
        top.contains(&format!("alloc_sites ({pid}) [exited]")),
        "{top}"
    );
}

/// Two workloads: the first allocates before snapshot A, the second between
/// A and B, so B - A is exactly the second's allocations.
#[test]
fn record_snapshots_compare_with_pprof_base_and_allocprof_diff() {
    common::require_bpf();
    let mut first = Workload::c(&[]);
    let mut second = Workload::c(&[]);
    let dir = common::scratch_dir(&format!("export/record-{}", first.pid()));
    let out = dir.join("heap.pb.gz");
    let (p1, p2) = (first.pid().to_string(), second.pid().to_string());
    let args = [
        "record",
        "--pid",
        &p1,
        "--pid",
        &p2,
        "--interval",
        "1s",
        "-o",
        out.to_str().unwrap(),
    ];
    let (mut profiler, stderr) = start(&args);
    let mut written = Vec::new();
    first.allocate();
    let a = snapshot_after_next(&stderr, &mut written);
    second.allocate();
    let b = snapshot_after_next(&stderr, &mut written);
    // SIGTERM: a last snapshot, then exit 0.
    // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
    let killed = unsafe { libc::kill(profiler.id() as i32, libc::SIGTERM) };
    assert_eq!(killed, 0);
    assert!(profiler.wait().unwrap().success());
    let last = stderr.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(last.contains("wrote"), "{last}");
    first.exit();
    second.exit();

    // Numbered from 1, consecutive.
    for (i, path) in written.iter().enumerate() {
        let name = format!("heap.{:04}.pb.gz", i + 1);
        assert_eq!(path, &dir.join(name));
        assert!(path.exists());
    }
    assert!(
        dir.join(format!("heap.{:04}.pb.gz", written.len() + 1))
            .exists()
    );

    let (a_s, b_s) = (a.to_str().unwrap(), b.to_str().unwrap());
    let top_a = go_tool_pprof(&["-top", "-unit=B", a_s]);
    let top_b = go_tool_pprof(&["-top", "-unit=B", b_s]);
    let base = go_tool_pprof(&["-top", "-unit=B", "-base", a_s, b_s]);
    assert_eq!(
        pprof_total(&base),
        pprof_total(&top_b) - pprof_total(&top_a),
        "{base}"
    );
    // The first workload's 8 MiB cancel out; the second's remain.
    assert_eq!(pprof_flat(&top_a, "site_large"), LARGE as i64);
    assert_eq!(pprof_flat(&top_b, "site_large"), 2 * LARGE as i64);
    assert_eq!(pprof_flat(&base, "site_large"), LARGE as i64, "{base}");

    // allocprof diff: folded stacks of the growth, all in the second process.
    let diff = allocprof()
        .args(["diff", a_s, b_s, "--format", "collapsed"])
        .output()
        .unwrap();
    assert!(diff.status.success(), "{diff:?}");
    let folded = String::from_utf8(diff.stdout).unwrap();
    let mut large = 0;
    for line in folded.lines() {
        let (stack, value) = line.rsplit_once(' ').unwrap();
        assert!(
            stack.starts_with(&format!("alloc_sites ({p2});")),
            "{folded}"
        );
        if stack.contains(";site_large") {
            large += value.parse::<u64>().unwrap();
        }
    }
    assert_eq!(large, LARGE, "{folded}");
    let stderr = String::from_utf8_lossy(&diff.stderr);
    assert!(stderr.contains("growth of live bytes"), "{stderr}");

    // And as a flamegraph.
    let svg_path = dir.join("growth.svg");
    let out = allocprof()
        .args([
            "diff",
            a_s,
            b_s,
            "-f",
            "svg",
            "-o",
            svg_path.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let titles = frame_titles(&svg);
    assert!(
        titles
            .iter()
            .any(|t| t.starts_with("site_large (8,388,608 bytes")),
        "{titles:?}"
    );
    assert!(!titles.iter().any(|t| t.contains(&p1)), "{titles:?}");
    assert!(svg.contains("allocprof: growth of live bytes from heap.0"));

    // pprof out of diff: the same growth, readable by go tool pprof.
    let growth = dir.join("growth.pb.gz");
    let out = allocprof()
        .args([
            "diff",
            a_s,
            b_s,
            "-f",
            "pprof",
            "-o",
            growth.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let top = go_tool_pprof(&["-top", "-unit=B", growth.to_str().unwrap()]);
    assert_eq!(pprof_total(&top), pprof_total(&base), "{top}\n{base}");
}

#[test]
fn diff_of_bad_files_is_a_clear_error() {
    let dir = common::scratch_dir("export");
    let garbage = dir.join("garbage.pb.gz");
    std::fs::write(&garbage, b"\x1f\x8b not really gzip").unwrap();
    let text = dir.join("text.pb.gz");
    std::fs::write(&text, b"hello world").unwrap();
    let missing = dir.join("missing.pb.gz");
    // 2 GiB of empty length-delimited fields in a small gzip file.
    let bomb = dir.join("bomb.pb.gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let chunk = [0x0a_u8, 0x00].repeat(1 << 20);
    for _ in 0..1024 {
        gz.write_all(&chunk).unwrap();
    }
    std::fs::write(&bomb, gz.finish().unwrap()).unwrap();
    for (a, b, needle) in [
        (&garbage, &text, "cannot decompress"),
        (&text, &text, "not a pprof profile"),
        (&missing, &text, "reading"),
        (&bomb, &text, "larger than 64 MiB"),
    ] {
        let out = allocprof()
            .args(["diff", a.to_str().unwrap(), b.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(needle), "{err}");
        assert!(
            err.contains(a.file_name().unwrap().to_str().unwrap()),
            "{err}"
        );
    }
    // The limit is the user's to lower (or raise), and named once.
    let out = allocprof()
        .args(["diff", "--max-profile-bytes", "1K"])
        .args([&bomb, &bomb])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("larger than 1.0 KiB"), "{err}");
    assert_eq!(err.matches("the limit").count(), 1, "{err}");
}

fn frame_titles(svg: &str) -> Vec<String> {
    // inferno declares the SVG 1.1 DTD.
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(svg, opts).expect("well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text().map(str::to_string))
        .collect()
}

#[test]
fn svg_flamegraph_is_well_formed_with_the_site_frames() {
    common::require_bpf();
    let mut w = Workload::c(&[]);
    let (out, _) = headless_export(&mut w, "svg", "svg");
    let label = w.label();
    w.exit();

    let svg = std::fs::read_to_string(&out).unwrap();
    let titles = frame_titles(&svg);
    let title_of = |name: &str| {
        titles
            .iter()
            .find(|t| t.starts_with(&format!("{name} (")))
            .unwrap_or_else(|| panic!("no frame {name} in {titles:?}"))
    };
    // Widths are the estimates: site_large's is exactly its 8 MiB.
    assert!(title_of("site_large").contains("8,388,608 bytes"));
    for frame in ["site_small", "site_medium", "main", &label] {
        title_of(frame);
    }
    assert!(
        !titles.iter().any(|t| t.starts_with("site_freed")),
        "freed memory is not live: {titles:?}"
    );
    assert!(svg.contains(&format!("allocprof: live bytes of {label}")));

    // A real renderer accepts it too; the PNG is left for people to look at.
    let png = out.with_extension("png");
    let status = Command::new("rsvg-convert")
        .arg("-o")
        .arg(&png)
        .arg(&out)
        .status()
        .expect("rsvg-convert comes from apt-get install librsvg2-bin");
    assert!(status.success());
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG"), "{png:?}");
}

// The JSON schema of docs/json-schema.md, written out independently of the
// exporter's own types: unknown or missing fields fail the test.

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Report {
    schema_version: u32,
    generator: String,
    elapsed_seconds: f64,
    confidence_level: f64,
    totals: Estimates,
    gone_totals: Estimates,
    dropped: u64,
    drops: BTreeMap<String, u64>,
    unmatched_frees: u64,
    lost_live_bytes: u64,
    processes: Vec<Process>,
    unwind: Unwind,
    min_age_seconds: f64,
    attached_at: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Unwind {
    files_ready: u64,
    files_loading: u64,
    files_unavailable: u64,
    free_rows: u64,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Process {
    pid: u32,
    generation: u32,
    name: String,
    state: String,
    sampling_rate_bytes: u64,
    totals: Estimates,
    alloc_events: u64,
    free_events: u64,
    dropped: u64,
    drops: BTreeMap<String, u64>,
    unmatched_frees: u64,
    lost_live_bytes: u64,
    contracts: Vec<String>,
    weight_form: Option<String>,
    weight_interval_bytes: Option<u64>,
    mapped_bytes: i64,
    since_attach: bool,
    thinned_events: u64,
    thin_factor: u64,
    resident: Option<Resident>,
    allocator: Option<Allocator>,
    ledger: Option<Ledger>,
    stacks: Vec<Stack>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Ledger {
    read: bool,
    seeded_blocks: u64,
    freed_since: u64,
    seen_blocks: u64,
    torn_records: u64,
    garbage_records: u64,
    unread_records: u64,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Allocator {
    backend: String,
    reserved_bytes: Option<u64>,
    committed_bytes: Option<u64>,
    in_use_bytes: Option<u64>,
    free_bytes: Option<u64>,
    mmapped_bytes: Option<u64>,
    age_seconds: f64,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Stack {
    totals: Estimates,
    age: Age,
    frames: Vec<Frame>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Resident {
    anon_bytes: u64,
    file_bytes: u64,
    shmem_bytes: u64,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Age {
    live_bytes_older_than_1m: f64,
    live_bytes_older_than_10m: f64,
    oldest_seconds: f64,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Frame {
    function: String,
    file: Option<String>,
    line: Option<u32>,
    module: Option<String>,
    inlined: bool,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Estimates {
    live_bytes: f64,
    live_bytes_ci95: Option<f64>,
    live_objects: f64,
    live_samples: u64,
    alloc_bytes: f64,
    alloc_bytes_ci95: Option<f64>,
    alloc_objects: f64,
    alloc_samples: u64,
    live_before_attach_bytes: f64,
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
    assert_eq!(large.frames[1].function, "main", "innermost first");
    let small = site("site_small");
    assert!(small.totals.live_bytes_ci95 > Some(0.0), "{small:?}");
    assert!(small.totals.live_bytes > 0.0);
    let freed = site("site_freed");
    assert_eq!(freed.totals.live_bytes, 0.0);
    assert!(freed.totals.alloc_bytes > 0.0);
    assert!(freed.totals.alloc_bytes_ci95 > Some(0.0));
}

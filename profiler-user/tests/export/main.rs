//! The export formats with real eBPF and real workloads, checked by the
//! tools people open them with: pprof in `go tool pprof` (-top, -traces,
//! -base), the flamegraph as XML (and through rsvg-convert), JSON against
//! the schema in docs/json-schema.md; `allocprof record` snapshots and
//! `allocprof diff`.

mod json;

use json::Report;

#[path = "../common/mod.rs"]
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

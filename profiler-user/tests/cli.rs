//! The `allocprof` binary as users run it: exit codes and messages for bad
//! input, headless reports, folded-stack output, targets that exit.

mod common;

use std::{
    io::{BufRead, BufReader, Read, Write},
    process::{Child, Command, Output, Stdio},
};

fn allocprof() -> Command {
    Command::new(env!("CARGO_BIN_EXE_allocprof"))
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

#[test]
fn help_lists_the_options() {
    let (code, out, _) = run(allocprof().arg("--help"));
    assert_eq!(code, 0);
    for opt in ["--pid", "--duration", "--format", "--output", "--value"] {
        assert!(out.contains(opt), "--help lacks {opt}:\n{out}");
    }
}

#[test]
fn garbage_arguments_are_usage_errors() {
    let (code, _, err) = run(allocprof().args(["--duration", "soon"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("examples: 30s"), "{err}");
    let (code, _, err) = run(allocprof().args(["--pid", "abc"]));
    assert_eq!(code, 2, "{err}");
}

#[test]
fn numbers_out_of_range_are_usage_errors_not_panics() {
    for args in [
        &["-d", "1e30"][..],
        &["record", "--interval", "1e-10", "-o", "/tmp/x.pb.gz"],
        &["--max-live-samples", "0"],
        &["--max-new-stacks-per-second", "0"],
        &[
            "record",
            "-d",
            "5s",
            "--interval",
            "10s",
            "-o",
            "/tmp/x.pb.gz",
        ],
    ] {
        let (code, _, err) = run(allocprof().args(args));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn probe_files_that_cannot_be_armed_are_named() {
    common::require_bpf();
    // A file without probes, a missing file, and the flag outside system-wide mode.
    let (code, _, err) = run(allocprof().args(["-d", "1s", "--probe-file", "/bin/true"]));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("/bin/true carries no otel_memory or ddheap probes"),
        "{err}"
    );
    let (code, _, err) = run(allocprof().args(["-d", "1s", "--probe-file", "/no/such.so"]));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot read the probe file /no/such.so"),
        "{err}"
    );
    let (code, _, err) = run(allocprof().args(["--pid", "1", "--probe-file", "/bin/true"]));
    assert_eq!(code, 2, "{err}");
}

#[test]
fn unwritable_outputs_fail_before_profiling() {
    let dir = std::env::temp_dir();
    let missing = dir.join("allocprof-no-such-dir/heap.folded");
    for out in [missing.as_path(), dir.as_path()] {
        let (code, _, err) = run(allocprof().args(["-d", "30s", "-o"]).arg(out));
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(&out.display().to_string()), "{err}");
    }
}

#[test]
fn nonexistent_pid_is_reported() {
    common::require_bpf();
    // Past pid_max, so it cannot exist.
    let (code, _, err) = run(allocprof().args(["--pid", "99999999", "-d", "1s"]));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no process with pid 99999999"), "{err}");
}

#[test]
fn process_without_probes_gets_instructions() {
    common::require_bpf();
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let (code, _, err) = run(allocprof().args(["--pid", &sleeper.id().to_string(), "-d", "1s"]));
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("has no otel_memory or ddheap probes"), "{err}");
    assert!(err.contains("LD_PRELOAD="), "{err}");
    assert!(err.contains("SamplingAllocator"), "{err}");
}

#[test]
fn unprivileged_user_is_told_to_use_root() {
    common::require_bpf();
    let setpriv = "/usr/bin/setpriv";
    assert!(
        std::path::Path::new(setpriv).exists(),
        "setpriv comes from util-linux"
    );
    // The test binary may live where nobody cannot reach it; copy it out.
    let dir = std::env::temp_dir().join("allocprof-unprivileged");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("allocprof");
    std::fs::copy(env!("CARGO_BIN_EXE_allocprof"), &exe).unwrap();
    std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (code, _, err) = run(Command::new(setpriv)
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(&exe)
        .args(["-d", "1s"]));
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("needs root"), "{err}");
}

/// The C workload under LD_PRELOAD, waiting for "go".
fn workload() -> Child {
    workload_with(&[])
}

fn workload_with(env: &[(&str, &str)]) -> Child {
    let exe = common::compile_c("alloc_sites.c", &["-ldl"]);
    let child = common::preloaded(Command::new(exe).envs(env.iter().copied()))
        .spawn()
        .unwrap();
    common::wait_for_mapping(child.id(), "liballocprof.so");
    child
}

/// Starts allocprof with `args` on the workload and waits until it has attached.
fn attach(w: &Child, args: &[&str]) -> Child {
    common::spawn_attached(
        allocprof()
            .args(["--pid", &w.id().to_string()])
            .args(args)
            .stdout(Stdio::piped()),
    )
}

fn go(w: &mut Child) {
    writeln!(w.stdin.as_mut().unwrap(), "go").unwrap();
    let mut line = String::new();
    BufReader::new(w.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
}

#[test]
fn a_hostile_process_name_reaches_the_terminal_inert() {
    common::require_bpf();
    // The name clears the screen and retitles the terminal if printed raw.
    let hostile = "\u{1b}[2J\u{1b}]0;x\u{7}esc";
    let mut w = workload_with(&[("WORKLOAD_COMM", hostile)]);
    let profiler = attach(&w, &["-d", "2s"]);
    go(&mut w);
    let result = profiler.wait_with_output().unwrap();
    writeln!(w.stdin.as_mut().unwrap(), "exit").unwrap();
    w.wait().unwrap();
    assert!(result.status.success());
    let report = String::from_utf8(result.stdout).unwrap();
    assert!(report.contains("\\x1b[2J\\x1b]0;x\\x07esc"), "{report}");
    assert!(
        !report.contains(['\u{1b}', '\u{7}']),
        "raw control characters in the report: {report:?}"
    );
}

#[test]
fn headless_collapsed_output_is_folded_stacks() {
    common::require_bpf();
    let mut w = workload();
    let out = common::scratch_dir("cli").join(format!("heap-{}.folded", w.id()));
    let profiler = attach(
        &w,
        &[
            "-d",
            "3s",
            "--format",
            "collapsed",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    go(&mut w);
    let result = profiler.wait_with_output().unwrap();
    assert!(result.status.success());
    writeln!(w.stdin.as_mut().unwrap(), "exit").unwrap();
    w.wait().unwrap();

    let folded = std::fs::read_to_string(&out).unwrap();
    let root = format!("alloc_sites ({})", w.id());
    let mut large = 0u64;
    for line in folded.lines() {
        let (stack, value) = line.rsplit_once(' ').expect("`stack value` lines");
        let value: u64 = value.parse().expect("integer values");
        assert!(
            stack.starts_with(&format!("{root};")),
            "process is the root frame: {line}"
        );
        assert!(value > 0);
        if stack.ends_with(";site_large") || stack.contains(";site_large;") {
            large += value;
        }
    }
    // 8 MiB live at site_large, always sampled at this rate.
    assert_eq!(large, 8 << 20, "{folded}");
    assert!(folded.contains("main;site_small"), "root first: {folded}");
    // The report is printed as well.
    let report = String::from_utf8_lossy(&result.stdout);
    assert!(
        report.contains("LIVE BYTES (95% CI)") && report.contains(&root),
        "{report}"
    );
    // The header says the tables of its files are in.
    let header = report.lines().next().unwrap_or_default();
    assert!(header.contains(", unwind tables for "), "{header}");
}

#[test]
fn max_unwind_rows_0_walks_frame_pointers_only() {
    common::require_bpf();
    let mut w = workload();
    let profiler = attach(&w, &["-d", "3s", "--max-unwind-rows", "0"]);
    go(&mut w);
    let result = profiler.wait_with_output().unwrap();
    assert!(result.status.success());
    writeln!(w.stdin.as_mut().unwrap(), "exit").unwrap();
    w.wait().unwrap();
    let report = String::from_utf8_lossy(&result.stdout);
    let header = report.lines().next().unwrap_or_default();
    assert!(!header.contains("unwind"), "no tables: {header}");
    // The workload is built with frame pointers: its stacks stay whole.
    assert!(
        report.contains("site_large") && report.contains("main"),
        "{report}"
    );
    assert!(!report.contains("[truncated"), "{report}");
}

#[test]
fn target_exiting_mid_run_stays_in_the_report() {
    common::require_bpf();
    let mut w = workload();
    let mut profiler = attach(&w, &["-d", "60s"]);
    go(&mut w);
    // Give allocprof a refresh with the process alive, then let it exit.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    writeln!(w.stdin.as_mut().unwrap(), "exit").unwrap();
    w.wait().unwrap();
    // allocprof stops by itself once every target has exited.
    let status = profiler.wait().unwrap();
    assert!(status.success());
    let mut report = String::new();
    profiler
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut report)
        .unwrap();
    assert!(
        report.contains(&format!("alloc_sites ({})", w.id())),
        "{report}"
    );
    assert!(report.contains("exited"), "{report}");
    assert!(
        report.contains("site_large"),
        "symbolized after exit: {report}"
    );
}

#[test]
fn a_named_process_that_has_sampled_nothing_yet_is_in_the_report_and_json() {
    common::require_bpf();
    // At a 1 GiB rate and waiting for "go", it makes no sampled allocation.
    let exe = common::compile_c("alloc_sites.c", &["-ldl"]);
    let mut w = common::preloaded(&mut Command::new(exe))
        .env("ALLOCPROF_RATE", "1g")
        .spawn()
        .unwrap();
    common::wait_for_mapping(w.id(), "liballocprof.so");
    let json = common::scratch_dir("cli").join(format!("idle-{}.json", w.id()));
    let profiler = attach(
        &w,
        &["-d", "2s", "--format", "json", "-o", json.to_str().unwrap()],
    );
    let result = profiler.wait_with_output().unwrap();
    w.kill().unwrap();
    w.wait().unwrap();
    assert!(result.status.success(), "{:?}", result.status);
    let report = String::from_utf8_lossy(&result.stdout);
    let label = format!("alloc_sites ({})", w.id());
    let header = report.lines().next().unwrap_or_default();
    assert!(header.starts_with("allocprof: 1 process,"), "{report}");
    assert!(report.contains(&label), "{report}");
    assert!(!report.contains("no sampled allocations yet"), "{report}");
    let resident = report
        .lines()
        .find(|l| l.contains(&label) && l.contains("resident"))
        .unwrap_or_else(|| panic!("no resident line: {report}"));
    assert!(resident.contains("live heap 0 B"), "{resident}");

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let processes = json["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "{json:#}");
    let p = &processes[0];
    assert_eq!(p["pid"], w.id(), "{p:#}");
    assert_eq!(p["state"], "live", "{p:#}");
    assert_eq!(p["totals"]["live_bytes"], 0.0, "{p:#}");
    assert_eq!(p["stacks"].as_array().unwrap().len(), 0, "{p:#}");
    assert!(
        p["resident"]["anon_bytes"].as_u64().unwrap() > 0,
        "its resident memory: {p:#}"
    );
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on a child we own.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

#[test]
fn sigterm_detaches_cleanly_with_a_report() {
    common::require_bpf();
    let mut w = workload();
    let profiler = attach(&w, &["-d", "60s"]);
    go(&mut w);
    signal(&profiler, libc::SIGTERM);
    let result = profiler.wait_with_output().unwrap();
    assert!(result.status.success(), "{:?}", result.status);
    let report = String::from_utf8_lossy(&result.stdout);
    assert!(
        report.contains(&format!("alloc_sites ({})", w.id())),
        "{report}"
    );
    // The target runs on, unaffected, and exits normally.
    writeln!(w.stdin.as_mut().unwrap(), "exit").unwrap();
    assert!(w.wait().unwrap().success());
}

#[test]
fn sigterm_the_moment_it_says_attached_still_ends_cleanly() {
    common::require_bpf();
    let mut w = workload();
    let out = common::scratch_dir("cli").join(format!("stopped-{}.pb.gz", std::process::id()));
    let record = ["record", "-o", out.to_str().unwrap()];
    for args in [&["-d", "60s"][..], &record] {
        // Whoever waits for the "attached" line may stop it at once.
        let mut cmd = allocprof();
        cmd.args(args)
            .args(["--pid", &w.id().to_string()])
            .stdout(Stdio::piped());
        let profiler = common::spawn_attached(&mut cmd);
        signal(&profiler, libc::SIGTERM);
        let result = profiler.wait_with_output().unwrap();
        assert!(
            result.status.success(),
            "allocprof {args:?} stopped right after attaching: {:?}",
            result.status
        );
    }
    w.kill().unwrap();
    w.wait().unwrap();
}

#[test]
fn sigkill_of_allocprof_leaves_the_target_unharmed() {
    common::require_bpf();
    let mut w = workload();
    let mut profiler = attach(&w, &["-d", "60s"]);
    signal(&profiler, libc::SIGKILL);
    profiler.wait().unwrap();
    // The kernel removed the probes with allocprof's descriptors: the target
    // allocates (hitting the probe sites) and exits normally.
    go(&mut w);
    writeln!(w.stdin.as_mut().unwrap(), "exit").unwrap();
    assert!(w.wait().unwrap().success());
}

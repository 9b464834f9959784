//! The TUI as a person uses it: allocprof in a real terminal (a tmux pane)
//! on a workload with known allocation sites; keys sent with `send-keys`,
//! the screen read with `capture-pane`. Nothing here is timed: every check
//! polls the pane until the expected text shows, with a generous deadline,
//! and fails with what the pane showed.

mod common;

use common::{
    Workload,
    tmux::{Tmux, shell_quote},
};

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// The row of the first line that mentions `text`.
fn line_of(pane: &str, text: &str) -> usize {
    pane.lines()
        .position(|l| l.contains(text))
        .unwrap_or_else(|| panic!("{text} is not on screen:\n{pane}"))
}

#[test]
fn tui_shows_the_stacks_sorts_helps_exports_and_quits_cleanly() {
    common::require_bpf();
    let mut workload = Workload::c(&[]);
    let dir: PathBuf = common::scratch_dir(&format!("tui-e2e-{}", std::process::id()));
    let script = format!(
        "cd {dir} && stty -g > stty.before; {exe} --pid {pid}; echo EXIT=$? > exit.status; \
         stty -g > stty.after; echo TUI-TEST-DONE; exec sleep 600",
        dir = shell_quote(&dir),
        exe = shell_quote(Path::new(env!("CARGO_BIN_EXE_allocprof"))),
        pid = workload.pid(),
    );
    let tmux = Tmux::start(120, 40, &script);

    // The TUI is up once its header shows a profile; the probes were
    // attached before it started.
    // The workload ran before allocprof attached, but its ledger shows its
    // whole heap: "live heap" (0 B, or stdin's buffer when that 4 KiB
    // block was sampled: 1 run in 16 at the test's rate), and the process
    // named with --pid is listed before it samples.
    tmux.wait_for("the TUI", |p| {
        p.contains("1 process") && p.contains("live heap ") && p.contains("events/s")
    });
    workload.allocate();

    // The workload's sites, named by their most informative frame.
    let sites = [
        "site_small ← main",
        "site_medium ← main",
        "site_large ← main",
    ];
    let pane = tmux.wait_for("the workload's stacks", |p| {
        sites.iter().all(|s| p.contains(s))
    });
    assert!(pane.contains("pid "), "{pane}");
    // The all-processes view names each row's process.
    let pid = format!("({})", workload.pid());
    for site in sites {
        let row = pane.lines().find(|l| l.contains(site)).unwrap();
        assert!(row.contains(" · ") && row.contains(&pid), "{site}:\n{pane}");
    }
    assert!(pane.contains("sampling rate 64.0 KiB"), "{pane}");
    // By live bytes: 12.5 MB of 64-byte blocks over 8 MiB of 1 MiB ones.
    assert!(
        line_of(&pane, "site_small ← main") < line_of(&pane, "site_large ← main"),
        "sorted by live bytes:\n{pane}"
    );

    // `s` five times: samples, objects, allocation rate, live over a
    // minute old, then the name.
    for _ in 0..5 {
        tmux.keys(&["s"]);
    }
    let pane = tmux.wait_for("the sort by name", |p| p.contains("sort name"));
    assert!(
        line_of(&pane, "site_large ← main") < line_of(&pane, "site_small ← main"),
        "sorted by name:\n{pane}"
    );

    // F1 (as `?`) opens the help; `?` again turns to the legend.
    tmux.keys(&["F1"]);
    // Its last line drawn: the whole overlay is (a capture may land
    // mid-draw).
    let pane = tmux.wait_for("the help", |p| {
        p.contains("Keys") && p.contains("q F10 ? F1")
    });
    assert!(pane.contains("mark a baseline"), "{pane}");
    tmux.literal("?");
    tmux.wait_for("the legend", |p| {
        p.contains("Legend") && p.contains("(0 B – x)")
    });
    tmux.keys(&["Escape"]);
    tmux.wait_for("the help to close", |p| !p.contains("(0 B – x)"));

    // `d` enlarges the detail, which then scrolls; Esc makes it small again.
    tmux.keys(&["d"]);
    tmux.wait_for("the enlarged detail", |p| p.contains("PgUp/PgDn: scroll"));
    tmux.keys(&["Escape"]);
    tmux.wait_for("the detail back", |p| p.contains("Enter/d: larger"));

    // `e` exports the view; the status line names the file.
    tmux.keys(&["e"]);
    let pane = tmux.wait_for("the export", |p| {
        p.contains("exported the stacks of all processes to")
    });
    let exported = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "svg"))
        .unwrap_or_else(|| panic!("no .svg file in {}:\n{pane}", dir.display()));
    // Without --format, a flamegraph, named after the time.
    let name = exported.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("allocprof-20") && name.ends_with("Z.svg"),
        "{name}"
    );
    let svg = std::fs::read_to_string(&exported).unwrap();
    assert!(svg.contains("<svg") && svg.contains("site_large"), "{svg}");

    // F10 quits, as q does.
    tmux.keys(&["F10"]);
    let status_file = dir.join("exit.status");
    let pane = tmux.wait_for("allocprof to exit", |p| p.contains("TUI-TEST-DONE"));
    assert_eq!(
        std::fs::read_to_string(&status_file).unwrap().trim(),
        "EXIT=0",
        "{pane}"
    );
    // The terminal is restored: the main screen is back (with what allocprof
    // printed on leaving), and the tty modes are as they were.
    assert_eq!(
        tmux.output(&["display-message", "-p", "-t", "tui", "#{alternate_on}"])
            .trim(),
        "0"
    );
    assert!(!pane.contains("live since attach"), "{pane}");
    assert!(pane.contains("allocprof: exported the stacks"), "{pane}");
    assert_eq!(
        std::fs::read_to_string(dir.join("stty.before")).unwrap(),
        std::fs::read_to_string(dir.join("stty.after")).unwrap(),
        "the tty modes changed"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tui_shows_a_named_process_that_has_sampled_nothing_yet() {
    common::require_bpf();
    // At a 1 GiB rate and waiting for "go", it makes no sampled allocation.
    let exe = common::compile_c("alloc_sites.c", &["-ldl"]);
    let mut workload = common::preloaded(&mut Command::new(exe))
        .env("ALLOCPROF_RATE", "1g")
        .spawn()
        .unwrap();
    common::wait_for_mapping(workload.id(), "liballocprof.so");
    let script = format!(
        "{exe} --pid {pid}; echo TUI-TEST-DONE; exec sleep 600",
        exe = shell_quote(Path::new(env!("CARGO_BIN_EXE_allocprof"))),
        pid = workload.id(),
    );
    let tmux = Tmux::start(120, 40, &script);
    let pane = tmux.wait_for("the TUI", |p| p.contains("events/s"));
    assert!(pane.contains("1 process"), "{pane}");
    assert!(!pane.contains("Nothing profiled yet"), "{pane}");
    // Its row in the processes view, at 0 B.
    tmux.keys(&["Tab"]);
    let pid = workload.id().to_string();
    let is_row = |l: &str| l.contains("alloc_sites") && l.contains(&pid) && l.contains("live");
    let pane = tmux.wait_for("its row", |p| p.lines().any(is_row));
    let row = pane.lines().find(|l| is_row(l)).unwrap();
    assert!(row.contains("0 B ± 0 B"), "{pane}");
    assert!(pane.contains("resident "), "its resident memory: {pane}");
    tmux.keys(&["q"]);
    tmux.wait_for("allocprof to exit", |p| p.contains("TUI-TEST-DONE"));
    workload.kill().unwrap();
    workload.wait().unwrap();
}

//! The process and stack tables: rows, columns, sorting, grouping, search,
//! the selection, badges, and the first screen's how-to.

use super::*;

#[test]
fn stack_view_snapshot() {
    let mut app = app_at(3);
    let (text, buffer) = screen(&mut app, 80, 24);
    let expected = " allocprof  pid 7 · 2 processes · live heap 75.3 KiB ± 5.3 KiB · 3s
 sampled 0 events/s · drops 0 · sampling rate 512.0 KiB · refresh 1s
┌ Processes   Stacks  all processes · by stack ────────── 4 rows · sort live ▼ ┐
│  ALLOCATED AT                       LIVE ± 95% CI ▼   % ▼   SAMPLES   ALLOC/s│
│▶ cache_fill ← main · server (7)  48.8 KiB ± 4.3 KiB 64.9%         1       0 B│
│  cache_fill ← main · worker (9)  19.5 KiB ± 2.7 KiB 25.9%         1       0 B│
│  leak ← handle · server (7)       4.0 KiB ± 1.2 KiB  5.3%         1   2.0 KiB│
│  parse ← handle · server (7)      2.9 KiB ± 1.0 KiB  3.9%         1 390.6 KiB│
│                                                                              │
│                                                                              │
│                                                                              │
│                                                                              │
│                                                                              │
└──────────────────────────────────────────────────────────────────────────────┘
┌ Stack: cache_fill ← main · server (7) ───────┐┌ History ─────────────────────┐
│cache_fill  src/work.c:10                     ││live heap 75.3 KiB +3.0 KiB/1m│
│main  src/work.c:4                            ││▇▇▇█                          │
│                                              ││████                          │
│                                              ││████                          │
│                                              ││cache_fill ← ma… 48.8 KiB · 3s│
│                                              ││████                          │
│                                              ││████                          │
└───────────────────────────── Enter/d: larger ┘└──────────────────────────────┘
                                                                 ?:help  q:quit
";
    assert_eq!(text, expected, "\n{text}");
    // The selected row is highlighted, the naming frame bold.
    assert!(buffer[(3, 4)].modifier.contains(Modifier::BOLD));
    assert_eq!(buffer[(3, 4)].bg, Color::Indexed(236));
    assert_eq!(buffer[(3, 5)].bg, Color::Reset);
    assert!(buffer[(1, 15)].modifier.contains(Modifier::BOLD));
    // Growth is red.
    assert_eq!(buffer[(71, 15)].fg, GROWING);
    // Wide, every row names its process in full.
    let (text, _) = screen(&mut app, 160, 48);
    for row in [
        "│▶ cache_fill ← main · server (7) ",
        "│  cache_fill ← main · worker (9) ",
        "│  leak ← handle · server (7) ",
        "│  parse ← handle · server (7) ",
    ] {
        assert!(text.contains(row), "{row}:\n{text}");
    }
}

#[test]
fn hostile_names_are_shown_inert() {
    let mut app = App::new(options());
    let mut profile = sample(0);
    profile.processes[0].name = "\u{1b}]0;x\u{7}".into();
    app.update(AppEvent::Profile(profile));
    press(&mut app, KeyCode::Tab);
    let (text, _) = screen(&mut app, 120, 30);
    assert!(text.contains("\\x1b]0;x\\x07"), "{text}");
}

#[test]
fn process_view_has_a_row_per_process_with_growth_and_state() {
    let mut app = app_at(3);
    press(&mut app, KeyCode::Tab);
    press(&mut app, KeyCode::Char('s')); // by pid, ascending
    press(&mut app, KeyCode::Char('s')); // back to live
    let (text, _) = screen(&mut app, 120, 30);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[3].contains("PROCESS")
            && lines[3].contains("PID")
            && lines[3].contains("LIVE ± 95% CI")
            && lines[3].contains("OBJECTS")
            && lines[3].contains("ALLOC/s")
            && lines[3].contains("GROWTH 1m")
            && lines[3].contains("SAMPLES")
            && lines[3].contains("STATE"),
        "{text}"
    );
    assert!(lines[4].starts_with("│▶ server"), "{text}");
    assert!(lines[4].contains("55.7 KiB ± 4.6 KiB"), "{text}");
    assert!(lines[4].contains("+3.0 KiB"), "{text}");
    assert!(
        lines[4].trim_end_matches('│').trim_end().ends_with("live"),
        "{text}"
    );
    assert!(lines[5].starts_with("│  worker"), "{text}");
    // The detail pane describes the process and its top stacks.
    assert!(text.contains("Process server (7)"), "{text}");
    assert!(
        text.contains("sampled events: 10 allocs, 5 frees · dropped 0"),
        "{text}"
    );
    assert!(text.contains("48.8 KiB  cache_fill ← main"), "{text}");
    // Narrow: less important columns go, the name stays readable.
    let (narrow, _) = screen(&mut app, 60, 20);
    assert!(narrow.contains("▶ server"), "{narrow}");
    assert!(!narrow.contains("SAMPLES"), "{narrow}");
}

#[test]
fn sorting_marks_the_column_and_reorders() {
    let mut app = app_at(3);
    // Samples, objects, allocation rate, live over a minute, then the name.
    for _ in 0..5 {
        press(&mut app, KeyCode::Char('s'));
    }
    let (text, _) = screen(&mut app, 80, 24);
    assert!(text.contains("ALLOCATED AT ▲"), "{text}");
    assert!(text.contains("sort name ▲"), "{text}");
    let at = |s: &str| text.find(s).unwrap();
    assert!(at("cache_fill ← main") < at("leak ← handle"));
    assert!(at("leak ← handle") < at("parse ← handle"));
}

#[test]
fn baseline_and_pause_show_as_badges_and_a_column() {
    let mut app = app_at(3);
    press(&mut app, KeyCode::Char('b'));
    for s in 4..=6 {
        app.update(AppEvent::Profile(sample(s)));
    }
    press(&mut app, KeyCode::Char('p'));
    let (text, buffer) = screen(&mut app, 120, 30);
    let first = text.lines().next().unwrap();
    assert!(first.ends_with("PAUSED   BASELINE @3s"), "{text}");
    assert!(text.contains("Δ BASELINE ▼"), "{text}");
    let leak = text.lines().nth(4).unwrap();
    assert!(
        leak.starts_with("│▶ leak ← handle · server (7)"),
        "the grower is on top:\n{text}"
    );
    assert!(leak.contains("+3.0 KiB"), "{text}");
    assert!(text.contains("paused: the view is frozen"), "{text}");
    let badge = first.find("PAUSED").unwrap();
    let x = first[..badge].chars().count() as u16;
    assert_eq!(buffer[(x, 0)].bg, Color::Yellow);
}

#[test]
fn grouping_by_function_and_search() {
    let mut app = app_at(3);
    press(&mut app, KeyCode::Char('g'));
    press(&mut app, KeyCode::Char('/'));
    for c in "lea".chars() {
        press(&mut app, KeyCode::Char(c));
    }
    let (text, _) = screen(&mut app, 80, 24);
    assert!(text.contains("all processes · by function"), "{text}");
    assert!(text.contains("/lea"), "{text}");
    assert!(text.contains("1 row · sort live ▼"), "{text}");
    assert!(text.contains("│▶ leak · server (7) "), "{text}");
    assert!(text.contains("Function: leak · server (7)"), "{text}");
    assert!(text.contains("heaviest stack through leak:"), "{text}");
    assert!(text.contains(" /lea█  Enter: keep · Esc: clear"), "{text}");
    press(&mut app, KeyCode::Char('x'));
    let (text, _) = screen(&mut app, 80, 24);
    assert!(
        text.contains("no row matches the search (Esc clears it)"),
        "{text}"
    );
}

#[test]
fn the_selection_stays_on_screen() {
    let mut app = App::new(options());
    let mut p = sample(1);
    p.processes[0].stacks = (0..100)
        .map(|i| allocprof::model::profile::StackProfile {
            frames: crate::tui::rows::tests::frames(&[&format!("f{i:03}"), "main"]),
            totals: crate::tui::rows::tests::totals(1e6 - f64::from(i), 0.0),
        })
        .collect();
    app.update(AppEvent::Profile(p));
    let selected_line = |app: &mut App| {
        let (text, _) = screen(app, 80, 24);
        let line = text.lines().find(|l| l.contains('▶')).map(str::to_string);
        let label = app.selected_row().unwrap().label.clone();
        assert!(
            line.as_deref().is_some_and(|l| l.contains(&label)),
            "{label} is not on screen:\n{text}"
        );
        label
    };
    press(&mut app, KeyCode::End);
    assert_eq!(selected_line(&mut app), "cache_fill ← main · worker (9)");
    press(&mut app, KeyCode::PageUp);
    assert_eq!(app.selected_index(), Some(100 - app.table().page()));
    selected_line(&mut app);
    press(&mut app, KeyCode::Home);
    assert_eq!(selected_line(&mut app), "f000 ← main · server (7)");
    press(&mut app, KeyCode::PageDown);
    selected_line(&mut app);
}

#[test]
fn the_stack_flood_is_shown_as_its_frame() {
    let mut app = App::new(options());
    let mut profile = sample(0);
    profile.processes[0].stacks[0].frames = std::sync::Arc::from(vec![StackFrame::named(
        allocprof::model::profile::STACK_FLOOD,
    )]);
    profile.processes[0].stacks[0].totals.live_bytes = 1e9;
    app.update(AppEvent::Profile(profile));
    let (text, _) = screen(&mut app, 120, 24);
    assert!(
        text.contains("[stack flood: new stacks over the per-process limit]"),
        "{text}"
    );
}

#[test]
fn exited_processes_are_not_live_heap() {
    let mut app = App::new(options());
    let mut profile = sample(0);
    let live_before = profile.live_totals().live_bytes;
    let mut gone = profile.processes[0].clone();
    gone.key.pid = allocprof::ids::Pid(99);
    gone.state = allocprof::model::profile::ProcessState::Exited;
    for s in &mut gone.stacks {
        s.totals.live_bytes = 5e9;
    }
    gone.totals = gone.stacks.iter().map(|s| s.totals).sum();
    profile.processes.push(gone);
    app.update(AppEvent::Profile(profile));
    let (text, _) = screen(&mut app, 120, 24);
    let header = text.lines().next().unwrap();
    assert!(header.contains("(1 exited)"), "{header}");
    assert!(
        header.contains(&format!("live heap {}", human_bytes(live_before))),
        "the exited process's 5 GB are not live heap: {header}"
    );
    // Its 5 GB stacks come last, named as at exit, dimmed.
    let exited = line_of(&text, "· server (99) exited").unwrap();
    assert!(
        line_of(&text, "leak ← handle · server (7)").unwrap() < exited,
        "{text}"
    );
    // Shares apart, too: the running processes' of the live heap.
    let server = text
        .lines()
        .find(|l| l.contains("cache_fill ← main · server (7)"))
        .unwrap();
    assert!(
        server.contains("48.8 KiB ± 4.3 KiB") && server.contains(" 67.6% "),
        "{text}"
    );
    // The process table: GROWTH says it is at exit; a minute later, and
    // until `x`, the header counts it hidden.
    press(&mut app, KeyCode::Tab);
    let (text, buffer) = screen(&mut app, 120, 24);
    let (x, y) = cell_of(&text, "at exit");
    assert_eq!(buffer[(x, y)].fg, Color::DarkGray, "{text}");
    assert!(
        text.lines().nth(y as usize).unwrap().contains("server"),
        "{text}"
    );
    let mut later = sample(61);
    later
        .processes
        .push(app.shown().unwrap().processes[2].clone());
    app.update(AppEvent::Profile(later));
    let (text, _) = screen(&mut app, 120, 24);
    assert!(text.contains("(1 exited, 1 hidden: x)"), "{text}");
    assert!(!text.contains("at exit"), "{text}");
}

#[test]
fn the_cursor_is_drawn_on_the_first_row_after_a_reorder() {
    for (w, h) in [(80, 24), (160, 48)] {
        let mut app = app_at(2);
        app.update(AppEvent::Profile(sample(100)));
        let (text, _) = screen(&mut app, w, h);
        let cursor = text.lines().find(|l| l.contains('▶')).unwrap();
        assert!(
            cursor.starts_with("│▶ leak ← handle · server (7)"),
            "{text}"
        );
        assert_eq!(text.lines().position(|l| l.contains('▶')), Some(4));
    }
}

#[test]
fn intervals_never_reach_below_zero() {
    assert_eq!(interval(4096.0, 1024.0), " ± 1.0 KiB");
    assert_eq!(
        interval(512.0 * 1024.0, 1003.5 * 1024.0),
        " (0 B – 1.5 MiB)"
    );
    assert_eq!(interval(0.0, 0.0), " ± 0 B");
    assert_eq!(interval(10.0, f64::NAN), " ± ?");
    for (w, h) in [(80, 24), (160, 48)] {
        let mut app = App::new(options());
        let mut p = sample(1);
        // 512 KiB ± 1003.5 KiB: one heavy sample.
        let t = &mut p.processes[1].stacks[0].totals;
        t.live_bytes = 512.0 * 1024.0;
        t.live_var = (1003.5f64 * 1024.0 / 1.959_963_984_540_054).powi(2);
        p.processes[1].totals = *t;
        app.update(AppEvent::Profile(p));
        let (text, _) = screen(&mut app, w, h);
        let row = text
            .lines()
            .find(|l| l.contains("cache_fill ← main · worker (9)"))
            .unwrap();
        assert!(row.contains("512.0 KiB (0 B – 1.5 MiB)"), "{text}");
        // Each stack row says how many samples it stands on.
        assert!(text.contains("SAMPLES"), "{text}");
        assert!(!text.contains("± 1003"), "{text}");
        // The process's detail, too.
        press(&mut app, KeyCode::Tab);
        press(&mut app, KeyCode::Home);
        let (text, _) = screen(&mut app, w, h);
        assert!(text.contains("live 512.0 KiB (0 B – 1.5 MiB)"), "{text}");
        if w >= 160 {
            assert!(text.contains("(2 samples, 1 still live)"), "{text}");
        }
    }
}

#[test]
fn the_first_screen_says_how_to_make_a_program_profilable() {
    for (w, h) in [(80, 24), (160, 48)] {
        let mut app = App::new(options());
        app.update(AppEvent::Profile(crate::tui::rows::tests::profile(
            1,
            vec![],
        )));
        let (text, _) = screen(&mut app, w, h);
        assert!(text.contains("Nothing profiled yet"), "{text}");
        assert!(
            text.contains("LD_PRELOAD=/path/to/liballocprof.so your-program"),
            "{text}"
        );
        assert!(
            text.contains("static A: SamplingAllocator<System> = SamplingAllocator::new(System);"),
            "{text}"
        );
        // Both tables say it.
        press(&mut app, KeyCode::Tab);
        let (text, _) = screen(&mut app, w, h);
        assert!(text.contains("Nothing profiled yet"), "{text}");
        // Once a process has the probes, the table is back.
        app.update(AppEvent::Profile(sample(2)));
        let (text, _) = screen(&mut app, w, h);
        assert!(!text.contains("Nothing profiled yet"), "{text}");
        assert!(text.contains("server"), "{text}");
    }
    // The library found beside allocprof is named as it is, inert.
    let mut app = App::new(crate::tui::AppOptions {
        preload: Some("/opt/allocprof/liballocprof.so".into()),
        ..options()
    });
    app.update(AppEvent::Profile(crate::tui::rows::tests::profile(
        1,
        vec![],
    )));
    let (text, _) = screen(&mut app, 160, 48);
    assert!(
        text.contains("LD_PRELOAD=/opt/allocprof/liballocprof.so your-program"),
        "{text}"
    );
}

#[test]
fn the_process_table_folds_trees_and_a_root_opens_its_whole_tree() {
    let mut app = crate::tui::state::tests::forked_app();
    press(&mut app, KeyCode::Char('t'));
    press(&mut app, KeyCode::Right);
    let lines = screen_lines(&mut app, 120, 30);
    assert!(
        lines[2].contains(" Processes   Stacks  trees "),
        "{lines:#?}"
    );
    assert!(lines[4].starts_with("│▶ ▾ server (2 under)"), "{lines:#?}");
    // The root's live heap is the tree's: 100 B + 3000 B + 2000 B.
    assert!(lines[4].contains("5.0 KiB"), "{lines:#?}");
    assert!(lines[5].starts_with("│    └ worker"), "{lines:#?}");
    assert!(lines[6].starts_with("│    └ worker"), "{lines:#?}");
    assert!(lines[7].starts_with("│    other"), "{lines:#?}");
    // The notice says how to unfold; once gone, the footer names the key.
    assert!(lines[29].contains("→ unfolds, ← folds"), "{lines:#?}");
    for secs in [2, 13] {
        app.update(AppEvent::Profile(crate::tui::state::tests::forked(secs)));
    }
    let lines = screen_lines(&mut app, 120, 30);
    assert!(lines[29].contains("t:trees"), "{lines:#?}");
    press(&mut app, KeyCode::Enter);
    let lines = screen_lines(&mut app, 120, 30);
    assert!(
        lines[2].contains(" Stacks  tree of server (7) · by stack "),
        "{lines:#?}"
    );
}

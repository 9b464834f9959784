//! Snapshots of the screen (ratatui's `TestBackend`) for the states the
//! keys lead to.

use crossterm::event::KeyCode;
use ratatui::{Terminal, backend::TestBackend, buffer::Buffer};

use super::{
    footer::{KEYS, LEGEND},
    *,
};
use crate::tui::state::{
    AppEvent, Notice,
    tests::{options, press, sample},
};
use allocprof::symbolize::Frame as StackFrame;

/// The screen as text, one line per row, trailing spaces trimmed.
fn text(buffer: &Buffer) -> String {
    let area = buffer.area;
    let mut out = String::new();
    for y in 0..area.height {
        let mut line = String::new();
        for x in 0..area.width {
            line.push_str(buffer[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn screen(app: &mut App, width: u16, height: u16) -> (String, Buffer) {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    fit_and_draw(&mut terminal, app).unwrap();
    let buffer = terminal.backend().buffer().clone();
    (text(&buffer), buffer)
}

/// The screen as lines, trailing blanks trimmed (for the other test modules).
pub(super) fn screen_lines(app: &mut App, width: u16, height: u16) -> Vec<String> {
    screen(app, width, height)
        .0
        .lines()
        .map(str::to_owned)
        .collect()
}

fn app_at(secs: u64) -> App {
    let mut app = App::new(options());
    for s in 0..=secs {
        app.update(AppEvent::Profile(sample(s)));
    }
    app
}

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
fn lost_live_bytes_show_the_live_heap_as_a_lower_bound() {
    let mut app = App::new(options());
    let mut profile = sample(0);
    profile.processes[0].lost_live_bytes = 2 << 20;
    app.update(AppEvent::Profile(profile));
    let (text, _) = screen(&mut app, 120, 24);
    let header: Vec<&str> = text.lines().take(2).collect();
    assert!(header[0].contains("live heap ≥ "), "{text}");
    assert!(
        header[1].contains("(up to 2.0 MiB untracked live)"),
        "{text}"
    );
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
fn detail_shows_locations_inlined_and_library_frames() {
    let mut app = App::new(options());
    let mut p = sample(1);
    let frames: Vec<StackFrame> = vec![
        StackFrame {
            function: "alloc::raw_vec::finish_grow".into(),
            location: Some("/rustc/abc/library/alloc/src/raw_vec.rs:1".into()),
            module: Some("/usr/bin/app".into()),
            inlined: false,
        },
        StackFrame {
            function: "app::index::insert".into(),
            location: Some("/home/me/app/src/index.rs:42".into()),
            module: Some("/usr/bin/app".into()),
            inlined: true,
        },
        StackFrame {
            function: "app::main".into(),
            location: Some("/home/me/app/src/main.rs:7".into()),
            module: Some("/usr/bin/app".into()),
            inlined: false,
        },
        StackFrame {
            function: "__libc_start_call_main".into(),
            location: None,
            module: Some("/usr/lib/x86_64-linux-gnu/libc.so.6".into()),
            inlined: false,
        },
    ];
    p.processes[0].stacks[0].frames = frames.into();
    p.processes[0].stacks[0].totals.live_bytes = 1e9;
    app.update(AppEvent::Profile(p));
    let (text, buffer) = screen(&mut app, 100, 30);
    assert!(
        text.contains("Stack: app::index::insert ← app::main"),
        "{text}"
    );
    assert!(
        text.contains("app::index::insert (inlined)  src/index.rs:42"),
        "{text}"
    );
    assert!(
        text.contains("__libc_start_call_main  [x86_64-linux-gnu/libc.so.6]"),
        "{text}"
    );
    let y = text
        .lines()
        .position(|l| l.contains("│alloc::raw_vec::finish_grow"))
        .unwrap() as u16;
    assert_eq!(
        buffer[(1, y)].fg,
        Color::DarkGray,
        "library frames are dimmed"
    );
    assert!(buffer[(1, y + 1)].modifier.contains(Modifier::BOLD));
    // Enlarged, the detail shows full paths.
    press(&mut app, KeyCode::Enter);
    let (text, _) = screen(&mut app, 100, 30);
    assert!(text.contains("/home/me/app/src/index.rs:42"), "{text}");
    assert!(text.contains("Esc/d: smaller"), "{text}");
}

#[test]
fn the_selection_stays_on_screen() {
    let mut app = App::new(options());
    let mut p = sample(1);
    p.processes[0].stacks = (0..100)
        .map(|i| allocprof::profile::StackProfile {
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
fn help_lists_every_key_even_at_the_minimum_size() {
    let mut app = app_at(1);
    press(&mut app, KeyCode::Char('?'));
    for (w, h) in [(80, 24), (MIN_WIDTH, MIN_HEIGHT)] {
        let (text, _) = screen(&mut app, w, h);
        assert!(text.contains("Keys"), "{text}");
        for (key, description) in KEYS {
            let line = text
                .lines()
                .find(|l| l.contains(&format!("│ {key} ")))
                .unwrap_or_else(|| panic!("{key} missing at {w}×{h}:\n{text}"));
            let start: String = description.chars().take(20).collect();
            assert!(line.contains(&start), "{key} at {w}×{h}:\n{text}");
        }
    }
    // `?` again: the legend, whole at either size too.
    press(&mut app, KeyCode::Char('?'));
    for (w, h) in [(80, 24), (MIN_WIDTH, MIN_HEIGHT), (160, 48)] {
        let (text, _) = screen(&mut app, w, h);
        assert!(text.contains("Legend"), "{text}");
        for (key, description) in LEGEND {
            let line = text
                .lines()
                .find(|l| l.contains(&format!("│ {key} ")))
                .unwrap_or_else(|| panic!("{key} missing at {w}×{h}:\n{text}"));
            let start: String = description.chars().take(20).collect();
            assert!(line.contains(&start), "{key} at {w}×{h}:\n{text}");
        }
    }
}

#[test]
fn a_small_terminal_gets_a_message_not_garbage() {
    let mut app = app_at(1);
    for (w, h) in [(MIN_WIDTH - 1, 30), (120, MIN_HEIGHT - 1), (20, 5)] {
        let (text, _) = screen(&mut app, w, h);
        assert!(text.contains("Terminal too small"), "{w}×{h}:\n{text}");
        if w >= 40 {
            assert!(text.contains(&format!("{w}×{h}")), "{text}");
            assert!(text.contains("needs at least 60×15"), "{text}");
        }
        assert!(!text.contains("allocprof  pid"), "{text}");
    }
}

#[test]
fn before_the_first_profile() {
    let mut app = App::new(options());
    app.set_notice(Notice::Info("attached 2 probe sites".into()));
    let (text, _) = screen(&mut app, 80, 24);
    assert!(
        text.starts_with(" allocprof  pid 7 · waiting for the first refresh…"),
        "{text}"
    );
    assert!(text.contains(" attached 2 probe sites"), "{text}");
    app.update(AppEvent::Profile(crate::tui::rows::tests::profile(
        1,
        vec![],
    )));
    let (text, _) = screen(&mut app, 80, 24);
    assert!(text.contains("0 processes"), "{text}");
    // No process with the probes: the how-to, not an empty table.
    assert!(text.contains("Nothing profiled yet"), "{text}");
}

#[test]
fn drops_and_several_rates_show_in_the_header() {
    let mut app = App::new(options());
    let mut p = sample(1);
    p.drops[0] = 3;
    p.processes[1].rate = 65_536;
    app.update(AppEvent::Profile(p));
    let (text, buffer) = screen(&mut app, 80, 24);
    let second = text.lines().nth(1).unwrap();
    assert!(second.contains("drops 3"), "{text}");
    assert!(second.contains("rates 64.0 KiB, 512.0 KiB"), "{text}");
    let x = second[..second.find("drops 3").unwrap()].chars().count() as u16 + 6;
    assert_eq!(buffer[(x, 1)].fg, GROWING);
}

#[test]
fn the_stack_flood_is_shown_as_its_frame() {
    let mut app = App::new(options());
    let mut profile = sample(0);
    profile.processes[0].stacks[0].frames =
        std::sync::Arc::from(vec![StackFrame::named(allocprof::profile::STACK_FLOOD)]);
    profile.processes[0].stacks[0].totals.live_bytes = 1e9;
    app.update(AppEvent::Profile(profile));
    let (text, _) = screen(&mut app, 120, 24);
    assert!(
        text.contains("[stack flood: new stacks over the per-process limit]"),
        "{text}"
    );
}

#[test]
fn the_process_detail_names_its_contract_and_unavailable_intervals() {
    let mut app = App::new(options());
    let mut profile = sample(0);
    let p = &mut profile.processes[0];
    p.contracts = u64::from(profiler_common::CONTRACT_DDHEAP);
    p.weight_form = profiler_common::WeightForm::Unrecognized;
    p.mapped_bytes = 2 << 20;
    p.mmap_events = 3;
    for s in &mut p.stacks {
        s.totals = s
            .totals
            .with_weight_form(profiler_common::WeightForm::Unrecognized, 0, 1);
    }
    p.totals = p.stacks.iter().map(|s| s.totals).sum();
    app.update(AppEvent::Profile(profile));
    press(&mut app, KeyCode::Tab);
    let (text, _) = screen(&mut app, 140, 30);
    assert!(
        text.contains("ddheap · weights unrecognized (± ?)"),
        "{text}"
    );
    assert!(text.contains("± ?"), "{text}");
}

#[test]
fn exited_processes_are_not_live_heap() {
    let mut app = App::new(options());
    let mut profile = sample(0);
    let live_before = profile.live_totals().live_bytes;
    let mut gone = profile.processes[0].clone();
    gone.key.pid = 99;
    gone.state = allocprof::profile::ProcessState::Exited;
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

// ---- the flamegraph ----

/// The line index where `s` first shows, if it does.
fn line_of(text: &str, s: &str) -> Option<usize> {
    text.lines().position(|l| l.contains(s))
}

/// The screen cell where `s` first shows.
fn cell_of(text: &str, s: &str) -> (u16, u16) {
    let y = line_of(text, s).unwrap_or_else(|| panic!("{s} not on screen:\n{text}"));
    let line = text.lines().nth(y).unwrap();
    let x = line[..line.find(s).unwrap()].chars().count();
    (x as u16, y as u16)
}

/// The frame's status line: the second-to-last and third-to-last rows.
fn status(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len() - 3..lines.len() - 1].join("\n")
}

#[test]
fn the_flamegraph_is_an_icicle_with_a_status_line_at_both_sizes() {
    let mut app = app_at(3);
    press(&mut app, KeyCode::Char('f'));
    for (w, h) in [(80, 24), (160, 48)] {
        let (text, buffer) = screen(&mut app, w, h);
        assert!(
            text.contains("Flamegraph · all processes · live bytes"),
            "{text}"
        );
        assert!(text.contains("icicle: callers above callees"), "{text}");
        // The header stays.
        assert!(text.starts_with(" allocprof  pid 7"), "{text}");
        // Root on top, callers above callees, sites at the bottom.
        let rows: Vec<usize> = ["│all", "server (7)", "main", "cache_fill"]
            .iter()
            .map(|s| line_of(&text, s).unwrap_or_else(|| panic!("{s} at {w}×{h}:\n{text}")))
            .collect();
        assert_eq!(rows, [3, 4, 5, 6], "{text}");
        assert_eq!(line_of(&text, "worker (9)"), Some(4), "{text}");
        assert_eq!(line_of(&text, "handle"), Some(6), "{text}");
        // Widths: the server holds 72% of the bytes, so its frame starts
        // the row and the worker's starts about 72% along it.
        let (x, _) = cell_of(&text, "worker (9)");
        let expected = 1.0 + f64::from(w - 2) * 57_072.0 / 77_072.0;
        assert!((f64::from(x) - expected).abs() <= 1.0, "{x} vs {expected}");
        // The root is selected: highlighted, and described below.
        assert_eq!(buffer[(1, 3)].bg, Color::White);
        let s = status(&text);
        assert!(s.contains(" all\n"), "{s}");
        assert!(s.contains("root · live 75.3 KiB ± "), "{s}");
        assert!(s.contains("100.0% of total · 4 stacks"), "{s}");
        assert!(
            text.ends_with("q:table \n") || text.trim_end().ends_with("q:table"),
            "{text}"
        );
    }
}

#[test]
fn the_status_line_describes_the_selected_frame() {
    let mut app = app_at(3);
    press(&mut app, KeyCode::Char('f'));
    for _ in 0..3 {
        press(&mut app, KeyCode::Char('j'));
    }
    let (text, buffer) = screen(&mut app, 80, 24);
    let s = status(&text);
    let ci = allocprof::stats::human_ci(crate::tui::rows::tests::totals(50_000.0, 0.0).live_ci95());
    assert!(s.contains(" cache_fill\n"), "{s}");
    assert!(
        s.contains(&format!(
            "[bin/work] · live 48.8 KiB ± {ci} · 64.9% of total · 1 stack"
        )),
        "{s}"
    );
    let (x, y) = cell_of(&text, "cache_fill");
    assert_eq!((y, buffer[(x, y)].bg), (6, Color::White), "{text}");
    // Frames too narrow for a label show none; cut ones end with `…`.
    press(&mut app, KeyCode::Char('l'));
    press(&mut app, KeyCode::Char('j'));
    let (text, _) = screen(&mut app, 80, 24);
    let sites = text.lines().nth(7).unwrap();
    assert!(sites.contains('…'), "{text}");
    assert!(!sites.contains("leak"), "4 columns cannot hold it: {text}");
    assert!(status(&text).contains(" leak\n"), "{text}");
}

#[test]
fn frozen_zoomed_and_searched_flamegraphs_say_so() {
    let mut app = app_at(3);
    press(&mut app, KeyCode::Char('f'));
    press(&mut app, KeyCode::Char(' '));
    press(&mut app, KeyCode::Char('j'));
    press(&mut app, KeyCode::Enter);
    app.update(AppEvent::Profile(sample(9)));
    let (text, buffer) = screen(&mut app, 80, 24);
    let title = text.lines().nth(2).unwrap();
    assert!(title.contains("zoom 1 "), "{text}");
    assert!(title.contains("FROZEN"), "{text}");
    let (x, y) = cell_of(&text, "FROZEN");
    assert_eq!(buffer[(x, y)].bg, Color::LightBlue);
    // Zoomed on the server: it spans the width, under the dimmed root.
    let server = text.lines().nth(4).unwrap();
    assert!(server.starts_with("│server (7)"), "{text}");
    assert!(!text.contains("worker (9)"), "{text}");
    assert_eq!(buffer[(1, 3)].bg, Color::Indexed(240));
    // Frozen: still the 3 s figures.
    assert!(status(&text).contains("live 55.7 KiB"), "{text}");
    // Search: matches turn magenta, the share matched is in the title.
    press(&mut app, KeyCode::Char('/'));
    for c in "cache".chars() {
        press(&mut app, KeyCode::Char(c));
    }
    let (text, buffer) = screen(&mut app, 80, 24);
    assert!(text.contains(" /cache█"), "{text}");
    assert!(text.contains("live bytes · matched 87.6%"), "{text}");
    let (x, y) = cell_of(&text, "cache_fill");
    assert_eq!(buffer[(x, y)].bg, Color::Magenta);
    // Thawed: the latest profile.
    press(&mut app, KeyCode::Enter);
    press(&mut app, KeyCode::Char(' '));
    let (text, _) = screen(&mut app, 80, 24);
    assert!(!text.contains("FROZEN"), "{text}");
    assert!(status(&text).contains("live 61.7 KiB"), "{text}");
}

#[test]
fn the_flamegraph_in_delta_mode_shows_growth_only() {
    let mut app = app_at(3);
    press(&mut app, KeyCode::Char('b'));
    for s in 4..=6 {
        app.update(AppEvent::Profile(sample(s)));
    }
    press(&mut app, KeyCode::Char('f'));
    press(&mut app, KeyCode::Char('d'));
    let (text, _) = screen(&mut app, 160, 48);
    assert!(
        text.contains("Flamegraph · all processes · growth since 3s"),
        "{text}"
    );
    // Only the leak grew: its callers fill the width, the rest is gone.
    assert!(!text.contains("worker (9)"), "{text}");
    assert!(!text.contains("cache_fill"), "{text}");
    let leak = text.lines().nth(7).unwrap();
    assert!(leak.starts_with("│leak"), "{text}");
    let s = status(&text);
    assert!(s.contains("Δ +3.0 KiB · 100.0% of growth"), "{s}");
    assert!(
        s.contains("live 78.3 KiB ± "),
        "the live interval stays: {s}"
    );
}

#[test]
fn the_flamegraph_keeps_deep_selections_in_sight_and_names_inert() {
    let mut app = App::new(options());
    let names: Vec<String> = (0..60).map(|i| format!("depth_{i:02}")).collect();
    let mut frames: Vec<&str> = names.iter().map(String::as_str).collect();
    // Innermost first: depth_00 allocates; the hostile name is outermost.
    frames.push("\u{1b}]0;evil\u{7}");
    let p = crate::tui::rows::tests::profile(
        1,
        vec![crate::tui::rows::tests::process(
            7,
            "deep",
            &[(&frames, 1e6, 1e6)],
        )],
    );
    app.update(AppEvent::Profile(p));
    press(&mut app, KeyCode::Char('f'));
    let (text, _) = screen(&mut app, 80, 24);
    assert!(text.contains("\\x1b]0;evil\\x07"), "{text}");
    for _ in 0..50 {
        press(&mut app, KeyCode::Char('j'));
    }
    let (text, buffer) = screen(&mut app, 80, 24);
    // The process, the hostile frame, then depth_59 …: 50 down is depth_12.
    assert!(status(&text).contains(" depth_12\n"), "{text}");
    let (x, y) = cell_of(&text, "depth_12");
    assert_eq!(buffer[(x, y)].bg, Color::White, "{text}");
    assert!(
        line_of(&text, "depth_11").is_some(),
        "a callee row below: {text}"
    );
    assert!(
        line_of(&text, "│all").is_none(),
        "the root scrolled off: {text}"
    );
    for y in 0..buffer.area.height {
        for x in 0..buffer.area.width {
            assert!(!buffer[(x, y)].symbol().contains('\u{1b}'));
        }
    }
}

#[test]
fn an_empty_profile_and_tiny_terminals_do_not_break_the_flamegraph() {
    let mut app = App::new(options());
    app.update(AppEvent::Profile(crate::tui::rows::tests::profile(
        1,
        vec![],
    )));
    press(&mut app, KeyCode::Char('f'));
    let (text, _) = screen(&mut app, 80, 24);
    assert!(text.contains("│all"), "{text}");
    assert!(text.contains("no live bytes here (yet)"), "{text}");
    assert!(
        status(&text).contains("live 0 B ± 0 B · 0.0% of total · 0 stacks"),
        "{text}"
    );
    for k in ['j', 'k', 'h', 'l', 'n', 'd'] {
        press(&mut app, KeyCode::Char(k));
    }
    press(&mut app, KeyCode::Enter);
    // A 0-byte process.
    app.update(AppEvent::Profile(crate::tui::rows::tests::profile(
        2,
        vec![crate::tui::rows::tests::process(
            1,
            "idle",
            &[(&["f", "main"], 0.0, 0.0)],
        )],
    )));
    let (text, _) = screen(&mut app, 80, 24);
    assert!(text.contains("1 stack"), "{text}");
    for (w, h) in [(20, 5), (0, 0), (1, 1), (MIN_WIDTH, MIN_HEIGHT), (500, 3)] {
        let (text, _) = screen(&mut app, w, h);
        if w < MIN_WIDTH || h < MIN_HEIGHT {
            assert!(
                w < 20 || text.contains("Terminal too small"),
                "{w}×{h}:\n{text}"
            );
        } else {
            assert!(text.contains("│all"), "{w}×{h}:\n{text}");
        }
    }
}

#[test]
fn the_flamegraph_help_lists_its_keys() {
    let mut app = app_at(1);
    press(&mut app, KeyCode::Char('f'));
    press(&mut app, KeyCode::Char('?'));
    for (w, h) in [(80, 24), (MIN_WIDTH, MIN_HEIGHT)] {
        let (text, _) = screen(&mut app, w, h);
        for (key, description) in footer::FLAME_KEYS {
            let start: String = description.chars().take(20).collect();
            let line = text
                .lines()
                .find(|l| l.contains(&start))
                .unwrap_or_else(|| panic!("{key} missing at {w}×{h}:\n{text}"));
            assert!(
                line.contains(&format!("│ {key}")),
                "{key} at {w}×{h}:\n{text}"
            );
        }
    }
    assert!(KEYS.iter().any(|(k, _)| *k == "f"));
}

#[test]
fn wide_names_are_cut_within_their_frame() {
    let mut app = App::new(options());
    // Two callees side by side, half the width each: the wide one's name,
    // in double-width characters, does not fit in it.
    let wide = "数据库连接池分配器数据库连接池分配器数据库连接池分配器";
    let p = crate::tui::rows::tests::profile(
        1,
        vec![crate::tui::rows::tests::process(
            7,
            "wide",
            &[
                (&[wide, "main"], 1000.0, 1.0),
                (&["zzz", "main"], 1000.0, 1.0),
            ],
        )],
    );
    app.update(AppEvent::Profile(p));
    press(&mut app, KeyCode::Char('f'));
    let (text, buffer) = screen(&mut app, 80, 24);
    let row = text.lines().nth(6).unwrap();
    assert!(row.starts_with("│zzz "), "{text}");
    assert!(row.contains('…'), "{text}");
    // The wide frame starts half way; its name stops before its last
    // column, and the border stays.
    assert_eq!(buffer[(40, 6)].symbol(), "数", "{text}");
    let ellipsis = (0..80).find(|&x| buffer[(x, 6)].symbol() == "…").unwrap();
    assert!((76..=77).contains(&ellipsis), "{ellipsis}: {text}");
    assert_eq!(buffer[(78, 6)].symbol(), " ", "{text}");
    assert_eq!(buffer[(79, 6)].symbol(), "│", "{text}");
    assert_ne!(buffer[(78, 6)].bg, Color::Reset);
}

/// A profile whose heaviest stack is `depth` frames deep: `f00` innermost.
fn deep(depth: usize) -> App {
    let mut app = App::new(options());
    let mut p = sample(1);
    let names: Vec<String> = (0..depth).map(|i| format!("f{i:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    p.processes[0].stacks[0].frames = crate::tui::rows::tests::frames(&names);
    p.processes[0].stacks[0].totals.live_bytes = 1e9;
    app.update(AppEvent::Profile(p));
    app
}

#[test]
fn a_deep_stack_says_how_many_frames_are_not_shown_and_scrolls() {
    for (w, h) in [(80, 24), (160, 48)] {
        let mut app = deep(60);
        let (text, _) = screen(&mut app, w, h);
        // Small: the frames that fit, then how many more, never a silent cut.
        let shown = text.lines().filter(|l| l.contains("work.c:3")).count();
        assert!(shown > 0, "{text}");
        assert!(
            text.contains(&format!("+{} more frames (d: all)", 60 - shown)),
            "{w}×{h}:\n{text}"
        );
        // Enlarged: more frames, and j scrolls them one by one.
        press(&mut app, KeyCode::Char('d'));
        let (text, _) = screen(&mut app, w, h);
        let page = text.lines().filter(|l| l.contains("work.c:3")).count();
        assert!(page > shown, "{text}");
        assert!(
            text.contains(&format!("+{} more frames (j: scroll)", 60 - page)),
            "{w}×{h}:\n{text}"
        );
        assert!(text.contains("│f00  /src/work.c:3"), "{text}");
        press(&mut app, KeyCode::Char('j'));
        let (text, _) = screen(&mut app, w, h);
        assert!(!text.contains("│f00 "), "{text}");
        assert!(text.contains("│f01  /src/work.c:3"), "{text}");
        // To the end: the last frame shows, and nothing is said to follow.
        for _ in 0..10 {
            press(&mut app, KeyCode::PageDown);
        }
        let (text, _) = screen(&mut app, w, h);
        assert!(text.contains("│f59  /src/work.c:3"), "{text}");
        assert!(!text.contains("more frames"), "{text}");
        // The arrows still move among the rows, and a new row's detail starts
        // at its top.
        press(&mut app, KeyCode::Down);
        let (text, _) = screen(&mut app, w, h);
        assert_eq!(app.detail_scroll(), 0);
        assert!(
            text.contains("Stack: cache_fill ← main · server (7)"),
            "{text}"
        );
    }
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
fn the_status_line_lets_a_notice_go_after_a_while() {
    for (w, h) in [(80, 24), (160, 48)] {
        let mut app = App::new(options());
        app.set_notice(Notice::Info(
            "attached 4 probe sites; press ? for the keys".into(),
        ));
        app.update(AppEvent::Profile(sample(0)));
        let (text, _) = screen(&mut app, w, h);
        assert!(
            text.lines()
                .last()
                .unwrap()
                .contains("attached 4 probe sites"),
            "{text}"
        );
        app.update(AppEvent::Profile(sample(10)));
        let (text, _) = screen(&mut app, w, h);
        let status = text.lines().last().unwrap();
        assert!(!status.contains("attached"), "{text}");
        assert!(status.contains("?:help"), "{text}");
    }
}

#[test]
fn f1_shows_the_keys_and_names_f1_and_f10() {
    for (w, h) in [(80, 24), (160, 48)] {
        let mut app = app_at(1);
        press(&mut app, KeyCode::F(1));
        let (text, _) = screen(&mut app, w, h);
        assert!(text.contains(" Keys "), "{text}");
        assert!(
            text.contains("q F10 ? F1  quit (also Ctrl-C) / help; again: legend"),
            "{text}"
        );
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
fn the_process_detail_sets_the_heap_against_resident_memory() {
    let mut app = App::new(options());
    let mut profile = sample(0);
    profile.processes[0].resident = Some(allocprof::discover::Resident {
        anon: 100 << 20,
        file: 18 << 20,
        shmem: 2 << 20,
    });
    profile.processes[0].backend_heap = Some(allocprof::backend_stats::BackendHeap {
        backend: "glibc",
        reserved: Some(90 << 20),
        committed: None,
        in_use: Some(50 << 20),
        free: Some(40 << 20),
        mmapped: Some(0),
        age: std::time::Duration::from_millis(400),
    });
    app.update(AppEvent::Profile(profile));
    press(&mut app, KeyCode::Tab); // the processes, the first selected
    for (w, h) in [(80, 24), (160, 48)] {
        let (text, _) = screen(&mut app, w, h);
        assert!(
            // Narrow, the pane cuts it (d enlarges it).
            text.contains("resident 120.0 MiB (anonymous 100.0 MiB, file"),
            "{w}x{h}:\n{text}"
        );
    }
    let (wide, _) = screen(&mut app, 160, 48);
    // Wide, the process table has the column too.
    let header = wide.lines().find(|l| l.contains("PROCESS")).unwrap();
    assert!(header.contains("RSS ANON"), "{wide}");
    let row = wide.lines().find(|l| l.contains("▶ server")).unwrap();
    assert!(row.contains("100.0 MiB"), "{wide}");
    assert!(
        wide.contains("file 18.0 MiB, shared 2.0 MiB) · 99.9 MiB anonymous b"),
        "{wide}"
    );
    // The allocator's own figures, under it.
    assert!(
        wide.contains("allocator glibc: reserved 90.0 MiB, in use 50.0 MiB, free 40.0 MiB"),
        "{wide}"
    );
}

#[test]
fn the_heap_from_before_attach_is_named_in_the_details() {
    let mut app = App::new(options());
    let mut profile = sample(0);
    for p in &mut profile.processes {
        for s in &mut p.stacks {
            s.totals.before_attach_bytes = s.totals.live_bytes;
        }
        p.totals.before_attach_bytes = p.totals.live_bytes;
        p.ledger = Some(allocprof::ledger::LedgerStatus {
            read: true,
            seeded: 4,
            retired: 1,
            ..Default::default()
        });
    }
    app.update(AppEvent::Profile(profile));
    let (stacks, _) = screen(&mut app, 160, 48);
    assert!(
        stacks.contains("48.8 KiB of its 48.8 KiB live allocated before attach"),
        "{stacks}"
    );
    press(&mut app, KeyCode::Tab); // the processes, the first selected
    let (text, _) = screen(&mut app, 160, 48);
    assert!(
        text.contains("52.7 KiB of the live heap (ledger: 4 blocks, 1 freed)"),
        "{text}"
    );
}

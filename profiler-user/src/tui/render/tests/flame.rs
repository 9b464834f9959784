//! The flamegraph: the icicle, its status line, zoom, freeze, search, Δ.

use super::*;

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
    let ci = allocprof::model::stats::human_ci(
        crate::tui::rows::tests::totals(50_000.0, 0.0).live_ci95(),
    );
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

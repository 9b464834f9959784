//! The state's transitions, driven key by key and profile by profile.

use std::path::PathBuf;

use crossterm::event::{KeyCode, KeyModifiers};

use super::*;
use crate::tui::rows::tests::{process, profile};
use allocprof::model::profile::ProcessProfile;

pub fn press(app: &mut App, code: KeyCode) -> Effect {
    app.update(AppEvent::Key(KeyEvent::new(code, KeyModifiers::NONE)))
}

pub fn type_str(app: &mut App, s: &str) {
    for c in s.chars() {
        press(app, KeyCode::Char(c));
    }
}

pub fn options() -> AppOptions {
    AppOptions {
        target: "pid 7".into(),
        interval: Duration::from_secs(1),
        preload: None,
    }
}

/// Two processes; `leak` grows by `secs` KiB a second.
pub fn sample(secs: u64) -> Profile {
    let grow = 1024.0 * secs as f64;
    profile(
        secs,
        vec![
            process(
                7,
                "server",
                &[
                    (
                        &["leak", "handle", "main"],
                        1000.0 + grow,
                        2000.0 + 2.0 * grow,
                    ),
                    (&["cache_fill", "main"], 50_000.0, 50_000.0),
                    (
                        &["parse", "handle", "main"],
                        3000.0,
                        400_000.0 * secs as f64,
                    ),
                ],
            ),
            process(
                9,
                "worker",
                &[(&["cache_fill", "main"], 20_000.0, 20_000.0)],
            ),
        ],
    )
}

fn labels(app: &App) -> Vec<&str> {
    app.rows().iter().map(|r| r.label.as_str()).collect()
}

fn app_at(secs: u64) -> App {
    let mut app = App::new(options());
    for s in 0..=secs {
        app.update(AppEvent::Profile(sample(s)));
    }
    app
}

#[test]
fn stack_view_shows_each_process_stacks_sorted_by_live_bytes() {
    let app = app_at(2);
    assert_eq!(app.view(), View::Stacks);
    // Not merged: the same stack in two processes is two rows, each named.
    assert_eq!(
        labels(&app),
        [
            "cache_fill ← main · server (7)",
            "cache_fill ← main · worker (9)",
            "leak ← handle · server (7)",
            "parse ← handle · server (7)"
        ]
    );
    assert_eq!(app.rows()[0].totals.live_bytes, 50_000.0);
    assert_eq!(
        app.selected_row().unwrap().label,
        "cache_fill ← main · server (7)"
    );
}

#[test]
fn sort_keys_cycle_and_reverse() {
    let mut app = app_at(2);
    press(&mut app, KeyCode::Char('s')); // live samples
    assert_eq!(app.sort(), Sort::by(Column::Samples));
    press(&mut app, KeyCode::Char('s')); // objects
    assert_eq!(app.sort().column, Column::Objects);
    press(&mut app, KeyCode::Char('s')); // allocation rate
    assert_eq!(app.sort(), Sort::by(Column::AllocRate));
    assert_eq!(labels(&app)[0], "parse ← handle · server (7)");
    press(&mut app, KeyCode::Char('s')); // live bytes over a minute old
    assert_eq!(app.sort(), Sort::by(Column::Old));
    press(&mut app, KeyCode::Char('s')); // back to the name
    assert_eq!(app.sort(), Sort::by(Column::Name));
    assert_eq!(
        labels(&app),
        [
            "cache_fill ← main · server (7)",
            "cache_fill ← main · worker (9)",
            "leak ← handle · server (7)",
            "parse ← handle · server (7)"
        ]
    );
    press(&mut app, KeyCode::Char('r'));
    assert_eq!(labels(&app)[0], "parse ← handle · server (7)");
    press(&mut app, KeyCode::Char('S'));
    assert_eq!(app.sort().column, Column::Old);
}

#[test]
fn selection_follows_the_row_across_refreshes_and_sorts() {
    let mut app = app_at(2);
    press(&mut app, KeyCode::Down);
    press(&mut app, KeyCode::Down);
    assert_eq!(
        app.selected_row().unwrap().label,
        "leak ← handle · server (7)"
    );
    // The leak outgrows everything: it moves to the top, selected.
    app.update(AppEvent::Profile(sample(100)));
    assert_eq!(app.selected_index(), Some(0));
    assert_eq!(
        app.selected_row().unwrap().label,
        "leak ← handle · server (7)"
    );
    press(&mut app, KeyCode::Char('s'));
    assert_eq!(
        app.selected_row().unwrap().label,
        "leak ← handle · server (7)"
    );
    press(&mut app, KeyCode::End);
    assert_eq!(app.selected_index(), Some(3));
    press(&mut app, KeyCode::Down);
    assert_eq!(app.selected_index(), Some(3));
    press(&mut app, KeyCode::Home);
    assert_eq!(app.selected_index(), Some(0));
    press(&mut app, KeyCode::Up);
    assert_eq!(app.selected_index(), Some(0));
}

#[test]
fn search_filters_by_function_incrementally() {
    let mut app = app_at(1);
    press(&mut app, KeyCode::Char('/'));
    type_str(&mut app, "hand");
    // Both stacks through `handle` match, by any of their frames.
    assert_eq!(
        labels(&app),
        ["parse ← handle · server (7)", "leak ← handle · server (7)"]
    );
    type_str(&mut app, "x");
    assert!(app.rows().is_empty());
    press(&mut app, KeyCode::Backspace);
    press(&mut app, KeyCode::Enter);
    assert!(!app.search().editing);
    // Keys are commands again, and the filter stays.
    press(&mut app, KeyCode::Char('s'));
    assert_eq!(app.sort().column, Column::Samples);
    assert_eq!(app.rows().len(), 2);
    press(&mut app, KeyCode::Esc);
    assert_eq!(app.rows().len(), 4);
    assert_eq!(app.search(), &Search::default());
}

#[test]
fn q_in_a_search_is_text_and_ctrl_c_always_quits() {
    let mut app = app_at(1);
    press(&mut app, KeyCode::Char('/'));
    assert!(matches!(press(&mut app, KeyCode::Char('q')), Effect::None));
    assert_eq!(app.search().query, "q");
    let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
    assert!(matches!(app.update(AppEvent::Key(ctrl_c)), Effect::Quit));
    press(&mut app, KeyCode::Esc);
    assert!(matches!(press(&mut app, KeyCode::Char('q')), Effect::Quit));
    assert!(matches!(app.update(AppEvent::Quit), Effect::Quit));
}

#[test]
fn grouping_by_function_sums_stacks_through_a_function() {
    let mut app = app_at(1);
    press(&mut app, KeyCode::Char('g'));
    assert_eq!(app.grouping(), Grouping::Function);
    assert_eq!(
        labels(&app),
        [
            "cache_fill · server (7)",
            "cache_fill · worker (9)",
            "parse · server (7)",
            "leak · server (7)"
        ]
    );
    press(&mut app, KeyCode::Char('g'));
    assert_eq!(app.grouping(), Grouping::Stack);
}

#[test]
fn processes_view_and_entering_a_process() {
    let mut app = app_at(2);
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.view(), View::Processes);
    assert_eq!(labels(&app), ["server", "worker"]);
    assert_eq!(app.rows()[0].growth, Some(2048.0));
    press(&mut app, KeyCode::Char('j'));
    press(&mut app, KeyCode::Enter);
    assert_eq!(app.view(), View::Stacks);
    assert_eq!(
        app.scope(),
        Some(ProcessKey {
            pid: allocprof::ids::Pid(9),
            generation: 0
        })
    );
    assert_eq!(labels(&app), ["cache_fill ← main"]);
    // Esc goes back to the processes, the process still selected.
    press(&mut app, KeyCode::Esc);
    assert_eq!(app.view(), View::Processes);
    assert_eq!(app.scope(), None);
    assert_eq!(app.selected_row().unwrap().label, "worker");
    press(&mut app, KeyCode::Char('a'));
    assert_eq!((app.view(), app.scope()), (View::Stacks, None));
}

#[test]
fn baseline_shows_and_sorts_by_growth_since() {
    let mut app = app_at(2);
    press(&mut app, KeyCode::Char('b'));
    assert!(app.columns().contains(&Column::Baseline));
    assert_eq!(app.sort(), Sort::by(Column::Baseline));
    assert!(app.rows().iter().all(|r| r.since_baseline == Some(0.0)));
    for s in 3..=10 {
        app.update(AppEvent::Profile(sample(s)));
    }
    assert_eq!(labels(&app)[0], "leak ← handle · server (7)");
    assert_eq!(app.rows()[0].since_baseline, Some(8.0 * 1024.0));
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.sort(), Sort::by(Column::Baseline));
    assert_eq!(app.rows()[0].since_baseline, Some(8.0 * 1024.0));
    press(&mut app, KeyCode::Char('B'));
    assert!(!app.columns().contains(&Column::Baseline));
    assert_eq!(app.sort(), Sort::by(Column::Live));
}

#[test]
fn pause_freezes_the_view_but_not_the_history() {
    let mut app = app_at(2);
    press(&mut app, KeyCode::Char('p'));
    assert!(app.paused());
    app.update(AppEvent::Profile(sample(50)));
    assert_eq!(app.shown().unwrap().elapsed.as_secs(), 2);
    press(&mut app, KeyCode::Char(' '));
    assert!(!app.paused());
    assert_eq!(app.shown().unwrap().elapsed.as_secs(), 50);
    assert_eq!(app.history().live_series(Duration::MAX).len(), 4);
}

#[test]
fn export_restricts_the_profile_to_the_view() {
    let mut app = app_at(1);
    let Effect::Export { profile, selection } = press(&mut app, KeyCode::Char('e')) else {
        panic!("e exports");
    };
    assert_eq!(profile.processes.len(), 2);
    assert_eq!(
        selection,
        ViewSelection {
            grouping: Some(Grouping::Stack),
            ..Default::default()
        }
    );
    // One process, searched.
    press(&mut app, KeyCode::Tab);
    press(&mut app, KeyCode::Enter);
    press(&mut app, KeyCode::Char('/'));
    type_str(&mut app, "leak");
    press(&mut app, KeyCode::Enter);
    let Effect::Export { profile, selection } = press(&mut app, KeyCode::Char('e')) else {
        panic!("e exports");
    };
    assert_eq!(profile.processes.len(), 1);
    assert_eq!(profile.processes[0].stacks.len(), 1);
    assert_eq!(profile.processes[0].totals.live_bytes, 2024.0);
    assert_eq!(
        selection.process.map(|k| k.pid),
        Some(allocprof::ids::Pid(7))
    );
    assert_eq!(
        app.describe_selection(&selection),
        "the stacks of server (7) matching \"leak\""
    );
    app.exported(Ok(PathBuf::from("/tmp/x.folded")), "it");
    assert_eq!(
        app.notice(),
        Some(&Notice::Info("exported it to /tmp/x.folded".into()))
    );
    assert_eq!(app.log, ["exported it to /tmp/x.folded"]);
}

#[test]
fn help_is_closed_by_any_key_which_does_nothing_else() {
    let mut app = app_at(1);
    press(&mut app, KeyCode::Char('?'));
    assert!(app.help());
    assert!(matches!(press(&mut app, KeyCode::Char('q')), Effect::None));
    assert!(!app.help());
    // `?` in the help turns to the legend; the next key closes both.
    press(&mut app, KeyCode::Char('?'));
    press(&mut app, KeyCode::Char('?'));
    assert!(app.help() && app.legend());
    press(&mut app, KeyCode::Char('?'));
    assert!(!app.help() && !app.legend());
}

#[test]
fn keys_before_the_first_profile_are_harmless() {
    let mut app = App::new(options());
    for c in "jkSsrgbBpe/x".chars() {
        press(&mut app, KeyCode::Char(c));
    }
    for code in [
        KeyCode::Esc,
        KeyCode::Enter,
        KeyCode::Tab,
        KeyCode::End,
        KeyCode::PageDown,
    ] {
        press(&mut app, code);
    }
    assert!(app.rows().is_empty());
    assert_eq!(app.selected_index(), None);
}

#[test]
fn elapsed_reads_well() {
    assert_eq!(format_elapsed(Duration::from_secs(42)), "42s");
    assert_eq!(format_elapsed(Duration::from_secs(187)), "3m 07s");
    assert_eq!(format_elapsed(Duration::from_secs(3723)), "1h 02m 03s");
}

/// The open flamegraph's tree root and selected frame.
fn flame_at(app: &App) -> (String, String) {
    let f = app.flame().expect("the flamegraph is open");
    (
        f.tree().node(crate::tui::flame::ROOT).name.to_string(),
        f.tree().node(f.selected()).name.to_string(),
    )
}

#[test]
fn f_opens_the_flamegraph_of_all_or_of_the_process_and_esc_q_close_it() {
    let mut app = App::new(options());
    press(&mut app, KeyCode::Char('f'));
    assert!(app.flame().is_none(), "no profile yet");
    assert!(matches!(app.notice(), Some(Notice::Warning(_))));
    let mut app = app_at(2);
    press(&mut app, KeyCode::Char('f'));
    assert_eq!(flame_at(&app).0, "all");
    // Keys go to the flamegraph: j moves in it, q leaves it, not the app.
    press(&mut app, KeyCode::Char('j'));
    assert_eq!(flame_at(&app).1, "server (7)");
    assert!(matches!(press(&mut app, KeyCode::Char('q')), Effect::None));
    assert!(app.flame().is_none());
    assert_eq!(app.view(), View::Stacks);
    // From the process table, of the selected process.
    press(&mut app, KeyCode::Tab);
    press(&mut app, KeyCode::Char('j'));
    press(&mut app, KeyCode::Char('f'));
    assert_eq!(flame_at(&app).0, "worker (9)");
    press(&mut app, KeyCode::Esc);
    assert!(app.flame().is_none());
    assert_eq!(app.view(), View::Processes);
    // From a process's stacks, of that process.
    press(&mut app, KeyCode::Enter);
    press(&mut app, KeyCode::Char('f'));
    assert_eq!(flame_at(&app).0, "worker (9)");
    assert!(matches!(
        app.update(AppEvent::Key(KeyEvent::new(
            KeyCode::Char('c'),
            KeyModifiers::CONTROL
        ))),
        Effect::Quit
    ));
}

#[test]
fn the_flamegraph_follows_profiles_unless_frozen() {
    let mut app = app_at(1);
    press(&mut app, KeyCode::Char('f'));
    let live = |app: &App| {
        let f = app.flame().unwrap();
        f.tree().node(crate::tui::flame::ROOT).live_bytes
    };
    let at1 = live(&app);
    app.update(AppEvent::Profile(sample(2)));
    assert_eq!(live(&app), at1 + 1024.0);
    press(&mut app, KeyCode::Char(' '));
    assert!(app.flame().unwrap().frozen());
    assert!(!app.paused(), "Space freezes the picture, not the app");
    app.update(AppEvent::Profile(sample(3)));
    assert_eq!(live(&app), at1 + 1024.0, "frozen");
    // Thawing shows the latest at once.
    press(&mut app, KeyCode::Char(' '));
    assert_eq!(live(&app), at1 + 2048.0);
}

#[test]
fn the_flamegraph_shows_growth_once_a_baseline_is_marked() {
    let mut app = app_at(1);
    press(&mut app, KeyCode::Char('f'));
    press(&mut app, KeyCode::Char('d'));
    assert_eq!(app.flame().unwrap().mode(), crate::tui::flame::Mode::Live);
    assert!(
        matches!(app.notice(), Some(Notice::Warning(w)) if w.contains("no baseline")),
        "{:?}",
        app.notice()
    );
    press(&mut app, KeyCode::Char('b'));
    app.update(AppEvent::Profile(sample(4)));
    press(&mut app, KeyCode::Char('d'));
    let f = app.flame().unwrap();
    assert_eq!(f.mode(), crate::tui::flame::Mode::Growth);
    // Only `leak` grew: 3 KiB.
    assert_eq!(f.tree().weight(crate::tui::flame::ROOT, f.mode()), 3072.0);
    press(&mut app, KeyCode::Char('B'));
    assert_eq!(app.flame().unwrap().mode(), crate::tui::flame::Mode::Live);
    // A baseline marked while frozen waits for the thaw.
    press(&mut app, KeyCode::Char(' '));
    press(&mut app, KeyCode::Char('b'));
    press(&mut app, KeyCode::Char('d'));
    assert!(
        matches!(app.notice(), Some(Notice::Warning(w)) if w.contains("Space thaws it")),
        "{:?}",
        app.notice()
    );
    press(&mut app, KeyCode::Char(' '));
    press(&mut app, KeyCode::Char('d'));
    assert_eq!(app.flame().unwrap().mode(), crate::tui::flame::Mode::Growth);
    // `?` opens the help over it; any key closes the help only.
    press(&mut app, KeyCode::Char('?'));
    assert!(app.help());
    press(&mut app, KeyCode::Esc);
    assert!(!app.help() && app.flame().is_some());
}

#[test]
fn the_enlarged_detail_scrolls_within_its_lines() {
    let mut app = app_at(1);
    // Not enlarged: j moves the selection.
    press(&mut app, KeyCode::Char('j'));
    assert_eq!(app.selected_index(), Some(1));
    press(&mut app, KeyCode::Char('d'));
    app.fit_detail(5, 20);
    press(&mut app, KeyCode::Char('j'));
    press(&mut app, KeyCode::Char('j'));
    assert_eq!((app.detail_scroll(), app.selected_index()), (2, Some(1)));
    press(&mut app, KeyCode::Char('k'));
    assert_eq!(app.detail_scroll(), 1);
    // A page is the pane less the "+N more" line.
    press(&mut app, KeyCode::PageDown);
    assert_eq!(app.detail_scroll(), 5);
    // Never past the last page.
    for _ in 0..10 {
        press(&mut app, KeyCode::PageDown);
    }
    assert_eq!(app.detail_scroll(), 15);
    press(&mut app, KeyCode::PageUp);
    assert_eq!(app.detail_scroll(), 11);
    // A shorter detail (the next draw) clamps it.
    app.fit_detail(5, 8);
    assert_eq!(app.detail_scroll(), 3);
    // Another row starts at its top.
    press(&mut app, KeyCode::Up);
    app.fit_detail(5, 20);
    assert_eq!((app.detail_scroll(), app.selected_index()), (0, Some(0)));
    // Smaller again: j is the table's.
    press(&mut app, KeyCode::Char('d'));
    press(&mut app, KeyCode::Char('j'));
    assert_eq!(app.selected_index(), Some(1));
}

#[test]
fn the_cursor_starts_on_the_first_row_and_stays_there_until_moved() {
    let mut app = app_at(2);
    assert_eq!(app.selected_index(), Some(0));
    // The leak outgrows the cache: the cursor stays on top, now the leak.
    app.update(AppEvent::Profile(sample(100)));
    assert_eq!(app.selected_index(), Some(0));
    assert_eq!(
        app.selected_row().unwrap().label,
        "leak ← handle · server (7)"
    );
    // Moved: from now on the cursor follows its row.
    press(&mut app, KeyCode::Char('j'));
    let chosen = app.selected_row().unwrap().id.clone();
    app.update(AppEvent::Profile(sample(2)));
    assert_eq!(app.selected_row().unwrap().id, chosen);
    assert_eq!(app.selected_index(), Some(0));
    // Processes too: j j Enter opens the process the cursor was on, even
    // when a refresh reorders the rows in between.
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.selected_index(), Some(0));
    press(&mut app, KeyCode::Char('j'));
    assert_eq!(app.selected_row().unwrap().label, "worker");
    let mut p = sample(3);
    p.processes[1].stacks[0].totals.live_bytes = 1e9;
    p.processes[1].totals.live_bytes = 1e9;
    app.update(AppEvent::Profile(p));
    assert_eq!(app.selected_index(), Some(0));
    press(&mut app, KeyCode::Enter);
    assert_eq!(app.scope().map(|k| k.pid), Some(allocprof::ids::Pid(9)));
}

#[test]
fn notices_expire_in_the_session_s_time() {
    let mut app = App::new(options());
    app.set_notice(Notice::Info("attached 4 probe sites".into()));
    // Timed from the first profile that finds it shown (here at 5 s).
    for s in 5..15 {
        app.update(AppEvent::Profile(sample(s)));
        assert!(app.notice().is_some(), "at {s}s");
    }
    app.update(AppEvent::Profile(sample(15)));
    assert_eq!(app.notice(), None);
    // A new notice starts its own time; warnings stay longer.
    app.update(AppEvent::Warning("a table is full".into()));
    app.update(AppEvent::Profile(sample(16)));
    app.update(AppEvent::Profile(sample(40)));
    assert!(app.notice().is_some());
    app.update(AppEvent::Info("baseline cleared".into()));
    app.update(AppEvent::Profile(sample(41)));
    app.update(AppEvent::Profile(sample(50)));
    assert_eq!(app.notice(), Some(&Notice::Info("baseline cleared".into())));
    app.update(AppEvent::Profile(sample(51)));
    assert_eq!(app.notice(), None);
    // The log keeps what the status line let go.
    assert_eq!(app.log, ["warning: a table is full", "baseline cleared"]);
}

#[test]
fn f1_opens_the_help_and_f10_quits_from_anywhere() {
    let mut app = app_at(1);
    press(&mut app, KeyCode::F(1));
    assert!(app.help() && !app.legend());
    press(&mut app, KeyCode::F(1));
    assert!(app.help() && app.legend());
    assert!(matches!(press(&mut app, KeyCode::F(10)), Effect::Quit));
    let mut app = app_at(1);
    assert!(matches!(press(&mut app, KeyCode::F(10)), Effect::Quit));
    // While a search is typed, and in the flamegraph.
    press(&mut app, KeyCode::Char('/'));
    assert!(matches!(press(&mut app, KeyCode::F(10)), Effect::Quit));
    press(&mut app, KeyCode::Esc);
    press(&mut app, KeyCode::Char('f'));
    assert!(app.flame().is_some());
    press(&mut app, KeyCode::F(1));
    assert!(app.help());
    press(&mut app, KeyCode::F(1));
    assert!(!app.help() && app.flame().is_some());
    assert!(matches!(press(&mut app, KeyCode::F(10)), Effect::Quit));
}

#[test]
fn a_steady_leak_sorts_above_a_larger_young_cache_by_old_live_bytes() {
    let mut app = app_at(2);
    let mut profile = sample(3);
    // The leak's bytes are all over a minute old, the larger cache's none.
    for p in &mut profile.processes {
        for s in &mut p.stacks {
            if s.frames.iter().any(|f| &*f.function == "leak") {
                s.totals.ages.over_old = s.totals.live_bytes;
            }
        }
    }
    app.update(AppEvent::Profile(profile));
    while app.sort().column != Column::Old {
        press(&mut app, KeyCode::Char('s'));
    }
    assert_eq!(labels(&app)[0], "leak ← handle · server (7)");
    while app.sort().column != Column::Live {
        press(&mut app, KeyCode::Char('s'));
    }
    assert_ne!(
        labels(&app)[0],
        "leak ← handle · server (7)",
        "by live bytes a larger stack is first"
    );
}

/// A server (7) with two workers (8, 9) forked from it, both allocating at
/// `serve`, and an unrelated process (20).
pub fn forked(secs: u64) -> Profile {
    let worker = |pid, live| ProcessProfile {
        parent: Some(allocprof::ids::Pid(7)),
        ..process(pid, "worker", &[(&["serve", "main"], live, live)])
    };
    profile(
        secs,
        vec![
            process(7, "server", &[(&["init", "main"], 100.0, 100.0)]),
            worker(8, 3000.0),
            worker(9, 2000.0),
            process(20, "other", &[(&["init", "main"], 4000.0, 4000.0)]),
        ],
    )
}

pub fn forked_app() -> App {
    let mut app = App::new(options());
    app.update(AppEvent::Profile(forked(1)));
    app
}

#[test]
fn t_folds_each_process_tree_under_its_root_and_arrows_unfold_it() {
    let mut app = forked_app();
    press(&mut app, KeyCode::Char('t'));
    assert_eq!(app.view(), View::Processes);
    assert!(app.trees());
    assert_eq!(labels(&app), ["▸ server (2 under)", "  other"]);
    // The tree's heap: the server's and its workers'.
    assert_eq!(app.rows()[0].totals.live_bytes, 5100.0);
    press(&mut app, KeyCode::Right);
    assert_eq!(
        labels(&app),
        ["▾ server (2 under)", "  └ worker", "  └ worker", "  other"]
    );
    // It stays unfolded across refreshes; ← on a member folds its tree and
    // selects the root.
    app.update(AppEvent::Profile(forked(2)));
    press(&mut app, KeyCode::Down);
    press(&mut app, KeyCode::Left);
    assert_eq!(labels(&app), ["▸ server (2 under)", "  other"]);
    assert_eq!(app.selected_index(), Some(0));
    // Flat again.
    press(&mut app, KeyCode::Char('t'));
    assert_eq!(labels(&app), ["other", "worker", "worker", "server"]);
}

#[test]
fn enter_on_a_root_shows_its_tree_s_stacks_merged_and_on_a_member_its_own() {
    let mut app = forked_app();
    press(&mut app, KeyCode::Char('t'));
    press(&mut app, KeyCode::Enter);
    assert_eq!(app.view(), View::Stacks);
    assert!(app.scope_tree());
    let stacks: Vec<(&str, f64)> = app
        .rows()
        .iter()
        .map(|r| (r.label.as_str(), r.totals.live_bytes))
        .collect();
    // Both workers' `serve` add up; the unrelated process is not there.
    assert_eq!(stacks, [("serve ← main", 5000.0), ("init ← main", 100.0)]);
    // `e` exports the tree merged, as shown.
    let Effect::Export { profile, selection } = press(&mut app, KeyCode::Char('e')) else {
        panic!("e exports");
    };
    assert_eq!(profile.processes.len(), 1);
    assert_eq!(profile.processes[0].totals.live_bytes, 5100.0);
    assert_eq!(selection.process.map(|k| k.pid.0), Some(7));
    // Back, unfold, and Enter on the second worker: that worker alone.
    press(&mut app, KeyCode::Esc);
    assert!(!app.scope_tree());
    press(&mut app, KeyCode::Right);
    press(&mut app, KeyCode::Down);
    press(&mut app, KeyCode::Down);
    press(&mut app, KeyCode::Enter);
    assert!(!app.scope_tree());
    let stacks: Vec<(&str, f64)> = app
        .rows()
        .iter()
        .map(|r| (r.label.as_str(), r.totals.live_bytes))
        .collect();
    assert_eq!(stacks, [("serve ← main", 2000.0)]);
    assert_eq!(app.scope().map(|k| k.pid.0), Some(9));
}

#[test]
fn on_a_tree_s_stacks_the_flamegraph_and_callers_count_the_whole_tree() {
    let mut app = forked_app();
    press(&mut app, KeyCode::Char('t'));
    press(&mut app, KeyCode::Enter);
    assert!(app.scope_tree());
    // The history of the first row, both workers' `serve ← main`: the
    // tree's, not the root's own (which has no such stack).
    let (row, root) = (app.rows()[0].id.clone(), app.scope());
    let now = Duration::from_secs(1);
    assert_eq!(
        app.history().row_series(now, &row, root).last().unwrap().1,
        5000
    );
    assert_eq!(
        app.history().row_series(now, &row, None).last().unwrap().1,
        0
    );
    press(&mut app, KeyCode::Char('f'));
    assert_eq!(flame_at(&app).0, "server (7) and children");
    let root = app
        .flame()
        .unwrap()
        .tree()
        .node(crate::tui::flame::ROOT)
        .live_bytes;
    assert_eq!(root, 5100.0, "the server's and both workers' bytes");
    press(&mut app, KeyCode::Char('q'));
    // The first row is both workers' `serve ← main`.
    press(&mut app, KeyCode::Char('c'));
    let callers = &app.callers().expect("the callers view").callers;
    assert_eq!(&*callers.function, "serve");
    assert_eq!(callers.live_bytes, 5000.0);
    // A member's own stacks stay its own.
    press(&mut app, KeyCode::Char('q'));
    press(&mut app, KeyCode::Esc);
    press(&mut app, KeyCode::Right);
    press(&mut app, KeyCode::Down);
    press(&mut app, KeyCode::Enter);
    press(&mut app, KeyCode::Char('f'));
    assert_eq!(
        app.flame()
            .unwrap()
            .tree()
            .node(crate::tui::flame::ROOT)
            .live_bytes,
        3000.0
    );
}

//! The layout at the sizes people use: 80×24 keeps the header's elapsed
//! time and the history's growth whole, 60×15 keeps PID and STATE, 200
//! columns spread the figures rather than pad the names.

use crossterm::event::KeyCode;

use super::tests::screen_lines;
use crate::tui::{
    rows::tests::{process, profile},
    state::{
        App, AppEvent,
        tests::{options, press},
    },
};
use allocprof::model::profile::{ProcessState, Profile};

/// An hour in, a leak that took 347.2 MiB in the last minute, an exited
/// process and a long target.
fn busy(secs: u64, leaked: f64) -> Profile {
    let mut gone = process(3, "finished-job", &[(&["build", "main"], 1e6, 1e6)]);
    gone.state = ProcessState::Exited;
    profile(
        secs,
        vec![
            process(
                1234,
                "python3",
                &[
                    (&["leak", "handle", "main"], leaked, leaked),
                    (&["cache_fill", "main"], 50_000.0, 50_000.0),
                ],
            ),
            process(
                9,
                "worker",
                &[(&["cache_fill", "main"], 20_000.0, 20_000.0)],
            ),
            gone,
        ],
    )
}

fn busy_app() -> App {
    let mut o = options();
    o.target = "pids 1234, 9, 3".into();
    let mut app = App::new(o);
    app.update(AppEvent::Profile(busy(3663, 0.0)));
    app.update(AppEvent::Profile(busy(3723, 347.2 * 1024.0 * 1024.0)));
    app
}

#[test]
fn at_80x24_the_elapsed_time_and_the_growth_are_whole() {
    let mut app = busy_app();
    let lines = screen_lines(&mut app, 80, 24);
    let text = lines.join("\n");
    assert!(lines[0].contains("1h 02m 03s"), "{text}");
    assert!(lines[0].contains("live heap 347.3 MiB"), "{text}");
    assert!(text.contains("+347.2 MiB/1m"), "{text}");
    // With a baseline badge too.
    press(&mut app, KeyCode::Char('b'));
    let lines = screen_lines(&mut app, 80, 24);
    let text = lines.join("\n");
    assert!(
        lines[0].contains("1h 02m 03s") && lines[0].contains("BASELINE"),
        "{text}"
    );
    assert!(text.contains("+347.2 MiB/1m"), "{text}");
}

#[test]
fn at_60x15_the_process_table_keeps_pid_and_state() {
    let mut app = busy_app();
    press(&mut app, KeyCode::Tab);
    let lines = screen_lines(&mut app, 60, 15);
    let text = lines.join("\n");
    let titles = lines.iter().find(|l| l.contains("PROCESS")).unwrap();
    assert!(titles.contains("PID") && titles.contains("STATE"), "{text}");
    let row = lines.iter().find(|l| l.contains("python3")).unwrap();
    assert!(row.contains("1234") && row.contains("live"), "{text}");
    assert!(lines[0].contains("1h 02m 03s"), "{text}");
    assert!(text.contains("+347.2 MiB"), "{text}");
}

#[test]
fn at_200_columns_the_figures_spread_instead_of_blank_names() {
    let mut app = busy_app();
    for view in ["processes", "stacks"] {
        // Tab: to the processes, then back to the stacks.
        press(&mut app, KeyCode::Tab);
        let lines = screen_lines(&mut app, 200, 50);
        let text = lines.join("\n");
        let row = lines.iter().find(|l| l.contains("worker")).unwrap();
        let after = &row[row.find("worker").unwrap() + "worker".len()..];
        let blank = after.chars().take_while(|c| *c != '│').collect::<String>();
        let gap = blank.len() - blank.trim_start().len();
        assert!(gap < 40, "{view}: {gap} blanks after the name:\n{text}");
        // The row still spans the table: its last figure at the right edge.
        assert!(row.trim_end_matches('│').len() > 190, "{view}:\n{text}");
    }
}

//! The help overlays, the status line's notices, and a terminal too small.

use super::*;

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

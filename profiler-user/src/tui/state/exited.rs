//! Processes that are gone (exited, exec'ed, OOM-killed): their rows hold
//! their figures at exit, sort apart after the running processes' rows, and
//! go from the tables a while after they went, unless `x` shows them.

use std::{collections::HashMap, time::Duration};

use allocprof::model::profile::{ProcessKey, ProcessState, Profile};

/// How long a gone process stays in the tables by default.
pub const EXITED_TTL: Duration = Duration::from_secs(60);

/// Which gone processes the tables show (`x` cycles them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ShowExited {
    /// Those gone for less than [`EXITED_TTL`].
    #[default]
    Recent,
    All,
    None,
}

impl ShowExited {
    pub(super) fn next(self) -> ShowExited {
        match self {
            ShowExited::Recent => ShowExited::All,
            ShowExited::All => ShowExited::None,
            ShowExited::None => ShowExited::Recent,
        }
    }

    /// The notice after `x`.
    pub(super) fn describe(self) -> String {
        match self {
            ShowExited::Recent => format!(
                "exited processes shown for {}s after they exit (x: show all)",
                EXITED_TTL.as_secs()
            ),
            ShowExited::All => "all exited processes shown (x: hide them)".into(),
            ShowExited::None => "exited processes hidden (x: show the recent ones)".into(),
        }
    }
}

/// When each gone process image was first seen gone, in the session's time
/// (the profiles' `elapsed`: the state has no clock).
#[derive(Debug, Default)]
pub(super) struct GoneSince(HashMap<ProcessKey, Duration>);

impl GoneSince {
    pub(super) fn record(&mut self, profile: &Profile) {
        let mut seen = HashMap::with_capacity(self.0.len());
        for p in profile
            .processes
            .iter()
            .filter(|p| p.state != ProcessState::Live)
        {
            let since = self.0.get(&p.key).copied().unwrap_or(profile.elapsed);
            seen.insert(p.key, since);
        }
        // Forgotten images leave the map with the profile.
        self.0 = seen;
    }

    /// Whether the gone process `key` is hidden at `now`.
    pub(super) fn hidden(&self, key: ProcessKey, show: ShowExited, now: Duration) -> bool {
        let Some(since) = self.0.get(&key) else {
            return false;
        };
        match show {
            ShowExited::All => false,
            ShowExited::None => true,
            ShowExited::Recent => now.saturating_sub(*since) >= EXITED_TTL,
        }
    }
}

#[cfg(test)]
mod tests {
    use crossterm::event::KeyCode;

    use super::*;
    use crate::tui::{
        rows::tests::{process, profile},
        state::{
            App, AppEvent, Column, Effect, Sort, View,
            tests::{options, press},
        },
    };

    /// `live` leaks 1 KB a second; `gone` held 1 MB when it exited at 1 s,
    /// more than `live` holds or gained.
    fn at(secs: u64) -> Profile {
        let leak = 1000.0 * secs as f64;
        let mut gone = process(3, "gone", &[(&["hoard", "main"], 1e6, 1e6)]);
        if secs == 0 {
            gone.stacks[0].totals.live_bytes = 0.0;
            gone.totals.live_bytes = 0.0;
        } else {
            gone.state = ProcessState::Exited;
        }
        profile(
            secs,
            vec![process(7, "live", &[(&["leak", "main"], leak, leak)]), gone],
        )
    }

    fn app_until(secs: u64) -> App {
        let mut app = App::new(options());
        for s in 0..=secs {
            app.update(AppEvent::Profile(at(s)));
        }
        app
    }

    fn labels(app: &App) -> Vec<&str> {
        app.rows().iter().map(|r| r.label.as_str()).collect()
    }

    #[test]
    fn exited_processes_sort_after_the_running_ones_whatever_the_column() {
        let mut app = app_until(5);
        press(&mut app, KeyCode::Tab);
        assert_eq!(app.view(), View::Processes);
        for column in [Column::Live, Column::Growth, Column::Old, Column::Name] {
            for descending in [true, false] {
                app.settings.process_sort = Sort { column, descending };
                app.arrange();
                assert_eq!(labels(&app), ["live", "gone"], "{column:?} {descending}");
            }
        }
        assert!(app.rows()[1].gone && !app.rows()[0].gone);
        // Its stacks too, named as at exit.
        press(&mut app, KeyCode::Tab);
        assert_eq!(
            labels(&app),
            ["leak ← main · live (7)", "hoard ← main · gone (3) exited"]
        );
        // A baseline sorts by growth since: the exited process stays last.
        press(&mut app, KeyCode::Char('b'));
        app.update(AppEvent::Profile(at(6)));
        assert_eq!(app.sort().column, Column::Baseline);
        assert_eq!(labels(&app)[0], "leak ← main · live (7)");
    }

    #[test]
    fn exited_processes_go_after_a_minute_unless_x_shows_them() {
        let mut app = app_until(5);
        press(&mut app, KeyCode::Tab);
        assert_eq!(labels(&app), ["live", "gone"]);
        // Seen gone at 1 s: still shown at 60 s, gone at 61 s.
        app.update(AppEvent::Profile(at(60)));
        assert_eq!(labels(&app), ["live", "gone"]);
        app.update(AppEvent::Profile(at(61)));
        assert_eq!(labels(&app), ["live"]);
        assert_eq!(app.hidden_processes(), 1);
        press(&mut app, KeyCode::Char('x'));
        assert_eq!(app.show_exited(), ShowExited::All);
        assert_eq!(labels(&app), ["live", "gone"]);
        assert_eq!(app.hidden_processes(), 0);
        press(&mut app, KeyCode::Char('x'));
        assert_eq!(app.show_exited(), ShowExited::None);
        assert_eq!(labels(&app), ["live"]);
        press(&mut app, KeyCode::Char('x'));
        assert_eq!(app.show_exited(), ShowExited::Recent);
        assert_eq!(labels(&app), ["live"]);
        // Hidden from the stacks and from what `e` writes.
        press(&mut app, KeyCode::Tab);
        assert_eq!(labels(&app), ["leak ← main · live (7)"]);
        let Effect::Export { profile, .. } = press(&mut app, KeyCode::Char('e')) else {
            panic!("no export");
        };
        let pids: Vec<u32> = profile.processes.iter().map(|p| p.key.pid.0).collect();
        assert_eq!(pids, [7]);
    }

    #[test]
    fn a_hidden_process_entered_still_shows_its_stacks() {
        let mut app = app_until(5);
        press(&mut app, KeyCode::Tab);
        press(&mut app, KeyCode::Down);
        press(&mut app, KeyCode::Enter);
        press(&mut app, KeyCode::Char('x'));
        press(&mut app, KeyCode::Char('x'));
        assert_eq!(app.show_exited(), ShowExited::None);
        assert_eq!(labels(&app), ["hoard ← main"]);
    }
}

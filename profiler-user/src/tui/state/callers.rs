//! The callers and callees view (`c`): for the function naming the selected
//! row, who called it and what it called, with the live bytes through each
//! (`tui::callers`). `Enter` follows the selected caller or callee, `Esc`
//! (or Backspace) goes back to the function before, `c`/`q` close it.
//! Refreshed with every profile shown.

use std::sync::Arc;

use crossterm::event::{KeyCode, KeyEvent};

use super::{App, Effect, Notice, View};
use crate::tui::{
    callers::{Callers, ROOT, SELF},
    rows::{RowId, function_of},
    view_model::merged_tree,
};
use allocprof::model::profile::{ProcessKey, Profile};

pub struct CallersView {
    pub callers: Callers,
    /// The process whose stacks are counted (`None`: every running one).
    pub scope: Option<ProcessKey>,
    /// `scope` is a tree's root: its whole tree's stacks are counted, merged
    /// (as the stack view shows them).
    pub tree: bool,
    /// In the callers then the callees, as listed.
    pub selected: usize,
    /// The functions followed to this one, to go back to.
    trail: Vec<Arc<str>>,
}

impl CallersView {
    fn len(&self) -> usize {
        self.callers.callers.len() + self.callers.callees.len()
    }

    /// The function the selection names, if one can be followed.
    fn selected_function(&self) -> Option<Arc<str>> {
        let c = &self.callers;
        let edge = c.callers.iter().chain(&c.callees).nth(self.selected)?;
        (!matches!(&*edge.name, ROOT | SELF)).then(|| edge.name.clone())
    }

    pub(super) fn select_by(&mut self, step: isize) {
        self.selected = self
            .selected
            .saturating_add_signed(step)
            .min(self.len().saturating_sub(1));
    }

    fn rebuild(&mut self, profile: &Profile, function: &str) {
        self.callers = callers_of(profile, self.scope, self.tree, function);
        self.selected = self.selected.min(self.len().saturating_sub(1));
    }
}

/// `function`'s callers and callees in `scope`'s stacks, or with `tree` in
/// its whole tree's, merged.
fn callers_of(profile: &Profile, scope: Option<ProcessKey>, tree: bool, function: &str) -> Callers {
    match scope {
        Some(root) if tree => Callers::of(&merged_tree(profile, root), scope, function),
        _ => Callers::of(profile, scope, function),
    }
}

impl App {
    pub fn callers(&self) -> Option<&CallersView> {
        self.callers.as_ref()
    }

    /// `c`: the callers and callees of the selected row's function.
    pub(super) fn open_callers(&mut self) {
        let (Some(shown), Some(row)) = (self.profiles.shown.clone(), self.selected_row()) else {
            self.notice = Some(Notice::Warning("no row selected".into()));
            return;
        };
        let function = match &row.id {
            RowId::Process(_) => {
                self.notice = Some(Notice::Warning(
                    "callers and callees are a function's: press c on a stack (Tab)".into(),
                ));
                return;
            }
            _ => function_of(&row.frames),
        };
        let scope = row.process_key();
        let tree = self.settings.scope_tree && self.settings.view == View::Stacks;
        self.callers = Some(CallersView {
            callers: callers_of(&shown, scope, tree, &function),
            scope,
            tree,
            selected: 0,
            trail: Vec::new(),
        });
    }

    /// The open view from the shown profile.
    pub(super) fn rebuild_callers(&mut self) {
        if let (Some(view), Some(shown)) = (self.callers.as_mut(), self.profiles.shown.as_deref()) {
            let function = view.callers.function.clone();
            view.rebuild(shown, &function);
        }
    }

    /// A key while the view is open: its own, `?`, else nothing.
    pub(super) fn callers_key(&mut self, key: KeyEvent) -> Effect {
        let (Some(view), Some(shown)) = (self.callers.as_mut(), self.profiles.shown.clone()) else {
            return Effect::None;
        };
        let len = view.len();
        match key.code {
            KeyCode::Char('q' | 'c') => self.callers = None,
            KeyCode::Esc | KeyCode::Backspace => match view.trail.pop() {
                Some(back) => {
                    view.selected = 0;
                    view.rebuild(&shown, &back);
                }
                None => self.callers = None,
            },
            KeyCode::Up | KeyCode::Char('k') => view.select_by(-1),
            KeyCode::Down | KeyCode::Char('j') => view.select_by(1),
            KeyCode::Home => view.selected = 0,
            KeyCode::End => view.selected = len.saturating_sub(1),
            KeyCode::Enter => {
                if let Some(next) = view.selected_function() {
                    view.trail.push(view.callers.function.clone());
                    view.selected = 0;
                    view.rebuild(&shown, &next);
                }
            }
            KeyCode::Char('?') | KeyCode::F(1) => self.help = true,
            _ => {}
        }
        Effect::None
    }
}

#[cfg(test)]
mod tests {
    use crossterm::event::KeyCode;

    use super::*;
    use crate::tui::state::{
        AppEvent, View,
        tests::{options, press, sample},
    };

    fn app_at(secs: u64) -> App {
        let mut app = App::new(options());
        for s in 0..=secs {
            app.update(AppEvent::Profile(sample(s)));
        }
        app
    }

    fn shown(app: &App) -> (String, Vec<String>, Vec<String>) {
        let c = &app.callers().unwrap().callers;
        let names =
            |e: &[crate::tui::callers::Edge]| e.iter().map(|e| e.name.to_string()).collect();
        (c.function.to_string(), names(&c.callers), names(&c.callees))
    }

    #[test]
    fn c_opens_the_function_s_callers_and_enter_follows_esc_goes_back() {
        let mut app = app_at(3);
        // The rows: cache_fill (7), cache_fill (9), leak (7), parse (7).
        press(&mut app, KeyCode::Down);
        press(&mut app, KeyCode::Down);
        assert!(app.selected_row().unwrap().label.starts_with("leak"));
        press(&mut app, KeyCode::Char('c'));
        assert_eq!(
            shown(&app),
            ("leak".into(), vec!["handle".into()], vec![SELF.into()])
        );
        assert_eq!(
            app.callers().unwrap().scope.map(|k| k.pid),
            Some(allocprof::ids::Pid(7))
        );
        let live = app.callers().unwrap().callers.live_bytes;
        // Refreshed with the profiles: the leak grows.
        app.update(AppEvent::Profile(sample(4)));
        assert!(app.callers().unwrap().callers.live_bytes > live);
        // Follow the caller: handle, called by main, calling leak and parse.
        press(&mut app, KeyCode::Enter);
        assert_eq!(
            shown(&app),
            (
                "handle".into(),
                vec!["main".into()],
                vec!["leak".into(), "parse".into()]
            )
        );
        // Down to the callees; the keys are the view's (s sorts nothing).
        press(&mut app, KeyCode::Char('j'));
        press(&mut app, KeyCode::Char('j'));
        press(&mut app, KeyCode::Char('j'));
        assert_eq!(app.callers().unwrap().selected, 2);
        press(&mut app, KeyCode::Char('s'));
        assert_eq!(app.sort().column, crate::tui::state::Column::Live);
        press(&mut app, KeyCode::Enter);
        assert_eq!(shown(&app).0, "parse");
        // Esc: back to handle, back to leak, then closed.
        press(&mut app, KeyCode::Esc);
        assert_eq!(shown(&app).0, "handle");
        press(&mut app, KeyCode::Esc);
        assert_eq!(shown(&app).0, "leak");
        press(&mut app, KeyCode::Esc);
        assert!(app.callers().is_none());
        // On a process row: a hint, nothing opens.
        press(&mut app, KeyCode::Tab);
        assert_eq!(app.view(), View::Processes);
        press(&mut app, KeyCode::Char('c'));
        assert!(app.callers().is_none());
        assert!(matches!(app.notice(), Some(Notice::Warning(_))));
    }
}

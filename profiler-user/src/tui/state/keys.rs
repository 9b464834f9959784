//! Keys: the tables', the flamegraph's (while it is open) and the search
//! query's, each turned into a transition of the state.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::{App, Effect, FlameOutcome, FlameView, Notice, Search, TableState, View};
use crate::tui::{
    flame::Scope as FlameScope,
    rows::{Grouping, RowId, TreeMark},
};

impl App {
    pub(super) fn key(&mut self, key: KeyEvent) -> Effect {
        if key.kind == KeyEventKind::Release {
            return Effect::None;
        }
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        // F10 quits from anywhere, as in htop and mc.
        if ctrl && matches!(key.code, KeyCode::Char('c' | 'C')) || key.code == KeyCode::F(10) {
            return Effect::Quit;
        }
        if self.help {
            // `?` turns the keys page to the legend; any other key closes
            // the help, and does nothing else.
            let help_key = matches!(key.code, KeyCode::Char('?') | KeyCode::F(1));
            if help_key && !self.legend && self.flame.is_none() {
                self.legend = true;
            } else {
                self.help = false;
                self.legend = false;
            }
            return Effect::None;
        }
        if self.flame.is_some() {
            return self.flame_key(key);
        }
        if self.callers.is_some() {
            return self.callers_key(key);
        }
        if self.settings.search.editing && self.search_key(key) {
            return Effect::None;
        }
        match key.code {
            KeyCode::Char('q') => return Effect::Quit,
            KeyCode::Char('?') | KeyCode::F(1) => self.help = true,
            KeyCode::Tab | KeyCode::BackTab => {
                let view = match self.settings.view {
                    View::Processes => View::Stacks,
                    View::Stacks => View::Processes,
                };
                self.set_view(view);
            }
            KeyCode::Enter => match (
                self.settings.view,
                self.selected_row().map(|r| r.id.clone()),
            ) {
                (View::Processes, Some(RowId::Process(key))) => {
                    self.settings.scope = Some(key);
                    // A folded or unfolded tree's root: the whole tree.
                    self.settings.scope_tree = matches!(
                        self.selected_row().and_then(|r| r.tree),
                        Some(TreeMark::Root { members, .. }) if members > 0
                    );
                    self.tables[View::Stacks as usize].reset();
                    self.selected[View::Stacks as usize] = None;
                    self.set_view(View::Stacks);
                }
                (View::Stacks, _) => {
                    self.zoom = !self.zoom;
                    self.detail_scroll = 0;
                }
                _ => {}
            },
            KeyCode::Char('d') => {
                self.zoom = !self.zoom;
                self.detail_scroll = 0;
            }
            KeyCode::Char('a') => {
                if self.settings.scope.is_some() {
                    self.settings.scope = None;
                    self.settings.scope_tree = false;
                    self.tables[View::Stacks as usize].reset();
                    self.selected[View::Stacks as usize] = None;
                }
                self.set_view(View::Stacks);
            }
            KeyCode::Esc => self.back(),
            // The enlarged detail takes the vi keys and the pages to scroll;
            // the arrows still move among the rows.
            KeyCode::Char('j') if self.zoom => self.scroll_detail(1),
            KeyCode::Char('k') if self.zoom => self.scroll_detail(-1),
            KeyCode::PageDown if self.zoom => self.scroll_detail(self.detail_page() as isize),
            KeyCode::PageUp if self.zoom => self.scroll_detail(-(self.detail_page() as isize)),
            KeyCode::Up | KeyCode::Char('k') => self.select(|t, len| t.select_by(-1, len)),
            KeyCode::Down | KeyCode::Char('j') => self.select(|t, len| t.select_by(1, len)),
            KeyCode::PageUp => self.select(TableState::page_up),
            KeyCode::PageDown => self.select(TableState::page_down),
            KeyCode::Home => self.select(TableState::home),
            KeyCode::End => self.select(TableState::end),
            KeyCode::Char('s') => self.cycle_sort(1),
            KeyCode::Char('S') => self.cycle_sort(-1),
            KeyCode::Char('r') => {
                let sort = self.settings.sort_mut();
                sort.descending = !sort.descending;
                self.arrange();
            }
            KeyCode::Char('g') => {
                self.settings.grouping = match self.settings.grouping {
                    Grouping::Stack => Grouping::Function,
                    Grouping::Function => Grouping::Stack,
                };
                self.tables[View::Stacks as usize].reset();
                self.selected[View::Stacks as usize] = None;
                self.set_view(View::Stacks);
            }
            KeyCode::Char('/') => self.settings.search.editing = true,
            KeyCode::Char('b') => self.mark_baseline(),
            KeyCode::Char('B') => self.clear_baseline(),
            KeyCode::Char('p' | ' ') => self.toggle_pause(),
            KeyCode::Char('x') => self.cycle_exited(),
            KeyCode::Char('t') => self.toggle_trees(),
            KeyCode::Right | KeyCode::Char('+') => self.fold(false),
            KeyCode::Left | KeyCode::Char('-') => self.fold(true),
            KeyCode::Char('c') => self.open_callers(),
            KeyCode::Char('e') => return self.export(),
            KeyCode::Char('f') => self.open_flame(),
            _ => {}
        }
        Effect::None
    }

    /// `t`: the process table folds each process tree under its root, or
    /// lists every process flat.
    fn toggle_trees(&mut self) {
        self.settings.trees = !self.settings.trees;
        self.notice = Some(Notice::Info(if self.settings.trees {
            "process trees: each under its root (→ unfolds, ← folds, Enter on a root: the \
             tree's stacks together; t: flat)"
                .into()
        } else {
            "processes listed flat (t: trees)".into()
        }));
        if self.settings.view == View::Processes {
            self.arrange();
        } else {
            self.set_view(View::Processes);
        }
    }

    /// `←` (`fold`) and `→`: fold the selected root's tree, or the tree of
    /// the selected member (the selection goes to its root); unfold it.
    pub(super) fn fold(&mut self, fold: bool) {
        if self.settings.view != View::Processes || !self.settings.trees {
            return;
        }
        let root = match self.selected_row().map(|r| (&r.id, r.tree)) {
            Some((RowId::Process(key), Some(TreeMark::Root { .. }))) => *key,
            Some((_, Some(TreeMark::Member { root, .. }))) if fold => {
                self.selected[View::Processes as usize] = Some(RowId::Process(root));
                root
            }
            _ => return,
        };
        if fold {
            self.settings.unfolded.remove(&root);
        } else {
            self.settings.unfolded.insert(root);
        }
        self.arrange();
    }

    /// A key in the flamegraph: its own first, then the app's baseline and
    /// help keys. Nothing else of the tables' (`q` leaves the view).
    pub(super) fn flame_key(&mut self, key: KeyEvent) -> Effect {
        let Some(flame) = self.flame.as_mut() else {
            return Effect::None;
        };
        match flame.key(key) {
            FlameOutcome::Done => {}
            FlameOutcome::Close => self.flame = None,
            FlameOutcome::Thawed => self.rebuild_flame(true),
            FlameOutcome::NoBaseline => {
                self.notice = Some(Notice::Warning(if self.profiles.baseline.is_some() {
                    // Marked after the freeze: the frozen tree has no growth.
                    "the picture was frozen before the baseline: Space thaws it".into()
                } else {
                    "no baseline to compare with: press b to mark one, d then shows the growth \
                     since"
                        .into()
                }));
            }
            FlameOutcome::Unhandled => match key.code {
                KeyCode::Char('?') | KeyCode::F(1) => self.help = true,
                KeyCode::Char('b') => self.mark_baseline(),
                KeyCode::Char('B') => self.clear_baseline(),
                _ => {}
            },
        }
        Effect::None
    }

    /// `f`: the flamegraph of the process the view is on (the selected
    /// process, or the stack view's: its whole tree when the view shows the
    /// tree), else of all processes.
    pub(super) fn open_flame(&mut self) {
        let scope = match (self.settings.view, self.selected_row().map(|r| &r.id)) {
            (View::Processes, Some(RowId::Process(key))) => FlameScope::Process(*key),
            (View::Processes, _) => FlameScope::All,
            (View::Stacks, _) => match self.settings.scope {
                Some(root) if self.settings.scope_tree => FlameScope::Tree(root),
                Some(key) => FlameScope::Process(key),
                None => FlameScope::All,
            },
        };
        let Some(shown) = self.profiles.shown.as_deref() else {
            self.notice = Some(Notice::Warning("no profile yet to draw".into()));
            return;
        };
        self.flame = Some(FlameView::new(self.placeholder_tree(scope), shown.elapsed));
        self.request_flame(scope, true);
    }

    /// The open flamegraph from the shown profile: not while frozen, and
    /// for a large tree not before its refresh gap is over, unless `now`
    /// (what it shows changed: baseline, thaw).
    pub(super) fn rebuild_flame(&mut self, now: bool) {
        let (Some(flame), Some(shown)) = (self.flame.as_mut(), self.profiles.shown.as_deref())
        else {
            return;
        };
        if !flame.due(shown.elapsed, now) {
            return;
        }
        let scope = flame.scope();
        // A tree owed since a thaw or a new baseline; a refresh owes none.
        self.request_flame(scope, now);
    }

    /// A key while the search query is edited; false if it is not for the
    /// query (navigation keys keep working).
    pub(super) fn search_key(&mut self, key: KeyEvent) -> bool {
        match key.code {
            KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::CONTROL) => {
                self.settings.search.query.push(c);
            }
            KeyCode::Backspace => {
                self.settings.search.query.pop();
            }
            KeyCode::Enter => self.settings.search.editing = false,
            KeyCode::Esc => self.settings.search = Search::default(),
            _ => return false,
        }
        self.arrange();
        true
    }

    /// Esc: one step back (detail zoom, search, scope), never a quit.
    pub(super) fn back(&mut self) {
        if self.zoom {
            self.zoom = false;
        } else if !self.settings.search.query.is_empty() {
            self.settings.search = Search::default();
            self.arrange();
        } else if let (View::Stacks, Some(key)) = (self.settings.view, self.settings.scope) {
            self.settings.scope = None;
            self.settings.scope_tree = false;
            self.selected[View::Processes as usize] = Some(RowId::Process(key));
            self.set_view(View::Processes);
        }
    }
}

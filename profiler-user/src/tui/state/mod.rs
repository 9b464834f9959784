//! The TUI's state and every transition of it: events in, state changes
//! and commands for the run loop out. No terminal, no I/O, no clock: this is
//! what the unit tests drive.
//!
//! Each view's scroll and selection is a [`TableState`] (`table`); the run
//! loop hands it the table's height before each draw ([`App::fit_table`]),
//! so drawing reads the state and never writes it. `columns`: the views'
//! columns and sort orders; `builds`: the rows and the flamegraph's tree
//! asked of the view worker and taken in; `arrange`: the rows filtered,
//! sorted, the selection found again; `search`: what a query keeps; `export`: the `e`
//! key; `flame`: the flamegraph view (opened over the tables by `f`). `App`'s fields group what was read (`Profiles`) apart from what the
//! user chose to see (`Settings`) and the rows and selections they yield.

mod arrange;
mod builds;
mod callers;
mod columns;
mod exited;
mod export;
mod flame;
mod keys;
mod mouse;
mod search;
mod table;
#[cfg(test)]
pub(crate) mod tests;

pub use self::{
    callers::CallersView,
    columns::{Column, Sort, View},
    exited::ShowExited,
    flame::{FlameView, Outcome as FlameOutcome, first_row},
    mouse::Screen,
    search::Search,
    table::TableState,
};

use std::{collections::HashSet, sync::Arc, time::Duration};

use crossterm::event::{KeyEvent, MouseEvent};

use super::{
    exporter::ViewSelection,
    history::History,
    rows::{Grouping, Row, RowId},
    view_model::Built,
};
use allocprof::{
    model::profile::{ProcessKey, Profile},
    output::inert::inert,
};

/// How long a notice stays in the status line: an information, and a
/// warning or error.
pub const INFO_TTL: Duration = Duration::from_secs(10);
pub const WARNING_TTL: Duration = Duration::from_secs(30);

/// What the run loop feeds the state.
#[derive(Debug)]
// A profile arrives once per interval, moved straight into the state:
// boxing it would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum AppEvent {
    /// A fresh profile from the session.
    Profile(Profile),
    Key(KeyEvent),
    /// A click or the wheel (the terminal reports them: mouse capture).
    Mouse(MouseEvent),
    /// The terminal changed size (the next draw adapts).
    Resize,
    /// Something the user should know (shown in the status line, and
    /// printed again on exit).
    Warning(String),
    Info(String),
    /// Rows or a flamegraph built off the UI's thread.
    Built(Box<Built>),
    /// SIGINT, SIGTERM, SIGHUP: leave as `q` would.
    Quit,
}

/// What the run loop must do after an event (the state machine's only output).
#[derive(Debug)]
pub enum Effect {
    None,
    Quit,
    /// Write this profile (the current view, already restricted to it).
    Export {
        profile: Box<Profile>,
        selection: ViewSelection,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    Info(String),
    Warning(String),
    Error(String),
}

/// Fixed facts about the session, for the header.
#[derive(Clone, Debug)]
pub struct AppOptions {
    /// What is profiled: `pid 1234`, `all processes`.
    pub target: String,
    pub interval: Duration,
    /// Where `liballocprof.so` is (made inert), for the empty view's how-to.
    pub preload: Option<String>,
}

/// The profiles read, and which the view shows and compares to.
#[derive(Default)]
struct Profiles {
    history: History,
    latest: Option<Arc<Profile>>,
    /// What the view shows: the latest profile, or the one paused on.
    shown: Option<Arc<Profile>>,
    paused: bool,
    baseline: Option<Arc<Profile>>,
    gone_since: exited::GoneSince,
}

/// What the user chose to see: which rows, grouped and ordered how.
struct Settings {
    view: View,
    /// The process the stack view is restricted to; `None` shows every
    /// process's stacks, each row naming its process.
    scope: Option<ProcessKey>,
    /// The scope is a tree's root: the stack view shows the whole tree's
    /// stacks merged (as `--merge-tree` does).
    scope_tree: bool,
    /// The process table folds each process tree under its root (`t`).
    trees: bool,
    /// The roots whose trees are unfolded.
    unfolded: HashSet<ProcessKey>,
    grouping: Grouping,
    process_sort: Sort,
    stack_sort: Sort,
    search: Search,
    exited: ShowExited,
}

impl Settings {
    /// The shown view's sort.
    fn sort(&self) -> Sort {
        match self.view {
            View::Processes => self.process_sort,
            View::Stacks => self.stack_sort,
        }
    }

    /// The shown view's sort, to change.
    fn sort_mut(&mut self) -> &mut Sort {
        match self.view {
            View::Processes => &mut self.process_sort,
            View::Stacks => &mut self.stack_sort,
        }
    }

    /// The search query as matched: trimmed, lowercase; `None` if empty.
    fn query(&self) -> Option<String> {
        let q = self.search.query.trim().to_lowercase();
        (!q.is_empty()).then_some(q)
    }
}

pub struct App {
    pub options: AppOptions,
    profiles: Profiles,
    settings: Settings,
    /// Rows of the view before the search filter, unsorted.
    all_rows: Vec<Row>,
    /// Rows as shown: filtered and sorted.
    rows: Vec<Row>,
    /// Selection per view, by identity, once the user moved it (`None`: the
    /// first row, whichever it is); its table keeps where it was as a
    /// fallback for when its row disappears, and the scroll.
    selected: [Option<RowId>; 2],
    tables: [TableState; 2],
    /// The detail pane's first line shown, of `detail_row`'s detail; and
    /// the most it can be (from the last draw).
    detail_scroll: usize,
    detail_max: usize,
    detail_page: usize,
    detail_row: Option<RowId>,
    help: bool,
    /// The help's second page: what the columns and markers mean.
    legend: bool,
    zoom: bool,
    /// The flamegraph, when open: it takes the keys and the screen.
    flame: Option<FlameView>,
    /// The callers and callees view, when open: it takes the keys and the
    /// table's place.
    callers: Option<CallersView>,
    notice: Option<Notice>,
    /// The notice shown and when it was first seen shown, in the session's
    /// time (the profiles' `elapsed`: the state has no clock of its own).
    notice_since: Option<(Notice, Duration)>,
    /// Where the last draw put what the mouse can point at.
    screen: Screen,
    /// Printed on exit: the terminal's history outlives the status line.
    pub log: Vec<String>,
    builds: builds::Builds,
}

impl App {
    pub fn new(options: AppOptions) -> App {
        App {
            options,
            profiles: Profiles::default(),
            settings: Settings {
                view: View::Stacks,
                scope: None,
                scope_tree: false,
                trees: false,
                unfolded: HashSet::new(),
                grouping: Grouping::Stack,
                process_sort: Sort::by(Column::Live),
                stack_sort: Sort::by(Column::Live),
                search: Search::default(),
                exited: ShowExited::default(),
            },
            all_rows: Vec::new(),
            rows: Vec::new(),
            selected: [None, None],
            tables: [TableState::default(); 2],
            detail_scroll: 0,
            detail_max: 0,
            detail_page: 0,
            detail_row: None,
            help: false,
            legend: false,
            zoom: false,
            flame: None,
            callers: None,
            notice: None,
            notice_since: None,
            screen: Screen::default(),
            log: Vec::new(),
            builds: builds::Builds::default(),
        }
    }

    // ---- what the renderer reads ----

    pub fn shown(&self) -> Option<&Profile> {
        self.profiles.shown.as_deref()
    }
    pub fn history(&self) -> &History {
        &self.profiles.history
    }
    pub fn paused(&self) -> bool {
        self.profiles.paused
    }
    pub fn view(&self) -> View {
        self.settings.view
    }
    pub fn scope(&self) -> Option<ProcessKey> {
        self.settings.scope
    }
    /// The stack view shows the scope's whole tree.
    pub fn scope_tree(&self) -> bool {
        self.settings.scope_tree
    }
    /// The process table folds process trees (`t`).
    pub fn trees(&self) -> bool {
        self.settings.trees
    }
    pub fn grouping(&self) -> Grouping {
        self.settings.grouping
    }
    pub fn search(&self) -> &Search {
        &self.settings.search
    }
    pub fn baseline(&self) -> Option<&Profile> {
        self.profiles.baseline.as_deref()
    }
    pub fn help(&self) -> bool {
        self.help
    }
    /// The help shows the legend rather than the keys.
    pub fn legend(&self) -> bool {
        self.legend
    }
    pub fn zoom(&self) -> bool {
        self.zoom
    }
    /// The detail pane's first line shown.
    pub fn detail_scroll(&self) -> usize {
        self.detail_scroll
    }
    pub fn flame(&self) -> Option<&FlameView> {
        self.flame.as_ref()
    }
    pub fn notice(&self) -> Option<&Notice> {
        self.notice.as_ref()
    }
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }
    pub fn sort(&self) -> Sort {
        self.settings.sort()
    }
    #[cfg(test)]
    pub fn show_exited(&self) -> ShowExited {
        self.settings.exited
    }

    /// Whether the tables leave out the gone process `key` (`x`; by
    /// default, once gone for [`EXITED_TTL`]). Never the one entered.
    pub fn hides(&self, key: ProcessKey) -> bool {
        let now = self
            .profiles
            .shown
            .as_ref()
            .map_or(Duration::ZERO, |p| p.elapsed);
        self.settings.scope != Some(key)
            && self
                .profiles
                .gone_since
                .hidden(key, self.settings.exited, now)
    }

    /// How many of the shown profile's processes the tables leave out.
    pub fn hidden_processes(&self) -> usize {
        self.profiles.shown.as_ref().map_or(0, |p| {
            p.processes.iter().filter(|p| self.hides(p.key)).count()
        })
    }

    /// The view's columns, in order.
    pub fn columns(&self) -> Vec<Column> {
        let mut cols = match self.settings.view {
            View::Processes => vec![
                Column::Name,
                Column::Pid,
                Column::Live,
                Column::Objects,
                Column::AllocRate,
                Column::Growth,
                Column::Old,
                Column::Samples,
                Column::Resident,
                Column::State,
            ],
            View::Stacks => vec![
                Column::Name,
                Column::Live,
                Column::Share,
                Column::Samples,
                Column::Objects,
                Column::AllocRate,
                Column::Old,
            ],
        };
        if self.profiles.baseline.is_some() {
            let at = cols
                .iter()
                .position(|c| *c == Column::AllocRate)
                .map_or(cols.len(), |i| i + 1);
            cols.insert(at, Column::Baseline);
        }
        cols
    }

    pub fn selected_index(&self) -> Option<usize> {
        self.table().selected(self.rows.len())
    }

    /// The shown view's scroll and selection.
    pub fn table(&self) -> &TableState {
        &self.tables[self.settings.view as usize]
    }

    pub fn selected_row(&self) -> Option<&Row> {
        self.selected_index().and_then(|i| self.rows.get(i))
    }

    /// The process a process row or the scope names.
    pub fn process_label(&self, key: ProcessKey) -> String {
        self.profiles
            .shown
            .as_ref()
            .and_then(|p| p.processes.iter().find(|p| p.key == key))
            .map_or_else(
                || format!("pid {}", key.pid),
                |p| inert(&p.label()).into_owned(),
            )
    }

    // ---- transitions ----

    pub fn update(&mut self, event: AppEvent) -> Effect {
        match event {
            AppEvent::Profile(profile) => {
                let profile = Arc::new(profile);
                self.expire_notice(profile.elapsed);
                self.profiles.history.record(&profile);
                self.profiles.gone_since.record(&profile);
                self.profiles.latest = Some(profile);
                if !self.profiles.paused {
                    self.profiles.shown = self.profiles.latest.clone();
                    self.refresh_rows();
                    self.rebuild_flame(false);
                    self.rebuild_callers();
                }
                Effect::None
            }
            AppEvent::Key(key) => self.key(key),
            AppEvent::Mouse(mouse) => self.mouse(mouse),
            AppEvent::Resize => Effect::None,
            AppEvent::Warning(text) => {
                self.log.push(format!("warning: {text}"));
                self.notice = Some(Notice::Warning(text));
                Effect::None
            }
            AppEvent::Info(text) => {
                self.log.push(text.clone());
                self.notice = Some(Notice::Info(text));
                Effect::None
            }
            AppEvent::Built(built) => {
                self.take_built(*built);
                Effect::None
            }
            AppEvent::Quit => Effect::Quit,
        }
    }

    /// Shows `notice` in the status line (until the next one, or until it
    /// expires).
    pub fn set_notice(&mut self, notice: Notice) {
        self.notice = Some(notice);
    }

    /// Clears a notice shown for long enough by `now`, a profile's
    /// `elapsed`. A notice is timed from the first profile that finds it
    /// shown: within a refresh of when it was set, without every setter
    /// having to know the time.
    fn expire_notice(&mut self, now: Duration) {
        let Some(notice) = &self.notice else {
            self.notice_since = None;
            return;
        };
        match &self.notice_since {
            Some((seen, since)) if seen == notice => {
                let ttl = match notice {
                    Notice::Info(_) => INFO_TTL,
                    // Worth a longer look; the log prints them again on exit.
                    Notice::Warning(_) | Notice::Error(_) => WARNING_TTL,
                };
                if now.saturating_sub(*since) >= ttl {
                    self.notice = None;
                    self.notice_since = None;
                }
            }
            _ => self.notice_since = Some((notice.clone(), now)),
        }
    }

    fn set_view(&mut self, view: View) {
        if view != self.settings.view {
            // Process names and function names are different searches.
            self.settings.search = Search::default();
            self.zoom = false;
        }
        self.settings.view = view;
        self.tables[view as usize].scroll_to_top();
        self.recompute();
    }

    fn cycle_sort(&mut self, step: isize) {
        let columns: Vec<Column> = self
            .columns()
            .into_iter()
            .filter(|c| *c != Column::Share)
            .collect();
        let current = self.sort().column;
        let current = if current == Column::Share {
            Column::Live
        } else {
            current
        };
        let i = columns.iter().position(|c| *c == current).unwrap_or(0) as isize;
        let next = columns[(i + step).rem_euclid(columns.len() as isize) as usize];
        *self.settings.sort_mut() = Sort::by(next);
        self.arrange();
    }

    fn mark_baseline(&mut self) {
        let Some(shown) = self.profiles.shown.clone() else {
            self.notice = Some(Notice::Warning(
                "no profile yet to mark a baseline on".into(),
            ));
            return;
        };
        let at = format_elapsed(shown.elapsed);
        self.profiles.baseline = Some(shown);
        // Leak hunting wants the growers on top.
        self.settings.process_sort = Sort::by(Column::Baseline);
        self.settings.stack_sort = Sort::by(Column::Baseline);
        self.notice = Some(Notice::Info(format!(
            "baseline marked at {at}: Δ BASELINE is the growth since, rows sorted by it \
             (b: mark again, B: clear)"
        )));
        self.recompute();
        self.rebuild_flame(true);
    }

    fn clear_baseline(&mut self) {
        if self.profiles.baseline.take().is_none() {
            return;
        }
        for sort in [
            &mut self.settings.process_sort,
            &mut self.settings.stack_sort,
        ] {
            if sort.column == Column::Baseline {
                *sort = Sort::by(Column::Live);
            }
        }
        self.notice = Some(Notice::Info("baseline cleared".into()));
        self.recompute();
        self.rebuild_flame(true);
    }

    /// `x`: which exited processes the tables show.
    fn cycle_exited(&mut self) {
        self.settings.exited = self.settings.exited.next();
        self.notice = Some(Notice::Info(self.settings.exited.describe()));
        self.arrange();
    }

    fn toggle_pause(&mut self) {
        self.profiles.paused = !self.profiles.paused;
        if self.profiles.paused {
            self.notice = Some(Notice::Info(
                "paused: the view is frozen, profiling goes on (p: resume)".into(),
            ));
        } else {
            self.notice = None;
            self.profiles.shown = self.profiles.latest.clone();
            self.recompute();
            self.rebuild_flame(false);
            self.rebuild_callers();
        }
    }

    // ---- rows and selection ----

    fn scroll_detail(&mut self, by: isize) {
        self.detail_scroll = self
            .detail_scroll
            .saturating_add_signed(by)
            .min(self.detail_max);
    }

    /// A page of the detail: all but the line kept for "+N more".
    fn detail_page(&self) -> usize {
        self.detail_page.saturating_sub(1).max(1)
    }

    /// The detail pane's height and how many lines the selected row's
    /// detail has, from the run loop before each draw: clamps the scroll,
    /// and starts another row's detail at its top.
    pub fn fit_detail(&mut self, page: usize, lines: usize) {
        let row = self.selected_row().map(|r| r.id.clone());
        if row != self.detail_row {
            self.detail_row = row;
            self.detail_scroll = 0;
        }
        self.detail_page = page;
        self.detail_max = lines.saturating_sub(page);
        self.detail_scroll = self.detail_scroll.min(self.detail_max);
    }

    /// The table's height in rows, from the run loop before each draw:
    /// scrolls the shown table so its selection is on screen.
    pub fn fit_table(&mut self, page: usize) {
        if self.rows.is_empty() {
            // Nothing to scroll.
            return;
        }
        let (v, len) = (self.settings.view as usize, self.rows.len());
        for (i, table) in self.tables.iter_mut().enumerate() {
            // The views share the screen's table area.
            if i == v {
                table.fit(page, len);
            } else {
                table.resize(page);
            }
        }
    }
}

/// `42s`, `3m 07s`, `1h 02m 03s`.
pub fn format_elapsed(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, (s / 60) % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m {s:02}s"),
        (h, m, s) => format!("{h}h {m:02}m {s:02}s"),
    }
}

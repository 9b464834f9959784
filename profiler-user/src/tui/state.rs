//! The TUI's state and every transition of it: events in, state changes
//! and commands for the run loop out. No terminal, no I/O, no clock: this is
//! what the unit tests drive.

use std::{cmp::Ordering, path::PathBuf, sync::Arc, time::Duration};

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::{
    exporter::ViewSelection,
    history::{GROWTH_WINDOW, History, RATE_WINDOW},
    rows::{self, Grouping, Inputs, Row, RowId, function_of},
};
use allocprof::{
    profile::{ProcessKey, ProcessState, Profile},
    symbolize::Frame,
};

/// What the run loop feeds the state.
#[derive(Debug)]
pub enum AppEvent {
    /// A fresh profile from the session.
    Profile(Profile),
    Key(KeyEvent),
    /// The terminal changed size (the next draw adapts).
    Resize,
    /// Something the user should know (shown in the status line, and
    /// printed again on exit).
    Warning(String),
    Info(String),
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
        profile: Profile,
        selection: ViewSelection,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Processes,
    Stacks,
}

/// A table column; every column but `Share` (ordered as `Live`) sorts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    Name,
    Pid,
    Live,
    Share,
    Objects,
    AllocRate,
    Growth,
    Baseline,
    Samples,
    State,
}

impl Column {
    pub fn title(self, view: View) -> &'static str {
        match (self, view) {
            (Column::Name, View::Processes) => "PROCESS",
            (Column::Name, View::Stacks) => "ALLOCATED AT",
            (Column::Pid, _) => "PID",
            (Column::Live, _) => "LIVE ± 95% CI",
            (Column::Share, _) => "%",
            (Column::Objects, _) => "OBJECTS",
            (Column::AllocRate, _) => "ALLOC/s",
            (Column::Growth, _) => "GROWTH 1m",
            (Column::Baseline, _) => "Δ BASELINE",
            (Column::Samples, _) => "SAMPLES",
            (Column::State, _) => "STATE",
        }
    }

    /// The column's name in the "sort" indicator.
    pub fn short(self) -> &'static str {
        match self {
            Column::Name => "name",
            Column::Pid => "pid",
            Column::Live | Column::Share => "live",
            Column::Objects => "objects",
            Column::AllocRate => "alloc/s",
            Column::Growth => "growth",
            Column::Baseline => "Δ baseline",
            Column::Samples => "samples",
            Column::State => "state",
        }
    }

    /// Names and pids read best ascending; quantities largest first.
    fn descending_by_default(self) -> bool {
        !matches!(self, Column::Name | Column::Pid | Column::State)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sort {
    pub column: Column,
    pub descending: bool,
}

impl Sort {
    fn by(column: Column) -> Sort {
        Sort {
            column,
            descending: column.descending_by_default(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Search {
    pub query: String,
    /// Keys go to the query.
    pub editing: bool,
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
}

pub struct App {
    pub options: AppOptions,
    history: History,
    latest: Option<Arc<Profile>>,
    /// What the view shows: the latest profile, or the one paused on.
    shown: Option<Arc<Profile>>,
    paused: bool,
    view: View,
    /// The process the stack view is restricted to; `None` merges all.
    scope: Option<ProcessKey>,
    grouping: Grouping,
    process_sort: Sort,
    stack_sort: Sort,
    search: Search,
    baseline: Option<Arc<Profile>>,
    /// Rows of the view before the search filter, unsorted.
    all_rows: Vec<Row>,
    /// Rows as shown: filtered and sorted.
    rows: Vec<Row>,
    /// Selection per view, by identity, and where it was as a fallback
    /// for when its row disappears.
    selected: [Option<RowId>; 2],
    selected_index: [usize; 2],
    /// First table row on screen (kept by the renderer).
    pub offset: usize,
    /// Table rows on screen (set by the renderer, for PageUp/PageDown).
    pub page: usize,
    help: bool,
    zoom: bool,
    notice: Option<Notice>,
    /// Printed on exit: the terminal's history outlives the status line.
    pub log: Vec<String>,
}

impl App {
    pub fn new(options: AppOptions) -> App {
        App {
            options,
            history: History::default(),
            latest: None,
            shown: None,
            paused: false,
            view: View::Stacks,
            scope: None,
            grouping: Grouping::Stack,
            process_sort: Sort::by(Column::Live),
            stack_sort: Sort::by(Column::Live),
            search: Search::default(),
            baseline: None,
            all_rows: Vec::new(),
            rows: Vec::new(),
            selected: [None, None],
            selected_index: [0, 0],
            offset: 0,
            page: 10,
            help: false,
            zoom: false,
            notice: None,
            log: Vec::new(),
        }
    }

    // ---- what the renderer reads ----

    pub fn shown(&self) -> Option<&Profile> {
        self.shown.as_deref()
    }
    pub fn history(&self) -> &History {
        &self.history
    }
    pub fn paused(&self) -> bool {
        self.paused
    }
    pub fn view(&self) -> View {
        self.view
    }
    pub fn scope(&self) -> Option<ProcessKey> {
        self.scope
    }
    pub fn grouping(&self) -> Grouping {
        self.grouping
    }
    pub fn search(&self) -> &Search {
        &self.search
    }
    pub fn baseline(&self) -> Option<&Profile> {
        self.baseline.as_deref()
    }
    pub fn help(&self) -> bool {
        self.help
    }
    pub fn zoom(&self) -> bool {
        self.zoom
    }
    pub fn notice(&self) -> Option<&Notice> {
        self.notice.as_ref()
    }
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }
    pub fn sort(&self) -> Sort {
        match self.view {
            View::Processes => self.process_sort,
            View::Stacks => self.stack_sort,
        }
    }

    /// The view's columns, in order.
    pub fn columns(&self) -> Vec<Column> {
        let mut cols = match self.view {
            View::Processes => vec![
                Column::Name,
                Column::Pid,
                Column::Live,
                Column::Objects,
                Column::AllocRate,
                Column::Growth,
                Column::Samples,
                Column::State,
            ],
            View::Stacks => vec![
                Column::Name,
                Column::Live,
                Column::Share,
                Column::Objects,
                Column::AllocRate,
            ],
        };
        if self.baseline.is_some() {
            let at = cols
                .iter()
                .position(|c| *c == Column::AllocRate)
                .map_or(cols.len(), |i| i + 1);
            cols.insert(at, Column::Baseline);
        }
        cols
    }

    pub fn selected_index(&self) -> Option<usize> {
        (!self.rows.is_empty()).then(|| self.selected_index[self.view as usize])
    }

    pub fn selected_row(&self) -> Option<&Row> {
        self.selected_index().and_then(|i| self.rows.get(i))
    }

    /// The process a process row or the scope names.
    pub fn process_label(&self, key: ProcessKey) -> String {
        self.shown
            .as_ref()
            .and_then(|p| p.processes.iter().find(|p| p.key == key))
            .map_or_else(|| format!("pid {}", key.pid), |p| p.label())
    }

    // ---- transitions ----

    pub fn update(&mut self, event: AppEvent) -> Effect {
        match event {
            AppEvent::Profile(profile) => {
                let profile = Arc::new(profile);
                self.history.record(&profile);
                self.latest = Some(profile);
                if !self.paused {
                    self.shown = self.latest.clone();
                    self.recompute();
                }
                Effect::None
            }
            AppEvent::Key(key) => self.key(key),
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
            AppEvent::Quit => Effect::Quit,
        }
    }

    /// Shows `notice` in the status line (until the next one).
    pub fn set_notice(&mut self, notice: Notice) {
        self.notice = Some(notice);
    }

    /// The outcome of an export the run loop carried out.
    pub fn exported(&mut self, result: anyhow::Result<PathBuf>, what: &str) {
        self.notice = Some(match result {
            Ok(path) => {
                let text = format!("exported {what} to {}", path.display());
                self.log.push(text.clone());
                Notice::Info(text)
            }
            Err(e) => Notice::Error(format!("export failed: {e:#}")),
        });
    }

    fn key(&mut self, key: KeyEvent) -> Effect {
        if key.kind == KeyEventKind::Release {
            return Effect::None;
        }
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && matches!(key.code, KeyCode::Char('c' | 'C')) {
            return Effect::Quit;
        }
        if self.help {
            // Any key closes the help; it does nothing else.
            self.help = false;
            return Effect::None;
        }
        if self.search.editing && self.search_key(key) {
            return Effect::None;
        }
        match key.code {
            KeyCode::Char('q') => return Effect::Quit,
            KeyCode::Char('?') => self.help = true,
            KeyCode::Tab | KeyCode::BackTab => {
                let view = match self.view {
                    View::Processes => View::Stacks,
                    View::Stacks => View::Processes,
                };
                self.set_view(view);
            }
            KeyCode::Enter => match (self.view, self.selected_row().map(|r| r.id.clone())) {
                (View::Processes, Some(RowId::Process(key))) => {
                    self.scope = Some(key);
                    self.selected_index[View::Stacks as usize] = 0;
                    self.selected[View::Stacks as usize] = None;
                    self.set_view(View::Stacks);
                }
                (View::Stacks, _) => self.zoom = !self.zoom,
                _ => {}
            },
            KeyCode::Char('d') => self.zoom = !self.zoom,
            KeyCode::Char('a') => {
                if self.scope.is_some() {
                    self.scope = None;
                    self.selected_index[View::Stacks as usize] = 0;
                    self.selected[View::Stacks as usize] = None;
                }
                self.set_view(View::Stacks);
            }
            KeyCode::Esc => self.back(),
            KeyCode::Up | KeyCode::Char('k') => self.move_by(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_by(1),
            KeyCode::PageUp => self.move_by(-(self.page.max(1) as isize)),
            KeyCode::PageDown => self.move_by(self.page.max(1) as isize),
            KeyCode::Home => self.move_to(0),
            KeyCode::End => self.move_to(usize::MAX),
            KeyCode::Char('s') => self.cycle_sort(1),
            KeyCode::Char('S') => self.cycle_sort(-1),
            KeyCode::Char('r') => {
                let sort = self.sort_mut();
                sort.descending = !sort.descending;
                self.arrange();
            }
            KeyCode::Char('g') => {
                self.grouping = match self.grouping {
                    Grouping::Stack => Grouping::Function,
                    Grouping::Function => Grouping::Stack,
                };
                self.selected_index[View::Stacks as usize] = 0;
                self.selected[View::Stacks as usize] = None;
                self.set_view(View::Stacks);
            }
            KeyCode::Char('/') => self.search.editing = true,
            KeyCode::Char('b') => self.mark_baseline(),
            KeyCode::Char('B') => self.clear_baseline(),
            KeyCode::Char('p' | ' ') => self.toggle_pause(),
            KeyCode::Char('e') => return self.export(),
            _ => {}
        }
        Effect::None
    }

    /// A key while the search query is edited; false if it is not for the
    /// query (navigation keys keep working).
    fn search_key(&mut self, key: KeyEvent) -> bool {
        match key.code {
            KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::CONTROL) => {
                self.search.query.push(c);
            }
            KeyCode::Backspace => {
                self.search.query.pop();
            }
            KeyCode::Enter => self.search.editing = false,
            KeyCode::Esc => self.search = Search::default(),
            _ => return false,
        }
        self.arrange();
        true
    }

    /// Esc: one step back (detail zoom, search, scope), never a quit.
    fn back(&mut self) {
        if self.zoom {
            self.zoom = false;
        } else if !self.search.query.is_empty() {
            self.search = Search::default();
            self.arrange();
        } else if let (View::Stacks, Some(key)) = (self.view, self.scope) {
            self.scope = None;
            self.selected[View::Processes as usize] = Some(RowId::Process(key));
            self.set_view(View::Processes);
        }
    }

    fn set_view(&mut self, view: View) {
        if view != self.view {
            // Process names and function names are different searches.
            self.search = Search::default();
            self.zoom = false;
        }
        self.view = view;
        self.offset = 0;
        self.recompute();
    }

    fn sort_mut(&mut self) -> &mut Sort {
        match self.view {
            View::Processes => &mut self.process_sort,
            View::Stacks => &mut self.stack_sort,
        }
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
        *self.sort_mut() = Sort::by(next);
        self.arrange();
    }

    fn mark_baseline(&mut self) {
        let Some(shown) = self.shown.clone() else {
            self.notice = Some(Notice::Warning(
                "no profile yet to mark a baseline on".into(),
            ));
            return;
        };
        let at = format_elapsed(shown.elapsed);
        self.baseline = Some(shown);
        // Leak hunting wants the growers on top.
        self.process_sort = Sort::by(Column::Baseline);
        self.stack_sort = Sort::by(Column::Baseline);
        self.notice = Some(Notice::Info(format!(
            "baseline marked at {at}: Δ BASELINE is the growth since, rows sorted by it \
             (b: mark again, B: clear)"
        )));
        self.recompute();
    }

    fn clear_baseline(&mut self) {
        if self.baseline.take().is_none() {
            return;
        }
        for sort in [&mut self.process_sort, &mut self.stack_sort] {
            if sort.column == Column::Baseline {
                *sort = Sort::by(Column::Live);
            }
        }
        self.notice = Some(Notice::Info("baseline cleared".into()));
        self.recompute();
    }

    fn toggle_pause(&mut self) {
        self.paused = !self.paused;
        if self.paused {
            self.notice = Some(Notice::Info(
                "paused: the view is frozen, profiling goes on (p: resume)".into(),
            ));
        } else {
            self.notice = None;
            self.shown = self.latest.clone();
            self.recompute();
        }
    }

    fn export(&mut self) -> Effect {
        let Some(shown) = self.shown.as_deref() else {
            self.notice = Some(Notice::Warning("nothing to export yet".into()));
            return Effect::None;
        };
        let mut profile = shown.clone();
        let query = self.query();
        let scope = match self.view {
            View::Stacks => self.scope,
            View::Processes => None,
        };
        if let Some(key) = scope {
            profile.processes.retain(|p| p.key == key);
        }
        if let Some(q) = &query {
            match self.view {
                View::Processes => profile
                    .processes
                    .retain(|p| process_matches(&p.name, p.key.pid, q)),
                View::Stacks => {
                    for p in &mut profile.processes {
                        p.stacks
                            .retain(|s| stack_matches(&s.frames, self.grouping, q));
                        p.totals = p.stacks.iter().map(|s| s.totals).sum();
                    }
                    profile.processes.retain(|p| !p.stacks.is_empty());
                }
            }
        }
        Effect::Export {
            profile,
            selection: ViewSelection {
                process: scope,
                filter: query,
            },
        }
    }

    /// What an export of `selection` contains, for the status line.
    pub fn describe_selection(&self, selection: &ViewSelection) -> String {
        let mut what = match selection.process {
            Some(key) => format!("the stacks of {}", self.process_label(key)),
            None => "the stacks of all processes".to_string(),
        };
        if let Some(q) = &selection.filter {
            what.push_str(&format!(" matching \"{q}\""));
        }
        what
    }

    fn query(&self) -> Option<String> {
        let q = self.search.query.trim().to_lowercase();
        (!q.is_empty()).then_some(q)
    }

    // ---- rows and selection ----

    /// Rebuilds the rows from the shown profile (view, scope, grouping,
    /// profile or baseline changed).
    fn recompute(&mut self) {
        let Some(current) = self.shown.clone() else {
            return;
        };
        let now = current.elapsed;
        let inputs = Inputs {
            current: &current,
            rate_ref: self.history.reference(now, RATE_WINDOW).map(|p| &**p),
            growth_ref: self.history.reference(now, GROWTH_WINDOW).map(|p| &**p),
            baseline: self.baseline.as_deref(),
        };
        self.all_rows = match self.view {
            View::Processes => rows::process_rows(inputs),
            View::Stacks => rows::stack_rows(inputs, self.scope, self.grouping),
        };
        self.arrange();
    }

    /// Filters and sorts the rows, and finds the selected row again.
    fn arrange(&mut self) {
        let query = self.query();
        let grouping = self.grouping;
        let mut shown: Vec<Row> = self
            .all_rows
            .iter()
            .filter(|r| query.as_deref().is_none_or(|q| row_matches(r, grouping, q)))
            .cloned()
            .collect();
        let sort = self.sort();
        shown.sort_by(|a, b| {
            let o = compare(sort.column, a, b);
            let o = if sort.descending { o.reverse() } else { o };
            o.then_with(|| b.totals.live_bytes.total_cmp(&a.totals.live_bytes))
                .then_with(|| a.id.cmp(&b.id))
        });
        self.rows = shown;
        let v = self.view as usize;
        let found = self.selected[v]
            .as_ref()
            .and_then(|id| self.rows.iter().position(|r| r.id == *id));
        match found {
            Some(i) => self.selected_index[v] = i,
            None => self.move_to(self.selected_index[v]),
        }
    }

    fn move_by(&mut self, delta: isize) {
        let i = self.selected_index[self.view as usize] as isize + delta;
        self.move_to(i.max(0) as usize);
    }

    fn move_to(&mut self, index: usize) {
        let v = self.view as usize;
        if self.rows.is_empty() {
            self.selected_index[v] = 0;
            return;
        }
        let i = index.min(self.rows.len() - 1);
        self.selected_index[v] = i;
        self.selected[v] = Some(self.rows[i].id.clone());
    }
}

fn compare(column: Column, a: &Row, b: &Row) -> Ordering {
    let opt = |x: Option<f64>| x.unwrap_or(f64::NEG_INFINITY);
    match column {
        Column::Name => a.label.to_lowercase().cmp(&b.label.to_lowercase()),
        Column::Pid => pid(a).cmp(&pid(b)),
        Column::Live | Column::Share => a.totals.live_bytes.total_cmp(&b.totals.live_bytes),
        Column::Objects => a.totals.live_objects.total_cmp(&b.totals.live_objects),
        Column::AllocRate => opt(a.alloc_rate).total_cmp(&opt(b.alloc_rate)),
        Column::Growth => opt(a.growth).total_cmp(&opt(b.growth)),
        Column::Baseline => opt(a.since_baseline).total_cmp(&opt(b.since_baseline)),
        Column::Samples => a.totals.alloc_samples.cmp(&b.totals.alloc_samples),
        Column::State => state_rank(a).cmp(&state_rank(b)),
    }
}

fn pid(r: &Row) -> u32 {
    match r.id {
        RowId::Process(k) => k.pid,
        _ => 0,
    }
}

fn state_rank(r: &Row) -> u8 {
    match r.process.as_ref().map(|p| p.state) {
        Some(ProcessState::Live) | None => 0,
        Some(ProcessState::Exited) => 1,
        Some(ProcessState::Replaced) => 2,
    }
}

fn process_matches(name: &str, pid: u32, query: &str) -> bool {
    name.to_lowercase().contains(query) || pid.to_string().contains(query)
}

/// Whether a stack belongs in a search for `query` (lowercase): any of its
/// functions by stack, its naming function by function.
pub fn stack_matches(frames: &[Frame], grouping: Grouping, query: &str) -> bool {
    match grouping {
        Grouping::Stack => frames
            .iter()
            .any(|f| f.function.to_lowercase().contains(query)),
        Grouping::Function => function_of(frames).to_lowercase().contains(query),
    }
}

fn row_matches(row: &Row, grouping: Grouping, query: &str) -> bool {
    match &row.id {
        RowId::Process(key) => process_matches(&row.label, key.pid, query),
        RowId::Function { name, .. } => name.to_lowercase().contains(query),
        RowId::Stack { frames, .. } => stack_matches(frames, grouping, query),
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tui::rows::tests::{process, profile};

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
    fn stack_view_merges_processes_sorted_by_live_bytes() {
        let app = app_at(2);
        assert_eq!(app.view(), View::Stacks);
        assert_eq!(
            labels(&app),
            ["cache_fill ← main", "leak ← handle", "parse ← handle"]
        );
        assert_eq!(app.rows()[0].totals.live_bytes, 70_000.0);
        assert_eq!(app.selected_row().unwrap().label, "cache_fill ← main");
    }

    #[test]
    fn sort_keys_cycle_and_reverse() {
        let mut app = app_at(2);
        press(&mut app, KeyCode::Char('s')); // objects
        assert_eq!(app.sort().column, Column::Objects);
        press(&mut app, KeyCode::Char('s')); // allocation rate
        assert_eq!(app.sort(), Sort::by(Column::AllocRate));
        assert_eq!(labels(&app)[0], "parse ← handle");
        press(&mut app, KeyCode::Char('s')); // back to the name
        assert_eq!(app.sort(), Sort::by(Column::Name));
        assert_eq!(
            labels(&app),
            ["cache_fill ← main", "leak ← handle", "parse ← handle"]
        );
        press(&mut app, KeyCode::Char('r'));
        assert_eq!(labels(&app)[0], "parse ← handle");
        press(&mut app, KeyCode::Char('S'));
        assert_eq!(app.sort().column, Column::AllocRate);
    }

    #[test]
    fn selection_follows_the_row_across_refreshes_and_sorts() {
        let mut app = app_at(2);
        press(&mut app, KeyCode::Down);
        assert_eq!(app.selected_row().unwrap().label, "leak ← handle");
        // The leak outgrows everything: it moves to the top, selected.
        app.update(AppEvent::Profile(sample(100)));
        assert_eq!(app.selected_index(), Some(0));
        assert_eq!(app.selected_row().unwrap().label, "leak ← handle");
        press(&mut app, KeyCode::Char('s'));
        assert_eq!(app.selected_row().unwrap().label, "leak ← handle");
        press(&mut app, KeyCode::End);
        assert_eq!(app.selected_index(), Some(2));
        press(&mut app, KeyCode::Down);
        assert_eq!(app.selected_index(), Some(2));
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
        assert_eq!(labels(&app), ["parse ← handle", "leak ← handle"]);
        type_str(&mut app, "x");
        assert!(app.rows().is_empty());
        press(&mut app, KeyCode::Backspace);
        press(&mut app, KeyCode::Enter);
        assert!(!app.search().editing);
        // Keys are commands again, and the filter stays.
        press(&mut app, KeyCode::Char('s'));
        assert_eq!(app.sort().column, Column::Objects);
        assert_eq!(app.rows().len(), 2);
        press(&mut app, KeyCode::Esc);
        assert_eq!(app.rows().len(), 3);
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
        assert_eq!(labels(&app), ["cache_fill", "parse", "leak"]);
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
                pid: 9,
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
        assert_eq!(labels(&app)[0], "leak ← handle");
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
        assert_eq!(selection, ViewSelection::default());
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
        assert_eq!(selection.process.map(|k| k.pid), Some(7));
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
}

//! Asking for the rows and the flamegraph's tree, and taking them in: the
//! state numbers each [`Request`] and hands it to its [`Builder`] (the
//! worker thread, or inline), and shows a [`Built`] view whenever it fits
//! what the user chose (view, scope, grouping; the flamegraph's scope) and
//! is newer than what is shown. Until then the screen shows the last built.

use super::{App, View};
use crate::tui::{
    flame::{Scope as FlameScope, Tree},
    history::{GROWTH_WINDOW, RATE_WINDOW},
    view_model::{Builder, Built, Request, RowsOf, build},
};
use allocprof::model::profile::{ProcessProfile, Profile};

/// The state's side of the builds.
#[derive(Default)]
pub(super) struct Builds {
    pub(super) builder: Builder,
    /// The last request's number.
    asked: u64,
    /// The request that first asked for the rows of the current choices,
    /// and for the open flamegraph: what the screen owes the user.
    rows_owed: u64,
    flame_owed: u64,
    /// The numbers of the rows and tree shown.
    rows_shown: u64,
    /// The view the rows shown are of.
    rows_view: Option<View>,
    flame_shown: u64,
}

impl App {
    /// Hands the rows and the flamegraph to a worker thread (the run loop's
    /// choice; without it they are built at once).
    pub fn build_with(&mut self, builder: Builder) {
        self.builds.builder = builder;
    }

    /// Whether the screen shows rows (and the flamegraph's tree) built for
    /// the latest choices (the benchmark waits for it).
    #[cfg(test)]
    pub fn settled(&self) -> bool {
        let b = &self.builds;
        b.rows_shown >= b.rows_owed && (self.flame.is_none() || b.flame_shown >= b.flame_owed)
    }

    /// New rows for a change of the user's choices (view, scope, grouping,
    /// baseline).
    pub(super) fn recompute(&mut self) {
        if let Some(generation) = self.request(true, None) {
            self.builds.rows_owed = generation;
        }
        // Rows of the other view (processes for stacks) are no stand-in.
        if self
            .builds
            .rows_view
            .is_some_and(|v| v != self.settings.view)
        {
            self.all_rows.clear();
            self.builds.rows_view = None;
            self.arrange();
        }
    }

    /// New rows from a new profile: the screen owes nothing until built.
    pub(super) fn refresh_rows(&mut self) {
        self.request(true, None);
    }

    /// Asks for the open flamegraph's tree of `scope`, owed at once.
    pub(super) fn request_flame(&mut self, scope: FlameScope, owed: bool) {
        if let Some(generation) = self.request(false, Some(scope))
            && owed
        {
            self.builds.flame_owed = generation;
        }
    }

    /// A request for what the shown profile yields; its number.
    fn request(&mut self, rows: bool, flame: Option<FlameScope>) -> Option<u64> {
        let current = self.profiles.shown.clone()?;
        let now = current.elapsed;
        let history = &self.profiles.history;
        self.builds.asked += 1;
        let request = Request {
            generation: self.builds.asked,
            rate_ref: history.reference(now, RATE_WINDOW).cloned(),
            growth_ref: history.reference(now, GROWTH_WINDOW).cloned(),
            baseline: self.profiles.baseline.clone(),
            current,
            rows: rows.then(|| self.rows_of()),
            flame,
        };
        match &self.builds.builder {
            Builder::Inline => {
                let built = build(&request);
                self.take_built(built);
            }
            Builder::Worker(tx) => {
                if tx.send(request.clone()).is_err() {
                    // The worker is gone (it panicked): build here.
                    self.builds.builder = Builder::Inline;
                    self.take_built(build(&request));
                }
            }
        }
        Some(request.generation)
    }

    fn rows_of(&self) -> RowsOf {
        RowsOf {
            view: self.settings.view,
            scope: match self.settings.view {
                View::Processes => None,
                View::Stacks => self.settings.scope,
            },
            grouping: self.settings.grouping,
            tree: self.settings.view == View::Stacks && self.settings.scope_tree,
        }
    }

    /// Shows what a build brought, where it still fits.
    pub(super) fn take_built(&mut self, built: Built) {
        if let Some((of, rows)) = built.rows
            && of == self.rows_of()
            && built.generation > self.builds.rows_shown
        {
            self.all_rows = rows;
            self.builds.rows_shown = built.generation;
            self.builds.rows_view = Some(of.view);
            self.arrange();
        }
        if let (Some(tree), Some(flame)) = (built.flame, self.flame.as_mut())
            && tree.scope == flame.scope()
            && built.generation > self.builds.flame_shown
        {
            flame.update(tree, built.elapsed);
            self.builds.flame_shown = built.generation;
        }
    }

    /// The tree a flamegraph opens with until its own is built: the scope's
    /// root alone (named after its process).
    pub(super) fn placeholder_tree(&self, scope: FlameScope) -> Tree {
        let mut bare = Profile::default();
        if let (FlameScope::Process(key) | FlameScope::Tree(key), Some(shown)) =
            (scope, self.profiles.shown.as_deref())
        {
            bare.processes
                .extend(
                    shown
                        .processes
                        .iter()
                        .filter(|p| p.key == key)
                        .map(|p| ProcessProfile {
                            stacks: Vec::new(),
                            ..p.clone()
                        }),
                );
        }
        Tree::build(&bare, scope, None)
    }
}

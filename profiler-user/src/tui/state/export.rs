//! The `e` key: the shown profile as the view shows it (its process, the
//! exited processes it hides, its search, its grouping, and with a
//! baseline, the growth since), and the notice of what became of it.

use std::{path::PathBuf, sync::Arc};

use super::{
    App, Effect, Notice, View, format_elapsed,
    search::{process_matches, stack_matches},
};
use crate::tui::{
    exporter::ViewSelection,
    rows::{Grouping, from_naming_frame},
    view_model::merged_tree,
};
use allocprof::{
    model::profile::{ProcessKey, Profile, StackProfile},
    output::export::diff,
};

/// What of a profile the view shows.
struct Restriction<'a> {
    view: View,
    /// The process entered (stack view only).
    scope: Option<ProcessKey>,
    /// The processes the tables hide (exited a while ago, or `x`).
    hidden: &'a dyn Fn(ProcessKey) -> bool,
    query: Option<&'a str>,
    grouping: Grouping,
}

impl Restriction<'_> {
    /// `profile` cut to the view: by function, each stack ends at the
    /// function that names its row (the allocator and library frames
    /// under it merged), so the export's leaves are the table's rows.
    fn apply(&self, profile: &Profile) -> Profile {
        let mut profile = profile.clone();
        match self.scope {
            Some(key) => profile.processes.retain(|p| p.key == key),
            None => profile.processes.retain(|p| !(self.hidden)(p.key)),
        }
        if self.view == View::Processes {
            if let Some(q) = self.query {
                profile
                    .processes
                    .retain(|p| process_matches(&p.name, p.key.pid, q));
            }
            return profile;
        }
        for p in &mut profile.processes {
            if let Some(q) = self.query {
                p.stacks
                    .retain(|s| stack_matches(&s.frames, self.grouping, q));
            }
            if self.grouping == Grouping::Function {
                p.stacks = p
                    .stacks
                    .iter()
                    .map(|s| StackProfile {
                        frames: from_naming_frame(&s.frames),
                        totals: s.totals,
                    })
                    .collect();
            }
            p.totals = p.stacks.iter().map(|s| s.totals).sum();
        }
        if self.query.is_some() {
            profile.processes.retain(|p| !p.stacks.is_empty());
        }
        profile
    }
}

impl App {
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

    /// The shown profile as the view shows it, for the run loop to write.
    pub(super) fn export(&mut self) -> Effect {
        let Some(shown) = self.profiles.shown.clone() else {
            self.notice = Some(Notice::Warning("nothing to export yet".into()));
            return Effect::None;
        };
        let query = self.settings.query();
        let scope = match self.settings.view {
            View::Stacks => self.settings.scope,
            View::Processes => None,
        };
        // A tree's root entered: what the view shows, the tree merged.
        let merge = |p: Arc<Profile>| match scope.filter(|_| self.settings.scope_tree) {
            Some(root) => Arc::new(merged_tree(&p, root)),
            None => p,
        };
        let shown = merge(shown);
        let baseline = self.profiles.baseline.clone().map(merge);
        let hidden = |key| self.hides(key);
        let restriction = Restriction {
            view: self.settings.view,
            scope,
            hidden: &hidden,
            query: query.as_deref(),
            grouping: self.settings.grouping,
        };
        let now = restriction.apply(&shown);
        let baseline = baseline.as_deref();
        let profile = match baseline {
            // Δ BASELINE is what the rows are sorted by: the growth since.
            Some(b) => diff::growth(&restriction.apply(b), &now),
            None => now,
        };
        let grouping = match self.settings.view {
            View::Stacks => Some(self.settings.grouping),
            View::Processes => None,
        };
        Effect::Export {
            profile: Box::new(profile),
            selection: ViewSelection {
                process: scope,
                name: scope.map(|key| self.process_name(&shown, key)),
                filter: query,
                grouping,
                since: baseline.map(|b| b.elapsed),
            },
        }
    }

    fn process_name(&self, shown: &Arc<Profile>, key: ProcessKey) -> String {
        shown
            .processes
            .iter()
            .find(|p| p.key == key)
            .map_or_else(String::new, |p| p.name.clone())
    }

    /// What an export of `selection` contains, for the status line.
    pub fn describe_selection(&self, selection: &ViewSelection) -> String {
        let mut what = match selection.process {
            Some(key) => format!("the stacks of {}", self.process_label(key)),
            None => "the stacks of all processes".to_string(),
        };
        if selection.grouping == Some(Grouping::Function) {
            what.push_str(" by function");
        }
        if let Some(q) = &selection.filter {
            what.push_str(&format!(" matching \"{q}\""));
        }
        if let Some(at) = selection.since {
            what.push_str(&format!(
                " (growth since the baseline at {})",
                format_elapsed(at)
            ));
        }
        what
    }
}

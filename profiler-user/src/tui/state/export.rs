//! The `e` key: the shown profile restricted to the view (its process, its
//! search), and the notice of what became of it.

use std::path::PathBuf;

use super::{
    App, Effect, Notice, View,
    search::{process_matches, stack_matches},
};
use crate::tui::exporter::ViewSelection;

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
        let Some(shown) = self.profiles.shown.as_deref() else {
            self.notice = Some(Notice::Warning("nothing to export yet".into()));
            return Effect::None;
        };
        let mut profile = shown.clone();
        let query = self.settings.query();
        let scope = match self.settings.view {
            View::Stacks => self.settings.scope,
            View::Processes => None,
        };
        match scope {
            Some(key) => profile.processes.retain(|p| p.key == key),
            // What the tables show: not the exited processes they hide.
            None => profile.processes.retain(|p| !self.hides(p.key)),
        }
        if let Some(q) = &query {
            match self.settings.view {
                View::Processes => profile
                    .processes
                    .retain(|p| process_matches(&p.name, p.key.pid, q)),
                View::Stacks => {
                    for p in &mut profile.processes {
                        p.stacks
                            .retain(|s| stack_matches(&s.frames, self.settings.grouping, q));
                        p.totals = p.stacks.iter().map(|s| s.totals).sum();
                    }
                    profile.processes.retain(|p| !p.stacks.is_empty());
                }
            }
        }
        Effect::Export {
            profile: Box::new(profile),
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
}

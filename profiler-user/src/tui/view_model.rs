//! What the tables and the flamegraph show, built off the UI's thread: the
//! state asks for a view ([`Request`]: the profiles and the choices the rows
//! depend on) and the worker sends back the rows and the tree ready to show
//! ([`Built`], as an [`AppEvent`]), so the UI keeps drawing and taking keys
//! while tens of thousands of stacks are grouped. Only the newest request
//! is built: one that arrives while another is built replaces any waiting.
//! `build` is pure; tests (and an `App` without a worker) call it inline.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, mpsc as std_mpsc},
    thread,
    time::Duration,
};

use tokio::sync::mpsc;

use super::{
    flame::{Scope as FlameScope, Tree},
    rows::{self, Grouping, Inputs, Row},
    state::{AppEvent, View},
};
use allocprof::{
    ids::Pid,
    model::profile::{ProcessKey, ProcessProfile, Profile},
};

/// Which rows to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowsOf {
    pub view: View,
    pub scope: Option<ProcessKey>,
    pub grouping: Grouping,
    /// The scope is a tree's root: its tree's stacks, merged.
    pub tree: bool,
}

/// A view to build, numbered: the state shows a build only if nothing it
/// asked for since changed the same part.
#[derive(Clone)]
pub struct Request {
    pub generation: u64,
    pub current: Arc<Profile>,
    /// A few seconds older: allocation rates.
    pub rate_ref: Option<Arc<Profile>>,
    /// About a minute older: growth.
    pub growth_ref: Option<Arc<Profile>>,
    pub baseline: Option<Arc<Profile>>,
    pub rows: Option<RowsOf>,
    /// The flamegraph's tree, when it is open and due.
    pub flame: Option<FlameScope>,
}

/// A built view: the rows unsorted (sorting and the search stay with the
/// state: a key changes them, and they take milliseconds), the tree.
pub struct Built {
    pub generation: u64,
    /// When the profile built from was taken.
    pub elapsed: Duration,
    pub rows: Option<(RowsOf, Vec<Row>)>,
    pub flame: Option<Tree>,
}

impl fmt::Debug for Built {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Built")
            .field("generation", &self.generation)
            .field("rows", &self.rows.as_ref().map(|(_, r)| r.len()))
            .field("flame", &self.flame.as_ref().map(Tree::node_count))
            .finish()
    }
}

/// Builds what `request` asks for.
pub fn build(request: &Request) -> Built {
    let rows = request.rows.map(|of| {
        // A tree's stacks: the scope's tree merged into one image.
        let merged = of.scope.filter(|_| of.tree).map(|root| {
            let merge = |p: &Option<Arc<Profile>>| p.as_deref().map(|p| merged_tree(p, root));
            (
                merged_tree(&request.current, root),
                merge(&request.rate_ref),
                merge(&request.growth_ref),
                merge(&request.baseline),
            )
        });
        let inputs = match &merged {
            Some((current, rate_ref, growth_ref, baseline)) => Inputs {
                current,
                rate_ref: rate_ref.as_ref(),
                growth_ref: growth_ref.as_ref(),
                baseline: baseline.as_ref(),
            },
            None => Inputs {
                current: &request.current,
                rate_ref: request.rate_ref.as_deref(),
                growth_ref: request.growth_ref.as_deref(),
                baseline: request.baseline.as_deref(),
            },
        };
        let rows = match of.view {
            View::Processes => rows::process_rows(inputs),
            View::Stacks => rows::stack_rows(inputs, of.scope, of.grouping),
        };
        (of, rows)
    });
    let flame = request.flame.map(|scope| match scope {
        FlameScope::Tree(root) => {
            let baseline = request.baseline.as_deref().map(|b| merged_tree(b, root));
            Tree::build(
                &merged_tree(&request.current, root),
                scope,
                baseline.as_ref(),
            )
        }
        _ => Tree::build(&request.current, scope, request.baseline.as_deref()),
    });
    Built {
        generation: request.generation,
        elapsed: request.current.elapsed,
        rows,
        flame,
    }
}

/// The processes of `profile` under `root` (their parents' chain reaches
/// it; gone ones too) merged into one image keyed `root`, as
/// `--merge-tree` merges (`Profile::merge_trees`).
pub fn merged_tree(profile: &Profile, root: ProcessKey) -> Profile {
    let parents: HashMap<Pid, Option<Pid>> = profile
        .processes
        .iter()
        .map(|p| (p.key.pid, p.parent))
        .collect();
    // Up the parents, as many steps as there are processes at most (a pid
    // cycle, which reuse could make, ends there).
    let under = |mut pid: Pid| {
        for _ in 0..=parents.len() {
            if pid == root.pid {
                return true;
            }
            match parents.get(&pid).copied().flatten() {
                Some(up) => pid = up,
                None => return false,
            }
        }
        false
    };
    let tree = Profile {
        processes: profile
            .processes
            .iter()
            .filter(|p| under(p.key.pid))
            .map(|p| ProcessProfile {
                // The root's own parent is outside the tree.
                parent: p.parent.filter(|_| p.key.pid != root.pid),
                ..p.clone()
            })
            .collect(),
        ..Profile::default()
    };
    let mut merged = tree.merge_trees();
    for p in &mut merged.processes {
        p.key = root;
    }
    merged.elapsed = profile.elapsed;
    merged
}

/// Where the state's requests go.
#[derive(Default)]
pub enum Builder {
    /// Built at once, on the caller's thread (tests, and before the run
    /// loop starts a worker).
    #[default]
    Inline,
    Worker(std_mpsc::Sender<Request>),
}

/// Starts the worker thread: requests in, [`AppEvent::Built`] out on
/// `events` (the UI's channel). It ends when either side is gone.
pub fn spawn(events: mpsc::Sender<AppEvent>) -> std::io::Result<Builder> {
    let (tx, rx) = std_mpsc::channel::<Request>();
    thread::Builder::new()
        .name("allocprof-view".into())
        .spawn(move || {
            while let Ok(first) = rx.recv() {
                let request = newest(first, &rx);
                let built = build(&request);
                if events
                    .blocking_send(AppEvent::Built(Box::new(built)))
                    .is_err()
                {
                    return;
                }
            }
        })?;
    Ok(Builder::Worker(tx))
}

/// The newest of the requests waiting, still asking for the flamegraph if
/// one it replaces did (a refresh that is not due for the tree does not
/// cancel an `f`).
fn newest(mut request: Request, waiting: &std_mpsc::Receiver<Request>) -> Request {
    while let Ok(next) = waiting.try_recv() {
        let flame = next.flame.or(request.flame);
        let rows = next.rows.or(request.rows);
        request = Request {
            flame,
            rows,
            ..next
        };
    }
    request
}

#[cfg(test)]
mod tests {
    use crossterm::event::KeyCode;

    use super::*;
    use crate::tui::state::{
        App,
        tests::{options, press, sample},
    };

    /// An app whose requests wait in `rx` until the test builds them.
    fn app_with_queue() -> (App, std_mpsc::Receiver<Request>) {
        let (tx, rx) = std_mpsc::channel();
        let mut app = App::new(options());
        app.build_with(Builder::Worker(tx));
        (app, rx)
    }

    fn deliver(app: &mut App, request: &Request) {
        app.update(AppEvent::Built(Box::new(build(request))));
    }

    #[test]
    fn rows_show_once_built_and_only_for_the_choices_they_were_built_for() {
        let (mut app, rx) = app_with_queue();
        app.update(AppEvent::Profile(sample(1)));
        assert!(app.rows().is_empty(), "nothing built yet");
        assert!(app.settled(), "a refresh owes nothing");
        let by_stack = rx.try_recv().unwrap();
        deliver(&mut app, &by_stack);
        assert_eq!(app.rows().len(), 4);

        // Grouped by function: owed until built; the stack rows stay
        // meanwhile, and a late stack build is not shown.
        press(&mut app, KeyCode::Char('g'));
        assert!(!app.settled());
        let by_function = rx.try_recv().unwrap();
        deliver(&mut app, &by_stack);
        assert_eq!(app.rows().len(), 4);
        assert!(!app.settled());
        deliver(&mut app, &by_function);
        assert!(app.settled());
        let labels: Vec<&str> = app.rows().iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels.len(), 4, "{labels:?}");
        assert!(
            labels.iter().any(|l| l.starts_with("cache_fill")),
            "{labels:?}"
        );
    }

    #[test]
    fn another_view_s_rows_are_not_shown_while_its_own_are_built() {
        let (mut app, rx) = app_with_queue();
        app.update(AppEvent::Profile(sample(1)));
        deliver(&mut app, &rx.try_recv().unwrap());
        assert_eq!(app.rows().len(), 4);
        press(&mut app, KeyCode::Tab);
        assert!(
            app.rows().is_empty(),
            "no stack rows under the processes' tab"
        );
        deliver(&mut app, &rx.try_recv().unwrap());
        assert_eq!(app.rows().len(), 2);
    }

    #[test]
    fn the_flamegraph_opens_on_its_root_and_shows_its_tree_once_built() {
        let (mut app, rx) = app_with_queue();
        app.update(AppEvent::Profile(sample(1)));
        deliver(&mut app, &rx.try_recv().unwrap());
        press(&mut app, KeyCode::Char('f'));
        let flame = app.flame().expect("open at once");
        assert_eq!(flame.tree().node_count(), 1, "its root alone");
        assert!(!app.settled());
        let request = rx.try_recv().unwrap();
        assert!(request.flame.is_some() && request.rows.is_none());
        deliver(&mut app, &request);
        assert!(app.settled());
        assert!(app.flame().unwrap().tree().node_count() > 1);
    }

    #[test]
    fn only_the_newest_waiting_request_is_built_and_it_keeps_a_flamegraph() {
        let (tx, rx) = std_mpsc::channel();
        let profile = Arc::new(sample(1));
        let request = |generation, flame| Request {
            generation,
            current: profile.clone(),
            rate_ref: None,
            growth_ref: None,
            baseline: None,
            rows: Some(RowsOf {
                view: View::Stacks,
                scope: None,
                grouping: Grouping::Stack,
                tree: false,
            }),
            flame,
        };
        tx.send(request(2, Some(FlameScope::All))).unwrap();
        tx.send(request(3, None)).unwrap();
        let newest = newest(request(1, None), &rx);
        assert_eq!(newest.generation, 3);
        assert_eq!(newest.flame, Some(FlameScope::All));
    }
}

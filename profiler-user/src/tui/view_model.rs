//! What the tables and the flamegraph show, built off the UI's thread: the
//! state asks for a view ([`Request`]: the profiles and the choices the rows
//! depend on) and the worker sends back the rows and the tree ready to show
//! ([`Built`], as an [`AppEvent`]), so the UI keeps drawing and taking keys
//! while tens of thousands of stacks are grouped. Only the newest request
//! is built: one that arrives while another is built replaces any waiting.
//! `build` is pure; tests (and an `App` without a worker) call it inline.

use std::{
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
use allocprof::profile::{ProcessKey, Profile};

/// Which rows to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowsOf {
    pub view: View,
    pub scope: Option<ProcessKey>,
    pub grouping: Grouping,
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
        let inputs = Inputs {
            current: &request.current,
            rate_ref: request.rate_ref.as_deref(),
            growth_ref: request.growth_ref.as_deref(),
            baseline: request.baseline.as_deref(),
        };
        let rows = match of.view {
            View::Processes => rows::process_rows(inputs),
            View::Stacks => rows::stack_rows(inputs, of.scope, of.grouping),
        };
        (of, rows)
    });
    let flame = request
        .flame
        .map(|scope| Tree::build(&request.current, scope, request.baseline.as_deref()));
    Built {
        generation: request.generation,
        elapsed: request.current.elapsed,
        rows,
        flame,
    }
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

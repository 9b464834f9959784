//! The search: its query, and which rows and stacks it keeps.

use crate::tui::rows::{Grouping, Row, RowId, function_of};
use allocprof::symbolize::Frame;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Search {
    pub query: String,
    /// Keys go to the query.
    pub editing: bool,
}

pub(super) fn process_matches(name: &str, pid: allocprof::ids::Pid, query: &str) -> bool {
    name.to_lowercase().contains(query) || pid.to_string().contains(query)
}

/// Whether a stack belongs in a search for `query` (lowercase): any of its
/// functions by stack, its naming function by function.
pub(super) fn stack_matches(frames: &[Frame], grouping: Grouping, query: &str) -> bool {
    match grouping {
        Grouping::Stack => frames
            .iter()
            .any(|f| f.function.to_lowercase().contains(query)),
        Grouping::Function => function_of(frames).to_lowercase().contains(query),
    }
}

pub(super) fn row_matches(row: &Row, grouping: Grouping, query: &str) -> bool {
    match &row.id {
        RowId::Process(key) => process_matches(&row.label, key.pid, query),
        RowId::Function { name, .. } => name.to_lowercase().contains(query),
        RowId::Stack { frames, .. } => stack_matches(frames, grouping, query),
    }
}

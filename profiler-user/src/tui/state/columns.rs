//! The views and their columns: titles, sort orders, and how rows compare.

use std::cmp::Ordering;

use crate::tui::rows::{Row, RowId};
use allocprof::model::profile::ProcessState;

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
    /// Live bytes allocated over a minute ago: a leak's grow, a cache's don't.
    Old,
    Share,
    Objects,
    AllocRate,
    Growth,
    Baseline,
    Samples,
    /// A running process's resident anonymous memory, where the heap lives.
    Resident,
    State,
}

impl Column {
    pub fn title(self, view: View) -> &'static str {
        match (self, view) {
            (Column::Name, View::Processes) => "PROCESS",
            (Column::Name, View::Stacks) => "ALLOCATED AT",
            (Column::Pid, _) => "PID",
            (Column::Live, _) => "LIVE ± 95% CI",
            (Column::Old, _) => "LIVE >1m",
            (Column::Share, _) => "%",
            (Column::Objects, _) => "OBJECTS",
            (Column::AllocRate, _) => "ALLOC/s",
            (Column::Growth, _) => "GROWTH 1m",
            (Column::Baseline, _) => "Δ BASELINE",
            (Column::Samples, _) => "SAMPLES",
            (Column::Resident, _) => "RSS ANON",
            (Column::State, _) => "STATE",
        }
    }

    /// The column's name in the "sort" indicator.
    pub fn short(self) -> &'static str {
        match self {
            Column::Name => "name",
            Column::Pid => "pid",
            Column::Live | Column::Share => "live",
            Column::Old => "live >1m",
            Column::Objects => "objects",
            Column::AllocRate => "alloc/s",
            Column::Growth => "growth",
            Column::Baseline => "Δ baseline",
            Column::Samples => "samples",
            Column::Resident => "rss anon",
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
    pub(super) fn by(column: Column) -> Sort {
        Sort {
            column,
            descending: column.descending_by_default(),
        }
    }
}

pub(super) fn compare(column: Column, a: &Row, b: &Row) -> Ordering {
    let opt = |x: Option<f64>| x.unwrap_or(f64::NEG_INFINITY);
    match column {
        Column::Name => a.label.to_lowercase().cmp(&b.label.to_lowercase()),
        Column::Pid => pid(a).cmp(&pid(b)),
        Column::Live | Column::Share => a.totals.live_bytes.total_cmp(&b.totals.live_bytes),
        Column::Old => (a.totals.ages.over_old).total_cmp(&b.totals.ages.over_old),
        Column::Objects => a.totals.live_objects.total_cmp(&b.totals.live_objects),
        Column::AllocRate => opt(a.alloc_rate).total_cmp(&opt(b.alloc_rate)),
        Column::Growth => opt(a.growth).total_cmp(&opt(b.growth)),
        Column::Baseline => opt(a.since_baseline).total_cmp(&opt(b.since_baseline)),
        Column::Samples => a.totals.live_samples.cmp(&b.totals.live_samples),
        Column::Resident => anon(a).cmp(&anon(b)),
        Column::State => state_rank(a).cmp(&state_rank(b)),
    }
}

fn anon(r: &Row) -> u64 {
    r.process
        .as_ref()
        .and_then(|p| p.resident)
        .map_or(0, |res| res.anon)
}

fn pid(r: &Row) -> u32 {
    match r.id {
        RowId::Process(k) => k.pid.0,
        _ => 0,
    }
}

fn state_rank(r: &Row) -> u8 {
    match r.process.as_ref().map(|p| p.state) {
        Some(ProcessState::Live) | None => 0,
        Some(ProcessState::Exited | ProcessState::OomKilled) => 1,
        Some(ProcessState::Replaced) => 2,
    }
}

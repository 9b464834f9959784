//! What the TUI remembers of past refreshes: total live bytes and event
//! counts for the last ten minutes, and whole profiles (about one a second)
//! for the last two, from which rates, growth and the sparkline of any row
//! are computed. Timestamps are the profiles' own (`Profile::elapsed`), so
//! everything here is deterministic.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use super::{
    rows::{RowId, totals_of},
    view_model::merged_tree,
};
use allocprof::model::profile::{ProcessKey, Profile};

/// Span of the total-live-bytes series.
pub const TOTALS_SPAN: Duration = Duration::from_secs(600);
/// Span of the kept profiles: a bit over the growth window.
pub const PROFILES_SPAN: Duration = Duration::from_secs(130);
/// Rates are measured over this long, smoothing the refresh jitter.
pub const RATE_WINDOW: Duration = Duration::from_secs(5);
/// "Growth over the last minute".
pub const GROWTH_WINDOW: Duration = Duration::from_secs(60);
/// Kept profiles are at least this far apart (whatever `--interval` is).
const PROFILE_SPACING: Duration = Duration::from_millis(900);
/// Bounds the memory of kept profiles on hosts with very many stacks.
const STACK_BUDGET: usize = 400_000;
const MAX_POINTS: usize = 6_000;

/// One refresh, summed over processes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub at: Duration,
    pub live_bytes: f64,
    /// Sampled alloc and free events since attach.
    pub events: u64,
}

#[derive(Default)]
pub struct History {
    points: VecDeque<Point>,
    profiles: VecDeque<Arc<Profile>>,
}

impl History {
    pub fn record(&mut self, profile: &Arc<Profile>) {
        let at = profile.elapsed;
        self.points.push_back(Point {
            at,
            live_bytes: profile.live_totals().live_bytes,
            events: profile
                .processes
                .iter()
                .map(|p| p.alloc_events + p.free_events)
                .sum(),
        });
        while self.points.len() > MAX_POINTS
            || self.points.front().is_some_and(|p| p.at + TOTALS_SPAN < at)
        {
            self.points.pop_front();
        }

        // The newest profile is always kept; the previous newest stays only
        // if it is far enough from the one before it.
        let n = self.profiles.len();
        if n >= 2
            && self.profiles[n - 1]
                .elapsed
                .saturating_sub(self.profiles[n - 2].elapsed)
                < PROFILE_SPACING
        {
            self.profiles.pop_back();
        }
        self.profiles.push_back(profile.clone());
        let stacks = |q: &VecDeque<Arc<Profile>>| -> usize {
            q.iter()
                .flat_map(|p| &p.processes)
                .map(|p| p.stacks.len())
                .sum()
        };
        while self.profiles.len() > 2
            && (self.profiles[0].elapsed + PROFILES_SPAN < at
                || stacks(&self.profiles) > STACK_BUDGET)
        {
            self.profiles.pop_front();
        }
    }

    /// The profile to measure change against over `window` up to `now`: the
    /// newest at least `window` older, else the oldest older one (early on,
    /// change is measured over what there is).
    pub fn reference(&self, now: Duration, window: Duration) -> Option<&Arc<Profile>> {
        let older = self.profiles.iter().filter(|p| p.elapsed < now);
        match now.checked_sub(window) {
            Some(limit) => older
                .clone()
                .rfind(|p| p.elapsed <= limit)
                .or_else(|| older.clone().next()),
            None => older.clone().next(),
        }
    }

    /// Sampled events per second over the rate window up to `now`.
    pub fn events_per_second(&self, now: Duration) -> Option<f64> {
        let upto: Vec<&Point> = self.points.iter().filter(|p| p.at <= now).collect();
        let last = **upto.last()?;
        let limit = now.saturating_sub(RATE_WINDOW);
        let first = upto.iter().rev().find(|p| p.at <= limit).or(upto.first())?;
        let dt = last.at.checked_sub(first.at)?.as_secs_f64();
        (dt > 0.0).then(|| last.events.saturating_sub(first.events) as f64 / dt)
    }

    /// Total live bytes, oldest first, up to `now`.
    pub fn live_series(&self, now: Duration) -> Vec<(Duration, u64)> {
        self.points
            .iter()
            .filter(|p| p.at <= now)
            .map(|p| (p.at, p.live_bytes.max(0.0) as u64))
            .collect()
    }

    /// One row's live bytes in the kept profiles, oldest first, up to `now`;
    /// 0 where the row did not exist yet. A row of a tree's merged stacks
    /// (`tree`: its root) is looked up in each profile's tree, merged.
    pub fn row_series(
        &self,
        now: Duration,
        id: &RowId,
        tree: Option<ProcessKey>,
    ) -> Vec<(Duration, u64)> {
        self.profiles
            .iter()
            .filter(|p| p.elapsed <= now)
            .map(|p| {
                let totals = match tree {
                    Some(root) => totals_of(&merged_tree(p, root), id),
                    None => totals_of(p, id),
                };
                let live = totals.map_or(0.0, |t| t.live_bytes);
                (p.elapsed, live.max(0.0) as u64)
            })
            .collect()
    }

    #[cfg(test)]
    pub fn kept_profiles(&self) -> usize {
        self.profiles.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::rows::tests::{process, profile};

    fn at(secs: u64, live: f64) -> Arc<Profile> {
        Arc::new(profile(
            secs,
            vec![process(1, "a", &[(&["f", "main"], live, live)])],
        ))
    }

    #[test]
    fn references_are_the_newest_old_enough_else_the_oldest() {
        let mut h = History::default();
        for s in 1..=100 {
            h.record(&at(s, s as f64));
        }
        let now = Duration::from_secs(100);
        assert_eq!(h.reference(now, RATE_WINDOW).unwrap().elapsed.as_secs(), 95);
        assert_eq!(
            h.reference(now, GROWTH_WINDOW).unwrap().elapsed.as_secs(),
            40
        );
        let early = Duration::from_secs(3);
        assert_eq!(
            h.reference(early, GROWTH_WINDOW).unwrap().elapsed.as_secs(),
            1
        );
        assert!(h.reference(Duration::from_secs(1), RATE_WINDOW).is_none());
    }

    #[test]
    fn history_is_bounded_in_time() {
        let mut h = History::default();
        for s in 0..1000 {
            h.record(&at(s, 1.0));
        }
        assert!(h.kept_profiles() <= PROFILES_SPAN.as_secs() as usize + 1);
        let series = h.live_series(Duration::from_secs(999));
        assert_eq!(series.len(), TOTALS_SPAN.as_secs() as usize + 1);
    }

    #[test]
    fn fast_refreshes_keep_one_profile_a_second() {
        let mut h = History::default();
        for ms in (0..10_000).step_by(100) {
            let mut p = profile(0, vec![]);
            p.elapsed = Duration::from_millis(ms);
            h.record(&Arc::new(p));
        }
        assert!(
            (10..=13).contains(&h.kept_profiles()),
            "{}",
            h.kept_profiles()
        );
    }

    #[test]
    fn events_per_second_over_the_window() {
        let mut h = History::default();
        for s in 0..10 {
            let mut p = profile(s, vec![process(1, "a", &[])]);
            p.processes[0].alloc_events = 100 * s;
            p.processes[0].free_events = 0;
            h.record(&Arc::new(p));
        }
        assert_eq!(h.events_per_second(Duration::from_secs(9)), Some(100.0));
        assert_eq!(h.events_per_second(Duration::from_secs(0)), None);
    }
}

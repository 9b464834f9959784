//! The one loop that drives a `Session` in every mode (headless, `record`,
//! the TUI): exec/exit events every [`POLL_EVERY`], a beat for each kernel
//! read, snapshot, deadline or stop signal. Each mode says what a beat does.

use std::time::Duration;

use allocprof::session::Session;
use anyhow::{Context, Result};
use tokio::{
    signal::unix::{Signal, SignalKind, signal},
    time::{Instant, Interval, MissedTickBehavior, interval, interval_at, sleep_until},
};

/// How often the session handles exec/exit events and due rescans.
pub const POLL_EVERY: Duration = Duration::from_millis(20);

/// What the driver wakes its caller for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Beat {
    /// Time to read the kernel.
    Refresh,
    /// Time for a snapshot (`record --interval`).
    Snapshot,
    /// The run's duration is over.
    Deadline,
    /// SIGINT or SIGTERM asked us to stop.
    StopSignal,
}

pub struct Driver {
    poll: Interval,
    refresh: Interval,
    snapshots: Option<Interval>,
    deadline: Option<Instant>,
    stop_signals: Option<[Signal; 2]>,
}

impl Driver {
    /// A refresh every `refresh_every`, the first at once.
    pub fn new(refresh_every: Duration) -> Driver {
        let mut poll = interval(POLL_EVERY);
        poll.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let mut refresh = interval(refresh_every);
        // A slow read (symbolization) must not be followed by a burst.
        refresh.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Driver {
            poll,
            refresh,
            snapshots: None,
            deadline: None,
            stop_signals: None,
        }
    }

    /// A [`Beat::Deadline`] once `after` has passed.
    pub fn with_deadline(mut self, after: Option<Duration>) -> Driver {
        self.deadline = after.map(|d| Instant::now() + d);
        self
    }

    /// A [`Beat::Snapshot`] every `every`, the first after one period.
    pub fn with_snapshots(mut self, every: Option<Duration>) -> Driver {
        self.snapshots = every.map(|every| {
            let mut snapshots = interval_at(Instant::now() + every, every);
            snapshots.set_missed_tick_behavior(MissedTickBehavior::Delay);
            snapshots
        });
        self
    }

    /// A [`Beat::StopSignal`] on SIGINT or SIGTERM (the TUI reads those
    /// itself, with the keys).
    pub fn stopped_by_signals(mut self) -> Result<Driver> {
        let sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        self.stop_signals = Some([sigint, sigterm]);
        Ok(self)
    }

    /// Handles the session's events until the next beat.
    pub async fn next(&mut self, session: &mut Session) -> Beat {
        let Driver {
            poll,
            refresh,
            snapshots,
            deadline,
            stop_signals,
        } = self;
        loop {
            // Biased: a stop or the deadline wins over more work.
            tokio::select! {
                biased;
                () = stop_signal(stop_signals) => return Beat::StopSignal,
                () = until(*deadline) => return Beat::Deadline,
                () = tick(snapshots) => return Beat::Snapshot,
                _ = refresh.tick() => return Beat::Refresh,
                _ = poll.tick() => session.poll_events(),
            }
        }
    }
}

async fn stop_signal(signals: &mut Option<[Signal; 2]>) {
    match signals {
        Some([sigint, sigterm]) => {
            tokio::select! {
                _ = sigint.recv() => {}
                _ = sigterm.recv() => {}
            }
        }
        None => std::future::pending().await,
    }
}

async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn tick(interval: &mut Option<Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

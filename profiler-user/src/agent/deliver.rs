//! The sender: a thread of its own that sends the queued exports, oldest
//! first, one at a time, so that profiling never waits on the network. The
//! driver's [`Sender::enqueue`] only takes the queue's lock.
//!
//! An export is retried only when its failure says so ([`Verdict`]), after
//! the collector's delay or the backoff's, until it is sent, fails for
//! good, or the queue needs its room; an accepted export is never sent
//! again. The log gets one line per kind of failure (until an export goes
//! through again), not one per attempt; the counts are in [`Counts`].
//! [`Sender::finish`] drains the queue for a bounded time at exit.

use std::{
    collections::HashSet,
    sync::{Arc, Condvar, Mutex, MutexGuard, mpsc},
    thread,
    time::{Duration, Instant},
};

use super::{
    Failure, Transport, Verdict,
    queue::{Item, Queue},
    retry,
    stats::Counts,
};
use crate::output::inert::inert;

/// Where the sender's lines go (stderr in the binary).
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// Distinct partial-success messages logged, at most (peer text).
const MAX_PARTIAL_MESSAGES: usize = 16;

pub struct Sender {
    shared: Arc<Shared>,
    done: mpsc::Receiver<()>,
    log: Log,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

struct State {
    queue: Queue,
    counts: Counts,
    /// Set at exit: the sender stops by then.
    closing: Option<Instant>,
    overflow_logged: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere leaves the counters usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Sender {
    /// Starts the thread. `timeout` bounds each attempt.
    pub fn spawn(
        transport: Box<dyn Transport>,
        queue_bytes: usize,
        timeout: Duration,
        log: Log,
    ) -> std::io::Result<Sender> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: Queue::new(queue_bytes),
                counts: Counts::default(),
                closing: None,
                overflow_logged: false,
            }),
            wake: Condvar::new(),
        });
        let (done_tx, done) = mpsc::channel();
        let (s, l) = (shared.clone(), log.clone());
        thread::Builder::new()
            .name("otlp-sender".into())
            .spawn(move || {
                run(&s, transport, timeout, &l);
                let _ = done_tx.send(());
            })?;
        Ok(Sender { shared, done, log })
    }

    /// Queues an encoded export; never waits on the network.
    pub fn enqueue(&self, bytes: Vec<u8>) {
        let mut s = self.shared.lock();
        s.counts.enqueued += 1;
        let dropped = s.queue.push(bytes);
        if dropped > 0 {
            s.counts.dropped_overflow += dropped as u64;
            if !s.overflow_logged {
                s.overflow_logged = true;
                (self.log)(&format!(
                    "the export queue is full ({} B): the oldest exports are dropped \
                     (counted in the exports line from now on)",
                    s.queue.bytes()
                ));
            }
        }
        drop(s);
        self.shared.wake.notify_all();
    }

    pub fn counts(&self) -> Counts {
        let s = self.shared.lock();
        Counts {
            queued: s.queue.len(),
            queue_bytes: s.queue.bytes(),
            ..s.counts.clone()
        }
    }

    /// Sends what is queued for at most `within`, then stops; what is left
    /// is counted as dropped at exit.
    pub fn finish(self, within: Duration) -> Counts {
        self.shared.lock().closing = Some(Instant::now() + within);
        self.shared.wake.notify_all();
        // The attempts are bounded by the same deadline; a little slack for
        // the thread to see it.
        let _ = self.done.recv_timeout(within + Duration::from_secs(1));
        let mut s = self.shared.lock();
        let left = s.queue.clear();
        s.counts.dropped_at_exit += left as u64;
        Counts {
            queued: 0,
            queue_bytes: 0,
            ..s.counts.clone()
        }
    }
}

/// The thread: the oldest export, attempts until done with it, the next.
fn run(shared: &Shared, mut transport: Box<dyn Transport>, timeout: Duration, log: &Log) {
    let mut failing: HashSet<String> = HashSet::new();
    let mut partials: HashSet<String> = HashSet::new();
    loop {
        let item = {
            let mut s = shared.lock();
            loop {
                if let Some(deadline) = s.closing
                    && (s.queue.is_empty() || Instant::now() >= deadline)
                {
                    return;
                }
                if let Some(item) = s.queue.start() {
                    break item;
                }
                s = shared.wake.wait(s).unwrap_or_else(|e| e.into_inner());
            }
        };
        if !send(
            shared,
            &mut *transport,
            &item,
            timeout,
            log,
            &mut failing,
            &mut partials,
        ) {
            return;
        }
    }
}

/// Attempts `item` until it is done with; false if the exit's deadline
/// came first.
fn send(
    shared: &Shared,
    transport: &mut dyn Transport,
    item: &Item,
    timeout: Duration,
    log: &Log,
    failing: &mut HashSet<String>,
    partials: &mut HashSet<String>,
) -> bool {
    let mut attempt = 0;
    loop {
        let closing = shared.lock().closing;
        let timeout = match closing {
            Some(deadline) => timeout.min(deadline.saturating_duration_since(Instant::now())),
            None => timeout,
        };
        if timeout.is_zero() {
            return false;
        }
        let result = transport.export(&item.bytes, timeout);
        let mut s = shared.lock();
        let failure = match result {
            Ok(accepted) => {
                s.queue.finish(item.id);
                s.counts.sent += 1;
                if accepted.rejected_profiles > 0 {
                    s.counts.rejected_profiles +=
                        u64::try_from(accepted.rejected_profiles).unwrap_or(0);
                    if partials.len() < MAX_PARTIAL_MESSAGES
                        && partials.insert(accepted.error_message.clone())
                    {
                        log(&format!(
                            "the collector rejected {} profiles: {} (this message is logged once; \
                             the count is in the exports line)",
                            accepted.rejected_profiles,
                            // The collector's words: a peer's text, made inert.
                            inert(&accepted.error_message)
                        ));
                    }
                }
                if !failing.is_empty() {
                    failing.clear();
                    log("exports go through again");
                }
                return true;
            }
            Err(f) => f,
        };
        let Failure { kind, verdict, .. } = &failure;
        match verdict {
            Verdict::Retry(after) if !s.queue.abandoned() => {
                s.counts.retried += 1;
                if failing.insert(kind.clone()) {
                    log(&format!(
                        "export failed, retrying with backoff: {failure} (further failures of \
                         this kind are counted, not logged)"
                    ));
                }
                let until = Instant::now() + retry::delay(attempt, *after);
                attempt = attempt.saturating_add(1);
                // Wait out the delay, or until the exit's deadline.
                loop {
                    let now = Instant::now();
                    if let Some(deadline) = s.closing
                        && deadline <= until
                        && now >= deadline
                    {
                        return false;
                    }
                    if now >= until {
                        break;
                    }
                    let wake = s.closing.map_or(until, |d| d.min(until));
                    s = shared
                        .wake
                        .wait_timeout(s, wake.saturating_duration_since(now))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                if s.queue.abandoned() {
                    s.queue.finish(item.id);
                    s.counts.dropped_overflow += 1;
                    return true;
                }
            }
            Verdict::Retry(_) => {
                // The queue needed its room while it failed.
                s.queue.finish(item.id);
                s.counts.dropped_overflow += 1;
                return true;
            }
            Verdict::Drop => {
                s.queue.finish(item.id);
                s.counts.dropped_failed += 1;
                if failing.insert(kind.clone()) {
                    log(&format!(
                        "export dropped: {failure} (further failures of this kind are counted, \
                         not logged)"
                    ));
                }
                return true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::{super::Accepted, *};

    /// What a transport was given, and when.
    type Seen = Arc<Mutex<Vec<(Vec<u8>, Instant)>>>;

    /// Answers from a script, one per attempt (the last repeated), and
    /// records what it was given and when.
    struct Scripted {
        script: Vec<Result<Accepted, Failure>>,
        seen: Seen,
        calls: Arc<AtomicUsize>,
        gate: Option<Arc<(Mutex<bool>, Condvar)>>,
    }

    impl Transport for Scripted {
        fn export(&mut self, request: &Arc<Vec<u8>>, _: Duration) -> Result<Accepted, Failure> {
            if let Some(gate) = &self.gate {
                let (open, cv) = &**gate;
                let mut o = open.lock().unwrap();
                while !*o {
                    o = cv.wait(o).unwrap();
                }
            }
            self.seen
                .lock()
                .unwrap()
                .push((request.to_vec(), Instant::now()));
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            self.script[n.min(self.script.len() - 1)].clone()
        }
    }

    fn logger() -> (Log, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = lines.clone();
        (
            Arc::new(move |s: &str| l.lock().unwrap().push(s.to_owned())),
            lines,
        )
    }

    fn scripted(script: Vec<Result<Accepted, Failure>>) -> (Scripted, Seen) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let t = Scripted {
            script,
            seen: seen.clone(),
            calls: Arc::new(AtomicUsize::new(0)),
            gate: None,
        };
        (t, seen)
    }

    fn retry_after(d: Duration) -> Result<Accepted, Failure> {
        Err(Failure::new("HTTP 503", "busy", Verdict::Retry(Some(d))))
    }

    #[test]
    fn every_export_is_sent_once_in_order() {
        let (t, seen) = scripted(vec![Ok(Accepted::default())]);
        let (log, lines) = logger();
        let sender = Sender::spawn(Box::new(t), 1 << 20, Duration::from_secs(5), log).unwrap();
        for i in 0..20u8 {
            sender.enqueue(vec![i; 10]);
        }
        let counts = sender.finish(Duration::from_secs(60));
        let seen: Vec<u8> = seen.lock().unwrap().iter().map(|(b, _)| b[0]).collect();
        assert_eq!(seen, (0..20).collect::<Vec<_>>());
        assert_eq!((counts.sent, counts.dropped(), counts.retried), (20, 0, 0));
        assert!(lines.lock().unwrap().is_empty());
    }

    #[test]
    fn a_retryable_refusal_is_retried_no_earlier_than_the_server_said_and_logged_once() {
        let after = Duration::from_millis(300);
        let (t, seen) = scripted(vec![
            retry_after(after),
            retry_after(after),
            Ok(Accepted::default()),
        ]);
        let (log, lines) = logger();
        let sender = Sender::spawn(Box::new(t), 1 << 20, Duration::from_secs(5), log).unwrap();
        sender.enqueue(vec![7; 10]);
        let counts = sender.finish(Duration::from_secs(60));
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3);
        for pair in seen.windows(2) {
            assert!(pair[1].1.duration_since(pair[0].1) >= after);
        }
        assert_eq!((counts.sent, counts.retried, counts.dropped()), (1, 2, 0));
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("HTTP 503: busy"), "{lines:?}");
        assert_eq!(lines[1], "exports go through again");
    }

    #[test]
    fn a_final_failure_is_dropped_at_once_and_counted() {
        let (t, seen) = scripted(vec![Err(Failure::new("HTTP 400", "bad", Verdict::Drop))]);
        let (log, lines) = logger();
        let sender = Sender::spawn(Box::new(t), 1 << 20, Duration::from_secs(5), log).unwrap();
        for _ in 0..3 {
            sender.enqueue(vec![1; 10]);
        }
        let counts = sender.finish(Duration::from_secs(60));
        assert_eq!(seen.lock().unwrap().len(), 3, "each tried once");
        assert_eq!(
            (counts.sent, counts.dropped_failed, counts.retried),
            (0, 3, 0)
        );
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 1, "one line per kind: {lines:?}");
        assert!(
            lines[0].starts_with("export dropped: HTTP 400: bad"),
            "{lines:?}"
        );
    }

    #[test]
    fn the_queue_drops_the_oldest_while_the_collector_is_away() {
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let (mut t, seen) = scripted(vec![Ok(Accepted::default())]);
        t.gate = Some(gate.clone());
        let (log, lines) = logger();
        let sender = Sender::spawn(Box::new(t), 100, Duration::from_secs(5), log).unwrap();
        // The first is in flight (held at the gate); 10 more of 30 B each
        // fit three at a time beside it.
        for i in 0..11u8 {
            sender.enqueue(vec![i; 30]);
        }
        let held = sender.counts();
        assert!(held.queue_bytes <= 100 + 30, "{held:?}");
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        let counts = sender.finish(Duration::from_secs(60));
        let seen: Vec<u8> = seen.lock().unwrap().iter().map(|(b, _)| b[0]).collect();
        // Oldest first, the newest kept; the older ones that did not fit
        // were dropped.
        assert_eq!(seen.last(), Some(&10));
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        assert_eq!(counts.sent + counts.dropped_overflow, 11, "{counts:?}");
        assert_eq!(counts.sent, seen.len() as u64);
        assert_eq!(lines.lock().unwrap().len(), 1);
    }

    #[test]
    fn finish_stops_at_its_deadline_and_counts_what_is_left() {
        // Refused for an hour: the drain cannot wait that long.
        let (t, seen) = scripted(vec![retry_after(Duration::from_secs(3600))]);
        let (log, _) = logger();
        let sender = Sender::spawn(Box::new(t), 1 << 20, Duration::from_secs(5), log).unwrap();
        sender.enqueue(vec![1; 10]);
        sender.enqueue(vec![2; 10]);
        let counts = sender.finish(Duration::from_millis(200));
        assert_eq!(seen.lock().unwrap().len(), 1);
        assert_eq!((counts.sent, counts.dropped_at_exit), (0, 2));
    }

    #[test]
    fn partial_successes_are_logged_once_per_message() {
        let partial = |m: &str| {
            Ok(Accepted {
                rejected_profiles: 2,
                error_message: m.into(),
            })
        };
        let (t, _) = scripted(vec![
            partial("old"),
            partial("old"),
            partial("new\u{1b}[31m"),
        ]);
        let (log, lines) = logger();
        let sender = Sender::spawn(Box::new(t), 1 << 20, Duration::from_secs(5), log).unwrap();
        for _ in 0..4 {
            sender.enqueue(vec![1]);
        }
        let counts = sender.finish(Duration::from_secs(60));
        assert_eq!((counts.sent, counts.rejected_profiles), (4, 8));
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(!lines[1].contains('\u{1b}'), "made inert: {lines:?}");
    }
}

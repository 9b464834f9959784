//! `cargo xtask bench tui`: key-to-screen latency and the view's CPU with a
//! heavy system-wide profile (500 processes, 20k stacks), synthetic profiles
//! fed through the real run loop (`ui`), state and drawing (a `TestBackend`,
//! so the terminal's own output is not counted). Keys are pressed one at a
//! time, each once the screen showed the last one and 50 ms later, while a
//! profile arrives every second; a key's latency runs from its sending to the
//! end of the first draw that shows it done (the rows, or the flamegraph,
//! built from the view it asked for).

use std::{
    sync::{Arc, mpsc as std_mpsc},
    thread,
    time::{Duration, Instant},
};

use crossterm::event::{KeyCode, KeyEvent};
use ratatui::{Terminal, backend::TestBackend};
use tokio::sync::mpsc;

use super::{App, AppEvent, AppOptions, Exporter, ui, view_model};
use crate::tui::rows::tests::{process, profile, totals};
use allocprof::{
    model::profile::{ProcessProfile, Profile},
    symbolize::{Frame, FrameKind},
};

const PROCESSES: usize = 500;
const STACKS_PER_PROCESS: usize = 40;
const DEPTH: usize = 20;
/// Distinct application functions (names are shared, as interned names are).
const FUNCTIONS: usize = 3000;
const PROGRAMS: usize = 50;
const WARMUP_PROFILES: u64 = 65;

/// The world's processes and their stacks; each profile changes the figures.
fn world() -> Vec<ProcessProfile> {
    let names: Vec<Arc<str>> = (0..FUNCTIONS)
        .map(|i| format!("app::module_{}::Handler<T>::handle_{i}", i % 97).into())
        .collect();
    let lines: Vec<Arc<str>> = (0..FUNCTIONS)
        .map(|i| format!("/src/app/module_{}.rs:{}", i % 97, 10 + i).into())
        .collect();
    let grow: Arc<str> = "alloc::raw_vec::RawVec<T,A>::grow_one".into();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    (0..PROCESSES)
        .map(|p| {
            let program = p % PROGRAMS;
            let module: Arc<str> = format!("/usr/bin/program{program}").into();
            let mut proc = process(p as u32 + 1000, &format!("program{program}"), &[]);
            proc.stacks = (0..STACKS_PER_PROCESS)
                .map(|s| {
                    let mut frames = vec![Frame {
                        function: grow.clone(),
                        location: None,
                        module: Some(module.clone()),
                        inlined: false,
                        offset: None,
                        kind: FrameKind::Native,
                    }];
                    // Stacks of one program share their outer frames.
                    let base = program * 60 + s % 7;
                    for d in 0..DEPTH {
                        let f = if d < DEPTH - 4 {
                            (base + d * 13 + next(40)) % FUNCTIONS
                        } else {
                            (base + d) % FUNCTIONS
                        };
                        frames.push(Frame {
                            function: names[f].clone(),
                            location: Some(lines[f].clone()),
                            module: Some(module.clone()),
                            inlined: false,
                            offset: None,
                            kind: FrameKind::Native,
                        });
                    }
                    let live = (1 + next(1000)) as f64 * 4096.0;
                    allocprof::model::profile::StackProfile {
                        frames: frames.into(),
                        totals: totals(live, live * 3.0),
                    }
                })
                .collect();
            proc.totals = proc.stacks.iter().map(|s| s.totals).sum();
            proc
        })
        .collect()
}

/// The world's profile at second `t`: every stack grows a little.
fn profile_at(world: &[ProcessProfile], t: u64) -> Profile {
    let processes = world
        .iter()
        .map(|p| {
            let mut p = p.clone();
            for (i, s) in p.stacks.iter_mut().enumerate() {
                let grow = 1.0 + (t as f64) * 0.001 * (i % 5) as f64;
                s.totals = totals(s.totals.live_bytes * grow, s.totals.alloc_bytes * grow);
            }
            p.totals = p.stacks.iter().map(|s| s.totals).sum();
            p.alloc_events += 100 * t;
            p
        })
        .collect();
    profile(t, processes)
}

/// A frame drawn: when, how many keys the loop had applied, and whether the
/// view was built for all of them.
struct Drawn {
    at: Instant,
    keys: u64,
    settled: bool,
}

/// CPU time (user + system) of this process's threads named `prefix*`.
fn cpu_of_threads(prefix: &str) -> Duration {
    let ticks = 100; // sysconf(_SC_CLK_TCK) on Linux
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let fields: Vec<&str> = after.split_whitespace().collect();
        // utime and stime: fields 14 and 15, 12 and 13 after the comm.
        total += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    Duration::from_millis(total * 1000 / ticks)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

#[test]
#[ignore = "a benchmark: cargo xtask bench tui"]
fn key_to_screen_latency() {
    let world = Arc::new(world());
    let (tx, rx) = mpsc::channel::<AppEvent>(64);
    let (drawn_tx, drawn_rx) = std_mpsc::channel::<Drawn>();
    let worker_tx = tx.clone();
    let ui_thread = thread::Builder::new()
        .name("allocprof-ui".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut terminal = Terminal::new(TestBackend::new(200, 50)).unwrap();
            let mut app = App::new(AppOptions {
                target: "all processes".into(),
                interval: Duration::from_secs(1),
                preload: None,
            });
            // As `run` does.
            app.build_with(view_model::spawn(worker_tx).unwrap());
            let exporter: Exporter = Box::new(|_, _| Ok("not-written".into()));
            runtime
                .block_on(ui(&mut terminal, rx, &mut app, &exporter, |app, keys| {
                    let _ = drawn_tx.send(Drawn {
                        at: Instant::now(),
                        keys,
                        settled: app.settled(),
                    });
                }))
                .unwrap();
        })
        .unwrap();

    // A minute and more of history, at once: rates and growth have references.
    for t in 1..=WARMUP_PROFILES {
        tx.blocking_send(AppEvent::Profile(profile_at(&world, t)))
            .unwrap();
    }
    // Until the first draw after the key, and until the draw that shows
    // what it asked for built.
    let wait_settled = |keys: u64, since: Instant| -> (Duration, Duration) {
        let mut first = None;
        loop {
            let d = drawn_rx.recv().unwrap();
            if d.keys >= keys {
                let after = d.at.saturating_duration_since(since);
                let first = *first.get_or_insert(after);
                if d.settled {
                    return (first, after);
                }
            }
        }
    };
    wait_settled(0, Instant::now());
    while drawn_rx.try_recv().is_ok() {}

    // A profile a second from now on.
    let producer_tx = tx.clone();
    let producer_world = world;
    let producer = thread::Builder::new()
        .name("bench-producer".into())
        .spawn(move || {
            let start = Instant::now();
            for t in WARMUP_PROFILES + 1.. {
                let p = profile_at(&producer_world, t);
                let due = start + Duration::from_secs(t - WARMUP_PROFILES);
                thread::sleep(due.saturating_duration_since(Instant::now()));
                if producer_tx.blocking_send(AppEvent::Profile(p)).is_err() {
                    return;
                }
            }
        })
        .unwrap();

    // The view's CPU while it only follows the profiles.
    let (cpu0, wall0) = (cpu_of_threads("allocprof-"), Instant::now());
    thread::sleep(Duration::from_secs(15));
    let idle_cpu =
        (cpu_of_threads("allocprof-") - cpu0).as_secs_f64() / wall0.elapsed().as_secs_f64();

    let cycle = [
        ('j', "j/k"),
        ('j', "j/k"),
        ('j', "j/k"),
        ('k', "j/k"),
        ('k', "j/k"),
        ('k', "j/k"),
        ('s', "sort (s)"),
        ('j', "j/k"),
        ('g', "group (g)"),
        ('j', "j/k"),
        ('k', "j/k"),
        ('g', "group (g)"),
        ('f', "flamegraph open (f)"),
        ('q', "flamegraph close (q)"),
    ];
    let rounds = 22;
    let mut latencies: Vec<(&str, (Duration, Duration))> = Vec::new();
    let (cpu0, wall0) = (cpu_of_threads("allocprof-"), Instant::now());
    let mut keys = 0;
    for _ in 0..rounds {
        for (c, kind) in cycle {
            while drawn_rx.try_recv().is_ok() {}
            let sent = Instant::now();
            tx.blocking_send(AppEvent::Key(KeyEvent::from(KeyCode::Char(c))))
                .unwrap();
            keys += 1;
            latencies.push((kind, wait_settled(keys, sent)));
            thread::sleep(Duration::from_millis(50));
        }
    }
    let keyed_cpu =
        (cpu_of_threads("allocprof-") - cpu0).as_secs_f64() / wall0.elapsed().as_secs_f64();
    tx.blocking_send(AppEvent::Quit).unwrap();
    ui_thread.join().unwrap();
    drop(tx);
    drop(drawn_rx);
    producer.join().unwrap();

    println!(
        "## TUI: {PROCESSES} processes, {} stacks, a profile a second, {} key presses",
        PROCESSES * STACKS_PER_PROCESS,
        latencies.len()
    );
    println!("| keys | presses | drawn p50 | p99 | max | built p50 | p99 | max |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut kinds: Vec<&str> = cycle.iter().map(|(_, k)| *k).collect();
    kinds.dedup();
    kinds.sort_unstable();
    kinds.dedup();
    kinds.push("all");
    for kind in kinds {
        let of = |which: fn(&(Duration, Duration)) -> Duration| {
            let mut of: Vec<Duration> = latencies
                .iter()
                .filter(|(k, _)| kind == "all" || *k == kind)
                .map(|(_, d)| which(d))
                .collect();
            of.sort_unstable();
            format!(
                "{} | {} | {}",
                ms(percentile(&of, 0.5)),
                ms(percentile(&of, 0.99)),
                ms(*of.last().unwrap())
            )
        };
        let presses = latencies
            .iter()
            .filter(|(k, _)| kind == "all" || *k == kind)
            .count();
        println!("| {kind} | {presses} | {} | {} |", of(|d| d.0), of(|d| d.1));
    }
    println!(
        "view CPU (UI and view threads): {:.0}% of a core following the profiles, {:.0}% \
         while keys are pressed",
        idle_cpu * 100.0,
        keyed_cpu * 100.0
    );
}

//! The live TUI (`allocprof` in a terminal): producers (the session, on a
//! thread of its own; the terminal's keys; signals; the view worker) send
//! [`AppEvent`]s over one channel; the UI loop applies each to the pure
//! [`App`] state and redraws. Nothing heavy runs on the UI's task: the
//! session's reads and scans are on its thread, the rows and the
//! flamegraph's tree on the worker's (`view_model`).
//!
//! - `state`: the state and its transitions (keys, profiles), unit-tested.
//! - `rows`: table rows with stable identities; `history`: rates, growth,
//!   sparkline series; `flame`: the flamegraph's tree and layout.
//! - `render`: drawing, from `&App`: before each draw it tells the state the
//!   table's height, the one thing of the screen the state needs (to scroll);
//!   `exporter`: the `e` key's injected writer.

#[cfg(test)]
mod bench;
pub mod callers;
pub mod exporter;
pub mod flame;
pub mod history;
pub mod render;
pub mod rows;
pub mod state;
pub mod view_model;

use std::{
    io::{Stdout, stdout},
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use anyhow::{Context, Result, anyhow};
use crossterm::{
    cursor::Show,
    event::{DisableMouseCapture, EnableMouseCapture, Event, EventStream, KeyEventKind},
    execute,
    terminal::{EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode},
};
use futures::StreamExt;
use ratatui::{
    Terminal,
    backend::{Backend, CrosstermBackend},
};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::{mpsc, oneshot},
};

pub use self::{
    exporter::{Exporter, file_exporter},
    state::{App, AppEvent, AppOptions, Effect},
};
use allocprof::{
    output::inert::inert,
    session::{Session, Target},
};

use crate::driver::Driver;

pub struct Options {
    /// Kernel reads and redraws happen this often.
    pub interval: Duration,
    pub target: Target,
    /// `liballocprof.so`, where found: the empty view tells how to use it.
    pub preload: Option<std::path::PathBuf>,
}

/// What is profiled, for the header.
fn describe(target: &Target) -> String {
    match target {
        Target::All => "all processes".into(),
        Target::Pids(pids) if pids.len() == 1 => format!("pid {}", pids[0]),
        Target::Pids(pids) => {
            let pids: Vec<String> = pids.iter().map(allocprof::ids::Pid::to_string).collect();
            format!("pids {}", pids.join(", "))
        }
        Target::Trees(pids) if pids.len() == 1 => format!("pid {} and children", pids[0]),
        Target::Trees(pids) => {
            let pids: Vec<String> = pids.iter().map(allocprof::ids::Pid::to_string).collect();
            format!("pids {} and children", pids.join(", "))
        }
    }
}

/// Runs the TUI until the user quits (or a signal asks to); returns what
/// should be printed once the terminal is restored (exports, warnings).
pub async fn run(session: Session, options: Options, exporter: Exporter) -> Result<Vec<String>> {
    let mut app = App::new(AppOptions {
        target: describe(&options.target),
        interval: options.interval,
        preload: options
            .preload
            .as_ref()
            .map(|p| inert(&p.display().to_string()).into_owned()),
    });
    app.set_notice(state::Notice::Info(format!(
        "attached {} probe sites; press ? for the keys",
        session.attachments()
    )));
    let (tx, rx) = mpsc::channel(64);
    app.build_with(view_model::spawn(tx.clone()).context("starting the view's thread")?);
    let session = on_own_thread(session, options.interval, tx.clone())?;
    let mut terminal = TerminalGuard::enter()?;
    let result = tokio::select! {
        r = session => r.unwrap_or_else(|_| Err(anyhow!("the session's thread panicked"))),
        r = input(tx) => r,
        r = ui(&mut terminal.terminal, rx, &mut app, &exporter, |_, _| {}) => r,
    };
    drop(terminal);
    result.map(|()| app.log)
}

/// Runs the session on a thread of its own (its kernel reads, `/proc` scans
/// and profile building take seconds under heavy load, and must not hold
/// the keys up); the result says how it ended. The thread ends at its next
/// send once the UI is gone.
fn on_own_thread(
    session: Session,
    every: Duration,
    tx: mpsc::Sender<AppEvent>,
) -> Result<oneshot::Receiver<Result<()>>> {
    let (done, ended) = oneshot::channel();
    std::thread::Builder::new()
        .name("allocprof-session".into())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the session's runtime")
                .and_then(|runtime| runtime.block_on(drive(session, every, tx)));
            let _ = done.send(result);
        })
        .context("starting the session's thread")?;
    Ok(ended)
}

/// The session's side: a profile every interval, warnings as they come.
async fn drive(mut session: Session, every: Duration, tx: mpsc::Sender<AppEvent>) -> Result<()> {
    let mut driver = Driver::new(every);
    let mut told_gone = false;
    loop {
        // No deadline and no stop signals here: `input` reads those, so
        // every beat is a refresh.
        driver.next(&mut session).await;
        let profile = session.refresh().context("reading the kernel's maps")?;
        // Warnings quote paths and names the targets control.
        let mut events: Vec<AppEvent> = session
            .warnings
            .drain(..)
            .map(|w| AppEvent::Warning(inert(&w).into_owned()))
            .collect();
        if !told_gone && !session.targets_alive() {
            told_gone = true;
            events.push(AppEvent::Info(
                "every target process has exited: its figures are frozen (q quits)".into(),
            ));
        }
        events.push(AppEvent::Profile(profile));
        for event in events {
            if tx.send(event).await.is_err() {
                return Ok(());
            }
        }
    }
}

/// The terminal's side: keys and resizes; and the signals that end us.
/// In raw mode Ctrl-C is a key, but `kill -INT` still sends SIGINT.
async fn input(tx: mpsc::Sender<AppEvent>) -> Result<()> {
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let mut events = EventStream::new();
    loop {
        let event = tokio::select! {
            _ = sigint.recv() => AppEvent::Quit,
            _ = sigterm.recv() => AppEvent::Quit,
            _ = sighup.recv() => AppEvent::Quit,
            event = events.next() => match event {
                Some(Ok(Event::Key(key))) if key.kind != KeyEventKind::Release => AppEvent::Key(key),
                Some(Ok(Event::Mouse(mouse))) => AppEvent::Mouse(mouse),
                Some(Ok(Event::Resize(..))) => AppEvent::Resize,
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(e).context("reading the terminal"),
                // The terminal is gone.
                None => AppEvent::Quit,
            },
        };
        if tx.send(event).await.is_err() {
            return Ok(());
        }
    }
}

/// Applies events and redraws once per batch of them: ratatui diffs each
/// frame against the last, and nothing clears the screen, so no flicker.
/// `drawn` hears of each frame drawn, with the number of keys applied so
/// far (the benchmark's clock).
async fn ui<B: Backend>(
    terminal: &mut Terminal<B>,
    mut rx: mpsc::Receiver<AppEvent>,
    app: &mut App,
    exporter: &Exporter,
    mut drawn: impl FnMut(&App, u64),
) -> Result<()>
where
    B::Error: Send + Sync + 'static,
{
    let mut keys = 0;
    render::fit_and_draw(terminal, app)?;
    drawn(app, keys);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(event) = next {
            keys += u64::from(matches!(event, AppEvent::Key(_)));
            match app.update(event) {
                Effect::None => {}
                Effect::Quit => return Ok(()),
                Effect::Export { profile, selection } => {
                    let what = app.describe_selection(&selection);
                    app.exported(exporter(&profile, &selection), &what);
                }
            }
            next = rx.try_recv().ok();
        }
        render::fit_and_draw(terminal, app)?;
        drawn(app, keys);
    }
    Ok(())
}

/// Raw mode, the alternate screen and mouse capture, undone on drop and on
/// panic.
struct TerminalGuard {
    terminal: Terminal<CrosstermBackend<Stdout>>,
}

static ACTIVE: AtomicBool = AtomicBool::new(false);

impl TerminalGuard {
    fn enter() -> Result<TerminalGuard> {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // Restore first, or the panic message lands in the alternate
            // screen and vanishes with it.
            restore();
            hook(info);
        }));
        enable_raw_mode().context("switching the terminal to raw mode")?;
        ACTIVE.store(true, Ordering::SeqCst);
        let guard = |e: std::io::Error| {
            restore();
            anyhow::Error::from(e).context("setting up the terminal")
        };
        execute!(stdout(), EnterAlternateScreen, EnableMouseCapture).map_err(guard)?;
        let terminal = Terminal::new(CrosstermBackend::new(stdout())).map_err(guard)?;
        Ok(TerminalGuard { terminal })
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}

/// Leaves raw mode, mouse capture and the alternate screen, once.
fn restore() {
    if ACTIVE.swap(false, Ordering::SeqCst) {
        let _ = disable_raw_mode();
        let _ = execute!(stdout(), DisableMouseCapture, LeaveAlternateScreen, Show);
    }
}

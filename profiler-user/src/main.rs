//! `allocprof`: attach to processes carrying the `otel_memory` (or `ddheap`) probes, and
//! report or export their heap profiles.

mod cli;
mod commands;
mod driver;
mod tui;

use std::{
    io::{IsTerminal, Write},
    process::ExitCode,
};

use allocprof::{
    kernel::KernelError,
    model::profile::Profile,
    output::export,
    output::inert::inert,
    output::report::{self, ReportOptions},
    output::{self, Existing},
    session::{Session, StartError, Target},
};
use anyhow::{Context, Result};
use clap::Parser;

use crate::{
    cli::{Cli, Command, Format},
    driver::{Beat, Driver},
};

/// Exit codes, distinct per cause so scripts can branch on them.
mod exit {
    pub const ERROR: u8 = 1;
    pub const NO_SUCH_PROCESS: u8 = 3;
    pub const NO_PROBES: u8 = 4;
    pub const PRIVILEGES: u8 = 5;
    pub const KERNEL: u8 = 6;
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    let command = cli.command.take();
    match &command {
        // Files in, file out: no runtime, no kernel, no privileges needed.
        Some(Command::Diff(args)) => return finish(commands::diff(args)),
        Some(Command::Record(args)) => {
            if let Some(interval) = args.interval {
                cli::refuse_interval_beyond_duration(interval, args.duration);
            }
        }
        // Headless, --interval is only how often the kernel is read: a run
        // shorter than it still reads at its start and its end.
        None | Some(Command::Agent(_)) => {}
    }
    // Without --duration, a terminal gets the TUI (--format is then what its
    // export key writes), so only a timed run could print pprof to it.
    if command.is_none() && cli.duration.is_some() {
        cli::refuse_binary_to_terminal(cli.format, cli.output.as_deref());
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("allocprof: cannot start the runtime: {e}");
            return ExitCode::from(exit::ERROR);
        }
    };
    finish(match command {
        Some(Command::Record(args)) => runtime.block_on(commands::record(args)),
        Some(Command::Agent(args)) => runtime.block_on(commands::agent(args)),
        _ => runtime.block_on(run(cli)),
    })
}

fn finish(result: Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allocprof: {}", inert(&format!("{e:#}")));
            ExitCode::from(exit_code(&e))
        }
    }
}

fn exit_code(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if let Some(start) = cause.downcast_ref::<StartError>() {
            return match start {
                StartError::NoSuchProcess(_) => exit::NO_SUCH_PROCESS,
                StartError::NoProbes { .. } | StartError::UnusableProbes { .. } => exit::NO_PROBES,
                StartError::Kernel(KernelError::Permission(_)) => exit::PRIVILEGES,
                StartError::Kernel(_) => exit::KERNEL,
            };
        }
        if let Some(pre) = cause.downcast_ref::<cli::Precondition>() {
            return match pre {
                cli::Precondition::Privileges => exit::PRIVILEGES,
                cli::Precondition::Kernel(_) => exit::KERNEL,
            };
        }
    }
    exit::ERROR
}

async fn run(cli: Cli) -> Result<()> {
    cli::check_preconditions()?;
    if let Some(path) = &cli.output {
        // Named before profiling, not after an hour of it.
        output::check_writable(path)?;
    }
    let headless =
        cli.duration.is_some() || !std::io::stdout().is_terminal() || cli.output.is_some();
    let mut session = start_session(&cli.targets)?;
    if !headless {
        let dir = std::env::current_dir().context("finding the current directory")?;
        // The live view is still useful where exports cannot go: say so in it.
        if let Err(e) = output::check_writable(&dir.join("allocprof-export")) {
            session
                .warnings
                .push(format!("the export key cannot write here: {e:#}"));
        }
        let exporter = tui::file_exporter(cli.format, cli.export_options(), dir);
        let options = tui::Options {
            interval: cli.interval,
            target: cli.targets.target(),
            // The LD_PRELOAD library beside us, for the first screen's how-to.
            preload: cli.targets.probe_files().1.into_iter().find(|p| {
                p.exists() && p.file_name() == Some(cli::DEFAULT_PROBE_FILES[0].as_ref())
            }),
        };
        // What the status line said (exports, warnings) outlives the screen.
        for line in tui::run(session, options, exporter).await? {
            eprintln!("allocprof: {}", inert(&line));
        }
        return Ok(());
    }
    let how_long = match cli.duration {
        Some(d) => format!("profiling for {}", humantime::format_duration(d)),
        None => "profiling until Ctrl-C".into(),
    };
    // Stop signals are handled before we say we attached: whoever waits
    // for that line may stop us at once, and still gets the report.
    let mut driver = Driver::new(cli.interval)
        .with_deadline(cli.duration)
        .stopped_by_signals()?;
    match (session.attachments(), cli.targets.target()) {
        (0, Target::All) => eprintln!(
            "allocprof: attached; no running process carries the otel_memory or ddheap probes yet, \
             waiting for one to start; {how_long}"
        ),
        (n, _) => eprintln!("allocprof: attached {n} probe sites; {how_long}"),
    }
    while driver.next(&mut session).await == Beat::Refresh {
        if !refresh_tick(&mut session)? {
            break;
        }
    }
    let profile = session
        .complete_profile()
        .context("reading the kernel's maps")?;
    // What the final reading found (e.g. a process whose memory hung).
    print_warnings(&mut session);
    output(&profile, &cli)
}

/// One periodic read of the kernel; `false` once every `--pid` target exited.
pub(crate) fn refresh_tick(session: &mut Session) -> Result<bool> {
    session.tick().context("reading the kernel's maps")?;
    print_warnings(session);
    if !session.targets_alive() {
        eprintln!("allocprof: every target process has exited");
        return Ok(false);
    }
    Ok(true)
}

/// Attaches to the targets as the options say, arms the probe files and
/// prints what the start found worth a warning.
pub(crate) fn start_session(targets: &cli::TargetArgs) -> Result<Session> {
    start_session_reading(targets, false)
}

/// [`start_session`], reading each process's command line with
/// `command_lines` (the agent's `--otlp-command-line`).
pub(crate) fn start_session_reading(
    targets: &cli::TargetArgs,
    command_lines: bool,
) -> Result<Session> {
    // Named before profiling, not at the first kill.
    let oom = match &targets.oom_dir {
        Some(dir) => Some(allocprof::oom::OomRecorder::new(dir, targets.oom_keep)?),
        None => None,
    };
    let mut session = Session::start_reading(targets.target(), targets.limits(), command_lines)?;
    session.set_max_gone_memory(targets.max_gone_memory);
    session.set_min_age(targets.min_age.unwrap_or_default());
    if let Some(recorder) = oom {
        session.record_oom_kills(recorder);
    }
    arm_probe_files(&mut session, targets)?;
    print_warnings(&mut session);
    Ok(session)
}

/// System-wide: arms the probe files named with `--probe-file` (each must
/// carry probes) and the liballocprof libraries next to us (where present).
fn arm_probe_files(session: &mut Session, targets: &cli::TargetArgs) -> Result<()> {
    if targets.target() != Target::All {
        return Ok(());
    }
    let (explicit, defaults) = targets.probe_files();
    for path in &explicit {
        if !session.arm(path)? {
            anyhow::bail!("{} carries no otel_memory or ddheap probes", path.display());
        }
    }
    for path in defaults.iter().filter(|p| p.exists()) {
        if let Err(e) = session.arm(path) {
            session.warnings.push(format!("{e:#}"));
        }
    }
    Ok(())
}

pub(crate) fn print_warnings(session: &mut Session) {
    for w in session.warnings.drain(..) {
        eprintln!("allocprof: warning: {}", inert(&w));
    }
}

fn output(profile: &Profile, cli: &Cli) -> Result<()> {
    let bytes = export::render(profile, cli.format, &cli.export_options())
        .with_context(|| format!("rendering the {}", cli.format.describe(cli.value)))?;
    match &cli.output {
        Some(path) => {
            output::write(path, &bytes, Existing::Replace)?;
            eprintln!(
                "allocprof: wrote {} ({})",
                path.display(),
                cli.format.describe(cli.value)
            );
            if cli.format != Format::Report {
                print!(
                    "{}",
                    report::render(
                        profile,
                        ReportOptions {
                            top: 5,
                            ..cli.report_options()
                        }
                    )
                );
            }
        }
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(&bytes)?;
            out.flush()?;
        }
    }
    Ok(())
}

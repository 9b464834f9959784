//! `allocprof`: attach to processes carrying the `otel_memory` probes, and
//! report or export their heap profiles.

mod cli;

use std::{
    io::{IsTerminal, Write},
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context, Result};
use clap::Parser;
use profiler_user::{
    collapsed,
    kernel::KernelError,
    profile::Profile,
    report::{self, ReportOptions},
    session::{Session, StartError},
};
use tokio::{
    signal::unix::{SignalKind, signal},
    time::{Instant, interval, sleep_until},
};

use crate::cli::{Cli, Format};

/// Exit codes, distinct per cause so scripts can branch on them.
mod exit {
    pub const ERROR: u8 = 1;
    pub const NO_SUCH_PROCESS: u8 = 3;
    pub const NO_PROBES: u8 = 4;
    pub const PRIVILEGES: u8 = 5;
    pub const KERNEL: u8 = 6;
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allocprof: {e:#}");
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
    let headless =
        cli.duration.is_some() || !std::io::stdout().is_terminal() || cli.output.is_some();
    let mut session = Session::start(cli.target(), cli.limits())?;
    for w in session.warnings.drain(..) {
        eprintln!("allocprof: warning: {w}");
    }
    if headless {
        eprintln!(
            "allocprof: attached {} probe sites; {}",
            session.attachments(),
            match cli.duration {
                Some(d) => format!("profiling for {}", humantime::format_duration(d)),
                None => "profiling until Ctrl-C".into(),
            }
        );
    }

    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let deadline = cli.duration.map(|d| Instant::now() + d);
    let far = Instant::now() + Duration::from_secs(100 * 365 * 86_400);
    let mut refresh = interval(cli.interval);
    let mut events = interval(Duration::from_millis(20));
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = sleep_until(deadline.unwrap_or(far)) => break,
            _ = events.tick() => session.poll_events(),
            _ = refresh.tick() => {
                let profile = session.refresh().context("reading the kernel's maps")?;
                for w in session.warnings.drain(..) {
                    eprintln!("allocprof: warning: {w}");
                }
                if !headless {
                    redraw(&profile, &cli)?;
                }
                if !session.targets_alive() {
                    eprintln!("allocprof: every target process has exited");
                    break;
                }
            }
        }
    }
    // One last read, then wait for every stack to be symbolized.
    session.refresh().context("reading the kernel's maps")?;
    session.finish_symbols();
    let profile = session.refresh().context("reading the kernel's maps")?;
    output(&profile, &cli)
}

fn redraw(profile: &Profile, cli: &Cli) -> Result<()> {
    let mut out = std::io::stdout().lock();
    // Home and clear: a plain refreshed report until the TUI lands.
    write!(
        out,
        "\x1b[H\x1b[2J{}",
        report::render(profile, cli.report_options())
    )?;
    out.flush()?;
    Ok(())
}

fn output(profile: &Profile, cli: &Cli) -> Result<()> {
    let text = match cli.format {
        Format::Report => report::render(profile, cli.report_options()),
        Format::Collapsed => collapsed::render(profile, cli.value),
    };
    match &cli.output {
        Some(path) => {
            std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
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
        None => print!("{text}"),
    }
    Ok(())
}

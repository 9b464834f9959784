//! The subcommands: `allocprof record` (pprof files, optionally numbered
//! snapshots), `allocprof diff` (the growth between two of them) and
//! `allocprof agent` (OTLP exports pushed to a collector).

use std::{
    io::{Read, Write},
    path::Path,
    time::{Duration, SystemTime},
};

use allocprof::{
    model::profile::Profile,
    model::stats::{Quantity, human_bytes, human_ci},
    output::export::{self, Format, diff, otlp, pprof, svg},
    output::{self, Existing, inert::inert},
    session::Session,
};
use anyhow::{Context, Result};

use crate::{
    cli::{self, AgentArgs, DiffArgs, RecordArgs},
    driver::{Beat, Driver},
};

/// How often the kernel's aggregates are read while recording (exec, exit
/// and dlopen are followed on these reads).
const REFRESH: Duration = Duration::from_secs(1);

pub async fn record(args: RecordArgs) -> Result<()> {
    cli::check_preconditions()?;
    // Named before profiling, not after an hour of it.
    output::check_writable(&args.output)?;
    let mut session = crate::start_session(&args.targets)?;
    // Stop signals are handled before we say we attached (see main.rs).
    let mut driver = Driver::new(args.interval.map_or(REFRESH, |i| i.min(REFRESH)))
        .with_deadline(args.duration)
        .with_snapshots(args.interval)
        .stopped_by_signals()?;
    eprintln!(
        "allocprof: attached {} probe sites; recording {}{}",
        session.attachments(),
        match args.duration {
            Some(d) => format!("for {}", humantime::format_duration(d)),
            None => "until Ctrl-C".into(),
        },
        match args.interval {
            Some(i) => format!(", a snapshot every {}", humantime::format_duration(i)),
            None => String::new(),
        }
    );
    // A device or pipe takes every snapshot in turn (no numbered names
    // beside /dev/null).
    let stream = output::is_stream(&args.output);
    let numbered = |n| {
        if stream {
            args.output.clone()
        } else {
            cli::numbered(&args.output, n)
        }
    };
    let mut written = 0;
    let mut at_deadline = false;
    loop {
        match driver.next(&mut session).await {
            Beat::StopSignal => break,
            Beat::Deadline => {
                at_deadline = true;
                break;
            }
            Beat::Snapshot => {
                written += 1;
                snapshot(&mut session, &numbered(written))?;
            }
            Beat::Refresh => {
                if !crate::refresh_tick(&mut session)? {
                    break;
                }
            }
        }
    }
    match (args.interval, args.duration) {
        // -d 30s --interval 10s: three snapshots, the last at the deadline,
        // whichever of the two timers fired first.
        (Some(every), Some(d)) if at_deadline && d.as_nanos() % every.as_nanos() == 0 => {
            let due = u32::try_from(d.as_nanos() / every.as_nanos()).unwrap_or(u32::MAX);
            if written < due {
                snapshot(&mut session, &numbered(written + 1))?;
            }
        }
        // Otherwise the state at the stop is one more snapshot.
        (Some(_), _) => snapshot(&mut session, &numbered(written + 1))?,
        (None, _) => snapshot(&mut session, &args.output)?,
    }
    Ok(())
}

/// Reads the kernel, waits for every stack to be symbolized, and writes the
/// profile as pprof.
fn snapshot(session: &mut Session, path: &Path) -> Result<()> {
    let profile = session
        .complete_profile()
        .context("reading the kernel's maps")?;
    let bytes = export::render(&profile, Format::Pprof, &export::Options::default())?;
    output::write(path, &bytes, Existing::Replace)?;
    let total = profile.totals();
    eprintln!(
        "allocprof: wrote {} ({} process{}, live {} ± {})",
        path.display(),
        profile.processes.len(),
        if profile.processes.len() == 1 {
            ""
        } else {
            "es"
        },
        human_bytes(total.live_bytes),
        human_ci(total.live_ci95()),
    );
    Ok(())
}

/// Bounds each export's connection, write and read: the last export at a
/// stop signal cannot hold allocprof longer than this.
const PUSH_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn agent(args: AgentArgs) -> Result<()> {
    cli::check_preconditions()?;
    let mut session = crate::start_session_reading(&args.targets, args.otlp_command_line)?;
    let mut driver = Driver::new(args.push_interval.min(REFRESH))
        .with_deadline(args.duration)
        .with_snapshots(Some(args.push_interval))
        .stopped_by_signals()?;
    eprintln!(
        "allocprof: attached {} probe sites; pushing to {} every {}",
        session.attachments(),
        args.otlp_endpoint,
        humantime::format_duration(args.push_interval)
    );
    let (host, bad_attributes) = otlp::resource::HostResource::detect();
    if let Some(e) = bad_attributes {
        eprintln!("allocprof: warning: {e}");
    }
    let mut encoder = otlp::Encoder::with_host(host);
    loop {
        match driver.next(&mut session).await {
            Beat::StopSignal | Beat::Deadline => break,
            Beat::Snapshot => push(&mut session, &mut encoder, &args.otlp_endpoint).await?,
            Beat::Refresh => {
                if !crate::refresh_tick(&mut session)? {
                    break;
                }
            }
        }
    }
    push(&mut session, &mut encoder, &args.otlp_endpoint).await
}

/// One export of the profile as it stands. A failed push is reported and
/// dropped (no retries yet): the kernel keeps counting meanwhile, and the
/// next export's live figures are whole again.
async fn push(session: &mut Session, encoder: &mut otlp::Encoder, endpoint: &str) -> Result<()> {
    let profile = session
        .complete_profile()
        .context("reading the kernel's maps")?;
    let request = otlp::http::request(encoder.encode(&profile, SystemTime::now()));
    let endpoint = endpoint.to_owned();
    let pushed =
        tokio::task::spawn_blocking(move || otlp::http::push(&endpoint, &request, PUSH_TIMEOUT))
            .await
            .context("the export task")?;
    match pushed {
        Ok(accepted) if accepted.rejected_profiles > 0 => eprintln!(
            "allocprof: the collector rejected {} profiles: {}",
            accepted.rejected_profiles,
            // The collector's words: a peer's text, made inert like a target's.
            inert(&accepted.error_message)
        ),
        Ok(_) => {}
        Err(e) => eprintln!("allocprof: export dropped: {}", inert(&e.to_string())),
    }
    Ok(())
}

pub fn diff(args: &DiffArgs) -> Result<()> {
    let format = Format::from(args.format);
    cli::refuse_binary_to_terminal(format, args.output.as_deref());
    let limits = pprof::Limits {
        bytes: args.max_profile_bytes,
        ..Default::default()
    };
    let a = read_pprof(&args.base, &limits)?;
    let b = read_pprof(&args.profile, &limits)?;
    let growth = diff::growth(&a, &b);
    let name = |p: &Path| {
        p.file_name()
            .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into())
    };
    let title = format!(
        "allocprof: growth of {} from {} to {}",
        args.value.describe(),
        name(&args.base),
        name(&args.profile)
    );
    let stacks = growth.processes.iter().flat_map(|p| &p.stacks);
    let grew = stacks
        .clone()
        .filter(|s| s.totals.value(args.value) >= 0.5)
        .count();
    let shrank = stacks
        .filter(|s| s.totals.value(args.value) <= -0.5)
        .count();
    let net = growth.totals().value(args.value);
    let unit = match args.value {
        Quantity::InuseBytes | Quantity::AllocBytes => "bytes",
        Quantity::InuseObjects | Quantity::AllocObjects => "objects",
    };
    eprintln!("{title}: {net:+.0} {unit} net; {grew} stacks grew, {shrank} shrank");
    let shrank_note = match shrank {
        0 => String::new(),
        n => format!("; {n} stacks that shrank are not drawn"),
    };
    let subtitle = format!(
        "{} later; net {}{}; widths proportional to the growth{shrank_note}",
        humantime::format_duration(Duration::from_secs(growth.elapsed.as_secs())),
        if net >= 0.0 { "+" } else { "" },
        svg::quantity(net, args.value),
    );
    let opts = export::Options {
        value: args.value,
        title: Some(title),
        subtitle: Some(subtitle),
        ..Default::default()
    };
    let bytes = export::render(&growth, format, &opts)?;
    match &args.output {
        Some(path) => {
            output::write(path, &bytes, Existing::Replace)?;
            eprintln!("allocprof: wrote {}", path.display());
        }
        None => std::io::stdout()
            .lock()
            .write_all(&bytes)
            .context("writing to stdout")?,
    }
    Ok(())
}

/// Reads at most one byte over the decoder's limit, whatever the file's size.
fn read_pprof(path: &Path, limits: &pprof::Limits) -> Result<Profile> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| {
            f.take(limits.bytes.saturating_add(1))
                .read_to_end(&mut bytes)
        })
        .with_context(|| format!("reading {}", path.display()))?;
    pprof::decode_with(&bytes, limits).with_context(|| format!("reading {}", path.display()))
}

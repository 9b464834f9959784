//! The subcommands: `allocprof record` (pprof files, optionally numbered
//! snapshots), `allocprof diff` (the growth between two of them) and
//! `allocprof agent` (OTLP exports pushed to a collector).

use std::{
    io::{Read, Write},
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime},
};

use allocprof::{
    agent::{
        self,
        config::{Config, Protocol},
        deliver::{self, Sender},
        stats,
    },
    model::profile::Profile,
    model::stats::{Quantity, human_bytes, human_ci},
    output::export::{self, Format, diff, otlp, pprof, svg},
    output::{self, Existing},
    session::Session,
    symbolize::Symbolization,
};
use anyhow::{Context, Result};
use prost::Message;

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

/// How often the exports line is logged, in pushes (and once at exit).
const STATS_EVERY: u64 = 4;
/// How often the agent reads each process's backend statistics and
/// resident size, in pushes.
const MEMORY_FIGURES_EVERY: u32 = 4;
/// The longest the agent waits between looks at every process.
const AGENT_SCAN_EVERY: Duration = Duration::from_secs(15);

pub async fn agent(args: AgentArgs) -> Result<()> {
    limit_malloc_arenas();
    // The configuration first: a wrong variable is named before anything
    // else is tried.
    let flags = agent::config::Flags {
        endpoint: args.otlp_endpoint.clone(),
        protocol: args.otlp.otlp_protocol.as_deref().and_then(Protocol::parse),
        headers: args.otlp.otlp_header.clone(),
    };
    let config = Config::from_env(&flags).context("the OTLP exporter's configuration")?;
    let transport = agent::transport(&config).context("the OTLP exporter")?;
    cli::check_preconditions()?;
    let mut session = crate::start_session_reading(&args.targets, args.otlp_command_line)?;
    if args.no_symbolize {
        session.set_symbolization(Symbolization::Addresses);
    }
    // Every few exports (the exports carry neither backend statistics nor
    // resident sizes; the profile keeps them for its other readers).
    session.set_memory_figures_every(args.push_interval.saturating_mul(MEMORY_FIGURES_EVERY));
    // Processes are looked at again once per export (at most every 15 s).
    session.set_scan_every(args.push_interval.min(AGENT_SCAN_EVERY));
    let mut driver = Driver::new(args.push_interval.min(REFRESH))
        .with_deadline(args.duration)
        .with_snapshots(Some(args.push_interval))
        .stopped_by_signals()?;
    let log: deliver::Log = Arc::new(|line: &str| eprintln!("allocprof: {line}"));
    let sender = Sender::spawn(
        transport,
        usize::try_from(args.otlp.otlp_queue_bytes).unwrap_or(usize::MAX),
        config.timeout,
        log,
    )
    .context("starting the export thread")?;
    eprintln!(
        "allocprof: attached {} probe sites; pushing to {} ({}) every {}",
        session.attachments(),
        config.url,
        config.protocol.name(),
        humantime::format_duration(args.push_interval)
    );
    let (host, bad_attributes) = otlp::resource::HostResource::detect();
    if let Some(e) = bad_attributes {
        eprintln!("allocprof: warning: {e}");
    }
    let mut encoder = otlp::Encoder::with_host(host);
    if args.no_symbolize {
        encoder = encoder.addresses_only();
    }
    let mut cpu = stats::CpuMeter::new();
    let mut pushes = 0u64;
    loop {
        match driver.next(&mut session).await {
            Beat::StopSignal | Beat::Deadline => break,
            Beat::Snapshot => {
                push(&mut session, &mut encoder, &sender)?;
                pushes += 1;
                if pushes.is_multiple_of(STATS_EVERY) {
                    let line = stats::line(&sender.counts(), cpu.percent(), stats::rss_bytes());
                    eprintln!("allocprof: {line}");
                }
            }
            Beat::Refresh => {
                if !crate::refresh_tick(&mut session)? {
                    break;
                }
            }
        }
    }
    push(&mut session, &mut encoder, &sender)?;
    // The last export and what is still queued, for at most one export
    // timeout; what is left then is counted.
    let counts = sender.finish(config.timeout);
    let line = stats::line(&counts, cpu.percent(), stats::rss_bytes());
    eprintln!("allocprof: {line}");
    Ok(())
}

/// glibc gives each thread that allocates concurrently an arena of its own
/// (up to 8 per core), and each keeps what it once held: the agent's reader,
/// symbolizer, unwind-table and export threads made tens of MiB of its
/// resident memory. Two arenas serve its few threads, which allocate off
/// each other's paths. Before any thread starts.
fn limit_malloc_arenas() {
    // SAFETY: mallopt only sets an allocator parameter; a refused value is
    // ignored (it returns 0) and changes nothing.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// One export of the profile as it stands, queued: the sender thread sends
/// it, profiling goes on.
fn push(session: &mut Session, encoder: &mut otlp::Encoder, sender: &Sender) -> Result<()> {
    let profile = session
        .complete_profile()
        .context("reading the kernel's maps")?;
    let request = agent::request(encoder.encode(&profile, SystemTime::now()));
    sender.enqueue(request.encode_to_vec());
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

//! Developer tasks: `cargo xtask <setup|build|test|demo|bench|ebpf-object|fuzz|soak|otelcol>`.

mod bench_alloc;
mod bench_otlp;
mod bench_peers;
mod bench_pipeline;
mod bench_python;
mod demo;
mod ebpf_object;
mod fuzz;
mod otelcol;
mod packages;
mod setup;
mod shell;
mod soak;
#[cfg(test)]
mod tidy;
mod toolchain;

use std::{path::PathBuf, process::ExitCode};

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "allocprof developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install the eBPF toolchain when missing and check the kernel.
    Setup,
    /// Build everything in release mode.
    Build,
    /// The whole suite: fmt, clippy (host and eBPF), unit and BPF integration tests.
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        cargo_args: Vec<String>,
    },
    /// Build everything, start the demo workload and profile it; `python`:
    /// the tests' Python web service under a steady load instead.
    Demo {
        #[arg(value_parser = ["python"])]
        which: Option<String>,
    },
    /// Benchmarks: `alloc` (allocator overhead), `pipeline` (profiler costs)
    /// `tui` (the live view's key-to-screen latency and CPU), `peers` (wall
    /// time against other allocators and heap profilers), `otlp` (`allocprof
    /// agent` pushing 500 processes' heaps to a real collector) or `python`
    /// (what seeing a CPython process's heap costs, with Python frames).
    Bench {
        #[arg(value_parser = ["alloc", "pipeline", "tui", "peers", "otlp", "python"])]
        which: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Rebuild the committed eBPF object and record the digest of its inputs.
    EbpfObject,
    /// The long soak: system-wide profiling of a churn and a slow leak, its
    /// figures recorded in docs/reliability.md.
    Soak {
        #[arg(long, default_value_t = 60)]
        minutes: u32,
        /// Seconds between the snapshots checked.
        #[arg(long, default_value_t = 60)]
        interval: u32,
    },
    /// Fuzz the parsers of untrusted input (USDT notes and arguments, pprof
    /// files, /proc text) with cargo-fuzz on the pinned nightly.
    Fuzz {
        /// How long to fuzz each target, in seconds.
        #[arg(long, default_value_t = 60)]
        seconds: u32,
        /// The targets to fuzz (stapsdt, usdt_args, pprof, proc_text); all
        /// if none is named.
        targets: Vec<String>,
    },
    /// Build the OpenTelemetry Collector the OTLP tests push to (Go, the
    /// module proxy) into target/otelcol/ unless it is current; print its path.
    Otelcol,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let root = workspace_root();
    if let Command::Setup = cli.command {
        return setup::run(&root, true);
    }
    setup::run(&root, false)?;
    match cli.command {
        Command::Setup => Ok(()),
        Command::Build => shell::cargo(&root, &["build", "--release"]),
        Command::Test { cargo_args } => test(&root, &cargo_args),
        Command::Demo { which: None } => demo::run(&root),
        Command::Demo { which: Some(_) } => demo::python(&root),
        // Synthetic profiles through the view's own code: no packages, no
        // kernel (`profiler-user/src/tui/bench.rs`).
        Command::Bench { which, .. } if which == "tui" => shell::cargo(
            &root,
            &[
                "test",
                "--release",
                "-p",
                "allocprof",
                "--bin",
                "allocprof",
                "tui::bench",
                "--",
                "--ignored",
                "--nocapture",
            ],
        ),
        Command::Bench { which, args } => {
            match packages::ensure_bench_packages().map(|()| which.as_str())? {
                "alloc" => bench_alloc::run(&root, &args),
                "peers" => bench_peers::run(&root, &args),
                "otlp" => bench_otlp::run(&root, &args),
                "python" => bench_python::run(&root, &args),
                _ => bench_pipeline::run(&root, &args),
            }
        }
        Command::EbpfObject => ebpf_object::refresh(&root),
        Command::Fuzz { seconds, targets } => fuzz::run(&root, seconds, &targets),
        Command::Otelcol => {
            println!("{}", otelcol::ensure(&root)?.display());
            Ok(())
        }
        Command::Soak { minutes, interval } => {
            packages::ensure_test_packages()?;
            soak::run(&root, minutes, interval)
        }
    }
}

fn test(root: &std::path::Path, cargo_args: &[String]) -> Result<()> {
    packages::ensure_test_packages()?;
    otelcol::ensure(root)?;
    shell::cargo(root, &["fmt", "--all", "--check"])?;
    shell::cargo(
        root,
        &[
            "clippy",
            "--workspace",
            "--exclude",
            "allocprof-ebpf",
            "--all-targets",
            "--release",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    ebpf_object::clippy(root)?;
    shell::cargo(root, &["build", "--release"])?;
    // The kernel crate only builds for the BPF target (clippy'd above).
    let mut args: Vec<&str> = vec![
        "test",
        "--workspace",
        "--exclude",
        "allocprof-ebpf",
        "--release",
    ];
    args.extend(cargo_args.iter().map(String::as_str));
    shell::cargo(root, &args)
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

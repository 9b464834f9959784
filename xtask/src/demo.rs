//! `cargo xtask demo`: the demo workload under allocprof.

use std::{
    io::IsTerminal,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{Context, Result};

use crate::shell;

/// Builds everything, starts the demo workload and profiles it: in a
/// terminal until you quit, otherwise for ten seconds with a final report.
pub fn run(root: &Path) -> Result<()> {
    shell::cargo(root, &["build", "--release"])?;
    let mut workload = Command::new(root.join("target/release/allocprof-demo"))
        .stdout(Stdio::null())
        .spawn()
        .context("starting the demo workload")?;
    let pid = workload.id().to_string();
    // The workload waits a second before its first allocations; attach early.
    thread::sleep(Duration::from_millis(300));
    let mut args = vec!["--pid", &pid];
    if !std::io::stdout().is_terminal() {
        args.extend(["--duration", "10s"]);
    }
    let profiled = shell::run_cmd(
        Command::new(root.join("target/release/allocprof"))
            .args(&args)
            .current_dir(root),
    );
    let _ = workload.kill();
    let _ = workload.wait();
    profiled
}

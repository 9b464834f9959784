//! `cargo xtask fuzz`: every cargo-fuzz target of `profiler-user/fuzz`, each
//! for a bounded time, on the pinned nightly.

use std::{path::Path, process::Command};

use anyhow::{Result, bail};

use crate::{shell, toolchain};

const CARGO_FUZZ_VERSION: &str = "0.13.2";
pub const TARGETS: &[&str] = &["stapsdt", "usdt_args", "pprof", "proc_text"];

/// Fuzzes `only` (every target if empty), each for `seconds`.
pub fn run(root: &Path, seconds: u32, only: &[String]) -> Result<()> {
    if let Some(unknown) = only.iter().find(|t| !TARGETS.contains(&t.as_str())) {
        bail!(
            "no fuzz target {unknown}; the targets are {}",
            TARGETS.join(", ")
        );
    }
    ensure_cargo_fuzz(root)?;
    let plus = toolchain::plus(&toolchain::nightly(root)?);
    let max_time = format!("-max_total_time={seconds}");
    let chosen = TARGETS
        .iter()
        .filter(|t| only.is_empty() || only.iter().any(|o| o == *t));
    for target in chosen {
        shell::run(
            &root.join("profiler-user"),
            "cargo",
            &[&plus, "fuzz", "run", target, "--", &max_time],
        )?;
    }
    Ok(())
}

fn ensure_cargo_fuzz(root: &Path) -> Result<()> {
    let want = format!("cargo-fuzz {CARGO_FUZZ_VERSION}");
    let have = Command::new("cargo").args(["fuzz", "--version"]).output();
    if have.is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains(&want)) {
        return Ok(());
    }
    shell::cargo(
        root,
        &[
            "install",
            "--locked",
            &format!("cargo-fuzz@{CARGO_FUZZ_VERSION}"),
        ],
    )
}

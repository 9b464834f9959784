//! `cargo xtask fuzz`: every cargo-fuzz target of `profiler-user/fuzz`, each
//! for a bounded time, on the pinned nightly.

use std::{path::Path, process::Command};

use anyhow::Result;

use crate::{shell, toolchain};

const CARGO_FUZZ_VERSION: &str = "0.13.2";
const TARGETS: &[&str] = &["stapsdt", "usdt_args"];

pub fn run(root: &Path, seconds: u32) -> Result<()> {
    ensure_cargo_fuzz(root)?;
    let plus = toolchain::plus(&toolchain::nightly(root)?);
    let max_time = format!("-max_total_time={seconds}");
    for target in TARGETS {
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

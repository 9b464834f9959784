//! Running commands with their output shown and failures named.

use std::{path::Path, process::Command};

use anyhow::{Context, Result, bail};

/// Runs a command in `dir`, failing with the command line if it fails.
pub fn run(dir: &Path, program: &str, args: &[&str]) -> Result<()> {
    run_cmd(Command::new(program).args(args).current_dir(dir))
}

pub fn run_cmd(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {}", display(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {}", display(cmd)))?;
    if !status.success() {
        bail!("{} failed: {status}", display(cmd));
    }
    Ok(())
}

pub fn cargo(dir: &Path, args: &[&str]) -> Result<()> {
    run(dir, "cargo", args)
}

/// Whether a command runs and exits 0 (its output discarded).
pub fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `cmd` as root: as it is when we are root (there may be no sudo), else via sudo.
pub fn as_root(program: &str, args: &[&str]) -> Command {
    if is_root() {
        let mut cmd = Command::new(program);
        cmd.args(args);
        cmd
    } else {
        let mut cmd = Command::new("sudo");
        cmd.arg(program).args(args);
        cmd
    }
}

fn display(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

//! The pinned eBPF nightly: named once, in `profiler-ebpf/rust-toolchain.toml`,
//! installed exactly (never by updating a channel) and used by every step that
//! needs a nightly.

use std::{fs, path::Path, process::Command};

use anyhow::{Context, Result, bail};

use crate::shell;

/// The toolchain file that names the nightly.
pub const NIGHTLY_FILE: &str = "profiler-ebpf/rust-toolchain.toml";

/// The dated nightly named in [`NIGHTLY_FILE`], e.g. `nightly-2026-05-19`.
pub fn nightly(root: &Path) -> Result<String> {
    let text = fs::read_to_string(root.join(NIGHTLY_FILE))
        .with_context(|| format!("reading {NIGHTLY_FILE}"))?;
    let channel = channel_of(&text).with_context(|| format!("{NIGHTLY_FILE} names no channel"))?;
    if !is_dated_nightly(channel) {
        bail!("{NIGHTLY_FILE} names `{channel}`: pin a dated nightly (nightly-YYYY-MM-DD)");
    }
    Ok(channel.to_owned())
}

/// `cargo +<nightly>`'s first argument.
pub fn plus(nightly: &str) -> String {
    format!("+{nightly}")
}

/// Installs the pinned nightly with rust-src and clippy when any is missing.
/// Installing a dated toolchain never moves another one.
pub fn ensure_nightly(root: &Path) -> Result<String> {
    let nightly = nightly(root)?;
    if has_components(&nightly) {
        return Ok(nightly);
    }
    eprintln!("setup: installing {nightly} with rust-src and clippy (the eBPF toolchain)");
    shell::run(
        root,
        "rustup",
        &[
            "toolchain",
            "install",
            &nightly,
            "--profile",
            "minimal",
            "--component",
            "rust-src,clippy",
            "--no-self-update",
        ],
    )?;
    Ok(nightly)
}

fn has_components(nightly: &str) -> bool {
    let out = Command::new("rustup")
        .args(["component", "list", "--installed", "--toolchain", nightly])
        .output();
    let Ok(out) = out else { return false };
    let installed = String::from_utf8_lossy(&out.stdout);
    out.status.success()
        && ["rust-src", "clippy"]
            .iter()
            .all(|c| installed.lines().any(|l| l.starts_with(c)))
}

/// The `channel = "…"` value of a rust-toolchain.toml.
pub fn channel_of(toolchain_file: &str) -> Option<&str> {
    toolchain_file.lines().find_map(|line| {
        let value = line.trim().strip_prefix("channel")?.trim_start();
        value
            .strip_prefix('=')?
            .trim()
            .strip_prefix('"')?
            .split('"')
            .next()
    })
}

fn is_dated_nightly(channel: &str) -> bool {
    channel.strip_prefix("nightly-").is_some_and(|date| {
        date.len() == 10
            && date.bytes().enumerate().all(|(i, b)| {
                if i == 4 || i == 7 {
                    b == b'-'
                } else {
                    b.is_ascii_digit()
                }
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_nightly_is_dated() {
        let nightly = nightly(&crate::workspace_root()).unwrap();
        assert!(nightly.starts_with("nightly-20"), "{nightly}");
    }

    #[test]
    fn undated_or_malformed_channels_are_refused() {
        for bad in [
            "nightly",
            "stable",
            "nightly-2026-5-19",
            "nightly-2026-05-1x",
            "1.95.0",
        ] {
            assert!(!is_dated_nightly(bad), "{bad}");
        }
        assert!(is_dated_nightly("nightly-2026-05-19"));
    }

    #[test]
    fn channel_is_read_from_a_toolchain_file() {
        let file = "# c\n[toolchain]\nchannel = \"nightly-2026-05-19\"\ncomponents = [\"x\"]\n";
        assert_eq!(channel_of(file), Some("nightly-2026-05-19"));
        assert_eq!(channel_of("[toolchain]\nprofile = \"minimal\"\n"), None);
    }

    #[test]
    fn the_host_toolchain_is_a_pinned_stable_release() {
        let text = fs::read_to_string(crate::workspace_root().join("rust-toolchain.toml")).unwrap();
        let channel = channel_of(&text).expect("rust-toolchain.toml names a channel");
        assert!(
            channel.split('.').count() == 3 && channel.split('.').all(|p| p.parse::<u32>().is_ok()),
            "rust-toolchain.toml must pin a stable release as X.Y.Z, not `{channel}`"
        );
        for component in ["clippy", "rustfmt"] {
            assert!(text.contains(&format!("\"{component}\"")), "{component}");
        }
    }
}

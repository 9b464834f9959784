//! The OpenTelemetry Collector the OTLP tests push to: `xtask/otelcol/` (the
//! OTLP receiver and the file exporter, every module at one release), built
//! with Go into `target/otelcol/` once and rebuilt only when its sources
//! change. Test infrastructure only: the product has no Go in it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use crate::shell;

/// Where the tests look for it (profiler-user/tests/common/otelcol.rs).
pub const BINARY: &str = "target/otelcol/allocprof-otelcol";
/// The digest of the sources it was built from, next to it.
const STAMP: &str = "target/otelcol/sources.sha256";
const SOURCES: &[&str] = &["main.go", "go.mod", "go.sum"];

/// Builds the collector unless the one in `target/otelcol/` was built from
/// the current sources; returns its path.
pub fn ensure(root: &Path) -> Result<PathBuf> {
    let dir = root.join("xtask/otelcol");
    let binary = root.join(BINARY);
    let stamp = root.join(STAMP);
    let digest = sources_digest(&dir)?;
    if binary.exists() && fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == digest) {
        return Ok(binary);
    }
    let go = go_binary();
    eprintln!(
        "setup: building the test OpenTelemetry Collector with {} (a few minutes the first time)",
        go.display()
    );
    fs::create_dir_all(binary.parent().expect("BINARY has a parent"))?;
    // Built beside and renamed: a test running the old one keeps it intact.
    let partial = binary.with_extension("partial");
    let mut cmd = Command::new(&go);
    cmd.current_dir(&dir)
        .args(["build", "-trimpath", "-o"])
        .arg(&partial)
        .arg(".");
    shell::run_cmd(&mut cmd).context(
        "building the test collector needs Go >= 1.26 (/usr/local/go/bin/go or `go` on PATH) \
         and the Go module proxy (GOPROXY) reachable",
    )?;
    fs::rename(&partial, &binary)?;
    fs::write(&stamp, format!("{digest}\n"))?;
    Ok(binary)
}

/// The Go toolchain: Go's own install location first, for Debian's `go` on
/// PATH is too old for the collector's modules.
fn go_binary() -> PathBuf {
    let official = Path::new("/usr/local/go/bin/go");
    if official.exists() {
        official.to_path_buf()
    } else {
        PathBuf::from("go")
    }
}

fn sources_digest(dir: &Path) -> Result<String> {
    let mut hasher = Sha256::new();
    for name in SOURCES {
        let path = dir.join(name);
        let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        hasher.update(name.as_bytes());
        hasher.update(u64::try_from(bytes.len())?.to_le_bytes());
        hasher.update(&bytes);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

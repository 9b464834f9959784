//! The committed eBPF object (`profiler-ebpf/prebuilt/profiler.bpf.o`) lets
//! stable-only users build allocprof. Next to it we record a digest of every
//! input of the kernel build; a test fails when the sources moved on without
//! the object being refreshed (`cargo xtask ebpf-object`).

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use crate::{shell, toolchain};

pub const OBJECT: &str = "profiler-ebpf/prebuilt/profiler.bpf.o";
pub const DIGEST: &str = "profiler-ebpf/prebuilt/inputs.sha256";
/// Directories whose files are inputs of the kernel build.
const INPUT_DIRS: &[&str] = &["profiler-ebpf", "profiler-common"];
/// Lock-file entries that pin the kernel build's dependencies.
const LOCKED_CRATES: &[&str] = &[
    "aya-ebpf",
    "aya-ebpf-bindings",
    "aya-ebpf-cty",
    "aya-ebpf-macros",
];

/// The kernel build's arguments after `cargo +<nightly>`.
const EBPF_BUILD: &[&str] = &[
    "build",
    "--package",
    "allocprof-ebpf",
    "--release",
    "--target",
    "bpfel-unknown-none",
    "-Z",
    "build-std=core",
];

/// Rebuilds the object with the pinned nightly and records its inputs.
pub fn refresh(root: &Path) -> Result<()> {
    let plus = toolchain::plus(&toolchain::nightly(root)?);
    let target_dir = root.join("target/ebpf-object");
    let target_arg = target_dir.to_string_lossy();
    let mut args = vec![plus.as_str()];
    args.extend(EBPF_BUILD);
    args.extend(["--target-dir", &target_arg]);
    let mut cmd = std::process::Command::new("cargo");
    cmd.args(&args).current_dir(root);
    // The same flags aya-build passes, so both builds agree.
    cmd.env(
        "CARGO_ENCODED_RUSTFLAGS",
        "--cfg=bpf_target_arch=\"x86_64\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf",
    );
    shell::run_cmd(&mut cmd)?;
    let built = target_dir.join("bpfel-unknown-none/release/allocprof-ebpf");
    fs::copy(&built, root.join(OBJECT))
        .with_context(|| format!("copying {} to {OBJECT}", built.display()))?;
    fs::write(root.join(DIGEST), format!("{}\n", inputs_digest(root)?))?;
    eprintln!("ebpf-object: refreshed {OBJECT} and {DIGEST}");
    Ok(())
}

/// Clippy on the kernel crate, for its own target, with the pinned nightly.
pub fn clippy(root: &Path) -> Result<()> {
    let plus = toolchain::plus(&toolchain::nightly(root)?);
    let mut args = vec![plus.as_str(), "clippy"];
    args.extend(&EBPF_BUILD[1..]);
    let target_dir = root.join("target/ebpf-clippy");
    let target_arg = target_dir.to_string_lossy();
    args.extend(["--target-dir", &target_arg, "--", "-D", "warnings"]);
    shell::cargo(root, &args)
}

/// SHA-256 over the kernel build's inputs: each file's path and contents, in
/// sorted order, then the pinned lock-file entries.
pub fn inputs_digest(root: &Path) -> Result<String> {
    let mut files = Vec::new();
    for dir in INPUT_DIRS {
        collect_sources(&root.join(dir), &mut files)?;
    }
    files.sort();
    let mut hash = Sha256::new();
    for file in &files {
        let rel = file.strip_prefix(root).unwrap_or(file);
        hash.update(rel.to_string_lossy().as_bytes());
        hash.update([0]);
        hash.update(fs::read(file).with_context(|| format!("reading {}", file.display()))?);
        hash.update([0]);
    }
    let lock = fs::read_to_string(root.join("Cargo.lock")).context("reading Cargo.lock")?;
    for entry in lock.split("\n[[package]]\n") {
        let name = entry.lines().find_map(|l| l.strip_prefix("name = "));
        if name.is_some_and(|n| LOCKED_CRATES.contains(&n.trim_matches('"'))) {
            hash.update(entry.as_bytes());
        }
    }
    Ok(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Source and manifest files below `dir`, skipping the prebuilt output itself.
fn collect_sources(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if path.is_dir() {
            if name != "prebuilt" && name != "target" {
                collect_sources(&path, out)?;
            }
        } else if name.ends_with(".rs") || name == "Cargo.toml" || name == "rust-toolchain.toml" {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        crate::workspace_root()
    }

    #[test]
    fn committed_ebpf_object_is_fresh() {
        let root = root();
        let recorded = fs::read_to_string(root.join(DIGEST))
            .unwrap_or_else(|e| panic!("{DIGEST}: {e}; run `cargo xtask ebpf-object`"));
        let current = inputs_digest(&root).unwrap();
        assert_eq!(
            recorded.trim(),
            current,
            "the committed eBPF object is stale: its inputs changed since it was built; \
             run `cargo xtask ebpf-object` (it rebuilds with {}, pinned in {}) \
             and commit {OBJECT} and {DIGEST}",
            toolchain::nightly(&root).unwrap(),
            toolchain::NIGHTLY_FILE
        );
    }

    #[test]
    fn committed_ebpf_object_holds_the_programs() {
        let data = fs::read(root().join(OBJECT)).unwrap();
        assert_eq!(&data[..4], b"\x7fELF", "{OBJECT} is not an ELF object");
        let text = String::from_utf8_lossy(&data);
        for program in [
            "otel_memory_alloc",
            "otel_memory_free",
            "sched_process_exit",
            "sched_process_exec",
        ] {
            assert!(
                text.contains(program),
                "{OBJECT} lacks the program {program}"
            );
        }
    }

    #[test]
    fn digest_changes_with_an_ebpf_source_or_the_pinned_nightly() {
        // Build a scratch copy of the inputs and edit one source: the digest
        // must move, or the freshness test above could never fail.
        let root = root();
        let scratch = std::env::temp_dir().join(format!("xtask-digest-{}", std::process::id()));
        let _ = fs::remove_dir_all(&scratch);
        for dir in INPUT_DIRS {
            copy_tree(&root.join(dir), &scratch.join(dir));
        }
        fs::copy(root.join("Cargo.lock"), scratch.join("Cargo.lock")).unwrap();
        let before = inputs_digest(&scratch).unwrap();
        let main = scratch.join("profiler-ebpf/src/main.rs");
        let mut text = fs::read_to_string(&main).unwrap();
        text.push_str("\n// an edit\n");
        fs::write(&main, text).unwrap();
        let after_source_edit = inputs_digest(&scratch).unwrap();
        // Moving the pinned nightly also makes the object stale.
        let pin = scratch.join(toolchain::NIGHTLY_FILE);
        let text = fs::read_to_string(&pin).unwrap();
        fs::write(&pin, text.replace("nightly-", "nightly-1")).unwrap();
        let after_pin_edit = inputs_digest(&scratch).unwrap();
        fs::remove_dir_all(&scratch).unwrap();
        assert_ne!(before, after_source_edit);
        assert_ne!(after_source_edit, after_pin_edit);
    }

    fn copy_tree(from: &Path, to: &Path) {
        fs::create_dir_all(to).unwrap();
        for entry in fs::read_dir(from).unwrap() {
            let path = entry.unwrap().path();
            let dest = to.join(path.file_name().unwrap());
            if path.is_dir() {
                copy_tree(&path, &dest);
            } else {
                fs::copy(&path, &dest).unwrap();
            }
        }
    }
}

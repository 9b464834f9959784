//! Against real CPython interpreters: Debian's `/usr/bin/python3` (3.11),
//! required, and pyenv's 3.11 and later where the machine has them (each
//! test says which it ran).

use std::{path::PathBuf, process::Command};

mod code;
mod linetable;

/// The interpreters to test with: `/usr/bin/python3` always (a test fails
/// without it), then pyenv's CPython 3.11 and later.
fn interpreters() -> Vec<PathBuf> {
    let system = PathBuf::from("/usr/bin/python3");
    assert!(
        system.exists(),
        "these tests need CPython at /usr/bin/python3 (Debian's python3 package)"
    );
    let mut found = vec![system];
    if let Ok(dir) = std::fs::read_dir("/root/.pyenv/versions") {
        let mut pyenv: Vec<PathBuf> = dir
            .filter_map(|e| e.ok())
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let mut parts = name.split('.');
                parts.next() == Some("3")
                    && parts
                        .next()
                        .and_then(|m| m.parse::<u32>().ok())
                        .is_some_and(|m| m >= 11)
            })
            .map(|e| e.path().join("bin/python3"))
            .filter(|p| p.exists())
            .collect();
        pyenv.sort();
        found.extend(pyenv);
    }
    found
}

/// Runs `python` on `script` (a file of this directory) and returns its
/// standard output.
fn run_script(python: &PathBuf, script: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("src/python/tests")
        .join(script);
    let out = Command::new(python)
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    assert!(
        out.status.success(),
        "{} {script}: {}",
        python.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

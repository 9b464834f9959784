//! `cargo xtask soak`: the soak test (`profiler-user/tests/soak.rs`) for a
//! long run, and its figures recorded in docs/reliability.md (the table
//! between the `soak:begin`/`soak:end` markers is replaced).

use std::{path::Path, process::Command};

use anyhow::{Context, Result, bail};

const BEGIN: &str = "<!-- soak:begin -->";
const END: &str = "<!-- soak:end -->";
const DOC: &str = "docs/reliability.md";

pub fn run(root: &Path, minutes: u32, interval_seconds: u32) -> Result<()> {
    let seconds = u64::from(minutes) * 60;
    eprintln!("soak: {minutes} min, a snapshot every {interval_seconds} s");
    let out = Command::new("cargo")
        .current_dir(root)
        .args(["test", "--release", "-p", "allocprof", "--test", "soak"])
        .args(["--", "--nocapture", "--test-threads=1"])
        .env("ALLOCPROF_SOAK_SECONDS", seconds.to_string())
        .env("ALLOCPROF_SOAK_INTERVAL", interval_seconds.to_string())
        .output()
        .context("running the soak test")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    print!("{stdout}");
    let table = between_markers(&stdout).context("the soak test printed no table")?;
    if !out.status.success() {
        bail!("the soak test failed (its figures are above; docs not updated)");
    }
    let commit = Command::new("git")
        .current_dir(root)
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let table = table.replacen(
        "Soak of",
        &format!("Soak at commit `{commit}`, `cargo xtask soak --minutes {minutes}`: soak of"),
        1,
    );
    let doc_path = root.join(DOC);
    let doc = std::fs::read_to_string(&doc_path).with_context(|| format!("reading {DOC}"))?;
    std::fs::write(&doc_path, replace_table(&doc, &table))
        .with_context(|| format!("writing {DOC}"))?;
    eprintln!("soak: figures recorded in {DOC}");
    Ok(())
}

/// The text from the begin marker through the end marker.
fn between_markers(text: &str) -> Option<&str> {
    let start = text.find(BEGIN)?;
    let end = text[start..].find(END)? + start + END.len();
    Some(&text[start..end])
}

/// `doc` with its soak table replaced by `table` (appended if it has none).
fn replace_table(doc: &str, table: &str) -> String {
    match between_markers(doc) {
        Some(old) => doc.replacen(old, table, 1),
        None => format!("{}\n\n## Soak\n{table}\n", doc.trim_end()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_replaced_in_place_or_appended() {
        let table = format!("{BEGIN}\nnew\n{END}");
        let doc = format!("# R\nbefore\n{BEGIN}\nold\n{END}\nafter\n");
        assert_eq!(
            replace_table(&doc, &table),
            format!("# R\nbefore\n{BEGIN}\nnew\n{END}\nafter\n")
        );
        assert_eq!(
            replace_table("# R\n", &table),
            format!("# R\n\n## Soak\n{table}\n")
        );
        assert_eq!(between_markers("no table"), None);
    }
}

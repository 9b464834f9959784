//! The `e` key: the TUI hands the current view, as a profile restricted to
//! it, to an exporter the binary injects (so the export format follows the
//! command line), and shows where it went.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use super::rows::Grouping;
use allocprof::{
    model::profile::{ProcessKey, Profile},
    model::stats::Quantity,
    output::export::{self, Format},
    output::{self, Existing},
};

/// Which part of the profile the exported view is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ViewSelection {
    /// The process the view is restricted to; `None`: all processes.
    pub process: Option<ProcessKey>,
    /// That process's name, as the target set it (not yet file-safe).
    pub name: Option<String>,
    /// The search the stacks were filtered by, lowercase.
    pub filter: Option<String>,
    /// How the stack view grouped them (`None`: the process view).
    pub grouping: Option<Grouping>,
    /// The profile is the growth since the baseline marked at this time.
    pub since: Option<Duration>,
}

/// Writes a (view-restricted) profile somewhere and says where.
pub type Exporter = Box<dyn Fn(&Profile, &ViewSelection) -> anyhow::Result<PathBuf>>;

/// Writes each export in `format` to a new file in `dir`, named after the
/// process and the time (`allocprof-python3-1234-2026-11-25T10-31-02Z.svg`,
/// `fresh_path`). The text report is what the TUI already shows, so for it
/// (no `--format` given) the key writes a flamegraph.
pub fn file_exporter(format: Format, options: export::Options, dir: PathBuf) -> Exporter {
    let format = match format {
        Format::Report => Format::Svg,
        other => other,
    };
    Box::new(move |profile, selection| {
        let path = fresh_path(&dir, selection, format.extension(), SystemTime::now());
        let mut options = options.clone();
        if let Some(at) = selection.since {
            let value = options.value;
            options.title = Some(format!(
                "allocprof: growth of {} since the baseline",
                value.describe()
            ));
            options.subtitle = Some(growth_subtitle(profile, value, at));
        }
        let bytes = export::render(profile, format, &options)?;
        output::write(&path, &bytes, Existing::Keep)?;
        Ok(path)
    })
}

fn growth_subtitle(profile: &Profile, value: Quantity, at: Duration) -> String {
    let net = profile.totals().value(value);
    format!(
        "from {} to {} after start; net {}{}; widths proportional to the growth, \
         stacks that shrank not drawn",
        humantime::format_duration(Duration::from_secs(at.as_secs())),
        humantime::format_duration(Duration::from_secs((at + profile.elapsed).as_secs())),
        if net >= 0.0 { "+" } else { "" },
        export::svg::quantity(net, value),
    )
}

/// A path in `dir` for a new export, never an existing file (two exports
/// within a second must not overwrite each other): `allocprof-`, the
/// process's name made file-safe and its pid when the view is one
/// process's, and the time `now` in ISO 8601 (UTC; `-` for `:`, which
/// some file systems refuse).
pub fn fresh_path(
    dir: &Path,
    selection: &ViewSelection,
    extension: &str,
    now: SystemTime,
) -> PathBuf {
    let time = humantime::format_rfc3339_seconds(now)
        .to_string()
        .replace(':', "-");
    let stem = match (selection.process, &selection.name) {
        (Some(key), Some(name)) if !file_safe(name).is_empty() => {
            format!("allocprof-{}-{}-{time}", file_safe(name), key.pid)
        }
        (Some(key), _) => format!("allocprof-{}-{time}", key.pid),
        (None, _) => format!("allocprof-{time}"),
    };
    let mut path = dir.join(format!("{stem}.{extension}"));
    let mut n = 2;
    while path.exists() {
        path = dir.join(format!("{stem}-{n}.{extension}"));
        n += 1;
    }
    path
}

/// A name the target chose, fit for a file name and inert anywhere:
/// letters, digits, `.`, `_`, `+` and `-` kept (no leading `.` or `-`),
/// anything else `_`, at most 32 characters.
fn file_safe(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(32)
        .collect();
    safe.trim_start_matches(['.', '-']).to_string()
}

#[cfg(test)]
mod tests;

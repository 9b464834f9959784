//! The `e` key: the TUI hands the current view, as a profile restricted to
//! it, to an exporter the binary injects (so the export format follows the
//! command line), and shows where it went.

use std::{
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use allocprof::{
    export::{self, Format},
    output::{self, Existing},
    profile::{ProcessKey, Profile},
};

/// Which part of the profile the exported view is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ViewSelection {
    /// The process the view is restricted to; `None`: all processes.
    pub process: Option<ProcessKey>,
    /// The search the stacks were filtered by, lowercase.
    pub filter: Option<String>,
}

/// Writes a (view-restricted) profile somewhere and says where.
pub type Exporter = Box<dyn Fn(&Profile, &ViewSelection) -> anyhow::Result<PathBuf>>;

/// Writes each export in `format` to a new file
/// `allocprof-<unix time>[-<pid>].<extension>` in `dir`. The text report
/// is what the TUI already shows, so for it the key writes folded stacks.
pub fn file_exporter(format: Format, options: export::Options, dir: PathBuf) -> Exporter {
    let format = match format {
        Format::Report => Format::Collapsed,
        other => other,
    };
    Box::new(move |profile, selection| {
        let path = fresh_path(&dir, selection, format.extension());
        let bytes = export::render(profile, format, &options)?;
        output::write(&path, &bytes, Existing::Keep)?;
        Ok(path)
    })
}

/// A path in `dir` for a new export, never an existing file (two exports
/// within a second must not overwrite each other).
pub fn fresh_path(dir: &Path, selection: &ViewSelection, extension: &str) -> PathBuf {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let stem = match selection.process {
        Some(key) => format!("allocprof-{secs}-{}", key.pid),
        None => format!("allocprof-{secs}"),
    };
    let mut path = dir.join(format!("{stem}.{extension}"));
    let mut n = 2;
    while path.exists() {
        path = dir.join(format!("{stem}-{n}.{extension}"));
        n += 1;
    }
    path
}

#[cfg(test)]
mod tests {
    use allocprof::stats::Quantity;

    use super::*;
    use crate::tui::rows::tests::{process, profile};

    /// Folded stacks weighted by `value`.
    fn collapsed_exporter(value: Quantity, dir: PathBuf) -> Exporter {
        let options = export::Options {
            value,
            ..Default::default()
        };
        file_exporter(Format::Collapsed, options, dir)
    }

    #[test]
    fn exports_folded_stacks_to_fresh_files() {
        let dir = std::env::temp_dir().join(format!("allocprof-tui-export-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let export = collapsed_exporter(Quantity::InuseBytes, dir.clone());
        let p = profile(
            1,
            vec![process(7, "w", &[(&["leaf", "main"], 100.0, 100.0)])],
        );
        let selection = ViewSelection {
            process: Some(ProcessKey {
                pid: 7,
                generation: 0,
            }),
            filter: None,
        };
        let first = export(&p, &selection).unwrap();
        let second = export(&p, &selection).unwrap();
        assert_ne!(first, second);
        assert!(first.starts_with(&dir));
        assert!(first.to_string_lossy().ends_with("-7.folded"), "{first:?}");
        assert_eq!(
            std::fs::read_to_string(&second).unwrap(),
            "w (7);main;leaf 100\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

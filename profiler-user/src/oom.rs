//! The OOM flight recorder: when the kernel's OOM killer kills a profiled
//! process (`oom:mark_victim`), its frozen image is the heap it had then;
//! that image is written once, as pprof and the text report, into
//! `--oom-dir`, keeping the newest `--oom-keep` (the oldest go first, so
//! a service left running uses bounded disk).

use std::{
    fs,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result};

use crate::{
    model::profile::{ProcessProfile, Profile},
    output::export::pprof,
    output::report::{self, ReportOptions},
    output::{self, Existing},
};

/// Profiles kept by default.
pub const DEFAULT_KEEP: usize = 20;
/// Every file the recorder writes starts so: pruning touches nothing else.
const PREFIX: &str = "oom-";

pub struct OomRecorder {
    dir: PathBuf,
    keep: usize,
}

impl OomRecorder {
    /// Records into `dir` (checked writable now, not at the first kill).
    pub fn new(dir: &Path, keep: usize) -> Result<OomRecorder> {
        if !dir.is_dir() {
            anyhow::bail!("--oom-dir {}: no such directory", dir.display());
        }
        output::check_writable(&dir.join(format!("{PREFIX}check")))?;
        Ok(OomRecorder {
            dir: dir.to_path_buf(),
            keep: keep.max(1),
        })
    }

    /// Writes `victims`, images the OOM killer killed, each once (the
    /// session says which are new: a pid, even a pid and generation, may
    /// be another process's by the next kill), with `profile`'s context;
    /// returns the files written.
    pub fn record(
        &mut self,
        profile: &Profile,
        victims: &[ProcessProfile],
    ) -> Result<Vec<PathBuf>> {
        let mut files = Vec::new();
        for p in victims {
            let one = Profile {
                processes: vec![p.clone()],
                ..profile.clone()
            };
            let now = SystemTime::now();
            let mut stem = format!(
                "{PREFIX}{}-{}-{}",
                file_safe(&p.name),
                p.key.pid,
                humantime::format_rfc3339_seconds(now)
            );
            // Another victim of that pid within the second keeps its files.
            let taken = |stem: &str| {
                self.dir
                    .join(format!("{stem}.pb.gz"))
                    .symlink_metadata()
                    .is_ok()
            };
            if taken(&stem) {
                let base = stem.clone();
                stem = (2..)
                    .map(|n| format!("{base}-{n}"))
                    .find(|s| !taken(s))
                    .expect("a free name");
            }
            let nanos = now
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64);
            let pb = self.dir.join(format!("{stem}.pb.gz"));
            output::write(&pb, &pprof::render(&one, nanos), Existing::Replace)?;
            let txt = self.dir.join(format!("{stem}.txt"));
            let text = report::render(&one, ReportOptions::default());
            output::write(&txt, text.as_bytes(), Existing::Replace)?;
            files.extend([pb, txt]);
        }
        if !files.is_empty() {
            self.prune()?;
        }
        Ok(files)
    }

    /// Keeps the newest `keep` profiles (two files each).
    fn prune(&self) -> Result<()> {
        let mut ours: Vec<(SystemTime, PathBuf)> = Vec::new();
        for entry in fs::read_dir(&self.dir)
            .with_context(|| format!("listing {}", self.dir.display()))?
            .flatten()
        {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !name.starts_with(PREFIX) || !(name.ends_with(".pb.gz") || name.ends_with(".txt")) {
                continue;
            }
            // Not followed: a planted symlink is ours to remove, not its target.
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            ours.push((meta.modified().unwrap_or(UNIX_EPOCH), entry.path()));
        }
        ours.sort();
        let excess = ours.len().saturating_sub(2 * self.keep);
        for (_, path) in ours.into_iter().take(excess) {
            let _ = fs::remove_file(path);
        }
        Ok(())
    }
}

/// A process name as a file-name part: target-controlled, so only
/// `[A-Za-z0-9._-]` pass (the rest become `_`), at most 32 of them.
fn file_safe(name: &str) -> String {
    let safe: String = name
        .chars()
        .take(32)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.is_empty() || safe.starts_with('.') {
        format!("_{safe}")
    } else {
        safe
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::profile::{ProcessKey, ProcessState, StackProfile},
        model::stats::Totals,
        symbolize::Frame,
    };

    fn killed(pid: u32, name: &str) -> ProcessProfile {
        let stack = StackProfile {
            frames: vec![Frame::named("grow_site")].into(),
            totals: Totals {
                live_bytes: 1e6,
                live_samples: 3,
                ..Totals::default()
            },
        };
        let mut p = ProcessProfile::from_stacks(
            ProcessKey {
                pid: crate::ids::Pid(pid),
                generation: 0,
            },
            name.into(),
            ProcessState::OomKilled,
            4096,
            vec![stack],
        );
        p.state = ProcessState::OomKilled;
        p
    }

    #[test]
    fn each_victim_is_written_once_and_the_oldest_go_past_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = OomRecorder::new(dir.path(), 2).unwrap();
        let profile = Profile::default();
        for pid in 1..=3 {
            let files = r
                .record(&profile, &[killed(pid, "a/../b\u{1b}[2J")])
                .unwrap();
            assert_eq!(files.len(), 2, "only the new victim");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 4, "two profiles kept: {names:?}");
        assert!(
            names.iter().all(|n| n.starts_with("oom-a_.._b__2J-")),
            "{names:?}"
        );
        assert!(
            !names.iter().any(|n| n.contains("-1-")),
            "the oldest went: {names:?}"
        );
        let txt = names.iter().find(|n| n.ends_with(".txt")).unwrap();
        let text = fs::read_to_string(dir.path().join(txt)).unwrap();
        assert!(
            text.contains("grow_site") && text.contains("oom-killed"),
            "{text}"
        );
    }

    #[test]
    fn victims_that_reuse_a_pid_within_a_second_each_keep_their_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = OomRecorder::new(dir.path(), 10).unwrap();
        let (first, mut second) = (killed(7, "grow"), killed(7, "grow"));
        second.stacks[0].totals.live_bytes = 2e6;
        second.totals.live_bytes = 2e6;
        let a = r.record(&Profile::default(), &[first]).unwrap();
        let b = r.record(&Profile::default(), &[second]).unwrap();
        assert_eq!(a.len() + b.len(), 4, "{a:?} {b:?}");
        for f in a.iter().chain(&b) {
            assert!(f.exists(), "{f:?}");
        }
        assert_ne!(a[0], b[0]);
    }

    #[test]
    fn a_missing_directory_is_refused_before_profiling() {
        let err = OomRecorder::new(Path::new("/nonexistent/oom"), 2)
            .err()
            .unwrap();
        assert!(err.to_string().contains("no such directory"), "{err}");
    }
}

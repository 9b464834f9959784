//! Finding the `otel_memory` probes: which files a process maps, and which of
//! those files carry the probes. Files are cached by identity (device, inode,
//! mtime), so rescans of many processes read each library once.

use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::{
    kernel::{ProbeKind, ProbeSite},
    usdt::{self, NoteError},
};

/// The provider of the memory-profiling probe contract.
pub const PROVIDER: &str = "otel_memory";

/// Identity of a file on disk, independent of the path it was reached by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

/// A file that carries `otel_memory` probes.
#[derive(Debug)]
pub struct ProbeFile {
    pub id: FileId,
    /// A path that opens the file from our mount namespace.
    pub path: PathBuf,
    /// The path as the process sees it (for messages).
    pub display: PathBuf,
    pub sites: Vec<ProbeSite>,
    /// Probes of the provider that cannot be attached, with the reason.
    pub problems: Vec<String>,
}

/// Reads the `otel_memory` probe sites of one ELF file.
pub fn probe_sites(path: &Path) -> Result<(Vec<ProbeSite>, Vec<String>), NoteError> {
    let mut sites = Vec::new();
    let mut problems = Vec::new();
    for probe in usdt::probes_in_file(path)? {
        if probe.provider != PROVIDER {
            continue;
        }
        let Some(kind) = ProbeKind::from_name(&probe.name) else {
            continue;
        };
        let located = probe.file_offset.map_err(|e| e.to_string());
        let spec = probe.spec().map_err(|e| e.to_string());
        match (located, spec) {
            (Ok(file_offset), Ok(spec)) => sites.push(ProbeSite {
                kind,
                file_offset,
                spec,
            }),
            (Err(e), _) | (_, Err(e)) => {
                problems.push(format!("{PROVIDER}:{} at {:#x}: {e}", probe.name, probe.pc))
            }
        }
    }
    Ok((sites, problems))
}

/// The files mapped by a process, as (openable path, path the process sees).
/// The executable comes first.
pub fn mapped_files(pid: u32) -> std::io::Result<Vec<(PathBuf, PathBuf)>> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let mut seen = Vec::<PathBuf>::new();
    if let Ok(exe) = fs::read_link(format!("/proc/{pid}/exe")) {
        seen.push(exe);
    }
    for line in maps.lines() {
        // address perms offset dev inode path
        let Some(path) = line.splitn(6, ' ').nth(5).map(str::trim_start) else {
            continue;
        };
        if !path.starts_with('/') || path.ends_with(" (deleted)") {
            continue;
        }
        let path = PathBuf::from(path);
        if !seen.contains(&path) {
            seen.push(path);
        }
    }
    Ok(seen
        .into_iter()
        .map(|p| (root.join(p.strip_prefix("/").unwrap_or(&p)), p))
        .collect())
}

/// Every process id in /proc.
pub fn all_pids() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// Caches which files carry probes.
#[derive(Default)]
pub struct Scanner {
    files: HashMap<(FileId, i64), Option<Arc<ProbeFile>>>,
}

impl Scanner {
    /// The probe-carrying files a process maps (empty if none).
    pub fn probe_files(&mut self, pid: u32) -> std::io::Result<Vec<Arc<ProbeFile>>> {
        let mut found = Vec::new();
        for (path, display) in mapped_files(pid)? {
            if let Some(file) = self.file(&path, &display) {
                found.push(file);
            }
        }
        Ok(found)
    }

    fn file(&mut self, path: &Path, display: &Path) -> Option<Arc<ProbeFile>> {
        let meta = fs::metadata(path).ok()?;
        if !meta.is_file() {
            return None;
        }
        let id = FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        self.files
            .entry((id, meta.mtime()))
            .or_insert_with(|| {
                // Unreadable or not ELF: simply not a probe carrier.
                let (sites, problems) = probe_sites(path).ok()?;
                if sites.is_empty() && problems.is_empty() {
                    return None;
                }
                Some(Arc::new(ProbeFile {
                    id,
                    path: path.to_path_buf(),
                    display: display.to_path_buf(),
                    sites,
                    problems,
                }))
            })
            .clone()
    }
}

/// The name of a process (its `comm`), if it still exists.
pub fn process_name(pid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// Whether a process exists (and is not a zombie).
pub fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised comm, which may contain spaces.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// The sampling rate a process runs with: its `ALLOCPROF_RATE`, read as the
/// allocator reads it (absent or malformed means the default).
pub fn sampling_rate(pid: u32) -> u64 {
    use profiler_common::rate::{DEFAULT_RATE, parse_rate};
    let Ok(environ) = fs::read(format!("/proc/{pid}/environ")) else {
        return DEFAULT_RATE;
    };
    environ
        .split(|&b| b == 0)
        .find_map(|var| var.strip_prefix(b"ALLOCPROF_RATE="))
        .and_then(|value| parse_rate(value).ok())
        .unwrap_or(DEFAULT_RATE)
}

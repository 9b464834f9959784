//! Finding the `otel_memory` (and `ddheap`) probes: which files a process maps, and which of
//! those files carry the probes.
//!
//! A target controls what its mappings name, so every mapped file is opened
//! once, through `/proc/PID/map_files/<range>` (or, when that is gone, by its
//! path resolved inside the process's own root), and kept only if its device
//! and inode are those `/proc/PID/maps` shows. That one descriptor is then
//! used to parse the notes, to attach (as `/proc/self/fd/N`) and to
//! symbolize, so nobody can swap the file between the steps. Descriptors are
//! shared by identity (device, inode) across processes while anyone holds
//! them; which files carry probes is cached by identity and mtime, so rescans
//! of many processes read each library once.
//!
//! A process is reached through a live thread: when its main thread called
//! `pthread_exit`, `/proc/PID` reads as a zombie with empty maps while
//! `/proc/PID/task/TID` of the other threads is complete.

use std::{
    collections::HashMap,
    fs::{self, File},
    io::Read,
    os::{
        fd::{AsRawFd, FromRawFd},
        unix::fs::{MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    sync::{Arc, Weak},
};

use profiler_common::UsdtSpec;

pub(crate) use self::process::{all_parents, all_pids, process_name, process_parent};
pub use self::{
    proc_text::*,
    process::{Process, process_alive},
};
pub use crate::ids::FileId;
use crate::{
    ids::{Pid, Tid},
    process::normalize::AddressSpace,
    process::usdt::{self, NoteError},
};

mod proc_text;
mod process;
#[cfg(test)]
mod tests;

/// The provider of the memory-profiling probe contract.
pub(crate) const PROVIDER: &str = "otel_memory";

/// Every provider of the contract allocprof attaches to, with its bit in
/// `ProcCounters::contracts`: `otel_memory` (OpenTelemetry's name, emitted
/// by allocprof's allocator) and `ddheap` (Datadog's heap sampler, before
/// its rename). Their probes take the same arguments.
pub const PROVIDERS: [(&str, u32); 2] = [
    (PROVIDER, profiler_common::CONTRACT_OTEL_MEMORY),
    ("ddheap", profiler_common::CONTRACT_DDHEAP),
];

/// The provider names of a `ProcCounters::contracts` bit set, in
/// [`PROVIDERS`] order.
pub fn contract_names(bits: u64) -> Vec<&'static str> {
    PROVIDERS
        .iter()
        .filter(|(_, bit)| bits & u64::from(*bit) != 0)
        .map(|(name, _)| *name)
        .collect()
}

/// Which of the two probes of the contract a site is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    Alloc,
    Free,
    /// `mmap(addr, size)` / `munmap(addr, size)`: memory the emitter maps
    /// on its own account, beside the heap (OpenTelemetry's design).
    Mmap,
    Munmap,
}

impl ProbeKind {
    pub const ALL: [ProbeKind; 4] = [
        ProbeKind::Alloc,
        ProbeKind::Free,
        ProbeKind::Mmap,
        ProbeKind::Munmap,
    ];

    pub fn from_name(name: &str) -> Option<ProbeKind> {
        match name {
            "alloc" => Some(ProbeKind::Alloc),
            "free" => Some(ProbeKind::Free),
            "mmap" => Some(ProbeKind::Mmap),
            "munmap" => Some(ProbeKind::Munmap),
            _ => None,
        }
    }
}

/// One probe site to attach to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSite {
    pub kind: ProbeKind,
    pub file_offset: u64,
    pub spec: UsdtSpec,
}
/// The most of `/proc/PID/maps` read (65 530 mappings, the default
/// `vm.max_map_count`, of long paths).
const MAX_MAPS_BYTES: u64 = 64 << 20;
/// The most of a small `/proc` file (stat, comm, environ) read.
const MAX_SMALL_BYTES: u64 = 1 << 20;

impl FileId {
    pub fn of(meta: &fs::Metadata) -> FileId {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }

    /// The identity of the file a path names now.
    pub fn of_path(path: &Path) -> std::io::Result<FileId> {
        fs::metadata(path).map(|m| FileId::of(&m))
    }
}

/// A file a process maps, opened once and checked against the mapping.
#[derive(Debug)]
pub struct OpenFile {
    pub id: FileId,
    pub file: File,
    /// The path as the process sees it (for messages and frame modules).
    pub display: PathBuf,
}

impl OpenFile {
    /// A path that opens this very file through our descriptor, for APIs
    /// that take paths (aya's attach, blazesym). Valid while `self` lives.
    pub(crate) fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

impl PartialEq for OpenFile {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for OpenFile {}

impl std::hash::Hash for OpenFile {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

/// A file that carries `otel_memory` or `ddheap` probes.
#[derive(Debug)]
pub struct ProbeFile {
    pub file: Arc<OpenFile>,
    pub sites: Vec<ProbeSite>,
    /// Probes of the provider that cannot be attached, with the reason.
    pub problems: Vec<String>,
    /// File offset of its backend-statistics block (`liballocprof*.so`).
    pub backend_stats: Option<u64>,
    /// File offset of its live-sample ledger's header (`liballocprof*.so`).
    pub ledger: Option<u64>,
}

impl ProbeFile {
    pub fn id(&self) -> FileId {
        self.file.id
    }
}

/// A probe-carrying file named by path in our own mount namespace (to arm
/// it before any process maps it); `Ok(None)` if it carries no probes.
pub(crate) fn probe_file_at(path: &Path) -> std::io::Result<Option<ProbeFile>> {
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let notes = usdt::notes_in_open_file(&file).map_err(std::io::Error::other)?;
    let (backend_stats, ledger) = (notes.backend_stats, notes.ledger);
    let (sites, problems) = sites_of(notes.probes).map_err(std::io::Error::other)?;
    if sites.is_empty() {
        return Ok(None);
    }
    let id = FileId::of(&meta);
    Ok(Some(ProbeFile {
        file: Arc::new(OpenFile {
            id,
            file,
            display: path.to_path_buf(),
        }),
        sites,
        problems,
        backend_stats,
        ledger,
    }))
}

/// Reads the `otel_memory` and `ddheap` probe sites of one ELF file.
pub fn probe_sites(path: &Path) -> Result<(Vec<ProbeSite>, Vec<String>), NoteError> {
    sites_of(usdt::probes_in_file(path)?)
}

/// Reads the `otel_memory` and `ddheap` probe sites of an open ELF file.
pub fn probe_sites_in(file: &File) -> Result<(Vec<ProbeSite>, Vec<String>), NoteError> {
    sites_of(usdt::probes_in_open_file(file)?)
}

fn sites_of(probes: Vec<usdt::UsdtProbe>) -> Result<(Vec<ProbeSite>, Vec<String>), NoteError> {
    let mut sites = Vec::new();
    let mut problems = Vec::new();
    for probe in probes {
        let Some(&(provider, bit)) = PROVIDERS.iter().find(|(p, _)| *p == probe.provider) else {
            continue;
        };
        let Some(kind) = ProbeKind::from_name(&probe.name) else {
            continue;
        };
        let located = probe.file_offset.map_err(|e| e.to_string());
        let spec = probe.spec().map_err(|e| e.to_string());
        match (located, spec) {
            (Ok(file_offset), Ok(mut spec)) => {
                spec.provider = bit;
                sites.push(ProbeSite {
                    kind,
                    file_offset,
                    spec,
                })
            }
            (Err(e), _) | (_, Err(e)) => {
                problems.push(format!("{provider}:{} at {:#x}: {e}", probe.name, probe.pc))
            }
        }
    }
    Ok((sites, problems))
}

/// What one process maps.
pub struct Scan {
    /// A live thread of it (for per-process attachments: perf events
    /// follow a thread, and an exited main thread takes them along).
    pub tid: Tid,
    /// Its probe-carrying files.
    pub probes: Vec<Arc<ProbeFile>>,
    /// Its address space, each mapping with the file opened for it.
    pub space: AddressSpace,
}

/// Caches which files carry probes and shares open files by identity.
#[derive(Default)]
pub struct Scanner {
    open: HashMap<FileId, Weak<OpenFile>>,
    probes: HashMap<(FileId, i64, i64), Option<Arc<ProbeFile>>>,
}

impl Scanner {
    /// Opens and examines every file a process maps. `Err` when it is gone.
    pub fn scan(&mut self, pid: Pid) -> std::io::Result<Scan> {
        let gone = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let process = Process::find(pid).ok_or_else(gone)?;
        let maps = process.maps()?;
        let mut files: HashMap<FileId, Option<Arc<OpenFile>>> = HashMap::new();
        let mut probes = Vec::new();
        for entry in maps.iter().filter(|e| e.is_file()) {
            if files.contains_key(&entry.id()) {
                continue;
            }
            let file = self.open(&process, entry);
            if let Some(file) = &file
                && let Some(probe) = self.probe_file(file)
            {
                probes.push(probe);
            }
            files.insert(entry.id(), file);
        }
        self.open.retain(|_, f| f.strong_count() > 0);
        let space = AddressSpace::from_maps(&maps, |e| files.get(&e.id()).cloned().flatten());
        Ok(Scan {
            tid: process.tid,
            probes,
            space,
        })
    }

    /// The probe-carrying files a process maps (empty if none).
    pub fn probe_files(&mut self, pid: Pid) -> std::io::Result<Vec<Arc<ProbeFile>>> {
        Ok(self.scan(pid)?.probes)
    }

    /// The file of a mapping: one we hold already (a held descriptor pins
    /// the inode, so the identity cannot have been reused), or opened now.
    fn open(&mut self, process: &Process, entry: &MapsEntry) -> Option<Arc<OpenFile>> {
        if let Some(file) = self.open.get(&entry.id()).and_then(Weak::upgrade) {
            return Some(file);
        }
        let file = Arc::new(OpenFile {
            id: entry.id(),
            file: process.open_mapped(entry)?,
            display: PathBuf::from(&entry.path),
        });
        self.open.insert(file.id, Arc::downgrade(&file));
        Some(file)
    }

    fn probe_file(&mut self, file: &Arc<OpenFile>) -> Option<Arc<ProbeFile>> {
        let meta = file.file.metadata().ok()?;
        self.probes
            .entry((file.id, meta.mtime(), meta.mtime_nsec()))
            .or_insert_with(|| {
                // Unreadable or not ELF: simply not a probe carrier.
                let notes = usdt::notes_in_open_file(&file.file).ok()?;
                let (backend_stats, ledger) = (notes.backend_stats, notes.ledger);
                let (sites, problems) = sites_of(notes.probes).ok()?;
                if sites.is_empty() && problems.is_empty() {
                    return None;
                }
                Some(Arc::new(ProbeFile {
                    file: file.clone(),
                    sites,
                    problems,
                    backend_stats,
                    ledger,
                }))
            })
            .clone()
    }
}

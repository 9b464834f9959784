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

use crate::{
    normalize::AddressSpace,
    usdt::{self, NoteError},
};

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

/// Identity of a file on disk, independent of the path it was reached by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

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

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapsEntry {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// The device as `st_dev` encodes it.
    pub dev: u64,
    pub inode: u64,
    /// The path, without a ` (deleted)` suffix; empty for anonymous memory.
    pub path: String,
    pub deleted: bool,
    /// Mapped executable (`x` in the permissions): code a pc can be in.
    pub executable: bool,
    /// Mapped writable (`w`): a data segment.
    pub writable: bool,
}

impl MapsEntry {
    /// A mapping of a file (not anonymous memory, a stack, the vdso...).
    pub(crate) fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }

    pub fn id(&self) -> FileId {
        FileId {
            dev: self.dev,
            ino: self.inode,
        }
    }
}

/// Parses the text of `/proc/PID/maps`; malformed lines are skipped.
pub fn parse_maps(maps: &str) -> Vec<MapsEntry> {
    maps.lines().filter_map(parse_maps_line).collect()
}

fn parse_maps_line(line: &str) -> Option<MapsEntry> {
    // address perms offset dev inode path
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let inode = fields.next()?.parse().ok()?;
    let path = fields.next().map(str::trim_start).unwrap_or("");
    let (start, end) = range.split_once('-')?;
    let (path, deleted) = match path.strip_suffix(" (deleted)") {
        Some(p) => (p, true),
        None => (path, false),
    };
    Some(MapsEntry {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset,
        dev: libc::makedev(
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ),
        inode,
        path: path.to_string(),
        deleted,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        writable: perms.as_bytes().get(1) == Some(&b'w'),
    })
}

/// [`parse_maps`] of `text`, read up to `limit` bytes: a last line cut off
/// there is dropped (a partial line could parse as another range).
#[doc(hidden)] // public for the fuzz crate
pub fn parse_maps_read(mut text: Vec<u8>, limit: u64) -> Vec<MapsEntry> {
    if text.len() as u64 >= limit {
        let whole = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        text.truncate(whole);
    }
    parse_maps(&String::from_utf8_lossy(&text))
}

/// A process name from the bytes of `/proc/PID/comm`.
#[doc(hidden)] // public for the fuzz crate
pub fn parse_comm(comm: &[u8]) -> String {
    String::from_utf8_lossy(comm).trim_end().to_string()
}

/// The `ALLOCPROF_RATE` of a `/proc/PID/environ` (NUL-separated), read as
/// the allocator reads it: absent or malformed means the default.
#[doc(hidden)] // public for the fuzz crate
pub fn rate_in_environ(environ: &[u8]) -> u64 {
    use profiler_common::rate::{DEFAULT_RATE, parse_rate};
    environ
        .split(|&b| b == 0)
        .find_map(|var| var.strip_prefix(b"ALLOCPROF_RATE="))
        .and_then(|value| parse_rate(value).ok())
        .unwrap_or(DEFAULT_RATE)
}

/// The effective capabilities (`CapEff:`) in the text of `/proc/PID/status`;
/// none if the line is missing or malformed.
pub fn effective_caps(status: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

/// What a process has resident, by kind (`/proc/PID/status`), in bytes:
/// the heap lives in anonymous memory, next to the rest of it (allocator
/// overhead, fragmentation, memory not from malloc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resident {
    pub anon: u64,
    pub file: u64,
    pub shmem: u64,
}

/// The `RssAnon:`, `RssFile:` and `RssShmem:` lines of `/proc/PID/status`
/// (kB); none if any is missing or malformed (kernel threads have none).
pub fn parse_resident(status: &str) -> Option<Resident> {
    let kib = |name: &str| -> Option<u64> {
        let value = status.lines().find_map(|l| l.strip_prefix(name))?;
        let n = value
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse::<u64>()
            .ok()?;
        n.checked_mul(1024)
    };
    Some(Resident {
        anon: kib("RssAnon:")?,
        file: kib("RssFile:")?,
        shmem: kib("RssShmem:")?,
    })
}

/// The size of a process's executable mappings, `VmExe:` plus `VmLib:` of
/// `/proc/PID/status` (kB): a dlopen or dlclose changes it. None if either
/// is missing or malformed.
pub fn parse_code_size(status: &str) -> Option<u64> {
    let kib = |name: &str| -> Option<u64> {
        let value = status.lines().find_map(|l| l.strip_prefix(name))?;
        value.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()
    };
    kib("VmExe:")?.checked_add(kib("VmLib:")?)
}

/// Reads at most `limit` bytes of a file.
fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut data = Vec::new();
    File::open(path)?.take(limit).read_to_end(&mut data)?;
    Ok(data)
}

fn read_string(path: &Path, limit: u64) -> std::io::Result<String> {
    read_bounded(path, limit).map(|d| String::from_utf8_lossy(&d).into_owned())
}

/// Whether a `/proc/.../stat` names a task that is not a zombie (or dead).
#[doc(hidden)] // public for the fuzz crate
pub fn stat_is_live(stat: &str) -> bool {
    // The state follows the parenthesised comm, which may contain spaces.
    stat.rsplit_once(") ")
        .is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X']))
}

/// When a task started, from its `/proc/.../stat`: field 22, `starttime`,
/// in clock ticks since boot.
#[doc(hidden)] // public for the fuzz crate
pub fn stat_start_ticks(stat: &str) -> Option<u64> {
    // Fields after the parenthesised comm (which may contain spaces and
    // parentheses): the state is field 3, so starttime is the 20th of them.
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split(' ').nth(19)?.parse().ok()
}

/// A running process, reached through one of its live threads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    /// A live thread: `pid` itself unless the main thread is gone.
    pub tid: u32,
    /// `/proc/PID`, or `/proc/PID/task/TID` when the main thread is gone.
    dir: PathBuf,
    /// When the process started (clock ticks since boot), from its
    /// leader's `stat`, zombie or not.
    started: Option<u64>,
}

impl Process {
    /// The process, if it runs: its main thread, or else any live thread.
    pub fn find(pid: u32) -> Option<Process> {
        let dir = PathBuf::from(format!("/proc/{pid}"));
        let stat = read_string(&dir.join("stat"), MAX_SMALL_BYTES).ok()?;
        let started = stat_start_ticks(&stat);
        if stat_is_live(&stat) {
            return Some(Process {
                pid,
                tid: pid,
                dir,
                started,
            });
        }
        // The leader exited (pthread_exit); the process lives on while
        // another thread does.
        for entry in fs::read_dir(dir.join("task")).ok()? {
            let Some(tid) = entry
                .ok()
                .and_then(|e| e.file_name().to_str()?.parse::<u32>().ok())
            else {
                continue;
            };
            let task = dir.join("task").join(tid.to_string());
            if tid != pid
                && read_string(&task.join("stat"), MAX_SMALL_BYTES)
                    .is_ok_and(|stat| stat_is_live(&stat))
            {
                return Some(Process {
                    pid,
                    tid,
                    dir: task,
                    started,
                });
            }
        }
        None
    }

    /// Its mappings (as many as [`MAX_MAPS_BYTES`] of text hold).
    pub fn maps(&self) -> std::io::Result<Vec<MapsEntry>> {
        let text = read_bounded(&self.dir.join("maps"), MAX_MAPS_BYTES)?;
        Ok(parse_maps_read(text, MAX_MAPS_BYTES))
    }

    /// When it started, in clock ticks since boot (the process's start,
    /// not the live thread's).
    pub fn start_ticks(&self) -> Option<u64> {
        self.started
    }

    /// The live thread its memory is read through (`process_vm_readv` of
    /// the thread-group id fails once the main thread called `pthread_exit`).
    pub fn thread(&self) -> crate::target_memory::LiveThread {
        crate::target_memory::LiveThread::found(self.pid, self.tid, self.started.unwrap_or(0))
    }

    /// What it has resident now.
    pub fn resident(&self) -> Option<Resident> {
        parse_resident(&read_string(&self.dir.join("status"), MAX_SMALL_BYTES).ok()?)
    }

    /// The size of its executable mappings ([`parse_code_size`]).
    pub fn code_size(&self) -> Option<u64> {
        parse_code_size(&read_string(&self.dir.join("status"), MAX_SMALL_BYTES).ok()?)
    }

    /// Its name (`comm`).
    pub fn name(&self) -> Option<String> {
        read_bounded(&self.dir.join("comm"), MAX_SMALL_BYTES)
            .ok()
            .map(|comm| parse_comm(&comm))
    }

    /// The sampling rate it runs with: its `ALLOCPROF_RATE`, read as the
    /// allocator reads it (absent or malformed means the default). Reads
    /// its memory: through `target_memory::TargetMemory` only.
    pub(crate) fn sampling_rate(&self) -> u64 {
        read_bounded(&self.dir.join("environ"), MAX_SMALL_BYTES)
            .map_or(profiler_common::rate::DEFAULT_RATE, |e| rate_in_environ(&e))
    }

    /// Opens the file of a mapping: through `/proc/PID/map_files` (the very
    /// file mapped, even if renamed or deleted), or else by its path inside
    /// the process's root; either way only if it is a regular file whose
    /// device and inode are the mapping's. It is first reached with `O_PATH`
    /// (which opens nothing: a mapped device's driver never sees us), and
    /// opened for reading only once checked.
    fn open_mapped(&self, entry: &MapsEntry) -> Option<File> {
        let by_range = format!(
            "/proc/{}/map_files/{:x}-{:x}",
            self.pid, entry.start, entry.end
        );
        let handle = match fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(by_range)
        {
            Ok(handle) => handle,
            // map_files is per process and empty once the main thread is
            // gone; a deleted file has no path to resolve.
            Err(_) if !entry.deleted => open_in_root(&self.dir.join("root"), &entry.path)?,
            Err(_) => return None,
        };
        let is_mapped = |file: &File| {
            file.metadata()
                .is_ok_and(|m| m.is_file() && m.dev() == entry.dev && m.ino() == entry.inode)
        };
        if !is_mapped(&handle) {
            return None;
        }
        let file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
            .ok()?;
        is_mapped(&file).then_some(file)
    }
}

/// Reaches `path` as seen from `root` (a `/proc/.../root` link), resolving
/// every component inside that root, symlinks and `..` included; an
/// `O_PATH` handle.
fn open_in_root(root: &Path, path: &str) -> Option<File> {
    let root = File::open(root).ok()?;
    let path = std::ffi::CString::new(path.trim_start_matches('/')).ok()?;
    // struct open_how { u64 flags, mode, resolve } (linux/openat2.h).
    let how: [u64; 3] = [
        (libc::O_PATH | libc::O_CLOEXEC) as u64,
        0,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    ];
    // SAFETY: openat2 reads `path` (NUL-terminated) and `how` (of the size
    // passed) during the call only; `root` is an open directory descriptor.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            path.as_ptr(),
            how.as_ptr(),
            size_of_val(&how),
        )
    };
    let fd = i32::try_from(fd).ok().filter(|&fd| fd >= 0)?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Some(unsafe { File::from_raw_fd(fd) })
}

/// Whether a process exists (a live thread of it does).
pub fn process_alive(pid: u32) -> bool {
    Process::find(pid).is_some()
}

/// The name of a process (its `comm`), if it still runs.
pub(crate) fn process_name(pid: u32) -> Option<String> {
    Process::find(pid)?.name()
}

/// Every process id in /proc.
pub(crate) fn all_pids() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// What one process maps.
pub struct Scan {
    /// A live thread of it (for per-process attachments: perf events
    /// follow a thread, and an exited main thread takes them along).
    pub tid: u32,
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
    pub fn scan(&mut self, pid: u32) -> std::io::Result<Scan> {
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
    pub fn probe_files(&mut self, pid: u32) -> std::io::Result<Vec<Arc<ProbeFile>>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_field_22_whatever_the_name_holds() {
        let stat =
            "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 98765 1000 50";
        assert_eq!(stat_start_ticks(stat), Some(98765));
        assert_eq!(stat_start_ticks("4242 (x) S 1 2"), None);
        assert_eq!(stat_start_ticks("garbage"), None);
    }

    #[test]
    fn code_size_is_the_executable_and_its_libraries() {
        let status = "Name:\tx\nVmExe:\t  120 kB\nVmLib:\t   2048 kB\n";
        assert_eq!(parse_code_size(status), Some(2168));
        assert_eq!(parse_code_size("VmExe:\t1 kB\n"), None);
        assert_eq!(parse_code_size("VmExe:\tx kB\nVmLib:\t1 kB\n"), None);
    }

    #[test]
    fn resident_memory_comes_from_the_rss_lines_of_status() {
        let status = "Name:\tx\nVmRSS:\t  120 kB\nRssAnon:\t   100 kB\nRssFile:\t    18 kB\nRssShmem:\t     2 kB\n";
        assert_eq!(
            parse_resident(status),
            Some(Resident {
                anon: 100 << 10,
                file: 18 << 10,
                shmem: 2 << 10
            })
        );
        assert_eq!(
            parse_resident("RssAnon: 1 kB\nRssFile: 2 kB\n"),
            None,
            "no RssShmem"
        );
        assert_eq!(
            parse_resident("RssAnon: x kB\nRssFile: 2 kB\nRssShmem: 0 kB"),
            None
        );
        let huge = format!("RssAnon: {} kB\nRssFile: 0 kB\nRssShmem: 0 kB", u64::MAX);
        assert_eq!(parse_resident(&huge), None, "overflow is malformed");
    }

    #[test]
    fn maps_lines_parse() {
        let maps = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 123 /usr/bin/demo
7f0000000000-7f0000021000 rw-p 00000000 00:00 0 [heap]
7f1000000000-7f1000100000 r-xp 00028000 08:11 456      /usr/lib/a b.so (deleted)
garbage
";
        let entries = parse_maps(maps);
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].dev, libc::makedev(0xfd, 1));
        assert_eq!(entries[0].inode, 123);
        assert!(entries[0].is_file());
        assert!(!entries[1].is_file());
        assert_eq!(entries[2].path, "/usr/lib/a b.so");
        assert!(entries[2].deleted);
        assert_eq!(entries[2].offset, 0x28000);
    }

    #[test]
    fn a_maps_read_cut_at_its_limit_drops_the_partial_line() {
        let text = b"1000-2000 r-xp 0 fd:01 7 /a\n3000-4000 r-xp 0 fd:01 8 /b".to_vec();
        let whole = parse_maps_read(text.clone(), 1 << 20);
        assert_eq!(whole.len(), 2);
        let cut = parse_maps_read(text.clone(), text.len() as u64);
        assert_eq!(cut, whole[..1]);
        assert!(parse_maps_read(b"1000-2000 r-xp 0 fd:01 7 /a".to_vec(), 10).is_empty());
    }

    #[test]
    fn small_proc_files_parse() {
        assert!(stat_is_live("42 (a) b) c) S 1 2"));
        assert!(!stat_is_live("42 (x) Z 1 2"));
        assert!(!stat_is_live("42 (x"));
        assert_eq!(parse_comm(b"demo\n"), "demo");
        assert_eq!(parse_comm(b"\xff\n"), "\u{fffd}");
        assert_eq!(rate_in_environ(b"A=1\0ALLOCPROF_RATE=4096\0"), 4096);
        let default = profiler_common::rate::DEFAULT_RATE;
        assert_eq!(rate_in_environ(b"ALLOCPROF_RATE=lots\0"), default);
        assert_eq!(rate_in_environ(b""), default);
        assert_eq!(
            effective_caps("Name:\tx\nCapEff:\t000001ffffffffff\n"),
            0x1ff_ffff_ffff
        );
        assert_eq!(effective_caps("CapEff:\tzz\n"), 0);
        assert_eq!(effective_caps(""), 0);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Whatever the kernel (or a fuzzer) writes, parsing yields at most
        /// one entry per line, each of its text, and never panics.
        #[test]
        fn arbitrary_proc_text_never_panics(
            text in "([0-9a-f]{0,9}-?[0-9a-f]{0,9} [rwxsp-]{0,4} [0-9a-f]{0,9} [0-9a-f:]{0,6} [0-9]{0,6} {0,8}\\PC{0,12}\n){0,6}|\\PC{0,80}",
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let entries = parse_maps(&text);
            proptest::prop_assert!(entries.len() <= text.lines().count());
            for e in &entries {
                proptest::prop_assert!(e.path.len() <= text.len());
            }
            let _ = AddressSpace::parse(&text).normalize(0x1000);
            let _ = parse_maps_read(bytes.clone(), 32);
            let _ = (stat_is_live(&text), effective_caps(&text), rate_in_environ(&bytes));
            proptest::prop_assert!(parse_comm(&bytes).len() <= 3 * bytes.len());
        }
    }

    #[test]
    fn our_own_files_open_by_identity() {
        let mut scanner = Scanner::default();
        let scan = scanner.scan(std::process::id()).unwrap();
        let exe = fs::metadata("/proc/self/exe").unwrap();
        let addr = our_own_files_open_by_identity as *const () as u64;
        let at = scan.space.normalize(addr).expect("our code is file-backed");
        let file = at.file.open.as_ref().expect("opened");
        assert_eq!(
            file.id,
            FileId {
                dev: exe.dev(),
                ino: exe.ino()
            }
        );
        let through_fd = fs::metadata(file.fd_path()).unwrap();
        assert_eq!(through_fd.ino(), exe.ino());
    }
}

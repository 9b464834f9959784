//! A running process, reached through a live thread (`/proc/PID/task/TID`
//! once the main thread called `pthread_exit`): its maps, its mapped files
//! each opened once, its status.

use super::*;

/// A running process, reached through one of its live threads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    pub pid: Pid,
    /// A live thread: `pid` itself unless the main thread is gone.
    pub tid: Tid,
    /// `/proc/PID`, or `/proc/PID/task/TID` when the main thread is gone.
    dir: PathBuf,
    /// When the process started (clock ticks since boot), from its
    /// leader's `stat`, zombie or not.
    started: Option<u64>,
}

impl Process {
    /// The process, if it runs: its main thread, or else any live thread.
    pub fn find(pid: Pid) -> Option<Process> {
        let dir = PathBuf::from(format!("/proc/{pid}"));
        let stat = read_string(&dir.join("stat"), MAX_SMALL_BYTES).ok()?;
        let started = stat_start_ticks(&stat);
        if stat_is_live(&stat) {
            return Some(Process {
                pid,
                tid: Tid(pid.0),
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
            if tid != pid.0
                && read_string(&task.join("stat"), MAX_SMALL_BYTES)
                    .is_ok_and(|stat| stat_is_live(&stat))
            {
                return Some(Process {
                    pid,
                    tid: Tid(tid),
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
    pub fn thread(&self) -> crate::process::target_memory::LiveThread {
        crate::process::target_memory::LiveThread::found(
            self.pid,
            self.tid,
            self.started.unwrap_or(0),
        )
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

    /// What of its resource is read from `/proc` outside its memory: its
    /// executable's path and its cgroup's container and pod (see
    /// [`crate::process::resource`]).
    pub(crate) fn resource_outside_memory(&self) -> crate::process::resource::ProcessResource {
        use crate::process::resource::{MAX_READ_BYTES, parse_cgroup};
        // The process's own exe (a thread's is the same).
        let executable_path = fs::read_link(format!("/proc/{}/exe", self.pid))
            .ok()
            .map(|p| p.to_string_lossy().into_owned());
        let cgroup = read_string(&self.dir.join("cgroup"), MAX_READ_BYTES)
            .map(|text| parse_cgroup(&text))
            .unwrap_or_default();
        crate::process::resource::ProcessResource {
            executable_path,
            container_id: cgroup.container_id,
            pod_uid: cgroup.pod_uid,
            ..Default::default()
        }
    }

    /// What of its resource is in its memory (`/proc/PID/environ` and
    /// `cmdline` read it): its own `OTEL_SERVICE_NAME`, and with
    /// `command_line` its command line. Through
    /// `target_memory::TargetMemory` only.
    pub(crate) fn resource_in_memory(
        &self,
        command_line: bool,
    ) -> (Option<String>, Option<String>) {
        use crate::process::resource::{MAX_READ_BYTES, command_line as joined, env_value};
        let service = read_bounded(&self.dir.join("environ"), MAX_READ_BYTES)
            .ok()
            .and_then(|e| env_value(&e, "OTEL_SERVICE_NAME"));
        let line = command_line
            .then(|| read_bounded(&self.dir.join("cmdline"), MAX_READ_BYTES).ok())
            .flatten()
            .and_then(|c| joined(&c));
        (service, line)
    }

    /// Opens the file of a mapping: through `/proc/PID/map_files` (the very
    /// file mapped, even if renamed or deleted), or else by its path inside
    /// the process's root; either way only if it is a regular file whose
    /// device and inode are the mapping's. It is first reached with `O_PATH`
    /// (which opens nothing: a mapped device's driver never sees us), and
    /// opened for reading only once checked.
    pub(super) fn open_mapped(&self, entry: &MapsEntry) -> Option<File> {
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
pub fn process_alive(pid: Pid) -> bool {
    Process::find(pid).is_some()
}

/// The name of a process (its `comm`), if it still runs.
pub(crate) fn process_name(pid: Pid) -> Option<String> {
    Process::find(pid)?.name()
}

/// The parent of a process (`ppid` of `/proc/PID/stat`; 0 for the init
/// processes of a namespace).
pub(crate) fn process_parent(pid: Pid) -> Option<Pid> {
    let stat = read_string(Path::new(&format!("/proc/{pid}/stat")), MAX_SMALL_BYTES).ok()?;
    stat_parent(&stat).map(Pid)
}

/// Every process in /proc with its parent: one small read per process.
pub(crate) fn all_parents() -> Vec<(Pid, Pid)> {
    all_pids()
        .into_iter()
        .filter_map(|pid| Some((pid, process_parent(pid)?)))
        .collect()
}

/// Every process id in /proc.
pub(crate) fn all_pids() -> Vec<Pid> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<Pid> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok().map(Pid))
        .collect();
    pids.sort_unstable();
    pids
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

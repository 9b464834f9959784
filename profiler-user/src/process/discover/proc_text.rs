//! The text of `/proc` files, parsed as pure functions on bytes (a target
//! writes some of it: names, environment; fuzzed): maps, stat, status, comm,
//! environ.

use super::*;

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

/// A task's parent process, from its `/proc/.../stat`: field 4, `ppid`.
#[doc(hidden)] // public for the fuzz crate
pub fn stat_parent(stat: &str) -> Option<u32> {
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split(' ').nth(1)?.parse().ok()
}

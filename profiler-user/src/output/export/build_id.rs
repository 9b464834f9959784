//! GNU build ids of the files frames are in, for pprof mappings (tools use
//! them to find the right binary and its debug info). Read with the
//! `object` crate through a read cache, so only the ELF headers and the note
//! are read, and remembered per file version.

use std::{
    collections::HashMap,
    fs::File,
    os::unix::fs::MetadataExt,
    path::Path,
    sync::{Mutex, OnceLock},
};

use object::{Object, ReadCache};

/// (device, inode, mtime): a replaced file gets read again; one file under
/// several paths (the agent names files by `/proc/self/fd/N`, numbers
/// that are reused) is one entry.
type Key = (u64, u64, i64, i64);

/// Files remembered at most: the cache is forgotten whole when full, so a
/// long-running agent over a host whose programs are replaced day after
/// day holds a bounded amount (about 100 bytes an entry).
const MAX_CACHED: usize = 4096;

/// The build id of `path` as lowercase hex, if it is an ELF file with a
/// `.note.gnu.build-id` and still exists.
pub fn build_id(path: &Path) -> Option<String> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Option<String>>>> = OnceLock::new();
    let meta = std::fs::metadata(path).ok()?;
    let key = (meta.dev(), meta.ino(), meta.mtime(), meta.mtime_nsec());
    let cache = CACHE.get_or_init(Default::default);
    if let Some(id) = cache.lock().expect("build id cache").get(&key) {
        return id.clone();
    }
    // Read outside the lock: a slow disk must not stall other exports.
    let id = read_build_id(path);
    let mut cache = cache.lock().expect("build id cache");
    if cache.len() >= MAX_CACHED {
        cache.clear();
    }
    cache.insert(key, id.clone());
    id
}

fn read_build_id(path: &Path) -> Option<String> {
    let file = File::open(path).ok()?;
    let cache = ReadCache::new(file);
    let elf = object::File::parse(&cache).ok()?;
    let id = elf.build_id().ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_executable_has_a_build_id() {
        let exe = std::env::current_exe().unwrap();
        let id = build_id(&exe).expect("rustc links with a GNU build id on Linux");
        assert!(id.len() >= 16 && id.chars().all(|c| c.is_ascii_hexdigit()));
        // The second call is served from the cache, with the same answer.
        assert_eq!(build_id(&exe), Some(id));
        // Agrees with readelf's view, when readelf is installed.
        if let Ok(out) = std::process::Command::new("readelf")
            .arg("-n")
            .arg(&exe)
            .output()
        {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains(&build_id(&exe).unwrap()),
                "readelf -n disagrees:\n{text}"
            );
        }
    }

    #[test]
    fn missing_or_non_elf_files_have_none() {
        assert_eq!(build_id(Path::new("/nonexistent/allocprof")), None);
        assert_eq!(build_id(Path::new("/etc/hostname")), None);
    }
}

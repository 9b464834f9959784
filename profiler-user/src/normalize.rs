//! Turning a process's absolute addresses into (file, file offset) while the
//! process is alive, so its stacks still symbolize after it exits.

use std::{path::PathBuf, sync::Arc};

/// A file a process maps.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MappedFile {
    /// The file as the process names it.
    pub path: PathBuf,
    /// The same file reached through `/proc/PID/root` (its mount namespace).
    pub open_path: PathBuf,
}

/// One file-backed mapping of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub file: Arc<MappedFile>,
}

/// A normalized address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileAddr {
    pub file: Arc<MappedFile>,
    pub file_offset: u64,
}

/// The file-backed mappings of a process, sorted by address.
#[derive(Clone, Debug, Default)]
pub struct AddressSpace {
    mappings: Vec<Mapping>,
}

impl AddressSpace {
    /// Parses the text of `/proc/PID/maps`.
    pub fn parse(pid: u32, maps: &str) -> AddressSpace {
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        let mut mappings: Vec<Mapping> = Vec::new();
        for line in maps.lines() {
            let mut fields = line.splitn(6, ' ');
            let (Some(range), Some(_perms), Some(offset), Some(_dev), Some(_inode)) = (
                fields.next(),
                fields.next(),
                fields.next(),
                fields.next(),
                fields.next(),
            ) else {
                continue;
            };
            let path = fields.next().map(str::trim_start).unwrap_or("");
            if !path.starts_with('/') {
                continue;
            }
            let path = path.strip_suffix(" (deleted)").unwrap_or(path);
            let Some((start, end)) = range.split_once('-') else {
                continue;
            };
            let (Ok(start), Ok(end), Ok(offset)) = (
                u64::from_str_radix(start, 16),
                u64::from_str_radix(end, 16),
                u64::from_str_radix(offset, 16),
            ) else {
                continue;
            };
            // Consecutive mappings of one file share it.
            let file = match mappings.last() {
                Some(m) if m.file.path.as_os_str() == path => m.file.clone(),
                _ => Arc::new(MappedFile {
                    path: PathBuf::from(path),
                    open_path: root.join(path.trim_start_matches('/')),
                }),
            };
            mappings.push(Mapping {
                start,
                end,
                offset,
                file,
            });
        }
        mappings.sort_by_key(|m| m.start);
        AddressSpace { mappings }
    }

    pub fn read(pid: u32) -> std::io::Result<AddressSpace> {
        Ok(AddressSpace::parse(
            pid,
            &std::fs::read_to_string(format!("/proc/{pid}/maps"))?,
        ))
    }

    pub fn normalize(&self, addr: u64) -> Option<FileAddr> {
        let i = self
            .mappings
            .partition_point(|m| m.start <= addr)
            .checked_sub(1)?;
        let m = &self.mappings[i];
        (addr < m.end).then(|| FileAddr {
            file: m.file.clone(),
            file_offset: addr - m.start + m.offset,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.mappings.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 123 /usr/bin/demo
55d0c0a01000-55d0c0a05000 r-xp 00001000 fd:01 123 /usr/bin/demo
7f0000000000-7f0000021000 rw-p 00000000 00:00 0 [heap]
7f1000000000-7f1000100000 r-xp 00028000 fd:01 456 /usr/lib/libc.so.6
";

    #[test]
    fn addresses_map_to_file_offsets() {
        let space = AddressSpace::parse(42, MAPS);
        let a = space.normalize(0x55d0c0a01234).unwrap();
        assert_eq!(a.file.path.to_str(), Some("/usr/bin/demo"));
        assert_eq!(
            a.file.open_path.to_str(),
            Some("/proc/42/root/usr/bin/demo")
        );
        assert_eq!(a.file_offset, 0x1234);
        let c = space.normalize(0x7f1000000010).unwrap();
        assert_eq!(c.file_offset, 0x28010);
        assert!(
            space.normalize(0x7f0000000010).is_none(),
            "anonymous memory has no file"
        );
        assert!(space.normalize(0x10).is_none());
    }
}

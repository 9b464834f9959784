//! Turning a process's absolute addresses into (file, file offset) while the
//! process is alive, so its stacks still symbolize after it exits: each
//! mapping holds the file opened for it (see `discover`), so symbolization
//! reads the very file the process mapped, not whatever a path names later.

use std::{path::PathBuf, sync::Arc};

use crate::ids::Pid;
use crate::process::discover::{MapsEntry, OpenFile, Scanner, parse_maps};

/// A file a process maps.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MappedFile {
    /// The file as the process names it.
    pub path: PathBuf,
    /// The file itself, opened and checked against the mapping; `None` when
    /// it could not be (then its frames stay unknown).
    pub open: Option<Arc<OpenFile>>,
}

/// One file-backed mapping of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub executable: bool,
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
    /// Parses the text of `/proc/PID/maps`, opening no file.
    pub fn parse(maps: &str) -> AddressSpace {
        AddressSpace::from_maps(&parse_maps(maps), |_| None)
    }

    /// The address space of `maps`, with the file `open` gives each mapping.
    pub(crate) fn from_maps(
        maps: &[MapsEntry],
        mut open: impl FnMut(&MapsEntry) -> Option<Arc<OpenFile>>,
    ) -> AddressSpace {
        let mut mappings: Vec<Mapping> = Vec::new();
        for entry in maps.iter().filter(|e| e.is_file()) {
            // Consecutive mappings of one file share it.
            let opened = open(entry);
            let file = match mappings.last() {
                Some(m)
                    if m.file.path.as_os_str() == entry.path.as_str() && m.file.open == opened =>
                {
                    m.file.clone()
                }
                _ => Arc::new(MappedFile {
                    path: PathBuf::from(&entry.path),
                    open: opened,
                }),
            };
            mappings.push(Mapping {
                start: entry.start,
                end: entry.end,
                offset: entry.offset,
                executable: entry.executable,
                file,
            });
        }
        mappings.sort_by_key(|m| m.start);
        AddressSpace { mappings }
    }

    /// A process's address space with its files opened.
    pub fn read(pid: Pid) -> std::io::Result<AddressSpace> {
        Ok(Scanner::default().scan(pid)?.space)
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

    /// The space without the mapping that holds `addr` (tests: a library
    /// not mapped yet).
    #[cfg(test)]
    pub(crate) fn without(mut self, addr: u64) -> AddressSpace {
        self.mappings.retain(|m| !(m.start <= addr && addr < m.end));
        self
    }

    pub fn is_empty(&self) -> bool {
        self.mappings.is_empty()
    }

    /// The file-backed mappings, sorted by address.
    pub fn mappings(&self) -> &[Mapping] {
        &self.mappings
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
        let space = AddressSpace::parse(MAPS);
        let a = space.normalize(0x55d0c0a01234).unwrap();
        assert_eq!(a.file.path.to_str(), Some("/usr/bin/demo"));
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

//! The life of each file's unwind table: compiled on a thread of its own
//! (a large binary takes a while; the event loop never waits for it),
//! written into the kernel's row array a chunk per call, and its range
//! released once no process maps the file. A file whose table cannot be
//! built or does not fit is reported once; its frames fall back to frame
//! pointers, then end in a truncation marker.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    os::unix::fs::FileExt,
    sync::{Arc, mpsc},
    thread,
};

use profiler_common::unwind::{UnwindMapping, UnwindRow};

use super::pool::RowPool;
use crate::{
    discover::{FileId, OpenFile},
    normalize::Mapping,
};

/// Rows written into the kernel per call of [`UnwindTables::progress`]
/// (one map update each): a large table loads over several polls.
const ROWS_PER_STEP: usize = 16_384;

/// Compiles a file's table: its rows, sorted by address.
pub type Compile = fn(&File) -> Result<Vec<UnwindRow>, String>;

/// Where a PT_LOAD segment's bytes are in the file and in its addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
}

struct Compiled {
    rows: Vec<UnwindRow>,
    segments: Vec<Segment>,
}

enum FileTable {
    Compiling,
    Writing {
        start: u32,
        rows: Vec<UnwindRow>,
        written: usize,
        segments: Vec<Segment>,
    },
    Ready {
        start: u32,
        len: u32,
        segments: Vec<Segment>,
    },
    /// Not built or did not fit: said once, not tried again.
    Unavailable,
}

/// The writes a table needs; the session's kernel provides them.
pub trait RowSink {
    fn write_rows(&mut self, start: u32, rows: &[UnwindRow]) -> Result<(), String>;
}

pub struct UnwindTables {
    pool: RowPool,
    files: HashMap<FileId, FileTable>,
    requests: mpsc::Sender<(FileId, Arc<OpenFile>)>,
    responses: mpsc::Receiver<(FileId, Result<Compiled, String>)>,
    problems: Vec<String>,
    names: HashMap<FileId, String>,
}

impl UnwindTables {
    /// Tables for a kernel array of `capacity` rows, compiled by `compile`.
    pub fn new(capacity: u32, compile: Compile) -> UnwindTables {
        let (req_tx, req_rx) = mpsc::channel::<(FileId, Arc<OpenFile>)>();
        let (resp_tx, resp_rx) = mpsc::channel();
        thread::Builder::new()
            .name("unwind-tables".into())
            .spawn(move || {
                for (id, file) in req_rx {
                    let compiled = compile(&file.file).and_then(|rows| {
                        Ok(Compiled {
                            segments: load_segments(&file.file)?,
                            rows,
                        })
                    });
                    if resp_tx.send((id, compiled)).is_err() {
                        return;
                    }
                }
            })
            .expect("spawning the unwind-table thread");
        UnwindTables {
            pool: RowPool::new(capacity),
            files: HashMap::new(),
            requests: req_tx,
            responses: resp_rx,
            problems: Vec::new(),
            names: HashMap::new(),
        }
    }

    /// Asks for the table of a file a process maps executable (once per file).
    pub fn want(&mut self, file: &Arc<OpenFile>) {
        if self.files.contains_key(&file.id) {
            return;
        }
        self.files.insert(file.id, FileTable::Compiling);
        self.names
            .insert(file.id, file.display.display().to_string());
        let _ = self.requests.send((file.id, file.clone()));
    }

    /// Takes in compiled tables and writes the next chunk of rows. Returns
    /// whether a table became ready (processes mapping it can use it).
    pub fn progress(&mut self, sink: &mut impl RowSink) -> bool {
        while let Ok((id, compiled)) = self.responses.try_recv() {
            if !matches!(self.files.get(&id), Some(FileTable::Compiling)) {
                continue; // released meanwhile
            }
            let table = match compiled {
                Ok(c) if c.rows.is_empty() => self.unavailable(id, "it has no call-frame information"),
                Ok(c) => match u32::try_from(c.rows.len()).ok().and_then(|n| self.pool.alloc(n)) {
                    Some(start) => FileTable::Writing {
                        start,
                        rows: c.rows,
                        written: 0,
                        segments: c.segments,
                    },
                    None => {
                        let why = format!(
                            "its {} rows do not fit in the {} rows left (raise --max-unwind-rows)",
                            c.rows.len(),
                            self.pool.free_rows()
                        );
                        self.unavailable(id, &why)
                    }
                },
                Err(e) => self.unavailable(id, &e),
            };
            self.files.insert(id, table);
        }
        let mut ready = false;
        let mut budget = ROWS_PER_STEP;
        for (id, table) in &mut self.files {
            let FileTable::Writing {
                start,
                rows,
                written,
                segments,
            } = table
            else {
                continue;
            };
            if budget == 0 {
                break;
            }
            let chunk = (rows.len() - *written).min(budget);
            let at = *start + *written as u32;
            if let Err(e) = sink.write_rows(at, &rows[*written..*written + chunk]) {
                self.problems.push(format!(
                    "no unwind table for {}: {e}",
                    self.names.get(id).map_or("?", String::as_str)
                ));
                let len = rows.len() as u32;
                self.pool.release(*start, len);
                *table = FileTable::Unavailable;
                continue;
            }
            *written += chunk;
            budget -= chunk;
            if *written == rows.len() {
                *table = FileTable::Ready {
                    start: *start,
                    len: rows.len() as u32,
                    segments: std::mem::take(segments),
                };
                ready = true;
            }
        }
        ready
    }

    fn unavailable(&mut self, id: FileId, why: &str) -> FileTable {
        let name = self.names.get(&id).map_or("?", String::as_str);
        self.problems
            .push(format!("no unwind table for {name}: {why}; its frames are walked by frame pointers"));
        FileTable::Unavailable
    }

    /// The kernel's view of one executable mapping, if its file's table is ready.
    pub fn mapping(&self, m: &Mapping) -> Option<UnwindMapping> {
        let file = m.file.open.as_ref()?;
        let FileTable::Ready {
            start,
            len,
            segments,
        } = self.files.get(&file.id)?
        else {
            return None;
        };
        let segment = segments
            .iter()
            .find(|s| m.offset >= s.offset & !0xfff && m.offset < s.offset + s.filesz)?;
        // vaddr = addr - m.start + m.offset + (s.vaddr - s.offset)
        let bias = m
            .start
            .wrapping_sub(m.offset)
            .wrapping_add(segment.offset)
            .wrapping_sub(segment.vaddr);
        Some(UnwindMapping {
            start: m.start,
            end: m.end,
            bias,
            rows_start: *start,
            rows_len: *len,
        })
    }

    /// Frees the tables of files no process maps any more.
    pub fn release_unused(&mut self, in_use: &HashSet<FileId>) {
        let pool = &mut self.pool;
        self.files.retain(|id, table| {
            if in_use.contains(id) {
                return true;
            }
            match table {
                FileTable::Writing { start, rows, .. } => pool.release(*start, rows.len() as u32),
                FileTable::Ready { start, len, .. } => pool.release(*start, *len),
                FileTable::Compiling | FileTable::Unavailable => {}
            }
            // Unavailable files are remembered while mapped only: a new
            // version of the file may fit.
            false
        });
        self.names.retain(|id, _| self.files.contains_key(id));
    }

    /// Problems to report (each once).
    pub fn take_problems(&mut self) -> Vec<String> {
        std::mem::take(&mut self.problems)
    }

    /// Rows of the kernel's array not in use.
    pub fn free_rows(&self) -> u64 {
        self.pool.free_rows()
    }
}

/// Most program headers read: real files have about a dozen.
const MAX_PROGRAM_HEADERS: u16 = 512;

/// The PT_LOAD segments of an ELF64 little-endian file, by bounded reads.
pub fn load_segments(file: &File) -> Result<Vec<Segment>, String> {
    let mut header = [0u8; 64];
    file.read_exact_at(&mut header, 0)
        .map_err(|e| format!("reading its ELF header: {e}"))?;
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let phoff = u64_at(&header, 32);
    let phentsize = u16_at(&header, 54);
    let phnum = u16_at(&header, 56);
    if phentsize != 56 || phnum > MAX_PROGRAM_HEADERS {
        return Err(format!("unexpected program headers ({phnum} of {phentsize} bytes)"));
    }
    let mut table = vec![0u8; usize::from(phnum) * 56];
    file.read_exact_at(&mut table, phoff)
        .map_err(|e| format!("reading its program headers: {e}"))?;
    const PT_LOAD: u32 = 1;
    Ok(table
        .chunks_exact(56)
        .filter(|ph| u32_at(ph, 0) == PT_LOAD)
        .map(|ph| Segment {
            offset: u64_at(ph, 8),
            vaddr: u64_at(ph, 16),
            filesz: u64_at(ph, 32),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_executable_has_an_executable_load_segment() {
        let exe = File::open("/proc/self/exe").unwrap();
        let segments = load_segments(&exe).unwrap();
        let here = our_own_executable_has_an_executable_load_segment as *const () as u64;
        let space = crate::normalize::AddressSpace::read(std::process::id()).unwrap();
        let m = space
            .mappings()
            .iter()
            .find(|m| m.start <= here && here < m.end)
            .unwrap();
        assert!(m.executable);
        assert!(
            segments
                .iter()
                .any(|s| m.offset >= s.offset & !0xfff && m.offset < s.offset + s.filesz),
            "{segments:?} vs offset {:#x}",
            m.offset
        );
    }

    #[test]
    fn garbage_is_not_an_elf_file() {
        let dir = std::env::temp_dir().join(format!("unwind-garbage-{}", std::process::id()));
        std::fs::write(&dir, b"not an elf file at all, not at all, no").unwrap();
        let f = File::open(&dir).unwrap();
        assert!(load_segments(&f).is_err());
        std::fs::remove_file(&dir).unwrap();
    }
}

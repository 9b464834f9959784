//! The life of each file's unwind table: compiled on a thread of its own
//! (a large binary takes a while; the event loop never waits for it),
//! written into the kernel's row array a chunk per call, and its range
//! released once no process maps the file. A file whose table cannot be
//! built or does not fit is reported once; its frames fall back to frame
//! pointers, then end in a truncation marker.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, mpsc},
    thread,
};

use profiler_common::unwind::{FRAME_POINTERS, UnwindMapping, UnwindRow};

use super::{LoadSegment, UnwindTable, bias, pool::RowPool};
use crate::{
    discover::{FileId, OpenFile},
    normalize::Mapping,
};

/// Rows written into the kernel per call of [`UnwindTables::progress`]
/// (one map update each): a large table loads over several polls.
const ROWS_PER_STEP: usize = 16_384;

/// Compiles a file's table (see [`super::compile_open_file`]).
pub type Compile = fn(&OpenFile) -> Result<UnwindTable, String>;

/// The real compiler, with the default limits.
pub fn compile(file: &OpenFile) -> Result<UnwindTable, String> {
    super::compile_open_file(&file.file, &file.display, &super::Limits::default())
        .map_err(|e| e.kind.to_string())
}

enum FileTable {
    Compiling,
    Writing {
        start: u32,
        rows: Vec<UnwindRow>,
        written: usize,
        loads: Vec<LoadSegment>,
        frame_pointers: bool,
        runs: Vec<(u64, u64)>,
    },
    Ready {
        start: u32,
        len: u32,
        loads: Vec<LoadSegment>,
        frame_pointers: bool,
        /// `UnwindTable::frame_pointer_runs`.
        runs: Vec<(u64, u64)>,
    },
    /// Not built or did not fit: said once, not tried again.
    Unavailable,
}

/// Files by the state of their table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TablesStatus {
    pub ready: usize,
    pub loading: usize,
    pub unavailable: usize,
    /// Rows of the kernel's array not in use.
    pub free_rows: u64,
}

/// The writes a table needs; the session's kernel provides them.
pub trait RowSink {
    fn write_rows(&mut self, start: u32, rows: &[UnwindRow]) -> Result<(), String>;
}

pub struct UnwindTables {
    pool: RowPool,
    files: HashMap<FileId, FileTable>,
    requests: mpsc::Sender<(FileId, Arc<OpenFile>)>,
    responses: mpsc::Receiver<(FileId, Result<UnwindTable, String>)>,
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
                    let compiled = compile(&file);
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
    /// whether a file's table came out of loading (ready: processes mapping
    /// it can use it; or unavailable: processes waiting for it need not).
    pub(crate) fn progress(&mut self, sink: &mut impl RowSink) -> bool {
        let mut ready = false;
        while let Ok((id, compiled)) = self.responses.try_recv() {
            if !matches!(self.files.get(&id), Some(FileTable::Compiling)) {
                continue; // released meanwhile
            }
            let table = match compiled {
                // Its frames get one frame-pointer step, then the walk ends
                // with a truncation marker naming it.
                Ok(c) if c.rows.is_empty() => FileTable::Ready {
                    start: 0,
                    len: 0,
                    loads: c.loads,
                    frame_pointers: false,
                    runs: Vec::new(),
                },
                Ok(c) => match u32::try_from(c.rows.len())
                    .ok()
                    .and_then(|n| self.pool.alloc(n))
                {
                    Some(start) => FileTable::Writing {
                        start,
                        rows: c.rows,
                        written: 0,
                        loads: c.loads,
                        frame_pointers: c.frame_pointers,
                        runs: c.frame_pointer_runs,
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
            ready |= !matches!(table, FileTable::Writing { .. });
            self.files.insert(id, table);
        }
        let mut budget = ROWS_PER_STEP;
        for (id, table) in &mut self.files {
            let FileTable::Writing {
                start,
                rows,
                written,
                loads,
                frame_pointers,
                runs,
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
                ready = true;
                continue;
            }
            *written += chunk;
            budget -= chunk;
            if *written == rows.len() {
                *table = FileTable::Ready {
                    start: *start,
                    len: rows.len() as u32,
                    loads: std::mem::take(loads),
                    frame_pointers: *frame_pointers,
                    runs: std::mem::take(runs),
                };
                ready = true;
            }
        }
        ready
    }

    fn unavailable(&mut self, id: FileId, why: &str) -> FileTable {
        let name = self.names.get(&id).map_or("?", String::as_str);
        self.problems.push(format!(
            "no unwind table for {name}: {why}; its frames are walked by frame pointers"
        ));
        FileTable::Unavailable
    }

    /// The kernel's view of one executable mapping, if its file's table is ready.
    pub fn mapping(&self, m: &Mapping) -> Option<UnwindMapping> {
        let file = m.file.open.as_ref()?;
        let FileTable::Ready {
            start,
            len,
            loads,
            frame_pointers,
            ..
        } = self.files.get(&file.id)?
        else {
            return None;
        };
        Some(UnwindMapping {
            start: m.start,
            end: m.end,
            bias: bias(loads, m.start, m.offset)?,
            rows_start: *start,
            rows_len: *len,
            flags: if *frame_pointers { FRAME_POINTERS } else { 0 },
            _pad: 0,
        })
    }

    /// Whether the code at `file_offset` of file `id` keeps a frame
    /// pointer (its function is in one of the table's
    /// `frame_pointer_runs`), so that a return address read through its
    /// frame is sure; `None` while the table is being compiled. Code in a
    /// file without a table (unavailable, or never asked for) is not known
    /// to.
    pub fn keeps_frame_pointer_at(&self, id: FileId, file_offset: u64) -> Option<bool> {
        let (loads, runs) = match self.files.get(&id) {
            Some(FileTable::Compiling) => return None,
            Some(FileTable::Writing { loads, runs, .. } | FileTable::Ready { loads, runs, .. }) => {
                (loads, runs)
            }
            Some(FileTable::Unavailable) | None => return Some(false),
        };
        let Some(vaddr) = loads
            .iter()
            .filter(|l| l.executable)
            .find(|l| file_offset >= l.offset && file_offset - l.offset < l.filesz)
            .map(|l| file_offset - l.offset + l.vaddr)
        else {
            return Some(false);
        };
        let i = runs.partition_point(|&(start, _)| start <= vaddr);
        Some(i > 0 && vaddr < runs[i - 1].1)
    }

    /// Whether the table of a mapping's file is still being built or loaded.
    pub fn loading(&self, m: &Mapping) -> bool {
        m.file.open.as_ref().is_some_and(|file| {
            matches!(
                self.files.get(&file.id),
                Some(FileTable::Compiling | FileTable::Writing { .. })
            )
        })
    }

    /// Frees the tables of files no process maps any more.
    pub(crate) fn release_unused(&mut self, in_use: &HashSet<FileId>) {
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
    pub(crate) fn take_problems(&mut self) -> Vec<String> {
        std::mem::take(&mut self.problems)
    }

    /// How far loading has come, for a status line and for tests.
    pub fn status(&self) -> TablesStatus {
        let mut status = TablesStatus {
            free_rows: self.pool.free_rows(),
            ..TablesStatus::default()
        };
        for table in self.files.values() {
            match table {
                FileTable::Ready { .. } => status.ready += 1,
                FileTable::Compiling | FileTable::Writing { .. } => status.loading += 1,
                FileTable::Unavailable => status.unavailable += 1,
            }
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use super::*;

    #[test]
    fn a_mapping_of_our_own_code_has_a_bias_that_finds_our_functions() {
        let exe = File::open("/proc/self/exe").unwrap();
        let table = super::super::compile_open_file(
            &exe,
            "self".as_ref(),
            &super::super::Limits::default(),
        )
        .unwrap();
        let here =
            a_mapping_of_our_own_code_has_a_bias_that_finds_our_functions as *const () as u64;
        let space = crate::normalize::AddressSpace::read(std::process::id()).unwrap();
        let m = space
            .mappings()
            .iter()
            .find(|m| m.start <= here && here < m.end)
            .unwrap();
        assert!(m.executable);
        let bias = bias(&table.loads, m.start, m.offset).expect("a PT_LOAD holds our code");
        let row = profiler_common::unwind::find_row(&table.rows, here - bias).unwrap();
        assert_eq!(
            table.rows[row].cfa_rule,
            profiler_common::unwind::cfa::RSP,
            "a function's first instruction: CFA = rsp + 8"
        );
        assert_eq!(table.rows[row].cfa_offset, 8);
    }
}

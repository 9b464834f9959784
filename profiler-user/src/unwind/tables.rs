//! The life of each file's unwind table: compiled off the event loop (a
//! large binary takes a while; the loop never waits for it), written into
//! the kernel's row array a chunk per call, and its range released once no
//! process maps the file. A file whose table cannot be built or does not fit
//! is reported once; its frames fall back to frame pointers, then end in a
//! truncation marker.
//!
//! Compiling is fair: [`WORKERS`] threads take files from the processes that
//! wait for them in turn, each process's one at a time (a file several
//! processes map is in each one's turn). A slow file (a huge binary, or a
//! crafted one up to its work budget) holds one thread and only its own
//! process's next file: another process's tables go on being built.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, Condvar, Mutex, MutexGuard, mpsc},
    thread,
};

use profiler_common::unwind::{FRAME_POINTERS, UnwindMapping, UnwindRow};

use super::{LoadSegment, UnwindTable, bias, pool::RowPool};
use crate::{
    ids::Pid,
    process::discover::{FileId, OpenFile},
    process::normalize::Mapping,
};

/// Rows written into the kernel per call of [`UnwindTables::progress`]
/// (one map update each): a large table loads over several polls.
const ROWS_PER_STEP: usize = 16_384;

/// Threads compiling tables: one slow file leaves the other going.
const WORKERS: usize = 2;
/// Files of one process compiled at once: a process never takes every
/// thread, so another process always has one.
const PER_OWNER: usize = WORKERS - 1;

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

/// Files waiting to be compiled, by the processes that wait for them.
#[derive(Default)]
struct Queue {
    /// Processes in turn, each with the files it waits for (a file may be
    /// in several lists; whoever's turn comes first takes it).
    owners: VecDeque<(Pid, VecDeque<FileId>)>,
    /// Files not taken yet.
    files: HashMap<FileId, Arc<OpenFile>>,
    /// Files being compiled, by the process whose turn took them.
    in_flight: HashMap<Pid, usize>,
    /// No more work: the workers end.
    closed: bool,
}

impl Queue {
    /// The next file in turn: the first still waiting of the next process
    /// with fewer than [`PER_OWNER`] files being compiled.
    fn next(&mut self) -> Option<(Pid, FileId, Arc<OpenFile>)> {
        for _ in 0..self.owners.len() {
            let (owner, mut wanted) = self.owners.pop_front()?;
            if self.in_flight.get(&owner).copied().unwrap_or(0) >= PER_OWNER {
                self.owners.push_back((owner, wanted));
                continue;
            }
            while let Some(id) = wanted.pop_front() {
                if let Some(file) = self.files.remove(&id) {
                    if !wanted.is_empty() {
                        self.owners.push_back((owner, wanted));
                    }
                    *self.in_flight.entry(owner).or_default() += 1;
                    return Some((owner, id, file));
                }
            }
        }
        None
    }

    fn done(&mut self, owner: Pid) {
        if let Some(n) = self.in_flight.get_mut(&owner) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(&owner);
            }
        }
    }

    fn add(&mut self, owner: Pid, id: FileId) {
        match self.owners.iter_mut().find(|(o, _)| *o == owner) {
            Some((_, wanted)) if wanted.contains(&id) => {}
            Some((_, wanted)) => wanted.push_back(id),
            None => self.owners.push_back((owner, VecDeque::from([id]))),
        }
    }
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when a file is queued or the queue closes.
    wake: Condvar,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        // Nothing panics while holding it; a poisoned queue is still whole.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A worker: compiles the next file in turn until the queue closes.
fn work(
    shared: &Shared,
    compile: Compile,
    out: &mpsc::Sender<(FileId, Result<UnwindTable, String>)>,
) {
    loop {
        let (owner, id, file) = {
            let mut queue = shared.queue();
            loop {
                if queue.closed {
                    return;
                }
                if let Some(next) = queue.next() {
                    break next;
                }
                queue = shared.wake.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
        };
        let compiled = compile(&file);
        shared.queue().done(owner);
        // The owner may have a file another worker could not take.
        shared.wake.notify_one();
        if out.send((id, compiled)).is_err() {
            return;
        }
    }
}

pub struct UnwindTables {
    pool: RowPool,
    files: HashMap<FileId, FileTable>,
    shared: Arc<Shared>,
    responses: mpsc::Receiver<(FileId, Result<UnwindTable, String>)>,
    problems: Vec<String>,
    names: HashMap<FileId, String>,
    /// The last `ProcUnwind::version` handed out.
    version: u64,
}

impl Drop for UnwindTables {
    fn drop(&mut self) {
        self.shared.queue().closed = true;
        self.shared.wake.notify_all();
    }
}

impl UnwindTables {
    /// Tables for a kernel array of `capacity` rows, compiled by `compile`.
    pub fn new(capacity: u32, compile: Compile) -> UnwindTables {
        let shared = Arc::new(Shared::default());
        let (resp_tx, resp_rx) = mpsc::channel();
        for i in 0..WORKERS {
            let (shared, out) = (shared.clone(), resp_tx.clone());
            thread::Builder::new()
                .name(format!("unwind-tables-{i}"))
                .spawn(move || work(&shared, compile, &out))
                .expect("spawning an unwind-table thread");
        }
        UnwindTables {
            pool: RowPool::new(capacity),
            files: HashMap::new(),
            shared,
            responses: resp_rx,
            problems: Vec::new(),
            names: HashMap::new(),
            version: 0,
        }
    }

    /// A `ProcUnwind::version` no table had before (from 1: 0 marks the
    /// kernel's empty row-cache entries).
    pub(crate) fn next_version(&mut self) -> u64 {
        self.version += 1;
        self.version
    }

    /// Asks for the table of a file process `owner` maps executable
    /// (compiled once per file; a file still waiting also waits in
    /// `owner`'s turn).
    pub fn want(&mut self, file: &Arc<OpenFile>, owner: Pid) {
        match self.files.get(&file.id) {
            Some(FileTable::Compiling) => {
                let mut queue = self.shared.queue();
                if queue.files.contains_key(&file.id) {
                    queue.add(owner, file.id);
                    drop(queue);
                    // Its turn may come before its first owner's.
                    self.shared.wake.notify_one();
                }
                return;
            }
            Some(_) => return,
            None => {}
        }
        self.files.insert(file.id, FileTable::Compiling);
        self.names
            .insert(file.id, file.display.display().to_string());
        let mut queue = self.shared.queue();
        queue.files.insert(file.id, file.clone());
        queue.add(owner, file.id);
        drop(queue);
        self.shared.wake.notify_one();
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
        let mut queue = self.shared.queue();
        self.files.retain(|id, table| {
            if in_use.contains(id) {
                return true;
            }
            // Not compiled if not started (the owners' lists skip it).
            queue.files.remove(id);
            match table {
                FileTable::Writing { start, rows, .. } => pool.release(*start, rows.len() as u32),
                FileTable::Ready { start, len, .. } => pool.release(*start, *len),
                FileTable::Compiling | FileTable::Unavailable => {}
            }
            // Unavailable files are remembered while mapped only: a new
            // version of the file may fit.
            false
        });
        drop(queue);
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
    use std::{
        fs::File,
        sync::LazyLock,
        time::{Duration, Instant},
    };

    use super::*;

    /// Files whose compile waits until their gate opens (by name; each test
    /// uses its own names), as a slow file would.
    static GATES: LazyLock<(Mutex<HashSet<String>>, Condvar)> = LazyLock::new(Default::default);

    fn open_gate(name: &str) {
        GATES.0.lock().unwrap().insert(name.into());
        GATES.1.notify_all();
    }

    /// A compiler that holds `/slow/…` files until their gate opens.
    fn gated(file: &OpenFile) -> Result<UnwindTable, String> {
        let name = file.display.display().to_string();
        if name.starts_with("/slow/") {
            let mut open = GATES.0.lock().unwrap();
            while !open.contains(&name) {
                open = GATES.1.wait(open).unwrap();
            }
        }
        Ok(UnwindTable::default())
    }

    fn file(ino: u64, name: &str) -> Arc<OpenFile> {
        Arc::new(OpenFile {
            id: FileId { dev: 0, ino },
            file: File::open("/proc/self/exe").unwrap(),
            display: name.into(),
        })
    }

    struct NoRows;

    impl RowSink for NoRows {
        fn write_rows(&mut self, _: u32, _: &[UnwindRow]) -> Result<(), String> {
            Ok(())
        }
    }

    fn ready(tables: &UnwindTables, id: u64) -> bool {
        matches!(
            tables.files.get(&FileId { dev: 0, ino: id }),
            Some(FileTable::Ready { .. })
        )
    }

    /// Progresses until `done`, failing (not hanging) if it never comes.
    fn until(tables: &mut UnwindTables, what: &str, done: impl Fn(&UnwindTables) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done(tables) {
            assert!(Instant::now() < deadline, "{what}: {:?}", tables.status());
            tables.progress(&mut NoRows);
            thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn slow_files_hold_up_only_their_own_process_s_other_files() {
        let mut tables = UnwindTables::new(1000, gated);
        // Process 1 maps two slow files and one it shares with process 2.
        let slow = [file(1, "/slow/one-a"), file(2, "/slow/one-b")];
        let shared = file(3, "/lib/shared.so");
        tables.want(&slow[0], Pid(1));
        tables.want(&slow[1], Pid(1));
        tables.want(&shared, Pid(1));
        tables.want(&shared, Pid(2));
        tables.want(&file(4, "/bin/two"), Pid(2));
        until(&mut tables, "process 2's tables held up", |t| {
            ready(t, 3) && ready(t, 4)
        });
        assert_eq!(
            tables.status().loading,
            2,
            "both slow files still compiling"
        );

        open_gate("/slow/one-a");
        open_gate("/slow/one-b");
        until(&mut tables, "the slow files once let go", |t| {
            t.status().loading == 0
        });
        assert_eq!(tables.status().ready, 4);
    }

    #[test]
    fn a_file_released_before_its_turn_is_not_compiled() {
        let mut tables = UnwindTables::new(1000, gated);
        // Process 1's slow file holds its turn; its second file waits.
        tables.want(&file(11, "/slow/released-a"), Pid(1));
        tables.want(&file(12, "/slow/released-b"), Pid(1));
        until(&mut tables, "the first file taken", |t| {
            !t.shared
                .queue()
                .files
                .contains_key(&FileId { dev: 0, ino: 11 })
        });
        tables.release_unused(&HashSet::from([FileId { dev: 0, ino: 11 }]));
        assert!(
            tables.shared.queue().files.is_empty(),
            "dropped from the queue"
        );
        open_gate("/slow/released-a");
        until(&mut tables, "the first file", |t| ready(t, 11));
        assert_eq!(tables.status().loading, 0);
        assert_eq!(tables.status().ready, 1);
    }

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
        let space = crate::process::normalize::AddressSpace::read(Pid(std::process::id())).unwrap();
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

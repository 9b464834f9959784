//! Which processes the kernel walks with unwind tables: each process that
//! carries probes gets the tables of the files it maps executable, once
//! they are built and loaded (until then, and for files without one, the
//! kernel follows frame pointers).

use std::collections::HashSet;

use profiler_common::unwind::{MAX_UNWIND_MAPPINGS, ProcUnwind};

use super::{KernelPort, ProcessPort, Session};
use crate::{
    discover::FileId,
    unwind::tables::{RowSink, TablesStatus},
};

/// The kernel as the tables' writer.
struct KernelRows<'a, K>(&'a mut K);

impl<K: KernelPort> RowSink for KernelRows<'_, K> {
    fn write_rows(
        &mut self,
        start: u32,
        rows: &[profiler_common::unwind::UnwindRow],
    ) -> Result<(), String> {
        self.0
            .write_unwind_rows(start, rows)
            .map_err(|e| e.to_string())
    }
}

impl<K: KernelPort, P: ProcessPort> Session<K, P> {
    /// Where the unwind tables of the mapped files stand.
    pub fn unwind_status(&self) -> TablesStatus {
        self.unwind.status()
    }

    /// Asks for the tables of `pid`'s executable files and gives it those
    /// that are ready.
    pub(super) fn unwind_process(&mut self, pid: u32) {
        let Some(space) = self.spaces.get(&pid) else {
            return;
        };
        if self.kernel.unwind_capacity() == 0 {
            return; // tables turned off: the kernel walks frame pointers
        }
        for m in space.mappings().iter().filter(|m| m.executable) {
            if let Some(file) = &m.file.open {
                self.unwind.want(file, pid);
            }
        }
        self.give_tables(pid);
    }

    /// Builds `pid`'s kernel entry from the tables ready now. A process's
    /// first entry waits until none of its files is loading: with some
    /// tables in and others not, a walk from code still without one (e.g.
    /// the allocator's) would end at once in a marker, where frame
    /// pointers alone may walk whole. Later entries (a library loaded
    /// since) do not wait.
    pub(super) fn give_tables(&mut self, pid: u32) {
        let (Some(space), Some(host)) = (self.spaces.get(&pid), self.pids.host(pid)) else {
            return;
        };
        let executable = || space.mappings().iter().filter(|m| m.executable);
        // The first entry only once no table is loading: until then the
        // kernel walks the whole stack by frame pointers, rather than take the
        // code whose table is still loading for code without one (one
        // frame-pointer step, then a truncation).
        if !self.unwound.contains_key(&pid) && executable().any(|m| self.unwind.loading(m)) {
            return;
        }
        let mut table = ProcUnwind::default();
        let mut len = 0;
        for m in executable() {
            if len == MAX_UNWIND_MAPPINGS {
                break; // the rest is walked by frame pointers
            }
            if let Some(mapping) = self.unwind.mapping(m) {
                table.mappings[len] = mapping;
                len += 1;
            }
        }
        table.len = len as u32;
        if self.unwound.get(&pid) == Some(&table) {
            return;
        }
        if len == 0 {
            self.kernel.clear_process_unwind(host);
        } else if let Err(e) = self.kernel.set_process_unwind(host, &table) {
            self.warnings.push(format!("process {pid}: {e}"));
            return;
        }
        self.unwound.insert(pid, table);
    }

    /// Loads what the table thread finished; processes get the new tables.
    pub(super) fn load_tables(&mut self) {
        if self.unwind.progress(&mut KernelRows(&mut self.kernel)) {
            let pids: Vec<u32> = self.spaces.keys().copied().collect();
            for pid in pids {
                self.give_tables(pid);
            }
        }
        for problem in self.unwind.take_problems() {
            self.warnings.push(problem);
        }
    }

    /// Loads tables until none is loading, for at most `limit`.
    pub(super) fn settle_tables(&mut self, limit: std::time::Duration) {
        let deadline = std::time::Instant::now() + limit;
        while self.unwind.status().loading > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
            self.load_tables();
        }
    }

    /// The image of `pid` is gone (exec or exit): its tables no longer apply.
    pub(super) fn forget_tables(&mut self, pid: u32) {
        if self.unwound.remove(&pid).is_some()
            && let Some(host) = self.pids.host(pid)
        {
            self.kernel.clear_process_unwind(host);
        }
    }

    /// Frees the tables of files no tracked process maps.
    pub(super) fn release_tables(&mut self) {
        let in_use: HashSet<FileId> = self
            .spaces
            .values()
            .flat_map(|s| s.mappings().iter().filter(|m| m.executable))
            .filter_map(|m| m.file.open.as_ref().map(|f| f.id))
            .collect();
        self.unwind.release_unused(&in_use);
    }
}

//! Which processes the kernel walks with unwind tables: each process that
//! carries probes gets the tables of the files it maps executable, once
//! they are built and loaded (until then, and for files without one, the
//! kernel follows frame pointers).

use std::collections::HashSet;

use profiler_common::unwind::{
    DEPTH_CUT_FRAME, MAX_UNWIND_MAPPINGS, NO_TABLES_DEPTH_FRAME, NO_TABLES_FRAME, ProcUnwind,
};

use super::{KernelPort, ProcessPort, Session};
use crate::ids::Pid;
use crate::{
    process::discover::FileId,
    process::normalize::FileAddr,
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
    pub(super) fn unwind_process(&mut self, pid: Pid) {
        let Some(space) = self.tracked.get(&pid).and_then(|t| t.image.space.as_ref()) else {
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

    /// With `--pid`, before attaching: reads `pid`'s maps and asks for the
    /// tables of its files (as a scan would, without attaching).
    pub(super) fn want_tables_of(&mut self, pid: Pid) {
        let Ok(scan) = self.processes.scan(pid) else {
            return; // gone: the attach says so
        };
        if !scan.probes.is_empty() {
            self.set_space(pid, scan.space);
            self.unwind_process(pid);
        }
    }

    /// Builds `pid`'s kernel entry from the tables ready now. A process's
    /// first entry waits until none of its files is loading: with some
    /// tables in and others not, a walk from code still without one (e.g.
    /// the allocator's) would end at once in a marker, where frame
    /// pointers alone may walk whole. Later entries (a library loaded
    /// since) do not wait.
    pub(super) fn give_tables(&mut self, pid: Pid) {
        let (Some(tracked), Some(host)) = (self.tracked.get(&pid), self.pids.host(pid)) else {
            return;
        };
        let Some(space) = tracked.image.space.as_ref() else {
            return;
        };
        let unwound = &tracked.image.unwound;
        let executable = || space.mappings().iter().filter(|m| m.executable);
        // The first entry only once no table is loading: until then the
        // kernel walks the whole stack by frame pointers, rather than take the
        // code whose table is still loading for code without one (one
        // frame-pointer step, then a truncation).
        if unwound.is_none() && executable().any(|m| self.unwind.loading(m)) {
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
        let mappings = &table.mappings[..len];
        if unwound.as_deref() == Some(mappings) {
            return;
        }
        // A new version for every table given: the kernel's row cache is
        // keyed by it, so nothing found in an earlier table is used.
        table.version = self.unwind.next_version();
        if len == 0 {
            self.kernel.clear_process_unwind(host);
        } else if let Err(e) = self.kernel.set_process_unwind(host, &table) {
            self.warnings.push(format!("process {pid}: {e}"));
            return;
        }
        let mappings = mappings.into();
        if let Some(tracked) = self.tracked.get_mut(&pid) {
            tracked.image.unwound = Some(mappings);
        }
    }

    /// The frames of a stack the kernel walked by frame pointers before its
    /// process had tables (it ends in `NO_TABLES_FRAME` or
    /// `NO_TABLES_DEPTH_FRAME`; any other stack comes back as it is). A
    /// return address read through a frame pointer is sure while every
    /// frame below it is in a function that keeps a frame pointer (its
    /// file's table's `frame_pointer_runs`); so the stack keeps its frames
    /// up to and including the first that is not (or lies in no file), then
    /// `NO_TABLES_FRAME`, which user space shows as a marker. A stack whose
    /// every frame is vouched for is whole (cut at the depth limit, it ends
    /// in `DEPTH_CUT_FRAME`). `None`: a file's table is still compiling,
    /// and `wait` says to ask again later rather than cut there.
    pub(super) fn vouch_for(
        &self,
        mut frames: Vec<(u64, Option<FileAddr>)>,
        wait: bool,
    ) -> Option<Vec<(u64, Option<FileAddr>)>> {
        let last = match frames.last() {
            Some((a, _)) if *a == NO_TABLES_FRAME || *a == NO_TABLES_DEPTH_FRAME => *a,
            _ => return Some(frames),
        };
        frames.pop();
        let mut sure = frames.len();
        for (i, (_, at)) in frames.iter().enumerate() {
            // A return address points after its call: the call's function
            // is the one whose frame matters (the first frame is the probe
            // site itself).
            let keeps = match at.as_ref().and_then(|a| Some((a.file.open.as_ref()?, a))) {
                Some((file, at)) => {
                    let offset = at.file_offset.saturating_sub(u64::from(i > 0));
                    self.unwind.keeps_frame_pointer_at(file.id, offset)
                }
                None => Some(false),
            };
            match keeps {
                Some(true) => {}
                None if wait => return None,
                _ => {
                    sure = i;
                    break;
                }
            }
        }
        if sure == frames.len() {
            if last == NO_TABLES_DEPTH_FRAME {
                frames.push((DEPTH_CUT_FRAME, None));
            }
        } else {
            frames.truncate(sure + 1);
            frames.push((NO_TABLES_FRAME, None));
        }
        Some(frames)
    }

    /// Loads what the table thread finished; processes get the new tables.
    pub(super) fn load_tables(&mut self) {
        if self.unwind.progress(&mut KernelRows(&mut self.kernel)) {
            let pids: Vec<Pid> = self
                .tracked
                .iter()
                .filter(|(_, t)| t.image.space.is_some())
                .map(|(&pid, _)| pid)
                .collect();
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
    pub(super) fn forget_tables(&mut self, pid: Pid) {
        if self
            .tracked
            .get_mut(&pid)
            .and_then(|t| t.image.unwound.take())
            .is_some()
            && let Some(host) = self.pids.host(pid)
        {
            self.kernel.clear_process_unwind(host);
        }
    }

    /// Frees the tables of files no tracked process maps.
    pub(super) fn release_tables(&mut self) {
        let in_use: HashSet<FileId> = self
            .tracked
            .values()
            .filter_map(|t| t.image.space.as_ref())
            .flat_map(|s| s.mappings().iter().filter(|m| m.executable))
            .filter_map(|m| m.file.open.as_ref().map(|f| f.id))
            .collect();
        self.unwind.release_unused(&in_use);
    }
}

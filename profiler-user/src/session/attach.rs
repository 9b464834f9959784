//! Which probe files are attached, and for whom: system-wide, each file
//! once for every process (with `--pid`'s trees too: the kernel filters);
//! with `--pid --no-children`, per process through a live thread.

use std::{collections::HashMap, path::Path, time::Instant};

use crate::ids::{Pid, Tid};

use super::{ArmError, KernelPort, ProcessPort, Session, Target};
use crate::{
    kernel::{KernelError, Scope},
    process::discover::{self, FileId, ProbeFile},
};

impl<K: KernelPort, P: ProcessPort> Session<K, P> {
    /// Attaches to the probe files `pid` maps; returns how many it carries.
    pub(super) fn scan(&mut self, pid: Pid) -> Result<usize, KernelError> {
        let Ok(scan) = self.processes.scan(pid) else {
            return Ok(0); // gone already
        };
        // Its backend-statistics block is looked for anew.
        if let Some(tracked) = self.tracked.get_mut(&pid) {
            tracked.image.backend_block = Default::default();
            tracked.image.memory_read = None;
        }
        // Only processes that carry probes can have stacks: only theirs
        // hold their mapped files open.
        if !scan.probes.is_empty() {
            self.set_space(pid, scan.space);
            // Named now: a process may be gone (a zombie, its /proc unreadable)
            // before the first profile is built.
            self.identity(pid);
            self.resource(pid);
            self.unwind_process(pid);
            self.detect_python(pid);
        }
        let mut stale = Vec::new();
        for file in &scan.probes {
            stale.extend(self.attach(pid, scan.tid, file)?);
        }
        // Only now, so that no probe is unattached in between.
        stale.sort_unstable();
        stale.dedup();
        for tid in stale {
            self.kernel.detach_process(tid);
        }
        Ok(scan.probes.iter().filter(|f| !f.sites.is_empty()).count())
    }

    /// Attaches to a probe file `pid` maps; per process, through its live
    /// thread `tid` (attached again through another when that one ends: a
    /// per-process uprobe follows its thread's memory, which an exiting
    /// main thread leaves behind). Returns the thread attached through
    /// before, whose attachments the caller detaches.
    pub(super) fn attach(
        &mut self,
        pid: Pid,
        tid: Tid,
        file: &ProbeFile,
    ) -> Result<Option<Tid>, KernelError> {
        let (scope, replaced) = if self.target.attaches_for_all() {
            if self.attached_files.contains_key(&file.id()) {
                return Ok(None);
            }
            // Its time once its probes are attached (below).
            self.attached_files.insert(file.id(), 0);
            (Scope::AllProcesses, None)
        } else {
            match self.track_pid(pid).attached.insert(file.id(), tid) {
                Some(old) if old == tid => return Ok(None),
                old => (Scope::Process(tid), old),
            }
        };
        self.probe_ids.insert(file.id());
        if replaced.is_none() {
            for problem in &file.problems {
                self.warnings
                    .push(format!("{}: {problem}", file.file.display.display()));
            }
        }
        for site in &file.sites {
            self.kernel.attach_file(&file.file, site, scope)?;
        }
        // From now on the kernel sees every allocation through this file.
        let now = self.processes.monotonic_ns();
        if self.target.attaches_for_all() {
            self.attached_files.insert(file.id(), now);
        } else {
            self.track_pid(pid)
                .attached_ns
                .entry(file.id())
                .or_insert(now);
        }
        Ok(replaced)
    }

    /// System-wide mode: attaches to the probes of `path` now, so that a
    /// process that maps it is covered from its first allocation (not from
    /// the rescan that finds it). Returns whether it carries probes.
    pub fn arm(&mut self, path: &Path) -> Result<bool, ArmError> {
        let io = |source| ArmError::Unreadable {
            path: path.to_path_buf(),
            source,
        };
        let Some(file) = discover::probe_file_at(path).map_err(io)? else {
            return Ok(false);
        };
        if self.target == Target::All {
            self.attach(Pid(0), Tid(0), &file)?;
        }
        Ok(true)
    }

    /// Looks for probes in every process (for dlopen, and processes that
    /// started before their library was armed). Processes tracked are
    /// `track`'s; one found without probes last time is read again only if
    /// it changed since (its start or code size): most of a host's
    /// processes never map a probe file, and their maps are the costly read.
    pub(super) fn scan_all(&mut self) {
        let mut probeless = HashMap::new();
        for pid in self.processes.all_pids() {
            if pid == Pid(std::process::id()) {
                continue;
            }
            if self
                .tracked
                .get(&pid)
                .is_some_and(|t| t.image.space.is_some())
            {
                if self.rescan_due(pid) {
                    self.rescan(pid);
                }
                continue;
            }
            let now = (
                self.processes.start_ticks(pid),
                self.processes.code_size(pid),
            );
            if now.1.is_some() && self.probeless.get(&pid) == Some(&now) {
                probeless.insert(pid, now);
                continue;
            }
            match self.scan(pid) {
                Ok(0) if !self.tracked.contains_key(&pid) => {
                    probeless.insert(pid, now);
                }
                Ok(_) => {
                    // Scanned whole, as `rescan` notes it (its code size read
                    // before the scan): the next sweep need not scan it
                    // again (500 processes at start: a second start-up).
                    if let Some(t) = self.tracked.get_mut(&pid)
                        && t.image.space.is_some()
                        && t.image.scanned.is_none()
                    {
                        t.image.scanned = Some((now.1, Instant::now()));
                    }
                }
                Err(e) => self.warnings.push(format!("process {pid}: {e}")),
            }
        }
        self.probeless = probeless;
        self.last_full_scan = Instant::now();
    }

    /// Whether the probes of file `id` are attached for `pid`.
    pub fn is_attached(&self, pid: Pid, id: FileId) -> bool {
        if self.target.attaches_for_all() {
            self.attached_files.contains_key(&id)
        } else {
            self.tracked
                .get(&pid)
                .is_some_and(|t| t.attached.contains_key(&id))
        }
    }

    /// Whether every probe-carrying file `pid` maps now is attached for it.
    pub fn is_attached_to(&mut self, pid: Pid) -> bool {
        let Ok(scan) = self.processes.scan(pid) else {
            return false;
        };
        !scan.probes.is_empty() && scan.probes.iter().all(|f| self.is_attached(pid, f.id()))
    }
}

//! Exec, exit and dlopen: the kernel's events and periodic rescans decide
//! when a process image is retired (frozen as it was, its kernel state
//! freed) and what only it needed is pruned.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Instant,
};

use profiler_common::{
    AggKey, PROC_EVENT_EXEC, PROC_EVENT_EXIT, PROC_EVENT_FORK, PROC_EVENT_OOM, ProcCounters,
};

use super::{
    Incarnation, KernelPort, ProcessPort, RESCAN_AFTER_EXEC, Session, Target, rescan_period,
};
use crate::{
    ids::{HostPid, Pid, Tid},
    kernel::KernelSnapshot,
    model::profile::{ProcessKey, ProcessState},
    model::stats::Totals,
    symbolize::Frame,
};

/// A process image that is gone, frozen as it was.
pub(super) struct Frozen {
    pub key: ProcessKey,
    pub incarnation: Incarnation,
    /// Its parent (`--pid`'s trees).
    pub parent: Option<Pid>,
    pub name: String,
    pub rate: u64,
    pub state: ProcessState,
    /// It ran before the session attached (see `Session::predates_attach`).
    pub since_attach: bool,
    pub ledger: Option<crate::process::ledger::LedgerStatus>,
    /// Who it was (OTLP resource attributes).
    pub resource: Option<Arc<crate::process::resource::ProcessResource>>,
    /// Its files' build ids (shared with the live image's record).
    pub build_ids: Option<Arc<crate::model::profile::BuildIds>>,
    /// Its CPython, if it ran one.
    pub python: Option<crate::python::runtime::PythonRuntime>,
    /// The allocator's budget as last read while it ran.
    pub alloc_thinning: Option<profiler_common::backend_stats::AllocatorThinning>,
    pub proc: ProcCounters,
    pub stacks: Vec<(u64, Totals)>,
    /// Its stacks' names, and those still at the symbolizer.
    pub names: HashMap<u64, Arc<[Frame]>>,
    pub pending: HashSet<u64>,
    /// Its `STACKS` entries were deleted (all its stacks symbolized).
    pub stacks_reclaimed: bool,
    /// An OOM victim written by the recorder.
    pub oom_recorded: bool,
    /// Estimated heap it holds, its stacks' names included once they are
    /// all symbolized.
    pub bytes: u64,
}

impl Frozen {
    /// An image the OOM killer killed that has no file yet (each victim is
    /// written once: a later one may have the same pid and generation).
    pub(super) fn oom_due(&self) -> bool {
        self.state == ProcessState::OomKilled && !self.oom_recorded
    }

    /// The heap of the image itself, without its stacks' names.
    fn own_bytes(&self) -> u64 {
        let resource = self.resource.as_deref().map_or(0, |r| {
            size_of_val(r)
                + [
                    &r.executable_path,
                    &r.service_name,
                    &r.container_id,
                    &r.pod_uid,
                    &r.command_line,
                ]
                .iter()
                .map(|s| s.as_ref().map_or(0, String::capacity))
                .sum::<usize>()
        });
        let build_ids = self.build_ids.as_deref().map_or(0, |ids| {
            ids.iter()
                .map(|(path, id)| path.len() + id.len() + 4 * size_of::<usize>())
                .sum::<usize>()
        });
        (size_of::<Frozen>()
            + resource
            + build_ids
            + self.name.capacity()
            + self.stacks.capacity() * size_of::<(u64, Totals)>()) as u64
    }
}

impl<K: KernelPort, P: ProcessPort> Session<K, P> {
    /// Handles process exits and execs reported by the kernel, and runs due
    /// rescans. Call often (every ~50 ms): rescans after exec are time-critical.
    ///
    /// The work follows what changed: an exec costs a lookup of the
    /// process's own kernel entry (most execs system-wide are of processes
    /// without one) and one series of rescans however often it execs; the
    /// images that went in one poll are retired together.
    pub fn poll_events(&mut self) {
        self.load_tables();
        self.retire_unseen_frees();
        for line in self.kernel.diagnostics() {
            self.warnings.push(format!("kernel: {line}"));
        }
        let now = Instant::now();
        let mut exited = Vec::new();
        let mut execed = Vec::new();
        let mut forked = Vec::new();
        let mut execed_pids = HashSet::new();
        for event in self.kernel.proc_events() {
            if event.kind == PROC_EVENT_FORK {
                forked.extend(self.forked(HostPid(event.pid), HostPid(event.parent)));
                continue;
            }
            if event.kind == PROC_EVENT_EXEC
                && let Some(pid) = self.pids.local(HostPid(event.pid))
            {
                execed_pids.insert(pid);
            }
            // Processes outside our pid namespace, or not recognised yet.
            let host = HostPid(event.pid);
            let Some(pid) = self.pids.local(host) else {
                continue;
            };
            match event.kind {
                // The kernel reports the main thread's exit; with
                // pthread_exit the other threads run on (then `track`
                // notices the real exit).
                // Already retired (a refresh found it dead before its
                // event came): freezing it again would show a second image
                // without what was read of it.
                PROC_EVENT_EXIT if !self.tracked.contains_key(&pid) => {}
                PROC_EVENT_EXIT if !self.processes.alive(pid) => exited.push(pid),
                // Its main thread left with pthread_exit: with `--pid`, the
                // probes attached through it went too; attach through
                // another thread now, not at the next periodic rescan.
                PROC_EVENT_EXIT => {
                    self.refollow(pid);
                    self.track_pid(pid).rescan = Some((now, 0));
                }
                // Its exit follows: the image it freezes is the heap the
                // OOM killer found.
                PROC_EVENT_OOM => {
                    self.track_pid(pid).oom_victim = true;
                }
                PROC_EVENT_EXEC => {
                    // The old image's tables would walk the new one wrong.
                    self.forget_tables(pid);
                    self.forget_python(pid);
                    // The kernel bumped its generation if it tracks it.
                    let seeded = self.seeded_generation(pid);
                    match (self.kernel.process(host), seeded) {
                        (Some(state), _) => execed.push((pid, state.generation)),
                        // No kernel sample, but blocks from before attach:
                        // the old image is frozen as those.
                        (None, Some(g)) => execed.push((pid, g + 1)),
                        // Nothing to freeze; the old image's files go.
                        (None, None) => self.prune(pid, false),
                    }
                    self.track_pid(pid).rescan = Some((now, 0));
                }
                _ => {}
            }
        }
        // A child gone before it could be scanned, which did not exec, had
        // its parent's mappings and was who its parent is: its stacks are
        // named with those, its resource is its parent's.
        for &pid in &forked {
            if exited.contains(&pid) && !execed_pids.contains(&pid) {
                self.inherit_from_parent(pid);
            }
        }
        self.retire(&exited, &execed);
        // New children of a followed tree: their probe files and the heap
        // they inherited (their ledger), unless gone already.
        for pid in forked {
            if !exited.contains(&pid)
                && let Err(e) = self.scan(pid)
            {
                self.warnings.push(format!("process {pid}: {e}"));
            }
        }
        let mut due = Vec::new();
        for (pid, tracked) in &mut self.tracked {
            let Some((at, next)) = &mut tracked.rescan else {
                continue;
            };
            let passed = RESCAN_AFTER_EXEC
                .iter()
                .skip(*next)
                .take_while(|d| *at + **d <= now)
                .count();
            if passed > 0 {
                due.push(*pid);
                *next += passed;
                // Its identity (name and rate) and resource are kept: an
                // exec reset the image already (`Tracked::exec`; the scan
                // reads the new image's when it carries probes), and an exit
                // event of a process still in /proc (exiting, its memory
                // gone, or its main thread gone) must not lose what was read
                // while it lived: read again after exit, its environ is gone
                // and its rate would be the default.
            }
            if *next >= RESCAN_AFTER_EXEC.len() {
                tracked.rescan = None;
            }
        }
        due.sort_unstable();
        for pid in due {
            if let Err(e) = self.scan(pid) {
                self.warnings.push(format!("process {pid}: {e}"));
            }
        }
    }

    /// Freezes the process images that exited (`exited`) or were replaced by
    /// exec (`execed`: the pid and its new generation), frees their kernel
    /// state, and prunes what only they needed. One snapshot per batch, and
    /// none when no process of it has kernel state; the kernel cleanup
    /// deletes the images' aggregates by key and walks the live samples only
    /// if the images still had some.
    pub(super) fn retire(&mut self, exited: &[Pid], execed: &[(Pid, u32)]) {
        // pid → the generations that go: those below this one, or all.
        let mut gone: HashMap<Pid, Option<u32>> = HashMap::new();
        for (pid, generation) in execed {
            gone.insert(*pid, Some(*generation));
        }
        for pid in exited {
            gone.insert(*pid, None);
        }
        if gone.is_empty() {
            return;
        }
        let tracked = gone.keys().any(|pid| {
            self.has_seeds(*pid)
                || self
                    .pids
                    .host(*pid)
                    .is_some_and(|host| self.kernel.process(host).is_some())
        });
        // Frozen images keep no ages: their live samples are not read.
        if tracked && let Ok(mut snapshot) = self.snapshot(false) {
            // Only the gone images are frozen: the others' seeds are not
            // wanted here.
            self.add_seeds_of(&mut snapshot, |pid| gone.contains_key(&pid));
            self.freeze(&snapshot, &gone);
        }
        for (pid, below) in gone {
            self.prune(pid, below.is_none());
        }
    }

    /// The freezing half of [`Session::retire`].
    pub(super) fn freeze(&mut self, snapshot: &KernelSnapshot, gone: &HashMap<Pid, Option<u32>>) {
        let is_gone = |pid: Pid, generation: u32| {
            gone.get(&pid)
                .is_some_and(|below| below.is_none_or(|g| generation < g))
        };
        let mut images: BTreeMap<ProcessKey, Vec<(u64, Totals)>> = BTreeMap::new();
        let mut keys = Vec::new();
        let mut live_samples = 0;
        for (key, agg) in &snapshot.aggregates {
            if is_gone(Pid(key.pid), key.generation) {
                images
                    .entry(ProcessKey {
                        pid: Pid(key.pid),
                        generation: key.generation,
                    })
                    .or_default()
                    .push((
                        key.stack_id,
                        self.mark(Pid(key.pid), key.stack_id, Totals::from_agg(agg)),
                    ));
                live_samples += agg.live_samples;
                if let Some(host) = self.pids.host(Pid(key.pid)) {
                    keys.push(AggKey {
                        pid: host.0,
                        ..*key
                    });
                }
            }
        }
        // Their stacks are normalized now, with the files they mapped; the
        // requests keep those files open until symbolized.
        self.request_symbols_where(snapshot, is_gone, false, &mut HashSet::new());
        for (key, stacks) in images {
            let exited = gone.get(&key.pid).is_some_and(Option::is_none);
            // Counters are per pid: the image's are those since the last
            // image frozen by exec; its weight form is the pid's.
            let now = snapshot
                .processes
                .get(&key.pid.0)
                .copied()
                .unwrap_or_default();
            let proc = self.image_counters(key.pid, &now);
            let (name, rate) = self.identity(key.pid);
            let resource = self.resource(key.pid);
            let since_attach = self.predates_attach(key);
            let ledger = self.ledger_status(key.pid, key.generation);
            let tracked = self.track_pid(key.pid);
            if !exited {
                tracked.exec_counters = Some(now);
            }
            let oom_victim = exited && std::mem::take(&mut tracked.oom_victim);
            // The image takes its stacks' names (stack ids are per image).
            let symbols = &mut tracked.symbols;
            let mut names = HashMap::new();
            let mut pending = HashSet::new();
            for (id, _) in &stacks {
                if let Some(frames) = symbols.names.remove(id) {
                    names.insert(*id, frames);
                }
                if symbols.pending.remove(id) {
                    pending.insert(*id);
                }
                // Its maps will not grow.
                symbols.unresolved.remove(id);
            }
            let build_ids = tracked.image.build_ids.clone();
            let mut frozen = Frozen {
                key,
                resource,
                build_ids,
                python: tracked.image.python_runtime,
                alloc_thinning: tracked.image.alloc_thinning,
                parent: tracked.parent,
                since_attach,
                ledger,
                incarnation: tracked.incarnation,
                name,
                rate,
                names,
                pending,
                state: if oom_victim {
                    ProcessState::OomKilled
                } else if exited {
                    ProcessState::Exited
                } else {
                    ProcessState::Replaced
                },
                proc,
                stacks,
                stacks_reclaimed: false,
                oom_recorded: false,
                bytes: 0,
            };
            frozen.bytes = frozen.own_bytes();
            self.gone_bytes += frozen.bytes;
            self.frozen.push_back(frozen);
        }
        self.drop_oldest_frozen();
        let hosts: Vec<(HostPid, Option<u32>)> = gone
            .iter()
            .filter_map(|(pid, below)| Some((self.pids.host(*pid)?, *below)))
            .collect();
        self.kernel.forget_images(&hosts, &keys, live_samples > 0);
    }

    /// The counters of `pid`'s current image: the kernel's (`now`, per pid)
    /// less those of its images frozen by exec. The weight form, the
    /// contracts and the back-pressure state stay the pid's.
    pub(super) fn image_counters(&self, pid: Pid, now: &ProcCounters) -> ProcCounters {
        let Some(before) = self
            .tracked
            .get(&pid)
            .and_then(|t| t.exec_counters.as_ref())
        else {
            return *now;
        };
        let mut c = *now;
        c.alloc_events = now.alloc_events.saturating_sub(before.alloc_events);
        c.free_events = now.free_events.saturating_sub(before.free_events);
        c.lost_live_bytes = now.lost_live_bytes.saturating_sub(before.lost_live_bytes);
        c.thinned_events = now.thinned_events.saturating_sub(before.thinned_events);
        c.mmap_events = now.mmap_events.saturating_sub(before.mmap_events);
        // Wrapping in the kernel too (read as signed).
        c.mapped_bytes = now.mapped_bytes.wrapping_sub(before.mapped_bytes);
        for (d, b) in c.drops.iter_mut().zip(before.drops) {
            *d = d.saturating_sub(b);
        }
        c
    }

    /// Keeps at most `max_frozen` frozen images, taking at most
    /// `max_gone_bytes`: the oldest go, with their stacks' names (the
    /// dropping said once).
    pub(super) fn drop_oldest_frozen(&mut self) {
        let mut excess = 0;
        while excess < self.frozen.len()
            && (self.frozen.len() - excess > self.max_frozen
                || self.gone_bytes > self.max_gone_bytes)
        {
            self.gone_bytes -= self.frozen[excess].bytes;
            excess += 1;
        }
        if excess == 0 {
            return;
        }
        // With their names (stack ids belong to one image: these served
        // only it); the answers to their pending requests find no owner.
        self.frozen.drain(..excess);
        if self.dropped_images == 0 {
            self.warnings.push(format!(
                "more than {} process images, or {} of them, have exited or exec'ed: \
                 the oldest are no longer shown (--max-gone-memory raises the memory cap)",
                self.max_frozen,
                crate::model::stats::human_bytes(self.max_gone_bytes as f64)
            ));
        }
        self.dropped_images += excess as u64;
    }

    /// Drops what only a retired image needed: for an exec, the image's
    /// state (the new image gets its own at the rescan); for an exit, the
    /// process's record, its pid mapping and its per-process attachments.
    pub(super) fn prune(&mut self, pid: Pid, exited: bool) {
        self.forget_tables(pid);
        self.forget_python(pid);
        self.forget_ledger(pid);
        if !exited {
            self.track_pid(pid).exec();
            return;
        }
        self.pids.remove_local(pid);
        // A process that reuses the pid is another incarnation.
        let Some(tracked) = self.tracked.remove(&pid) else {
            return;
        };
        let mut tids: Vec<Tid> = tracked.attached.into_values().collect();
        tids.sort_unstable();
        tids.dedup();
        for tid in tids {
            self.kernel.detach_process(tid);
        }
    }

    /// A tracked process known whole (scanned with probes, every stack
    /// within its maps): between sweeps, nothing is read for it.
    fn settled(&self, pid: Pid) -> bool {
        self.tracked.get(&pid).is_some_and(|t| {
            t.image.scanned.is_some() && t.image.space.is_some() && t.symbols.unresolved.is_empty()
        })
    }

    /// Processes scanned but never sampled that are gone.
    fn gone_unsampled(&self, snapshot: &KernelSnapshot) -> Vec<Pid> {
        self.tracked
            .iter()
            .filter(|(_, t)| t.image.space.is_some() || t.parent.is_some())
            .map(|(pid, _)| *pid)
            .filter(|pid| !snapshot.processes.contains_key(&pid.0))
            .filter(|pid| !self.processes.alive(*pid))
            .collect()
    }

    /// Scans `pid` again, noting its code size then.
    pub(super) fn rescan(&mut self, pid: Pid) {
        // Read before the scan: a dlopen in between is seen next time.
        let code_size = self.processes.code_size(pid);
        match self.scan(pid) {
            Ok(_) => self.track_pid(pid).image.scanned = Some((code_size, Instant::now())),
            Err(e) => self.warnings.push(format!("process {pid}: {e}")),
        }
    }

    /// Whether a tracked process's maps may have changed since its last
    /// scan: never scanned with probes, its code size changed or is unknown,
    /// stacks of it fell outside its maps, or its [`rescan_period`] passed.
    pub(super) fn rescan_due(&self, pid: Pid) -> bool {
        let Some(tracked) = self.tracked.get(&pid) else {
            return true;
        };
        let Some((size, at)) = tracked.image.scanned else {
            return true;
        };
        tracked.image.space.is_none()
            || size.is_none()
            || at.elapsed() >= rescan_period(pid)
            || !tracked.symbols.unresolved.is_empty()
            || self.processes.code_size(pid) != size
    }

    /// Keeps the address spaces of tracked processes current and picks up
    /// libraries they dlopen'ed. Processes found dead are retired and taken
    /// out of `snapshot`, so the profile built from it shows them once,
    /// frozen (not also live).
    pub(super) fn track(&mut self, snapshot: &mut KernelSnapshot) {
        let mut pids: Vec<Pid> = snapshot.processes.keys().map(|&p| Pid(p)).collect();
        pids.extend(self.target.roots());
        pids.sort_unstable();
        pids.dedup();
        // System-wide only: the named processes' trees are few enough to
        // look at every time.
        let sweep = self.target != Target::All || self.last_sweep.elapsed() >= self.sweep_every;
        if sweep {
            self.last_sweep = Instant::now();
        }
        let mut dead = Vec::new();
        for pid in pids {
            if !sweep && self.settled(pid) {
                continue;
            }
            if self.processes.alive(pid) {
                // Processes with stacks outside their known maps: a library
                // they dlopen'ed is to be seen at once.
                if self.rescan_due(pid) {
                    self.rescan(pid);
                }
            } else if snapshot.processes.contains_key(&pid.0) {
                // Its exit event was lost (full ring buffer) or it died
                // before we attached its exit: clean up all the same.
                dead.push(pid);
            }
        }
        // Processes scanned but never sampled have no kernel state (and no
        // exit event): what we hold for them goes when they do.
        if sweep {
            dead.extend(self.gone_unsampled(snapshot));
        }
        self.retire(&dead, &[]);

        if !dead.is_empty() {
            snapshot
                .aggregates
                .retain(|(key, _)| !dead.contains(&Pid(key.pid)));
            snapshot
                .processes
                .retain(|pid, _| !dead.contains(&Pid(*pid)));
        }
        self.release_tables();
        if self.target == Target::All && self.last_full_scan.elapsed() >= self.full_scan_every {
            self.scan_all();
        }
    }
}

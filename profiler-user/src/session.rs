//! A profiling session: attach to the targets, follow processes as they
//! exec, exit and dlopen, and turn the kernel's maps into a [`Profile`].
//! Everything here is synchronous; the binary drives it from its event loop.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use profiler_common::{AggKey, NO_STACK, PROC_EVENT_EXEC, PROC_EVENT_EXIT, ProcCounters};
use thiserror::Error;

use crate::{
    discover::{self, FileId, ProbeFile, Scanner},
    kernel::{Kernel, KernelError, KernelSnapshot, Limits, Scope},
    normalize::AddressSpace,
    pidns::{Correlation, PidMap, correlate},
    profile::{ProcessKey, ProcessProfile, ProcessState, Profile, StackProfile, sort_processes},
    stats::Totals,
    symbolize::{Frame, Request, SymbolizerThread},
};

/// After an exec, the dynamic loader maps LD_PRELOAD libraries within
/// milliseconds; look again a few times before relying on the periodic scan.
const RESCAN_AFTER_EXEC: [Duration; 4] = [
    Duration::from_millis(0),
    Duration::from_millis(30),
    Duration::from_millis(200),
    Duration::from_secs(1),
];
/// System-wide, every process is rescanned this often (for dlopen).
const FULL_SCAN_EVERY: Duration = Duration::from_secs(5);

/// Which processes to profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// These processes only.
    Pids(Vec<u32>),
    /// Every process that carries the probes, now or later.
    All,
}

#[derive(Debug, Error)]
pub enum ArmError {
    #[error("cannot read the probe file {path}: {source}")]
    Unreadable {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

#[derive(Debug, Error)]
pub enum StartError {
    #[error("no process with pid {0}")]
    NoSuchProcess(u32),
    #[error(
        "process {pid} ({name}) has no otel_memory probes: start it with \
         LD_PRELOAD=/path/to/liballocprof.so, or build it with the allocprof Rust global \
         allocator (allocator::SamplingAllocator)"
    )]
    NoProbes { pid: u32, name: String },
    #[error("process {pid} carries otel_memory probes, but none can be attached: {problems}")]
    UnusableProbes { pid: u32, problems: String },
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

/// A process image that is gone, frozen as it was.
struct Frozen {
    name: String,
    rate: u64,
    state: ProcessState,
    proc: ProcCounters,
    stacks: Vec<(u64, Totals)>,
}

pub struct Session {
    kernel: Kernel,
    target: Target,
    scanner: Scanner,
    /// Files attached for all processes (system-wide).
    attached_files: HashSet<FileId>,
    /// Files attached per process (`--pid`), with the live thread the
    /// attachment follows.
    attached_pid_files: HashMap<(u32, FileId), u32>,
    spaces: HashMap<u32, AddressSpace>,
    /// Host pids (the kernel's) ↔ ours; all pids outside `kernel` are ours.
    pids: PidMap,
    /// The files whose probes are attached (to recognise host pids).
    probe_ids: HashSet<FileId>,
    /// Host pids whose process could not be told apart (warned once).
    ambiguous: HashSet<u32>,
    names: HashMap<u32, (String, u64)>,
    symbols: HashMap<(u32, u64), Arc<[Frame]>>,
    pending: HashSet<(u32, u64)>,
    symbolizer: SymbolizerThread<(u32, u64)>,
    frozen: Vec<(ProcessKey, Frozen)>,
    /// Processes that exec'ed: when, and the next of `RESCAN_AFTER_EXEC`.
    rescans: HashMap<u32, (Instant, usize)>,
    last_full_scan: Instant,
    started: Instant,
    /// Problems found while attaching (shown once, e.g. unparsable notes).
    pub warnings: Vec<String>,
}

impl Session {
    pub fn start(target: Target, limits: Limits) -> Result<Session, StartError> {
        if let Target::Pids(pids) = &target {
            for &pid in pids {
                if !discover::process_alive(pid) {
                    return Err(StartError::NoSuchProcess(pid));
                }
            }
        }
        let kernel = Kernel::load(limits, target == Target::All)?;
        let mut session = Session {
            kernel,
            target: target.clone(),
            scanner: Scanner::default(),
            attached_files: HashSet::new(),
            attached_pid_files: HashMap::new(),
            spaces: HashMap::new(),
            pids: PidMap::detect(),
            probe_ids: HashSet::new(),
            ambiguous: HashSet::new(),
            names: HashMap::new(),
            symbols: HashMap::new(),
            pending: HashSet::new(),
            symbolizer: SymbolizerThread::spawn(),
            frozen: Vec::new(),
            rescans: HashMap::new(),
            last_full_scan: Instant::now(),
            started: Instant::now(),
            warnings: Vec::new(),
        };
        match target {
            Target::Pids(pids) => {
                for pid in pids {
                    let attached = session.scan(pid)?;
                    if attached == 0 {
                        let name = discover::process_name(pid).unwrap_or_default();
                        let problems = session.warnings.join("; ");
                        return Err(if problems.is_empty() {
                            StartError::NoProbes { pid, name }
                        } else {
                            StartError::UnusableProbes { pid, problems }
                        });
                    }
                }
            }
            Target::All => session.scan_all(),
        }
        Ok(session)
    }

    /// Attaches to the probe files `pid` maps; returns how many it carries.
    fn scan(&mut self, pid: u32) -> Result<usize, KernelError> {
        let Ok(scan) = self.scanner.scan(pid) else {
            return Ok(0); // gone already
        };
        // Only processes that carry probes can have stacks: only theirs
        // hold their mapped files open.
        if !scan.probes.is_empty() {
            self.spaces.insert(pid, scan.space);
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
    fn attach(&mut self, pid: u32, tid: u32, file: &ProbeFile) -> Result<Option<u32>, KernelError> {
        let (scope, replaced) = match self.target {
            Target::All => {
                if !self.attached_files.insert(file.id()) {
                    return Ok(None);
                }
                (Scope::AllProcesses, None)
            }
            Target::Pids(_) => match self.attached_pid_files.insert((pid, file.id()), tid) {
                Some(old) if old == tid => return Ok(None),
                old => (Scope::Process(tid), old),
            },
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
        Ok(replaced)
    }

    /// System-wide mode: attaches to the probes of `path` now, so that a
    /// process that maps it is covered from its first allocation (not from
    /// the rescan that finds it). Returns whether it carries probes.
    pub fn arm(&mut self, path: &std::path::Path) -> Result<bool, ArmError> {
        let io = |source| ArmError::Unreadable {
            path: path.to_path_buf(),
            source,
        };
        let Some(file) = discover::probe_file_at(path).map_err(io)? else {
            return Ok(false);
        };
        if self.target == Target::All {
            self.attach(0, 0, &file)?;
        }
        Ok(true)
    }

    fn scan_all(&mut self) {
        for pid in discover::all_pids() {
            if pid != std::process::id()
                && let Err(e) = self.scan(pid)
            {
                self.warnings.push(format!("process {pid}: {e}"));
            }
        }
        self.last_full_scan = Instant::now();
    }

    /// Handles process exits and execs reported by the kernel, and runs due
    /// rescans. Call often (every ~50 ms): rescans after exec are time-critical.
    ///
    /// The work follows what changed: an exec costs a lookup of the
    /// process's own kernel entry (most execs system-wide are of processes
    /// without one) and one series of rescans however often it execs; the
    /// images that went in one poll are retired together.
    pub fn poll_events(&mut self) {
        let now = Instant::now();
        let mut exited = Vec::new();
        let mut execed = Vec::new();
        for event in self.kernel.proc_events() {
            // Processes outside our pid namespace, or not recognised yet.
            let Some(pid) = self.pids.local(event.pid) else {
                continue;
            };
            match event.kind {
                // The kernel reports the main thread's exit; with
                // pthread_exit the other threads run on (then `track`
                // notices the real exit).
                PROC_EVENT_EXIT if !discover::process_alive(pid) => exited.push(pid),
                PROC_EVENT_EXEC => {
                    // The kernel bumped its generation if it tracks it.
                    match self.kernel.process(event.pid) {
                        Some(state) => execed.push((pid, state.generation)),
                        // Nothing to freeze; the old image's files go.
                        None => self.prune(pid, false),
                    }
                    self.rescans.insert(pid, (now, 0));
                }
                _ => {}
            }
        }
        self.retire(&exited, &execed);
        let mut due = Vec::new();
        self.rescans.retain(|pid, (at, next)| {
            let passed = RESCAN_AFTER_EXEC
                .iter()
                .skip(*next)
                .take_while(|d| *at + **d <= now)
                .count();
            if passed > 0 {
                due.push(*pid);
                *next += passed;
            }
            *next < RESCAN_AFTER_EXEC.len()
        });
        due.sort_unstable();
        for pid in due {
            self.names.remove(&pid);
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
    fn retire(&mut self, exited: &[u32], execed: &[(u32, u32)]) {
        // pid → the generations that go: those below this one, or all.
        let mut gone: HashMap<u32, Option<u32>> = HashMap::new();
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
            self.pids
                .host(*pid)
                .is_some_and(|host| self.kernel.process(host).is_some())
        });
        if tracked && let Ok(snapshot) = self.snapshot() {
            self.freeze(&snapshot, &gone);
        }
        for (pid, below) in gone {
            self.prune(pid, below.is_none());
        }
    }

    /// The freezing half of [`Session::retire`].
    fn freeze(&mut self, snapshot: &KernelSnapshot, gone: &HashMap<u32, Option<u32>>) {
        let is_gone = |pid: u32, generation: u32| {
            gone.get(&pid)
                .is_some_and(|below| below.is_none_or(|g| generation < g))
        };
        let mut images: BTreeMap<ProcessKey, Vec<(u64, Totals)>> = BTreeMap::new();
        let mut keys = Vec::new();
        let mut live_samples = 0;
        for (key, agg) in &snapshot.aggregates {
            if is_gone(key.pid, key.generation) {
                images
                    .entry(ProcessKey {
                        pid: key.pid,
                        generation: key.generation,
                    })
                    .or_default()
                    .push((key.stack_id, Totals::from_agg(agg)));
                live_samples += agg.live_samples;
                if let Some(host) = self.pids.host(key.pid) {
                    keys.push(AggKey { pid: host, ..*key });
                }
            }
        }
        // Their stacks are normalized now, with the files they mapped; the
        // requests keep those files open until symbolized.
        self.request_symbols_where(snapshot, is_gone);
        for (key, stacks) in images {
            let exited = gone.get(&key.pid).is_some_and(Option::is_none);
            // Counters are per pid, not per image: an exec'ed image keeps none.
            let proc = if exited {
                snapshot
                    .processes
                    .get(&key.pid)
                    .copied()
                    .unwrap_or_default()
            } else {
                ProcCounters::default()
            };
            let (name, rate) = self.identity(key.pid);
            let frozen = Frozen {
                name,
                rate,
                state: if exited {
                    ProcessState::Exited
                } else {
                    ProcessState::Replaced
                },
                proc,
                stacks,
            };
            self.frozen.push((key, frozen));
        }
        let hosts: Vec<(u32, Option<u32>)> = gone
            .iter()
            .filter_map(|(pid, below)| Some((self.pids.host(*pid)?, *below)))
            .collect();
        self.kernel.forget_images(&hosts, &keys, live_samples > 0);
    }

    /// Drops what only a retired image needed: its address space (the new
    /// image of an exec gets its own at the rescan) and name; for an exit,
    /// also its pid mapping, rescans and per-process attachments.
    fn prune(&mut self, pid: u32, exited: bool) {
        self.spaces.remove(&pid);
        self.names.remove(&pid);
        if !exited {
            return;
        }
        self.pids.remove_local(pid);
        self.rescans.remove(&pid);
        let mut tids = Vec::new();
        self.attached_pid_files.retain(|(p, _), tid| {
            if *p == pid {
                tids.push(*tid);
            }
            *p != pid
        });
        tids.sort_unstable();
        tids.dedup();
        for tid in tids {
            self.kernel.detach_process(tid);
        }
    }

    /// How many process address spaces (and so their open files) are held.
    pub fn held_address_spaces(&self) -> usize {
        self.spaces.len()
    }

    /// The kernel's maps, with host pids turned into ours; processes we
    /// cannot see (outside our pid namespace) or not recognised yet are left
    /// out.
    fn snapshot(&mut self) -> Result<KernelSnapshot, KernelError> {
        let mut snapshot = self.kernel.snapshot()?;
        if self.pids.is_identity() {
            return Ok(snapshot);
        }
        self.recognise(&snapshot);
        let pids = &self.pids;
        snapshot
            .aggregates
            .retain_mut(|(key, _)| match pids.local(key.pid) {
                Some(local) => {
                    key.pid = local;
                    true
                }
                None => false,
            });
        snapshot.processes = std::mem::take(&mut snapshot.processes)
            .into_iter()
            .filter_map(|(host, state)| Some((pids.local(host)?, state)))
            .collect();
        Ok(snapshot)
    }

    /// Learns the host pids of the snapshot that are not mapped yet, by the
    /// probe sites their stacks start at (see `pidns`).
    fn recognise(&mut self, snapshot: &KernelSnapshot) {
        let mut first_frames: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for (key, _) in &snapshot.aggregates {
            if key.stack_id == NO_STACK || self.pids.local(key.pid).is_some() {
                continue;
            }
            let frames = first_frames.entry(key.pid).or_default();
            if frames.len() < 8
                && let Some(first) = self
                    .kernel
                    .stack(key.stack_id)
                    .and_then(|s| s.first().copied())
            {
                frames.push(first);
            }
        }
        let mut matches: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (host, addresses) in first_frames {
            let candidates = self
                .spaces
                .iter()
                .filter(|(local, _)| !self.pids.is_mapped(**local))
                .map(|(local, space)| (*local, space));
            match correlate(&addresses, candidates, |id| self.probe_ids.contains(&id)) {
                Correlation::Unique(local) => matches.entry(local).or_default().push(host),
                Correlation::Ambiguous(locals) => {
                    self.warn_ambiguous(host, &format!("processes {locals:?}"));
                }
                Correlation::None => {}
            }
        }
        // Both ways: two host pids that look like one of ours (a process
        // outside our namespace with the same layout) are not told apart.
        for (local, hosts) in matches {
            match hosts.as_slice() {
                [host] => self.pids.insert(*host, local),
                _ => {
                    for host in hosts {
                        self.warn_ambiguous(host, &format!("process {local}"));
                    }
                }
            }
        }
    }

    fn warn_ambiguous(&mut self, host: u32, which: &str) {
        if self.ambiguous.insert(host) {
            self.warnings.push(format!(
                "cannot tell whether the kernel's pid {host} is {which} (the same \
                 address-space layout); its samples are left out"
            ));
        }
    }

    /// A process's name and sampling rate, read once while it is alive.
    fn identity(&mut self, pid: u32) -> (String, u64) {
        self.names
            .entry(pid)
            .or_insert_with(|| {
                let name = discover::process_name(pid).unwrap_or_else(|| "?".into());
                (name, discover::sampling_rate(pid))
            })
            .clone()
    }

    /// Reads the kernel's maps and builds the current profile.
    pub fn refresh(&mut self) -> Result<Profile, KernelError> {
        self.poll_events();
        let snapshot = self.snapshot()?;
        self.track(&snapshot);
        self.request_symbols(&snapshot);
        self.collect_symbols();
        Ok(self.build(&snapshot))
    }

    /// Keeps the address spaces of tracked processes current and picks up
    /// libraries they dlopen'ed.
    fn track(&mut self, snapshot: &KernelSnapshot) {
        let mut pids: Vec<u32> = snapshot.processes.keys().copied().collect();
        if let Target::Pids(targets) = &self.target {
            pids.extend(targets);
        }
        pids.sort_unstable();
        pids.dedup();
        let mut dead = Vec::new();
        for pid in pids {
            if discover::process_alive(pid) {
                if let Err(e) = self.scan(pid) {
                    self.warnings.push(format!("process {pid}: {e}"));
                }
            } else if snapshot.processes.contains_key(&pid) {
                // Its exit event was lost (full ring buffer) or it died
                // before we attached its exit: clean up all the same.
                dead.push(pid);
            }
        }
        // Processes scanned but never sampled have no kernel state (and no
        // exit event): what we hold for them goes when they do.
        dead.extend(
            self.spaces
                .keys()
                .filter(|pid| !snapshot.processes.contains_key(pid))
                .filter(|pid| !discover::process_alive(**pid))
                .copied()
                .collect::<Vec<_>>(),
        );
        self.retire(&dead, &[]);
        if self.target == Target::All && self.last_full_scan.elapsed() >= FULL_SCAN_EVERY {
            self.scan_all();
        }
    }

    fn request_symbols(&mut self, snapshot: &KernelSnapshot) {
        self.request_symbols_where(snapshot, |_, _| true);
    }

    /// Requests the stacks of the images `wanted(pid, generation)` selects.
    fn request_symbols_where(
        &mut self,
        snapshot: &KernelSnapshot,
        wanted: impl Fn(u32, u32) -> bool,
    ) {
        let mut batch = Vec::new();
        for (key, _) in &snapshot.aggregates {
            if !wanted(key.pid, key.generation) {
                continue;
            }
            let id = (key.pid, key.stack_id);
            if key.stack_id == NO_STACK
                || self.symbols.contains_key(&id)
                || self.pending.contains(&id)
            {
                continue;
            }
            let Some(addrs) = self.kernel.stack(key.stack_id) else {
                continue;
            };
            let space = self.spaces.get(&key.pid);
            let frames = addrs
                .into_iter()
                .map(|a| (a, space.and_then(|s| s.normalize(a))))
                .collect();
            self.pending.insert(id);
            batch.push(Request { key: id, frames });
        }
        self.symbolizer.submit(batch);
    }

    fn collect_symbols(&mut self) {
        for response in self.symbolizer.ready() {
            self.pending.remove(&response.key);
            self.symbols.insert(response.key, response.frames.into());
        }
    }

    /// The profile as of now with every stack symbolized: for a final
    /// report or a snapshot (waits for the symbolization thread).
    pub fn complete_profile(&mut self) -> Result<Profile, KernelError> {
        self.refresh()?;
        self.finish_symbols();
        self.refresh()
    }

    /// Waits for every requested stack to be symbolized.
    pub fn finish_symbols(&mut self) {
        for response in self.symbolizer.wait(self.pending.len()) {
            self.pending.remove(&response.key);
            self.symbols.insert(response.key, response.frames.into());
        }
    }

    fn frames(&self, pid: u32, stack_id: u64) -> Arc<[Frame]> {
        if let Some(text) = crate::profile::synthetic_stack(stack_id) {
            return placeholder(text);
        }
        match self.symbols.get(&(pid, stack_id)) {
            Some(frames) => frames.clone(),
            None => placeholder(&format!("[stack {stack_id:016x}, not yet symbolized]")),
        }
    }

    fn build(&mut self, snapshot: &KernelSnapshot) -> Profile {
        let mut live: BTreeMap<ProcessKey, Vec<(u64, Totals)>> = BTreeMap::new();
        for (key, agg) in &snapshot.aggregates {
            let pk = ProcessKey {
                pid: key.pid,
                generation: key.generation,
            };
            live.entry(pk)
                .or_default()
                .push((key.stack_id, Totals::from_agg(agg)));
        }
        let mut processes = Vec::new();
        for (key, stacks) in live {
            let proc = snapshot
                .processes
                .get(&key.pid)
                .copied()
                .unwrap_or_default();
            let (name, rate) = self.identity(key.pid);
            let image = Image {
                name,
                rate,
                state: ProcessState::Live,
            };
            processes.push(self.process_profile(key, image, &proc, &stacks));
        }
        for (key, f) in &self.frozen {
            let image = Image {
                name: f.name.clone(),
                rate: f.rate,
                state: f.state,
            };
            processes.push(self.process_profile(*key, image, &f.proc, &f.stacks));
        }
        sort_processes(&mut processes);
        Profile {
            processes,
            drops: snapshot.drops,
            elapsed: self.started.elapsed(),
        }
    }

    fn process_profile(
        &self,
        key: ProcessKey,
        image: Image,
        proc: &ProcCounters,
        stacks: &[(u64, Totals)],
    ) -> ProcessProfile {
        let stacks = stacks
            .iter()
            .map(|(id, totals)| StackProfile {
                frames: self.frames(key.pid, *id),
                totals: *totals,
            })
            .collect();
        ProcessProfile {
            alloc_events: proc.alloc_events,
            free_events: proc.free_events,
            drops: proc.drops,
            lost_live_bytes: proc.lost_live_bytes,
            ..ProcessProfile::from_stacks(key, image.name, image.state, image.rate, stacks)
        }
    }

    /// In `--pid` mode: whether any target still runs.
    pub fn targets_alive(&self) -> bool {
        match &self.target {
            Target::Pids(pids) => pids.iter().any(|&p| discover::process_alive(p)),
            Target::All => true,
        }
    }

    /// Whether every probe-carrying file `pid` maps is attached for it.
    pub fn is_attached_to(&mut self, pid: u32) -> bool {
        let Ok(files) = self.scanner.probe_files(pid) else {
            return false;
        };
        !files.is_empty() && files.iter().all(|f| self.is_attached(pid, f.id()))
    }

    /// Whether the probes of the file at `path` are attached for `pid`.
    pub fn is_attached_to_file(&self, pid: u32, path: &std::path::Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).is_ok_and(|m| {
            self.is_attached(
                pid,
                FileId {
                    dev: m.dev(),
                    ino: m.ino(),
                },
            )
        })
    }

    fn is_attached(&self, pid: u32, id: FileId) -> bool {
        match self.target {
            Target::All => self.attached_files.contains(&id),
            Target::Pids(_) => self.attached_pid_files.contains_key(&(pid, id)),
        }
    }

    /// Whether the kernel holds state for `pid`.
    pub fn kernel_tracks(&self, pid: u32) -> bool {
        let Some(host) = self.pids.host(pid) else {
            return false;
        };
        self.kernel
            .snapshot()
            .is_ok_and(|s| s.processes.contains_key(&host))
    }

    pub fn attachments(&self) -> usize {
        self.kernel.attachments()
    }
}

/// What identifies a process image in the profile, besides its key.
struct Image {
    name: String,
    rate: u64,
    state: ProcessState,
}

fn placeholder(text: &str) -> Arc<[Frame]> {
    Arc::from(vec![Frame::named(text)])
}

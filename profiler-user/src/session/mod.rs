//! A profiling session: attach to the targets, follow processes as they
//! exec, exit and dlopen, and turn the kernel's maps into a [`Profile`].
//! Everything here is synchronous; the binary drives it from its event loop.
//!
//! This is the one place where a process's life is tracked. The session
//! reads and changes the world only through [`KernelPort`] and
//! [`ProcessPort`] (`ports.rs`), so its bookkeeping is unit-tested with
//! fakes (`tests.rs`). By concern:
//! - `attach.rs`: which probe files are attached, for whom;
//! - `lifecycle.rs`: exec, exit and dlopen: retiring images (frozen as
//!   they were), pruning what only they needed, rescans;
//! - `namespace.rs`: the kernel's host pids turned into ours;
//! - `symbols.rs`: stacks to the symbolizer and back, per process
//!   incarnation (a reused pid never gets another process's names);
//! - `profile.rs`: the [`Profile`] of live and frozen images;
//! - `record.rs`: [`Tracked`], the record of one process: all the session
//!   knows of it, dropped when it goes;
//! - `tree.rs`: `--pid`'s trees: the descendants followed, their parents;
//! - `unwinding.rs`: which processes the kernel walks with unwind tables.

mod attach;
mod ledger;
mod lifecycle;
mod namespace;
mod ports;
mod profile;
mod python;
mod record;
mod symbols;
#[cfg(test)]
mod tests;
mod tree;
mod unwinding;

use std::{
    collections::{HashMap, HashSet, VecDeque},
    time::{Duration, Instant, SystemTime},
};

use thiserror::Error;

pub use self::ports::{BackendBlock, KernelPort, ProcessPort, Procfs};
use self::{
    lifecycle::Frozen,
    record::{Tracked, Visit},
};
use crate::{
    kernel::{Kernel, KernelError, KernelSnapshot, Limits, Mode as KernelMode},
    model::profile::Profile,
    oom::OomRecorder,
    process::discover::FileId,
    process::normalize::AddressSpace,
    process::pidns::PidMap,
    symbolize::{Symbolization, SymbolizerThread},
    unwind::tables::UnwindTables,
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
/// A tracked process is rescanned at a sweep only when its code size
/// changed (a dlopen or dlclose), some of its stacks fell outside its known
/// maps (then at once), or this long has passed (and its share of
/// `RESCAN_SPREAD`, see [`rescan_period`]).
const RESCAN_EVERY: Duration = Duration::from_secs(60);
/// Each process waits up to this much longer than `RESCAN_EVERY`, an amount
/// of its own.
const RESCAN_SPREAD: Duration = Duration::from_secs(30);

/// How long after its last scan a tracked process is rescanned when nothing
/// else called for it: `RESCAN_EVERY` plus a share of `RESCAN_SPREAD` fixed
/// by its pid. Processes scanned together (an agent starting on a host of
/// hundreds) then come due at different sweeps, and with periods of their
/// own they stay apart, so no sweep rescans them all at once.
fn rescan_period(pid: Pid) -> Duration {
    let spread = RESCAN_SPREAD.as_millis() as u64;
    // The pid's bits mixed (Fibonacci hashing), so consecutive pids fall
    // far apart.
    let share = (u64::from(pid.0).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) % spread;
    RESCAN_EVERY + Duration::from_millis(share)
}
/// How often every tracked process is looked at (alive? its code size?):
/// between sweeps, exits come as kernel events and a dlopen shows as stacks
/// outside the known maps, so a refresh costs what changed, not one /proc
/// read per process (500 processes: most of the agent's CPU).
const SWEEP_EVERY: Duration = FULL_SCAN_EVERY;
/// Exited and replaced images kept, so a long system-wide run over
/// short-lived processes holds bounded memory; the oldest go first.
const MAX_FROZEN_IMAGES: usize = 10_000;
/// With `--pid`, how long the start waits for the targets' unwind tables
/// before it attaches, so that their samples are walked whole from the
/// first (until its tables are in, a process is walked by frame pointers
/// and its stacks cut where they cannot be vouched for). A complete
/// profile waits as long for tables still loading, since the stacks walked
/// meanwhile are named only once they are in.
const TABLES_AT_START: Duration = Duration::from_secs(5);
/// What gone images (with their symbolized stacks) may hold by default:
/// a process with deep stacks takes megabytes of names.
pub const MAX_GONE_MEMORY: u64 = 64 << 20;

/// Which processes to profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// These processes only (`--pid --no-children`).
    Pids(Vec<Pid>),
    /// These processes and their descendants: those running now and those
    /// forked or spawned later, at any depth, until they exit (`--pid`).
    Trees(Vec<Pid>),
    /// Every process that carries the probes, now or later.
    All,
}

impl Target {
    /// The processes named (none system-wide).
    pub fn roots(&self) -> &[Pid] {
        match self {
            Target::Pids(pids) | Target::Trees(pids) => pids,
            Target::All => &[],
        }
    }

    /// Probe files are attached once for all processes (system-wide, and
    /// for trees, whose children must be seen from their first allocation;
    /// the kernel then profiles only the processes it follows).
    fn attaches_for_all(&self) -> bool {
        !matches!(self, Target::Pids(_))
    }
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
    NoSuchProcess(Pid),
    #[error(
        "process {pid} ({name}) has no otel_memory or ddheap probes: start it with \
         LD_PRELOAD=/path/to/liballocprof.so, or build it with the allocprof Rust global \
         allocator (allocator::SamplingAllocator)"
    )]
    NoProbes { pid: Pid, name: String },
    #[error(
        "process {pid} carries otel_memory or ddheap probes, but none can be attached: {problems}"
    )]
    UnusableProbes { pid: Pid, problems: String },
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

use crate::ids::{Incarnation, Pid};

/// A stack as the symbolizer is asked for it: of which process, which
/// incarnation of it (the answer is dropped if that one is gone), which id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct SymbolKey {
    pid: Pid,
    incarnation: Incarnation,
    stack: u64,
}

pub struct Session<K: KernelPort = Kernel, P: ProcessPort = Procfs> {
    kernel: K,
    processes: P,
    target: Target,
    /// Every tracked process, by our pid: all the session knows of it
    /// (see [`Tracked`]); forgetting a process is dropping its record.
    tracked: HashMap<Pid, Tracked>,
    /// Files attached for all processes (system-wide), and when
    /// (CLOCK_MONOTONIC ns).
    attached_files: HashMap<FileId, u64>,
    /// Host pids (the kernel's) ↔ ours; all pids outside `kernel` are ours.
    pids: PidMap,
    /// The files whose probes are attached (to recognise host pids).
    probe_ids: HashSet<FileId>,
    /// Host pids whose process could not be told apart (warned once).
    ambiguous: HashSet<crate::ids::HostPid>,
    /// When the live samples were last read, and the ages they gave.
    live_read_at: Option<Instant>,
    /// When the allocators' budgets were last read (`read_thinning`).
    thinning_read_at: Option<Instant>,
    ages: crate::model::age::AgesByStack,
    /// When the session attached: clock ticks since boot, and wall time.
    attach_ticks: u64,
    attached_at: SystemTime,
    next_incarnation: Incarnation,
    symbolizer: SymbolizerThread<SymbolKey>,
    /// Requests sent to the symbolizer and not answered yet (those of
    /// images dropped meanwhile included).
    in_flight: usize,
    /// Oldest first.
    frozen: VecDeque<Frozen>,
    max_frozen: usize,
    /// Cap on the estimated memory of `frozen` (see [`Frozen::bytes`]).
    max_gone_bytes: u64,
    /// The estimated memory of `frozen`.
    gone_bytes: u64,
    /// Frozen images dropped to keep `max_frozen` and `max_gone_bytes`.
    dropped_images: u64,
    last_full_scan: Instant,
    /// Processes the last full scan found without probes, as they were
    /// then (start, code size): the next one skips them if unchanged.
    probeless: HashMap<Pid, (Option<u64>, Option<u64>)>,
    last_sweep: Instant,
    /// [`SWEEP_EVERY`]; tests set it to zero.
    sweep_every: Duration,
    /// [`FULL_SCAN_EVERY`], or longer (see [`Session::set_scan_every`]).
    full_scan_every: Duration,
    started: Instant,
    /// `--oom-dir`: where the images the OOM killer killed are written.
    oom_recorder: Option<OomRecorder>,
    /// `--min-age`: live figures count samples live at least this long.
    min_age: Duration,
    /// How long a process's memory figures (backend statistics, resident
    /// size), once read, are shown as they were (zero: read at every
    /// profile).
    memory_figures_every: Duration,
    /// Unwind tables of the files processes map executable.
    unwind: UnwindTables,
    /// The caps seeds share with the kernel (see `ledger.rs`).
    seed_limits: ledger::SeedLimits,
    /// The seeds' cut: when the kernel's last snapshot was taken. Unseen
    /// frees of seeds after it wait for the next (see `ledger.rs`).
    seeds_cut_ns: u64,
    unseen_pending: Vec<profiler_common::UnseenFree>,
    /// What each executable file a process mapped says about CPython
    /// (see `python.rs`), and the files whose refusal was said.
    python_files: HashMap<FileId, crate::python::discover::Inspection>,
    python_warned: HashSet<FileId>,
    /// Symbolized stacks and build-id sets, each held once (see
    /// [`crate::symbolize::Shared`]).
    stacks: crate::symbolize::Shared<[crate::symbolize::Frame]>,
    build_ids: crate::symbolize::Shared<crate::model::profile::BuildIds>,
    /// Problems found while attaching (shown once, e.g. unparsable notes).
    pub warnings: Vec<String>,
    /// How many aggregates symbol requests looked at (for the tests: a
    /// tick looks only at the processes that may have new stacks).
    #[cfg(test)]
    looked_at: usize,
}

impl Session {
    /// Loads the kernel programs and attaches to the targets.
    pub fn start(target: Target, limits: Limits) -> Result<Session, StartError> {
        Session::start_reading(target, limits, false)
    }

    /// [`Session::start`], reading with `command_lines` each process's
    /// command line into its resource (opt-in: they hold secrets).
    pub fn start_reading(
        target: Target,
        limits: Limits,
        command_lines: bool,
    ) -> Result<Session, StartError> {
        let mut processes = Procfs::default();
        processes.command_lines = command_lines;
        // The kernel follows a tree by host pids, which a pid namespace
        // hides (they are learned from samples, too late for a fork): there
        // `--pid` follows the named processes only.
        let mut warning = None;
        let target = match target {
            Target::Trees(pids) if !crate::process::pidns::in_initial_pid_namespace() => {
                warning = Some(
                    "allocprof runs in a pid namespace: --pid follows the named processes, \
                     not their children (the kernel knows them by host pids)"
                        .to_owned(),
                );
                Target::Pids(pids)
            }
            target => target,
        };
        for &pid in target.roots() {
            if !processes.alive(pid) {
                return Err(StartError::NoSuchProcess(pid));
            }
        }
        let mode = match target {
            Target::Pids(_) => KernelMode::Attached,
            Target::Trees(_) => KernelMode::Trees,
            Target::All => KernelMode::All,
        };
        let kernel = Kernel::load(limits, mode)?;
        let mut session = Session::with_ports(kernel, processes, PidMap::detect(), target)?;
        session.warnings.extend(warning);
        session.seed_limits = ledger::SeedLimits::from(&limits);
        Ok(session)
    }
}

impl<K: KernelPort, P: ProcessPort> Session<K, P> {
    /// A session over given ports: attaches to the targets' probes now.
    pub(crate) fn with_ports(
        kernel: K,
        processes: P,
        pids: PidMap,
        target: Target,
    ) -> Result<Self, StartError> {
        let unwind = UnwindTables::new(kernel.unwind_capacity(), crate::unwind::tables::compile);
        let mut session = Session {
            unwind,
            min_age: Duration::ZERO,
            memory_figures_every: Duration::ZERO,
            oom_recorder: None,
            kernel,
            processes,
            target: target.clone(),
            tracked: HashMap::new(),
            attached_files: HashMap::new(),
            pids,
            probe_ids: HashSet::new(),
            ambiguous: HashSet::new(),
            live_read_at: None,
            thinning_read_at: None,
            ages: Default::default(),
            attach_ticks: boot_ticks_now(),
            attached_at: SystemTime::now(),
            next_incarnation: Incarnation(0),
            symbolizer: SymbolizerThread::spawn(),
            in_flight: 0,
            frozen: VecDeque::new(),
            max_frozen: MAX_FROZEN_IMAGES,
            max_gone_bytes: MAX_GONE_MEMORY,
            gone_bytes: 0,
            dropped_images: 0,
            last_full_scan: Instant::now(),
            probeless: HashMap::new(),
            last_sweep: Instant::now(),
            sweep_every: SWEEP_EVERY,
            full_scan_every: FULL_SCAN_EVERY,
            started: Instant::now(),
            seed_limits: ledger::SeedLimits::default(),
            seeds_cut_ns: 0,
            unseen_pending: Vec::new(),
            python_files: HashMap::new(),
            python_warned: HashSet::new(),
            stacks: Default::default(),
            build_ids: Default::default(),
            warnings: Vec::new(),
            #[cfg(test)]
            looked_at: 0,
        };
        match target {
            Target::Pids(pids) | Target::Trees(pids) => {
                // Before anything is scanned: a child forked from now on is
                // followed by the kernel, an older one found in /proc.
                let members = session.follow_trees(&pids);
                // The targets' unwind tables before their probes: their
                // samples are then walked with them from the first.
                for &pid in &pids {
                    session.want_tables_of(pid);
                }
                session.settle_tables(TABLES_AT_START);
                let mut in_trees = 0;
                for &pid in &members {
                    match session.scan(pid) {
                        Ok(n) => in_trees += n,
                        Err(e) => session.warnings.push(format!("process {pid}: {e}")),
                    }
                }
                for pid in pids {
                    let attached = session.scan(pid)?;
                    if attached == 0 && in_trees == 0 {
                        let name = session.processes.name(pid).unwrap_or_default();
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

    /// Reads the kernel's maps and builds the current profile.
    pub fn refresh(&mut self) -> Result<Profile, KernelError> {
        self.refresh_with(false)
    }

    /// [`Session::refresh`] without the profile, for the headless modes
    /// (report, `record`, `agent`) between their outputs: processes are
    /// followed, ledgers read and stacks symbolized as they come, but no
    /// profile is built to be thrown away (with 500 processes, that was
    /// most of the agent's CPU between exports).
    pub fn tick(&mut self) -> Result<(), KernelError> {
        self.read(false, false)?;
        if self.oom_victim_due() {
            // The recorder writes the whole profile beside the victim.
            let profile = self.build_now(false)?;
            self.record_oom(&profile);
        }
        self.take_process_warnings();
        Ok(())
    }

    /// [`Session::refresh`]; `complete` reads the live samples whatever the
    /// interval (a final profile's ages are those of its moment) and waits
    /// for every stack of this reading to be symbolized.
    fn refresh_with(&mut self, complete: bool) -> Result<Profile, KernelError> {
        let profile = self.build_now(complete)?;
        self.record_oom(&profile);
        self.take_process_warnings();
        Ok(profile)
    }

    fn build_now(&mut self, complete: bool) -> Result<Profile, KernelError> {
        let snapshot = self.read(complete, true)?;
        Ok(self.build(&snapshot))
    }

    /// The allocator's budget of each followed process, read from its
    /// statistics block about once a second, also in the headless modes,
    /// which build a profile only at the end: a process that exits before
    /// it keeps what was read last (its report still says what its
    /// allocator dropped, up to the last second). One bounded
    /// `process_vm_readv` per process with a block; none without.
    fn read_thinning(&mut self, visits: &HashMap<Pid, Visit>) {
        if self
            .thinning_read_at
            .is_some_and(|at| at.elapsed() < THINNING_READ_INTERVAL)
        {
            return;
        }
        self.thinning_read_at = Some(Instant::now());
        let processes = &self.processes;
        for (&pid, tracked) in &mut self.tracked {
            // A process that kept no sample since the last read dropped
            // none either (a budget keeps 1 sample in k): nothing to read.
            // That holds for one the kernel has no sample of too (500 idle
            // processes profiled from their ledgers were read every second).
            let kernel = visits.get(&pid).and_then(|v| v.kernel);
            if tracked.image.thinning_read_with == Some(kernel) {
                continue;
            }
            let block = &mut tracked.image.backend_block;
            if let Some(t) = processes
                .allocator_block(pid, block)
                .and_then(|b| b.thinning)
            {
                tracked.image.alloc_thinning = Some(t);
            }
            tracked.image.thinning_read_with = Some(kernel);
        }
    }

    /// One reading of the kernel's maps: events, new processes, ledgers,
    /// seeds and symbol requests; `for_profile` when a profile is built
    /// from it.
    fn read(&mut self, complete: bool, for_profile: bool) -> Result<KernelSnapshot, KernelError> {
        self.poll_events();
        // The live samples (the largest map) only feed the ages, which move
        // slowly: read every LIVE_READ_INTERVAL, or every time a minimum age
        // makes them the live figures; never for a tick, which shows no
        // ages (the seeds' check against their ledgers comes with them: a
        // seed freed meanwhile is retired before any profile shows it).
        let with_live = for_profile
            && (complete
                || !self.min_age.is_zero()
                || self
                    .live_read_at
                    .is_none_or(|at| at.elapsed() >= LIVE_READ_INTERVAL));
        if with_live {
            self.live_read_at = Some(Instant::now());
            // Before the snapshot: a seed whose block was freed after it
            // would be gone while the block that replaced it is not in it.
            self.check_all_seeds();
        }
        let mut snapshot = self.snapshot(with_live)?;
        self.track(&mut snapshot);
        if self.read_ledgers(&snapshot) {
            // Those ledgers' seeds are what lived at their read, less what
            // was freed since: the kernel is read again, after them, or the
            // blocks allocated meanwhile would be in neither (a churning
            // process's heap halved at its first profile).
            snapshot = self.snapshot_after(&snapshot, with_live)?;
        }
        // Only the processes whose stacks may have changed are looked at
        // for new ones; a tick, which builds nothing, adds only their seeds.
        let visits = self.visits(&snapshot);
        let quiet = self.quiet(&visits);
        if for_profile {
            self.add_seeds(&mut snapshot);
        } else {
            self.add_seeds_of(&mut snapshot, |pid| !quiet.contains(&pid));
        }
        self.read_thinning(&visits);
        if complete {
            // A stack walked while its files' tables were compiling waits
            // for them (`vouch_for`): a complete profile names it.
            self.settle_tables(TABLES_AT_START);
        }
        self.request_symbols(&snapshot, visits, &quiet);
        if complete {
            // Stacks new since the last refresh too (a churn keeps making
            // them).
            self.finish_symbols();
        } else {
            self.collect_symbols();
        }
        Ok(snapshot)
    }

    fn take_process_warnings(&mut self) {
        let unreadable = self.processes.take_warnings();
        self.warnings.extend(unreadable);
    }

    /// An image the OOM killer killed that has no file yet.
    fn oom_victim_due(&self) -> bool {
        self.oom_recorder.is_some() && self.frozen.iter().any(Frozen::oom_due)
    }

    /// Writes the images the OOM killer killed, once each, with their
    /// stacks symbolized (their names are what the files are for).
    fn record_oom(&mut self, profile: &Profile) {
        if self.oom_recorder.is_none() {
            return;
        }
        let due = Frozen::oom_due;
        if self.frozen.iter().any(|f| due(f) && !f.stacks_reclaimed) {
            return; // the next refresh has them
        }
        let victims: Vec<_> = self
            .frozen
            .iter()
            .filter(|f| due(f))
            .map(|f| self.frozen_profile(f))
            .collect();
        if victims.is_empty() {
            return;
        }
        for f in self.frozen.iter_mut().filter(|f| due(f)) {
            f.oom_recorded = true;
        }
        let Some(recorder) = &mut self.oom_recorder else {
            return;
        };
        match recorder.record(profile, &victims) {
            Ok(files) => {
                for pair in files.chunks(2) {
                    self.warnings.push(format!(
                        "the OOM killer killed a profiled process: its heap then is in {}",
                        pair.iter()
                            .map(|f| f.display().to_string())
                            .collect::<Vec<_>>()
                            .join(" and ")
                    ));
                }
            }
            Err(e) => self.warnings.push(format!("{e:#}")),
        }
    }

    /// The profile as of now with every stack symbolized: for a final
    /// report or a snapshot (waits for the symbolization thread).
    pub fn complete_profile(&mut self) -> Result<Profile, KernelError> {
        // The first reading scans new processes and asks for their stacks.
        self.tick()?;
        self.refresh_with(true)
    }

    /// Exited and exec'ed images stay shown while they take at most
    /// `bytes` (estimated, [`MAX_GONE_MEMORY`] by default); the oldest go
    /// first.
    pub fn set_max_gone_memory(&mut self, bytes: u64) {
        self.max_gone_bytes = bytes;
        self.drop_oldest_frozen();
    }

    /// Live figures (every view and export) count only samples allocated
    /// at least `age` ago (`--min-age`); zero counts all.
    pub fn set_min_age(&mut self, age: Duration) {
        self.min_age = age;
    }

    /// Each process's memory figures (its backend statistics and resident
    /// size) are read again only once `every` has passed since their last
    /// read: the agent's exports do not carry them, and reading 500
    /// processes' at each export (their memory, their `/proc`) was a tenth
    /// of its CPU. Zero (the default) reads them for every profile.
    pub fn set_memory_figures_every(&mut self, every: Duration) {
        self.memory_figures_every = every;
    }

    /// System-wide, how often every process is looked at again (the sweep
    /// of the tracked ones, the full scan for new probes): at least
    /// [`FULL_SCAN_EVERY`]. New programs are scanned at their exec event
    /// and dlopen'ed libraries show in their stacks whatever this is; the
    /// agent, which exports every 15 s, looks every 15 s (500 processes'
    /// `/proc/PID/status` every 5 s were a tenth of its CPU between exports).
    pub fn set_scan_every(&mut self, every: Duration) {
        let every = every.max(FULL_SCAN_EVERY);
        self.sweep_every = every;
        self.full_scan_every = every;
    }

    /// Whether stacks get names or stay addresses ([`Symbolization`]); to
    /// be set before the first refresh, as stacks already symbolized keep
    /// what they have.
    pub fn set_symbolization(&mut self, mode: Symbolization) {
        debug_assert_eq!(self.in_flight, 0, "symbolization set before any stack");
        self.symbolizer = SymbolizerThread::spawn_with(mode);
    }

    /// Writes the final profile of each process the OOM killer kills.
    pub fn record_oom_kills(&mut self, recorder: OomRecorder) {
        if let Some(why) = self.kernel.oom_unavailable() {
            self.warnings.push(format!(
                "OOM kills cannot be told from exits here ({why}): --oom-dir records none"
            ));
        }
        self.oom_recorder = Some(recorder);
    }

    /// In `--pid` mode: whether any target still runs.
    pub fn targets_alive(&self) -> bool {
        match &self.target {
            Target::Pids(pids) => pids.iter().any(|&p| self.processes.alive(p)),
            // Or any descendant (every tracked process is of the trees).
            Target::Trees(pids) => {
                pids.iter().any(|&p| self.processes.alive(p))
                    || self.tracked.keys().any(|&p| self.processes.alive(p))
            }
            Target::All => true,
        }
    }

    /// Number of attached probe sites.
    pub fn attachments(&self) -> usize {
        self.kernel.attachments()
    }

    /// How many process address spaces (and so their open files) are held.
    pub fn held_address_spaces(&self) -> usize {
        self.tracked
            .values()
            .filter(|t| t.image.space.is_some())
            .count()
    }

    /// The record of the process that has `pid` now (a new incarnation if
    /// none).
    fn track_pid(&mut self, pid: Pid) -> &mut Tracked {
        let next = &mut self.next_incarnation;
        self.tracked.entry(pid).or_insert_with(|| {
            next.0 += 1;
            Tracked::new(*next)
        })
    }

    /// `pid`'s address space, if known.
    fn space(&self, pid: Pid) -> Option<&AddressSpace> {
        self.tracked.get(&pid)?.image.space.as_ref()
    }

    /// How many per-process facts the session holds, over every record
    /// (for the tests: none outlives its process).
    #[cfg(test)]
    pub(crate) fn per_process_entries(&self) -> usize {
        self.tracked.values().map(Tracked::entries).sum()
    }
}

impl<K: KernelPort, P: ProcessPort> Session<K, P> {
    /// The kernel side, for tests that read its maps (raw stacks).
    pub fn kernel(&self) -> &K {
        &self.kernel
    }

    /// Whether the kernel holds state for `pid`.
    pub fn kernel_tracks(&self, pid: Pid) -> bool {
        let Some(host) = self.pids.host(pid) else {
            return false;
        };
        self.kernel.process(host).is_some()
    }
}

/// How often the live samples are read for their ages (without
/// `--min-age`).
const LIVE_READ_INTERVAL: Duration = Duration::from_secs(5);

/// How often each followed process's allocator budget is read from its
/// statistics block between profiles (`Session::read_thinning`).
const THINNING_READ_INTERVAL: Duration = Duration::from_secs(1);

/// Clock ticks since boot now (`CLOCK_BOOTTIME` in the unit of
/// `/proc/PID/stat`'s `starttime`).
fn boot_ticks_now() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut t) };
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&hz| hz > 0)
        .unwrap_or(100);
    t.tv_sec as u64 * hz + t.tv_nsec as u64 * hz / 1_000_000_000
}

//! The one module that talks to aya: loads the kernel programs, attaches them
//! to probe sites, and reads and trims the kernel's maps.
//!
//! (Over 600 lines on purpose: all of aya's surface stays in this one
//! module, the invariant that lets the rest be tested without a kernel.)

pub mod btf;
pub(crate) mod map_batch;

use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    num::NonZeroU32,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, IterableMap, MapData, PerCpuArray, RingBuf},
    programs::{
        RawTracePoint, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use profiler_common::map_names as names;
use profiler_common::{
    AggKey, DEFAULT_NEW_STACKS_BURST, DEFAULT_NEW_STACKS_PER_SECOND, DROP_REASONS, LiveKey,
    LiveSample, ProcCounters, ProcEvent, StackAgg, StackTrace, UnseenFree, UsdtSpec,
    python::{PyProcConfig, PyStackPrints},
    unwind::{ProcUnwind, UnwindRow},
};
use thiserror::Error;

use crate::ids::{HostPid, Tid};
use crate::process::discover::{FileId, OpenFile, ProbeKind, ProbeSite};

/// The kernel object, built by build.rs (from source, or the committed one).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/allocprof-ebpf"));

/// The program that handles a probe of this kind.
fn program_for(kind: ProbeKind) -> &'static str {
    match kind {
        ProbeKind::Alloc => "otel_memory_alloc",
        ProbeKind::Free => "otel_memory_free",
        ProbeKind::Mmap => "otel_memory_mmap",
        ProbeKind::Munmap => "otel_memory_munmap",
    }
}

/// Limits of the kernel-side state.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_live_samples: u32,
    pub max_live_per_process: u64,
    pub max_stacks: u32,
    pub max_aggregates: u32,
    pub max_processes: u32,
    /// Per process, new stack-table entries per second past the burst
    /// (0: unlimited); a known stack always resolves. The defaults'
    /// reasoning is at `profiler_common::DEFAULT_NEW_STACKS_PER_SECOND`.
    pub max_new_stacks_per_second: u64,
    /// New stack-table entries a process may create at once.
    pub new_stacks_burst: u64,
    /// Back-pressure: per process, the sampled alloc events per second the
    /// kernel keeps; past it, 1 in a power of two is kept and stands for
    /// all of them (see `profiler_common::thin_step`). 0: keep every one.
    pub max_event_rate: u64,
    /// Rows of compiled unwind tables, for all files (16 bytes each); 0
    /// turns unwind tables off (every stack is walked by frame pointers).
    pub max_unwind_rows: u32,
    /// Stream the kernel programs' diagnostics (aya-log, the unwinder's
    /// rare paths); off, the verifier drops their code.
    pub diagnostics: bool,
    /// Python frames in the stacks of CPython processes (`--python`).
    pub python: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_live_samples: 262_144,
            max_live_per_process: 65_536,
            max_stacks: 65_536,
            max_aggregates: 65_536,
            max_processes: 16_384,
            max_new_stacks_per_second: DEFAULT_NEW_STACKS_PER_SECOND,
            new_stacks_burst: DEFAULT_NEW_STACKS_BURST,
            max_event_rate: 0,
            max_unwind_rows: 1 << 20,
            diagnostics: false,
            python: true,
        }
    }
}

#[derive(Debug, Error)]
pub enum KernelError {
    #[error("loading the eBPF programs failed: {0}")]
    Load(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error(
        "the kernel refused the eBPF programs (missing privileges: run as root, or with CAP_BPF and CAP_PERFMON)"
    )]
    Permission(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("attaching to {path} at offset {offset:#x} failed: {source}")]
    Attach {
        path: PathBuf,
        offset: u64,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("reading kernel map {map}: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
}

/// Which processes the kernel programs profile and report on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The processes the probe files are attached for (`--pid
    /// --no-children`): execs of processes with kernel state are reported.
    Attached,
    /// Every process (system-wide): every exec is reported.
    All,
    /// The processes in the followed set (`--pid`'s trees: the files are
    /// attached for all processes, the kernel filters), to which forks of
    /// followed processes add their children, reported as
    /// `PROC_EVENT_FORK`.
    Trees,
}

/// Where an attachment fires: any process mapping the file, or one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    AllProcesses,
    Process(Tid),
}

/// A consistent-enough copy of the kernel's aggregates.
#[derive(Debug, Default)]
pub struct KernelSnapshot {
    pub aggregates: Vec<(AggKey, StackAgg)>,
    /// Every live sample (for their ages; see `crate::model::age`), when asked
    /// for (`live_read`).
    pub live: Vec<(LiveKey, LiveSample)>,
    pub live_read: bool,
    pub processes: BTreeMap<u32, ProcCounters>,
    /// Drops summed over CPUs, by `DropReason`.
    pub drops: [u64; DROP_REASONS],
    /// `CLOCK_MONOTONIC` (ns) right before the aggregates were read: a
    /// block freed before it is not in them (the seeds' cut, see
    /// `Session::retire_unseen_frees`).
    pub taken_ns: u64,
}

pub struct Kernel {
    ebpf: Ebpf,
    specs: Array<MapData, UsdtSpec>,
    next_cookie: u32,
    spec_cookies: StdHashMap<SpecKey, u32>,
    links: StdHashMap<LinkKey, UProbeLinkId>,
    live: HashMap<MapData, LiveKey, LiveSample>,
    aggs: HashMap<MapData, AggKey, StackAgg>,
    stacks: HashMap<MapData, u64, StackTrace>,
    procs: HashMap<MapData, u32, ProcCounters>,
    drops: PerCpuArray<MapData, u64>,
    events: RingBuf<MapData>,
    seeded_pids: HashMap<MapData, u32, u32>,
    unseen_frees: RingBuf<MapData>,
    unwind_rows: Array<MapData, UnwindRow>,
    unwind_procs: HashMap<MapData, u32, ProcUnwind>,
    followed: HashMap<MapData, u32, u32>,
    py_procs: HashMap<MapData, u32, PyProcConfig>,
    /// Per stack with Python frames: its code objects' prints at the sample.
    py_stack_prints: HashMap<MapData, u64, PyStackPrints>,
    python: bool,
    max_unwind_rows: u32,
    /// With `Limits::diagnostics`: the reader of the programs' log ring and
    /// what it read.
    diagnostics: Option<(aya_log::EbpfLogger<Diagnostics>, Diagnostics)>,
    /// Why OOM kills cannot be told from exits, if they cannot.
    oom_unavailable: Option<String>,
}

/// Log records of the kernel programs, as lines (see `Kernel::diagnostics`).
#[derive(Clone, Default)]
struct Diagnostics(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl log::Log for Diagnostics {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let mut lines = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded: read every poll, so only a flood reaches this.
        if lines.len() < 1024 {
            lines.push(record.args().to_string());
        }
    }

    fn flush(&self) {}
}

/// An attachment: which file (by identity), which probe, where, for whom.
type LinkKey = (FileId, ProbeKind, u64, Scope);

/// `UsdtSpec` as a hashable key, so equal specs share one cookie.
type SpecKey = [u8; size_of::<UsdtSpec>()];

fn spec_key(spec: &UsdtSpec) -> SpecKey {
    // SAFETY: UsdtSpec is #[repr(C)] plain data without padding bytes.
    unsafe { std::mem::transmute_copy(spec) }
}

impl Kernel {
    /// Loads the programs and attaches the process lifecycle tracepoints.
    pub fn load(limits: Limits, mode: Mode) -> Result<Kernel, KernelError> {
        Kernel::load_object(OBJECT, limits, mode)
    }

    /// As [`Kernel::load`], from a given object (the committed one, in tests).
    pub fn load_object(object: &[u8], limits: Limits, mode: Mode) -> Result<Kernel, KernelError> {
        let report_all = u8::from(mode == Mode::All);
        let follow_tree = u8::from(mode == Mode::Trees);
        // aya-log's levels: 0 off, 2 warnings (what the unwinder logs).
        let log_level: u8 = if limits.diagnostics { 2 } else { 0 };
        // The OOM tracepoint reads the victim's process from its task: where
        // the kernel's BTF does not say where that is, it stays unattached.
        let tgid_offset = btf::kernel_member_offset("task_struct", "tgid");
        let tgid_at = tgid_offset.as_ref().map_or(0, |&o| u64::from(o));
        let unwind_tables = u8::from(limits.max_unwind_rows > 0);
        let mut ebpf = EbpfLoader::new()
            .override_global("AYA_LOG_LEVEL", &log_level, true)
            .map_max_entries(names::LIVE, limits.max_live_samples)
            .map_max_entries(names::STACKS, limits.max_stacks)
            .map_max_entries(names::PY_STACK_PRINTS, limits.max_stacks)
            .map_max_entries(names::AGGS, limits.max_aggregates)
            .map_max_entries(names::PROCS, limits.max_processes)
            .map_max_entries(names::FOLLOWED, limits.max_processes)
            .map_max_entries(names::UNWIND_ROWS, limits.max_unwind_rows.max(1))
            .override_global("MAX_LIVE_PER_PROCESS", &limits.max_live_per_process, true)
            .override_global("REPORT_ALL_EXECS", &report_all, true)
            .override_global(
                "MAX_NEW_STACKS_PER_SECOND",
                &limits.max_new_stacks_per_second,
                true,
            )
            .override_global("NEW_STACKS_BURST", &limits.new_stacks_burst, true)
            .override_global("MAX_EVENT_RATE", &limits.max_event_rate, true)
            .override_global("TASK_TGID_OFFSET", &tgid_at, true)
            .override_global("FOLLOW_TREE", &follow_tree, true)
            .override_global("UNWIND_TABLES", &unwind_tables, true)
            .load(object)
            .map_err(classify_load_error)?;
        for kind in ProbeKind::ALL {
            let prog: &mut UProbe = program(&mut ebpf, program_for(kind))?;
            prog.load().map_err(classify_load_error)?;
        }
        for tp in ["sched_process_exit", "sched_process_exec"] {
            let prog: &mut RawTracePoint = program(&mut ebpf, tp)?;
            prog.load().map_err(classify_load_error)?;
            prog.attach(tp).map_err(classify_load_error)?;
        }
        // A tree is followed through forks: the child's process is read from
        // its task, at the offset the kernel's BTF gives.
        if mode == Mode::Trees {
            if let Err(e) = &tgid_offset {
                return Err(KernelError::Load(
                    format!(
                        "following a process's children needs task_struct's tgid from the \
                         kernel's BTF ({e}): use --no-children"
                    )
                    .into(),
                ));
            }
            let fork: &mut RawTracePoint = program(&mut ebpf, "sched_process_fork")?;
            fork.load().map_err(classify_load_error)?;
            fork.attach("sched_process_fork")
                .map_err(classify_load_error)?;
        }
        // Optional: without it (a kernel without the tracepoint), OOM kills
        // read as plain exits. A raw tracepoint: no tracefs is needed, so a
        // profile mounts nothing on the host.
        let oom: &mut RawTracePoint = program(&mut ebpf, "oom_mark_victim")?;
        let oom_victims = oom
            .load()
            .map_err(|e| e.to_string())
            .and_then(|()| tgid_offset.map(drop))
            .and_then(|()| {
                oom.attach("mark_victim")
                    .map(drop)
                    .map_err(|e| e.to_string())
            })
            .err();
        let specs = Array::try_from(take(&mut ebpf, names::USDT_SPECS)?)
            .map_err(map_err(names::USDT_SPECS))?;
        let live =
            HashMap::try_from(take(&mut ebpf, names::LIVE)?).map_err(map_err(names::LIVE))?;
        let aggs =
            HashMap::try_from(take(&mut ebpf, names::AGGS)?).map_err(map_err(names::AGGS))?;
        let stacks =
            HashMap::try_from(take(&mut ebpf, names::STACKS)?).map_err(map_err(names::STACKS))?;
        let procs =
            HashMap::try_from(take(&mut ebpf, names::PROCS)?).map_err(map_err(names::PROCS))?;
        let drops =
            PerCpuArray::try_from(take(&mut ebpf, names::DROPS)?).map_err(map_err(names::DROPS))?;
        let events = RingBuf::try_from(take(&mut ebpf, names::PROC_EVENTS)?)
            .map_err(map_err(names::PROC_EVENTS))?;
        let seeded_pids = HashMap::try_from(take(&mut ebpf, names::SEEDED_PIDS)?)
            .map_err(map_err(names::SEEDED_PIDS))?;
        let unseen_frees = RingBuf::try_from(take(&mut ebpf, names::UNSEEN_FREES)?)
            .map_err(map_err(names::UNSEEN_FREES))?;
        let unwind_rows = Array::try_from(take(&mut ebpf, names::UNWIND_ROWS)?)
            .map_err(map_err(names::UNWIND_ROWS))?;
        let unwind_procs = HashMap::try_from(take(&mut ebpf, names::UNWIND_PROCS)?)
            .map_err(map_err(names::UNWIND_PROCS))?;
        let followed = HashMap::try_from(take(&mut ebpf, names::FOLLOWED)?)
            .map_err(map_err(names::FOLLOWED))?;
        let py_procs = HashMap::try_from(take(&mut ebpf, names::PY_PROCS)?)
            .map_err(map_err(names::PY_PROCS))?;
        let py_stack_prints = HashMap::try_from(take(&mut ebpf, names::PY_STACK_PRINTS)?)
            .map_err(map_err(names::PY_STACK_PRINTS))?;
        let diagnostics = if limits.diagnostics {
            let lines = Diagnostics::default();
            let reader = aya_log::EbpfLogger::init_with_logger(&mut ebpf, lines.clone())
                .map_err(|e| KernelError::Load(Box::new(e)))?;
            Some((reader, lines))
        } else {
            None
        };
        Ok(Kernel {
            ebpf,
            specs,
            next_cookie: 0,
            spec_cookies: StdHashMap::new(),
            links: StdHashMap::new(),
            live,
            aggs,
            stacks,
            procs,
            drops,
            events,
            seeded_pids,
            unseen_frees,
            unwind_rows,
            unwind_procs,
            followed,
            py_procs,
            py_stack_prints,
            python: limits.python,
            max_unwind_rows: limits.max_unwind_rows,
            diagnostics,
            oom_unavailable: oom_victims,
        })
    }

    /// How many instructions the verifier processed for each loaded uprobe
    /// program (the kernel's `verified_insns`; `None` where it does not
    /// say): the alloc program must stay well under the 1M limit.
    pub fn verified_instructions(&self) -> Vec<(&'static str, Option<u32>)> {
        ProbeKind::ALL
            .into_iter()
            .map(|kind| {
                let name = program_for(kind);
                let count = self
                    .ebpf
                    .program(name)
                    .and_then(|p| p.info().ok())
                    .and_then(|info| info.verified_instruction_count());
                (name, count)
            })
            .collect()
    }

    /// Why OOM kills cannot be told from exits (no `oom:mark_victim`
    /// tracepoint), if they cannot.
    pub fn oom_unavailable(&self) -> Option<&str> {
        self.oom_unavailable.as_deref()
    }

    /// The kernel programs' log lines since the last call (none without
    /// `Limits::diagnostics`).
    pub fn diagnostics(&mut self) -> Vec<String> {
        let Some((reader, lines)) = &mut self.diagnostics else {
            return Vec::new();
        };
        reader.flush();
        std::mem::take(&mut *lines.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Attaches to `site` in the file at `path`. Attaching twice is a no-op.
    pub fn attach(
        &mut self,
        path: &Path,
        site: &ProbeSite,
        scope: Scope,
    ) -> Result<(), KernelError> {
        let id = FileId::of_path(path).map_err(|e| KernelError::Attach {
            path: path.to_path_buf(),
            offset: site.file_offset,
            source: Box::new(e),
        })?;
        self.attach_as(path, id, path, site, scope)
    }

    /// Attaches to `site` in an open file, through its descriptor (so the
    /// kernel resolves the very file we parsed, whatever its path names).
    pub(crate) fn attach_file(
        &mut self,
        file: &OpenFile,
        site: &ProbeSite,
        scope: Scope,
    ) -> Result<(), KernelError> {
        self.attach_as(&file.fd_path(), file.id, &file.display, site, scope)
    }

    fn attach_as(
        &mut self,
        path: &Path,
        id: FileId,
        shown: &Path,
        site: &ProbeSite,
        scope: Scope,
    ) -> Result<(), KernelError> {
        let key = (id, site.kind, site.file_offset, scope);
        if self.links.contains_key(&key) {
            return Ok(());
        }
        let cookie = self.cookie_for(&site.spec, shown, site.file_offset)?;
        let attach_err = |e: Box<dyn std::error::Error + Send + Sync>| KernelError::Attach {
            path: shown.to_path_buf(),
            offset: site.file_offset,
            source: e,
        };
        let prog: &mut UProbe = program(&mut self.ebpf, program_for(site.kind))?;
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(site.file_offset),
            cookie: Some(u64::from(cookie)),
        };
        let aya_scope = match scope {
            Scope::AllProcesses => UProbeScope::AllProcesses,
            Scope::Process(tid) => match NonZeroU32::new(tid.0) {
                Some(tid) => UProbeScope::OneProcess(tid),
                None => UProbeScope::AllProcesses,
            },
        };
        let link = prog
            .attach(point, path, aya_scope)
            .map_err(|e| attach_err(Box::new(e)))?;
        self.links.insert(key, link);
        Ok(())
    }

    /// Detaches every probe attached for thread `tid` alone (it exited).
    pub(crate) fn detach_process(&mut self, tid: Tid) {
        let keys: Vec<LinkKey> = self
            .links
            .keys()
            .filter(|k| k.3 == Scope::Process(tid))
            .copied()
            .collect();
        for key in keys {
            if let Some(link) = self.links.remove(&key)
                && let Ok(prog) = program::<UProbe>(&mut self.ebpf, program_for(key.1))
            {
                let _ = prog.detach(link);
            }
        }
    }

    fn cookie_for(
        &mut self,
        spec: &UsdtSpec,
        path: &Path,
        offset: u64,
    ) -> Result<u32, KernelError> {
        if let Some(&c) = self.spec_cookies.get(&spec_key(spec)) {
            return Ok(c);
        }
        let cookie = self.next_cookie;
        self.specs
            .set(cookie, spec, 0)
            .map_err(|e| KernelError::Attach {
                path: path.to_path_buf(),
                offset,
                source: Box::new(e),
            })?;
        self.next_cookie += 1;
        self.spec_cookies.insert(spec_key(spec), cookie);
        Ok(cookie)
    }

    /// Number of attached probe sites.
    pub fn attachments(&self) -> usize {
        self.links.len()
    }

    /// Copies the aggregates, per-process state and drop counters.
    /// The aggregates, per-process counters and drops, and with `with_live`
    /// every live sample too (the largest map: read only when needed).
    pub fn snapshot(&self, with_live: bool) -> Result<KernelSnapshot, KernelError> {
        let mut snap = KernelSnapshot {
            live_read: with_live,
            taken_ns: crate::model::age::monotonic_now_ns(),
            ..KernelSnapshot::default()
        };
        // In batches where the kernel has them (5.6+): a few syscalls per
        // map instead of two per entry.
        match map_batch::read_all(self.aggs.map()) {
            Ok(all) => snap.aggregates = all,
            Err(_) => {
                for entry in self.aggs.iter() {
                    snap.aggregates.push(entry.map_err(map_err(names::AGGS))?);
                }
            }
        }
        match map_batch::read_all::<u32, ProcCounters>(self.procs.map()) {
            Ok(all) => snap.processes.extend(all),
            Err(_) => {
                for entry in self.procs.iter() {
                    let (pid, state) = entry.map_err(map_err(names::PROCS))?;
                    snap.processes.insert(pid, state);
                }
            }
        }
        if with_live {
            match map_batch::read_all(self.live.map()) {
                Ok(all) => snap.live = all,
                // Entries freed while the walk runs are skipped, not an error.
                Err(_) => snap.live.extend(self.live.iter().filter_map(Result::ok)),
            }
        }
        for (i, slot) in snap.drops.iter_mut().enumerate() {
            let per_cpu = self
                .drops
                .get(&(i as u32), 0)
                .map_err(map_err(names::DROPS))?;
            *slot = per_cpu.iter().sum();
        }
        Ok(snap)
    }

    /// The frames of a stack, innermost first.
    pub fn stack(&self, id: u64) -> Option<Vec<u64>> {
        let trace = self.stacks.get(&id, 0).ok()?;
        let len = (trace.len as usize).min(trace.frames.len());
        Some(trace.frames[..len].to_vec())
    }

    /// The prints the kernel took of a stack's Python frames' code objects
    /// (see `profiler_common::python`), in frame order: the first as many
    /// as the stack has Python frames are theirs, the rest are not read.
    /// Empty if none were filed.
    pub fn stack_prints(&self, id: u64) -> Vec<u32> {
        self.py_stack_prints
            .get(&id, 0)
            .map_or_else(|_| Vec::new(), |p| p.prints.to_vec())
    }

    /// The ids in the stack table (a walk of its keys: for tests and
    /// diagnostics, not for every poll).
    pub fn stack_ids(&self) -> Vec<u64> {
        self.stacks.keys().filter_map(Result::ok).collect()
    }

    /// Deletes these stacks from the stack table; returns how many were
    /// there. Every stack id belongs to one process image (the kernel seeds
    /// its hash with pid and generation), so deleting one never touches
    /// another process's stacks. The caller must pass only ids of images
    /// that are gone (exited, or exec'ed into a later generation) and whose
    /// stacks are already symbolized: a live image would file its next
    /// sample of a deleted stack as a new one, spending its budget of new
    /// stacks, and an unsymbolized id could no longer be read.
    pub fn forget_stacks(&mut self, ids: &[u64]) -> usize {
        ids.iter()
            .filter(|id| {
                // A native stack has no prints: nothing to delete.
                let _ = self.py_stack_prints.remove(id);
                self.stacks.remove(id).is_ok()
            })
            .count()
    }

    /// Forgets retired images whose aggregates the caller read: deletes
    /// those by key (`aggregates`), walks the live samples only when the
    /// images had some (`live_samples`), and drops the state of the
    /// processes that exited (`None` in `gone`). Returns the samples freed.
    pub(crate) fn forget_images(
        &mut self,
        gone: &[(HostPid, Option<u32>)],
        aggregates: &[AggKey],
        live_samples: bool,
    ) -> usize {
        let is_gone = gone_images(gone);
        let mut freed = 0;
        if live_samples {
            let samples: Vec<LiveKey> = self
                .live
                .iter()
                .filter_map(Result::ok)
                .filter(|(k, s)| is_gone(k.pid, s.generation))
                .map(|(k, _)| k)
                .collect();
            freed = samples
                .iter()
                .filter(|k| self.live.remove(k).is_ok())
                .count();
        }
        for key in aggregates {
            let _ = self.aggs.remove(key);
        }
        for (pid, b) in gone {
            if b.is_none() {
                let _ = self.procs.remove(&pid.0);
                // The kernel unfollows a process at its leader's exit; one
                // followed again after a pthread_exit (`Session::refollow`)
                // is unfollowed here, when user space sees it gone.
                let _ = self.followed.remove(&pid.0);
            }
        }
        freed
    }

    /// The kernel's state of one process (a map lookup, no snapshot).
    pub fn process(&self, pid: HostPid) -> Option<ProcCounters> {
        self.procs.get(&pid.0, 0).ok()
    }

    /// How many unwind rows the kernel holds at most (for all files).
    pub(crate) fn unwind_capacity(&self) -> u32 {
        self.max_unwind_rows
    }

    /// Writes unwind rows at `start` (a range the caller allocated).
    pub(crate) fn write_unwind_rows(
        &mut self,
        start: u32,
        rows: &[UnwindRow],
    ) -> Result<(), KernelError> {
        for (i, row) in rows.iter().enumerate() {
            self.unwind_rows
                .set(start + i as u32, row, 0)
                .map_err(map_err(names::UNWIND_ROWS))?;
        }
        Ok(())
    }

    /// Gives process `pid` (host) its mappings with unwind tables: its
    /// stacks are walked with them from now on.
    pub(crate) fn set_process_unwind(
        &mut self,
        pid: HostPid,
        table: &ProcUnwind,
    ) -> Result<(), KernelError> {
        self.unwind_procs
            .insert(pid.0, table, 0)
            .map_err(map_err(names::UNWIND_PROCS))
    }

    /// Whether the stacks of CPython processes get their Python frames.
    pub(crate) fn python_frames(&self) -> bool {
        self.python
    }

    /// Tells the kernel where the Python frames of process `pid` (host)
    /// are: its stacks carry them from now on.
    pub(crate) fn set_process_python(
        &mut self,
        pid: HostPid,
        config: &PyProcConfig,
    ) -> Result<(), KernelError> {
        self.py_procs
            .insert(pid.0, config, 0)
            .map_err(map_err(names::PY_PROCS))
    }

    /// No Python frames for `pid` (its image went).
    pub(crate) fn clear_process_python(&mut self, pid: HostPid) {
        let _ = self.py_procs.remove(&pid.0);
    }

    /// The kernel's Python entry of `pid` (for tests).
    pub fn process_python(&self, pid: HostPid) -> Option<PyProcConfig> {
        self.py_procs.get(&pid.0, 0).ok()
    }

    /// Back to frame pointers for `pid` (it exec'ed or exited).
    pub(crate) fn clear_process_unwind(&mut self, pid: HostPid) {
        let _ = self.unwind_procs.remove(&pid.0);
    }

    /// The process exit/exec events reported since the last call.
    pub(crate) fn proc_events(&mut self) -> Vec<ProcEvent> {
        let mut events = Vec::new();
        while let Some(item) = self.events.next() {
            if let Some(event) = decode_event(&item) {
                events.push(event);
            }
        }
        events
    }

    /// Follows process `pid` (host), of the tree rooted at `root`
    /// ([`Mode::Trees`]): the kernel profiles it, and follows its children
    /// from their fork on. Fails past the process cap.
    pub(crate) fn follow(&mut self, pid: HostPid, root: HostPid) -> Result<(), KernelError> {
        self.followed
            .insert(pid.0, root.0, 0)
            .map_err(map_err(names::FOLLOWED))
    }

    /// Whether process `pid` (host) is followed ([`Mode::Trees`]).
    pub(crate) fn is_followed(&self, pid: HostPid) -> bool {
        self.followed.get(&pid.0, 0).is_ok()
    }

    /// From now on, frees of process `pid` (host) with no live sample are
    /// reported ([`Kernel::unseen_frees`]): its ledger was read.
    pub(crate) fn watch_unseen_frees(&mut self, pid: HostPid) -> Result<(), KernelError> {
        self.seeded_pids
            .insert(pid.0, 1, 0)
            .map_err(map_err(names::SEEDED_PIDS))
    }

    pub(crate) fn unwatch_unseen_frees(&mut self, pid: HostPid) {
        let _ = self.seeded_pids.remove(&pid.0);
    }

    /// The frees without a live sample of watched processes since the last
    /// call (host pids).
    pub(crate) fn unseen_frees(&mut self) -> Vec<UnseenFree> {
        let mut frees = Vec::new();
        while let Some(item) = self.unseen_frees.next() {
            if item.len() >= size_of::<UnseenFree>() {
                // SAFETY: UnseenFree is plain data; the length was checked.
                let f: UnseenFree =
                    unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<UnseenFree>()) };
                frees.push(f);
            }
        }
        frees
    }

    /// Whether the kernel holds a live sample of `pid` (host) at `ptr`.
    pub(crate) fn has_live_sample(&self, pid: HostPid, ptr: u64) -> bool {
        let key = LiveKey {
            pid: pid.0,
            _pad: 0,
            ptr,
        };
        self.live.get(&key, 0).is_ok()
    }
}

/// Whether a (pid, generation) image is among `gone`: the pid exited
/// (`None`), or exec'ed into a later generation than the image's.
fn gone_images(gone: &[(HostPid, Option<u32>)]) -> impl Fn(u32, u32) -> bool {
    let below: StdHashMap<u32, Option<u32>> = gone.iter().map(|&(p, g)| (p.0, g)).collect();
    move |pid, generation| {
        below
            .get(&pid)
            .is_some_and(|b| b.is_none_or(|g| generation < g))
    }
}

/// Decodes a ring buffer record.
fn decode_event(bytes: &[u8]) -> Option<ProcEvent> {
    if bytes.len() < size_of::<ProcEvent>() {
        return None;
    }
    // SAFETY: ProcEvent is plain data; the length was checked above.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<ProcEvent>()) })
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, KernelError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let prog = ebpf.program_mut(name).ok_or_else(|| {
        KernelError::Load(format!("the eBPF object has no program {name}").into())
    })?;
    prog.try_into().map_err(|e| KernelError::Load(Box::new(e)))
}

fn take(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map, KernelError> {
    ebpf.take_map(name)
        .ok_or_else(|| KernelError::Load(format!("the eBPF object has no map {name}").into()))
}

fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> KernelError {
    move |source| KernelError::Map { map, source }
}

/// EPERM/EACCES anywhere in the chain means privileges, not a broken object.
fn classify_load_error<E: std::error::Error + Send + Sync + 'static>(e: E) -> KernelError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>()
            && matches!(io.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES))
        {
            return KernelError::Permission(Box::new(e));
        }
        cause = c.source();
    }
    KernelError::Load(Box::new(e))
}

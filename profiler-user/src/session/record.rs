//! One record per tracked process: everything the session knows about a
//! process incarnation, so that forgetting a process is dropping its record.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Instant,
};

use profiler_common::{ProcCounters, unwind::UnwindMapping};

use super::{BackendBlock, Incarnation, ledger::LedgerImage};
use crate::{
    ids::{FileId, Pid, Tid},
    model::profile::BuildIds,
    process::{normalize::AddressSpace, resource::ProcessResource},
    symbolize::Frame,
};

/// A tracked process incarnation (by our pid, the key of
/// `Session::tracked`).
///
/// Invariants:
/// - a record exists from the first thing the session learns of its pid
///   until the process exits (its exit event, or found dead by `track`):
///   then it is dropped whole, and with it every per-process fact; a
///   process that reuses the pid gets a new record, a new incarnation;
/// - an exec keeps the record (the pid, its attachments, its start, the
///   incarnation) and replaces `image` (address space, scan state, name,
///   unwind entry, ledger: what the old image's code made true);
/// - `symbols` holds the names of stacks of this incarnation's live image
///   (stack ids belong to one image); a retired image takes its stacks'
///   names and pending requests into its `Frozen` record;
/// - nothing outside the record is keyed by this process, except the pid
///   map (host ↔ ours), the kernel's own maps, and the
///   symbolizer's requests in flight (a response whose owner is gone is
///   dropped).
pub(super) struct Tracked {
    pub incarnation: Incarnation,
    /// What belongs to the current image (reset at exec).
    pub image: ImageState,
    /// When it started (clock ticks since boot), read once.
    pub start: Option<u64>,
    /// After an exec: when, and the next of `RESCAN_AFTER_EXEC`.
    pub rescan: Option<(Instant, usize)>,
    /// The kernel's counters of the pid when its last image replaced by
    /// exec was frozen: they are per pid, so each image's are the
    /// difference.
    pub exec_counters: Option<ProcCounters>,
    /// Its image was replaced by an exec since we attached: its current
    /// image is seen whole.
    pub execed_since_attach: bool,
    /// The OOM killer picked it; its image is not frozen yet.
    pub oom_victim: bool,
    /// Its parent, with `--pid`'s trees (as forked, or read at attach).
    pub parent: Option<Pid>,
    /// Files attached for it alone (`--pid`), with the live thread the
    /// attachment follows.
    pub attached: HashMap<FileId, Tid>,
    /// When the probes of a file were attached for it (`--pid`;
    /// CLOCK_MONOTONIC ns).
    pub attached_ns: HashMap<FileId, u64>,
    pub symbols: Symbols,
    /// The CPython its image runs, once recognised (its Python frames are
    /// walked); reset at exec.
    pub python: Option<crate::python::PyVersion>,
}

/// What the session knows of a process's current image.
#[derive(Default)]
pub(super) struct ImageState {
    /// Its mappings (only for a process that carries probes).
    pub space: Option<AddressSpace>,
    /// Its code size (see `ProcessPort::code_size`) when it was scanned,
    /// and when: its next rescan waits for a change.
    pub scanned: Option<(Option<u64>, Instant)>,
    /// Its name and sampling rate, read once.
    pub identity: Option<(String, u64)>,
    /// A fork child's rate, its parent's (the same image until it execs):
    /// taken instead of reading its environ.
    pub forked_rate: Option<u64>,
    /// Who it is (OTLP resource attributes), read once.
    pub resource: Option<Arc<ProcessResource>>,
    /// The GNU build ids of the files it maps, by the path it names them
    /// with (read from the files it mapped, with its space).
    pub build_ids: Option<Arc<BuildIds>>,
    /// The mappings its kernel unwind entry holds (to skip rewrites): the
    /// used ones only, as the entry's fixed array is 10 KiB and the agent
    /// tracks hundreds of processes.
    pub unwound: Option<Box<[UnwindMapping]>>,
    /// Its live-sample ledger and seeds.
    pub ledger: Option<LedgerImage>,
    /// Where its backend-statistics block is (found at the first read).
    pub backend_block: BackendBlock,
    /// The allocator's budget as last read from that block: kept for the
    /// image's profile once it is gone.
    pub alloc_thinning: Option<profiler_common::backend_stats::AllocatorThinning>,
    /// The kernel's counters of the process at that read (see `Visit`;
    /// `Some(None)`: read while the kernel had no sample of it).
    pub thinning_read_with: Option<Option<(u32, u64)>>,
    /// Its memory figures as last read, and when (see
    /// `Session::set_memory_figures_every`).
    pub memory_read: Option<(Instant, MemoryFigures)>,
    /// The Python code objects its stacks name (a CPython process).
    pub python_code: crate::python::cache::CodeCache,
    /// Its CPython and what serves its objects, once recognised.
    pub python_runtime: Option<crate::python::runtime::PythonRuntime>,
}

/// What a process's memory looks like from outside its heap profile.
#[derive(Clone, Copy, Default)]
pub(super) struct MemoryFigures {
    /// What its allocator library says: its backend's heap, its budget.
    pub allocator: crate::process::backend_stats::AllocatorBlock,
    /// Its resident memory.
    pub resident: Option<crate::process::discover::Resident>,
}

/// The names of a live incarnation's stacks, by stack id.
#[derive(Default)]
pub(super) struct Symbols {
    pub names: HashMap<u64, Arc<[Frame]>>,
    /// Requested, not answered yet.
    pub pending: HashSet<u64>,
    /// Addresses that no mapping of the process held when the stack was
    /// requested (a library dlopen'ed since the last scan): the stack is
    /// symbolized again once a scan maps one of them.
    pub unresolved: HashMap<u64, Vec<u64>>,
    /// Where its stacks stood when every one of them was last requested
    /// (or named): while they stand there, a tick has nothing to ask for
    /// it and skips its aggregates (20,000 of them at every beat were most
    /// of a system-wide agent's CPU between exports).
    pub visited: Option<Visit>,
    /// Where they stood at the read before (a visit vouches only for
    /// those: a sample counted in a read may have missed its aggregates'
    /// copy, taken just before).
    pub seen: Option<Visit>,
}

/// What says a process may have stacks the session has not seen: a new
/// stack comes with a sample (the kernel's count of them moves, or its
/// image changes) or with its ledger's read (seeds only go afterwards).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Visit {
    /// The kernel's counters of the pid: generation and sampled allocations
    /// (none while the kernel's entry is not ours to see, e.g. a host pid
    /// not recognised yet).
    pub kernel: Option<(u32, u64)>,
    /// Its ledger image: generation, and whether it was read.
    pub ledger: Option<(u32, bool)>,
}

impl Tracked {
    pub fn new(incarnation: Incarnation) -> Tracked {
        Tracked {
            incarnation,
            image: ImageState::default(),
            start: None,
            rescan: None,
            exec_counters: None,
            execed_since_attach: false,
            oom_victim: false,
            parent: None,
            attached: HashMap::new(),
            attached_ns: HashMap::new(),
            symbols: Symbols::default(),
            python: None,
        }
    }

    /// Its image was replaced by an exec.
    pub fn exec(&mut self) {
        self.image = ImageState::default();
        self.python = None;
        self.execed_since_attach = true;
    }

    /// How many per-process facts it holds (for the tests: none outlives
    /// its process).
    #[cfg(test)]
    pub fn entries(&self) -> usize {
        let i = &self.image;
        1 + usize::from(i.space.is_some())
            + usize::from(i.scanned.is_some())
            + usize::from(i.identity.is_some())
            + usize::from(i.forked_rate.is_some())
            + usize::from(i.unwound.is_some())
            + usize::from(i.ledger.is_some())
            + usize::from(self.python.is_some())
            + self.attached.len()
            + self.attached_ns.len()
            + self.symbols.names.len()
            + self.symbols.pending.len()
            + self.symbols.unresolved.len()
    }
}

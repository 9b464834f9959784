//! Every map of the kernel side, with the defaults user space may resize at
//! load time (`EbpfLoader::map_max_entries`, from `kernel::Limits`).

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use profiler_common::{
    AggKey, DEFAULT_NEW_STACKS_BURST, DEFAULT_NEW_STACKS_PER_SECOND, DROP_REASONS, LiveKey,
    LiveSample, ProcCounters, StackAgg, StackTrace, UsdtSpec,
    python::{
        PY_BLOCK_WORDS, PY_CODE_PRINT_WORDS, PY_NAME_PRINT_WORDS, PyProcConfig, PyStackPrints,
    },
    unwind::{ProcUnwind, UNWIND_CACHE_ENTRIES, UnwindCacheEntry, UnwindRow},
};

/// Argument descriptions, indexed by the uprobe's attach cookie.
#[map]
pub static USDT_SPECS: Array<UsdtSpec> = Array::with_max_entries(4096, 0);

/// Live sampled allocations. Its size is the global cap on live samples.
/// Preallocated (~100 bytes an entry): every sampled alloc inserts and every
/// sampled free deletes, and preallocated elements are the cheapest to churn.
#[map]
pub static LIVE: HashMap<LiveKey, LiveSample> = HashMap::with_max_entries(262_144, 0);

/// Unbiased sums per (process, generation, stack).
#[map]
pub static AGGS: HashMap<AggKey, StackAgg> = HashMap::with_max_entries(65_536, BPF_F_NO_PREALLOC);

/// User stacks by the hash of their process image and frames: unlike the
/// direct-mapped STACK_TRACE map, distinct stacks share an id only on a
/// 64-bit hash collision; every id belongs to one (pid, generation), so user
/// space can delete a gone image's stacks. Each process may add entries at
/// `MAX_NEW_STACKS_PER_SECOND` (burst `NEW_STACKS_BURST`), so no process can
/// flood it for the others.
#[map]
pub static STACKS: HashMap<u64, StackTrace> = HashMap::with_max_entries(65_536, BPF_F_NO_PREALLOC);

/// Per-CPU scratch for `bpf_get_stack` (too big for the 512-byte BPF stack).
#[map]
pub static STACK_SCRATCH: PerCpuArray<StackTrace> = PerCpuArray::with_max_entries(1, 0);

/// Bytes of user stack a walk copies at once (see `unwind::read_user`): a
/// power of two that divides the page size, so an aligned block lies in
/// one page.
pub const BLOCK: u64 = 1024;
pub const BLOCK_WORDS: usize = BLOCK as usize / 8;

/// Per-CPU copy of the user stack block a walk is reading, under the
/// `STACK_SCRATCH` claim.
#[map]
pub static STACK_BLOCK: PerCpuArray<[u64; BLOCK_WORDS]> = PerCpuArray::with_max_entries(1, 0);

/// The back-pressure factor and the weight of the sample whose stack this
/// CPU is walking, parked across the walk under the `STACK_SCRATCH` claim
/// (see `probes::take_stack`).
#[map]
pub static THIN_SCRATCH: PerCpuArray<Parked> = PerCpuArray::with_max_entries(1, 0);

/// What [`THIN_SCRATCH`] parks.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Parked {
    pub factor: u64,
    pub weight: u64,
    /// The stack's length between its native and Python parts, parked so
    /// that the verifier sees one state (see `probes::take_stack_claimed`).
    pub len: u64,
}

/// Walks claiming `STACK_SCRATCH` on this CPU (see `probes::take_stack`).
#[map]
pub static STACK_SCRATCH_CLAIMS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub static PROCS: HashMap<u32, ProcCounters> = HashMap::with_max_entries(16_384, BPF_F_NO_PREALLOC);

/// With `--pid` and its tree (`FOLLOW_TREE`): the processes (host pids)
/// followed, each to the root it descends from. User space puts the roots
/// and the descendants it finds at attach; the fork tracepoint adds each
/// child of a followed process; the exit tracepoint takes a process out.
/// Its size is the process cap (`Limits::max_processes`).
#[map]
pub static FOLLOWED: HashMap<u32, u32> = HashMap::with_max_entries(16_384, BPF_F_NO_PREALLOC);

/// Drops by `DropReason`, for events that could not be tied to a process too.
#[map]
pub static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(DROP_REASONS as u32, 0);

/// Compiled unwind tables of every file with one, back to back (each
/// file's range is named by the `UnwindMapping`s that use it). Its size is
/// the cap on unwind-table memory (16 bytes a row).
#[map]
pub static UNWIND_ROWS: Array<UnwindRow> = Array::with_max_entries(1 << 20, 0);

/// Per CPU: what the table walk found for return addresses seen before
/// (`profiler_common::unwind::UnwindCacheEntry`). Written only under the
/// stack scratch claim (see `probes::take_stack`): one walk per CPU at a
/// time, so an entry is never read half written.
#[map]
pub static UNWIND_CACHE: PerCpuArray<UnwindCacheEntry> =
    PerCpuArray::with_max_entries(UNWIND_CACHE_ENTRIES as u32, 0);

/// Per process (host pid): its executable mappings with unwind tables.
/// Processes without an entry are walked by frame pointers.
#[map]
pub static UNWIND_PROCS: HashMap<u32, ProcUnwind> =
    HashMap::with_max_entries(4096, BPF_F_NO_PREALLOC);

/// Per CPython process (host pid): where its Python frames are (see
/// `python::append`). Written by user space; a fork child takes a copy of
/// its parent's; exec and exit delete it.
#[map]
pub static PY_PROCS: HashMap<u32, PyProcConfig> =
    HashMap::with_max_entries(16_384, BPF_F_NO_PREALLOC);

/// The thread state of each thread (`pid_tgid`) that allocated in a CPython
/// process, 0 for a thread without one (re-checked after
/// `python::NO_THREAD_STATE_NS`). A hint: checked at each use by reading the
/// state's native thread id back. LRU: threads come and go unannounced.
#[map]
pub static PY_THREADS: LruHashMap<u64, PyThread> = LruHashMap::with_max_entries(16_384, 0);

/// What [`PY_THREADS`] holds.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct PyThread {
    pub tstate: u64,
    pub checked_ns: u64,
}

/// By stack id, for each stack with Python frames: its code objects'
/// prints as they were when the stack was new (see
/// `profiler_common::python`). Filed before the stack, deleted with it by
/// user space; sized like `STACKS` by user space.
#[map]
pub static PY_STACK_PRINTS: HashMap<u64, PyStackPrints> =
    HashMap::with_max_entries(65_536, BPF_F_NO_PREALLOC);

/// Per-CPU state of a Python walk, under the `STACK_SCRATCH` claim.
#[map]
pub static PY_SCRATCH: PerCpuArray<PyScratch> = PerCpuArray::with_max_entries(1, 0);

/// What [`PY_SCRATCH`] holds: the loops' changing state (in a map, not on
/// the stack, so the verifier checks each callback once) and the copy of
/// the interpreter frames being read.
#[repr(C)]
pub struct PyScratch {
    /// The thread's memory at `block_at..block_end`, read at once: the
    /// frame being read and what lies below it in its page (see
    /// `PY_BLOCK_WORDS`). Empty (`block_at == block_end`) at a walk's start.
    pub block: [u64; PY_BLOCK_WORDS],
    pub block_at: u64,
    pub block_end: u64,
    /// The next frame (or thread state) to read; 0: none.
    pub frame: u64,
    /// Frames in the trace so far: the next slot.
    pub len: u64,
    /// The slot past the last a Python frame may take.
    pub end: u64,
    /// The slot of the last frame filed (`NO_FRAME` before any); the thread
    /// search's result.
    pub last: u64,
    /// The walk was cut short.
    pub cut: u64,
    /// The start of the code object being printed, and of its name.
    pub code: [u64; PY_CODE_PRINT_WORDS],
    pub name: [u64; PY_NAME_PRINT_WORDS],
    /// The walk's prints of its frames' code objects so far: `printed` of
    /// them; the last code object printed (0: none yet) and its print.
    pub prints: PyStackPrints,
    pub printed: u64,
    pub print_code: u64,
    pub last_print: u64,
}

/// Exit and exec of processes, so that user space cleans up and rescans.
#[map]
pub static PROC_EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// Processes (host pids) whose live-sample ledger user space has read: a
/// free of theirs with no `LIVE` entry may be of a block allocated before
/// attach, and goes to `UNSEEN_FREES` (written by user space only).
#[map]
pub static SEEDED_PIDS: HashMap<u32, u32> = HashMap::with_max_entries(16_384, BPF_F_NO_PREALLOC);

/// Those frees, for user space to retire the blocks it seeded. Separate
/// from `PROC_EVENTS`: a burst of frees must not crowd out exits and execs
/// (a lost free is caught by user space's periodic ledger check).
#[map]
pub static UNSEEN_FREES: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Set by user space at load time.
#[unsafe(no_mangle)]
pub static MAX_LIVE_PER_PROCESS: u64 = 65_536;

/// Set by user space at load time: the per-process budget of new `STACKS`
/// entries (see `profiler_common::new_stack_budget` and its defaults).
#[unsafe(no_mangle)]
pub static MAX_NEW_STACKS_PER_SECOND: u64 = DEFAULT_NEW_STACKS_PER_SECOND;
#[unsafe(no_mangle)]
pub static NEW_STACKS_BURST: u64 = DEFAULT_NEW_STACKS_BURST;

/// Set by user space at load time (`--max-event-rate`): the alloc events
/// per second and process kept, the rest thinned (see
/// `profiler_common::thin_step`); 0 keeps every event.
#[unsafe(no_mangle)]
pub static MAX_EVENT_RATE: u64 = 0;

/// Set by user space when profiling system-wide: report every exec, not only
/// those of processes already tracked.
#[unsafe(no_mangle)]
pub static REPORT_ALL_EXECS: u8 = 0;

/// Set by user space at load time (`--pid` without `--no-children`): only
/// the processes in `FOLLOWED` are profiled (the probe files are attached
/// for all processes, so that a child is seen from its first allocation).
#[unsafe(no_mangle)]
pub static FOLLOW_TREE: u8 = 0;

/// Set by user space at load time: unwind tables are on (not
/// `--max-unwind-rows 0`), so a process without them is one whose tables
/// are not in yet, and its frame-pointer walks are marked (see
/// `unwind::walk_without_tables`).
#[unsafe(no_mangle)]
pub static UNWIND_TABLES: u8 = 1;

/// Set by user space at load time: the offset of `tgid` in the kernel's
/// `struct task_struct` (from its BTF), for the OOM tracepoint; 0: unknown.
#[unsafe(no_mangle)]
pub static TASK_TGID_OFFSET: u64 = 0;

#[inline(always)]
pub fn max_live_per_process() -> u64 {
    // SAFETY: a plain read of a global; volatile so the compiler doesn't fold
    // the default that user space overrides at load time.
    unsafe { core::ptr::read_volatile(&MAX_LIVE_PER_PROCESS) }
}

#[inline(always)]
pub fn report_all_execs() -> bool {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&REPORT_ALL_EXECS) != 0 }
}

#[inline(always)]
pub fn new_stacks_per_second() -> u64 {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&MAX_NEW_STACKS_PER_SECOND) }
}

#[inline(always)]
pub fn new_stacks_burst() -> u64 {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&NEW_STACKS_BURST) }
}

#[inline(always)]
pub fn max_event_rate() -> u64 {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&MAX_EVENT_RATE) }
}

#[inline(always)]
pub fn task_tgid_offset() -> u64 {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&TASK_TGID_OFFSET) }
}

#[inline(always)]
pub fn unwind_tables_on() -> bool {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&UNWIND_TABLES) != 0 }
}

#[inline(always)]
pub fn follow_tree() -> bool {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&FOLLOW_TREE) != 0 }
}

/// Whether process `pid` (host) is profiled: always, unless only a tree is.
#[inline(always)]
pub fn followed(pid: u32) -> bool {
    // SAFETY: only tested for presence.
    !follow_tree() || unsafe { FOLLOWED.get(pid) }.is_some()
}

//! The `otel_memory:alloc(ptr, size, weight)` and `otel_memory:free(ptr)`
//! programs (also attached to `ddheap:alloc/free`, the same contract under
//! Datadog's provider name): keep the live samples and the per-stack
//! unbiased sums.

use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        generated::bpf_get_attach_cookie, generated::bpf_get_prandom_u32,
    },
    macros::uprobe,
    programs::ProbeContext,
};
use profiler_common::{
    AggKey, ClaimCounter, DropReason, LiveKey, LiveSample, MAX_STACK_DEPTH, NO_STACK,
    OVERFLOW_STACK, ProcCounters, SampleDelta, StackTrace, UnseenFree, UsdtSpec, new_stack_budget,
    python::py_ends_stack, release_claim, stack_hash_step, stack_id, stack_seed, thin_factor_for,
    thin_step, try_claim, weight_check,
};

use crate::{
    maps::{
        AGGS, DROPS, LIVE, PROCS, Parked, SEEDED_PIDS, STACK_SCRATCH, STACK_SCRATCH_CLAIMS, STACKS,
        THIN_SCRATCH, UNSEEN_FREES, USDT_SPECS, followed, max_event_rate, max_live_per_process,
        new_stacks_burst, new_stacks_per_second,
    },
    usdt::read_arg,
};

const EEXIST: i32 = 17;

#[uprobe]
pub fn otel_memory_alloc(ctx: ProbeContext) -> u32 {
    let pid = current_pid();
    if !followed(pid) {
        return 0;
    }
    if let Err(reason) = try_alloc(&ctx, pid) {
        count_drop(pid, reason);
    }
    0
}

#[uprobe]
pub fn otel_memory_free(ctx: ProbeContext) -> u32 {
    let pid = current_pid();
    if !followed(pid) {
        return 0;
    }
    if let Err(reason) = try_free(&ctx, pid) {
        count_drop(pid, reason);
    }
    0
}

/// `otel_memory:mmap(addr, size)`: the emitter mapped memory on its own
/// account (not sampled: every mapping is reported). Counted per process.
#[uprobe]
pub fn otel_memory_mmap(ctx: ProbeContext) -> u32 {
    let pid = current_pid();
    if !followed(pid) {
        return 0;
    }
    if let Err(reason) = try_mapping(&ctx, pid, false) {
        count_drop(pid, reason);
    }
    0
}

/// `otel_memory:munmap(addr, size)`: the emitter unmapped such memory.
#[uprobe]
pub fn otel_memory_munmap(ctx: ProbeContext) -> u32 {
    let pid = current_pid();
    if !followed(pid) {
        return 0;
    }
    if let Err(reason) = try_mapping(&ctx, pid, true) {
        count_drop(pid, reason);
    }
    0
}

fn try_mapping(ctx: &ProbeContext, pid: u32, unmap: bool) -> Result<(), DropReason> {
    let spec = probe_spec(ctx)?;
    let size = read_arg(ctx, &spec.args[1]).ok_or(DropReason::ArgReadFailed)?;
    // SAFETY: map values stay valid for the whole program run.
    let proc: &ProcCounters = unsafe { &*proc_state(pid)? };
    if unmap {
        sub(&proc.mapped_bytes, size);
    } else {
        add(&proc.mapped_bytes, size);
        add(&proc.mmap_events, 1);
    }
    Ok(())
}

fn try_alloc(ctx: &ProbeContext, pid: u32) -> Result<(), DropReason> {
    let spec = probe_spec(ctx)?;
    let ptr = read_arg(ctx, &spec.args[0]).ok_or(DropReason::ArgReadFailed)?;
    let size = read_arg(ctx, &spec.args[1]).ok_or(DropReason::ArgReadFailed)?;
    let weight = read_arg(ctx, &spec.args[2]).ok_or(DropReason::ArgReadFailed)?;
    let proc_ptr = proc_state(pid)?;
    // SAFETY: map values stay valid for the whole program run.
    let proc: &ProcCounters = unsafe { &*proc_ptr };
    add(&proc.alloc_events, 1);
    note_comm(proc_ptr);
    // Back-pressure, before the costly part: keep 1 event in `factor`,
    // lowered for a heavy event so its sums are never clamped.
    let factor = thin_factor_for(thin_factor(proc_ptr), weight);
    // SAFETY: a helper without arguments.
    if factor > 1 && u64::from(unsafe { bpf_get_prandom_u32() }) & (factor - 1) != 0 {
        add(&proc.thinned_events, 1);
        return Ok(());
    }

    let generation = proc.generation;
    let (stack, Parked { factor, weight, .. }) = take_stack(
        ctx,
        pid,
        generation,
        Parked {
            factor,
            weight,
            len: 0,
        },
    );
    let stack_id = stack.unwrap_or_else(|reason| {
        count_drop(pid, reason);
        if reason == DropReason::StackRateLimited {
            OVERFLOW_STACK
        } else {
            NO_STACK
        }
    });
    // After the stack walk: the verifier then explores the walk once, not
    // once per outcome of the weight checks.
    note_weight(proc_ptr, spec.provider, size, weight);
    let sample = LiveSample {
        stack_id,
        size,
        weight,
        generation,
        thin_factor: factor as u32,
        // SAFETY: a helper without arguments.
        allocated_ns: unsafe { bpf_ktime_get_ns() },
    };
    let delta = sample.delta();
    let agg_key = AggKey {
        pid,
        generation,
        stack_id,
    };
    let agg =
        get_or_insert(&AGGS, &agg_key).ok_or_else(|| lose(proc, &delta, DropReason::AggMapFull))?;
    add(&agg.alloc_bytes, delta.bytes);
    add(&agg.alloc_objects, delta.objects);
    add(&agg.alloc_var, delta.var);
    add(&agg.alloc_thin_var, delta.thin_var);
    add(&agg.alloc_samples, 1);

    // Pointer 0: the emitter sampled the allocation but cannot report its
    // free (allocprof's allocator could not place it). Allocated bytes stay
    // unbiased; live bytes become a lower bound, by this much.
    if ptr == 0 {
        return Err(lose(proc, &delta, DropReason::Unplaced));
    }
    if proc.live_samples_value() >= max_live_per_process() {
        return Err(lose(proc, &delta, DropReason::ProcessCap));
    }
    let key = LiveKey { pid, _pad: 0, ptr };
    if let Err(e) = LIVE.insert(key, sample, u64::from(BPF_NOEXIST)) {
        if e != -EEXIST {
            return Err(lose(proc, &delta, DropReason::LiveMapFull));
        }
        // The free of the block that lived here was missed (e.g. sampled
        // before we attached): retire it so its bytes don't live forever.
        // SAFETY: copied out at once; the remove arbitrates concurrent frees.
        if let Some(old) = unsafe { LIVE.get(key) }.copied()
            && LIVE.remove(key).is_ok()
        {
            retire(pid, Some(proc), &old);
        }
        count_drop(pid, DropReason::ReplacedLive);
        LIVE.insert(key, sample, u64::from(BPF_NOEXIST))
            .map_err(|_| lose(proc, &delta, DropReason::LiveMapFull))?;
    }
    add(&proc.live_samples, 1);
    add(&agg.live_bytes, delta.bytes);
    add(&agg.live_objects, delta.objects);
    add(&agg.live_var, delta.var);
    add(&agg.live_thin_var, delta.thin_var);
    add(&agg.live_samples, 1);
    Ok(())
}

/// Keeps the name the kernel sees, once per image (exec clears it), so a
/// process that exits before user space reads `/proc` is still named.
#[inline(always)]
fn note_comm(proc: *mut ProcCounters) {
    // SAFETY: a pointer to a field of a map value, valid for the whole
    // program run; racing writers write the same name.
    unsafe {
        let comm = core::ptr::addr_of_mut!((*proc).comm);
        if core::ptr::read_volatile(comm.cast::<u8>()) == 0
            && let Ok(name) = bpf_get_current_comm()
        {
            core::ptr::write_volatile(comm, name);
        }
    }
}

/// The process's back-pressure factor for this alloc event (1: keep it;
/// see `profiler_common::thin_step`). Plain racy writes, as the stack
/// budget: a lost update only shifts the factor for a moment, and whatever
/// the factor, keeping 1 in it and scaling by it stays unbiased.
#[inline(always)]
fn thin_factor(proc: *mut ProcCounters) -> u64 {
    let budget = max_event_rate();
    if budget == 0 {
        return 1;
    }
    // SAFETY: pointers to fields of a map value, valid for the whole program
    // run; aligned reads and writes (see above for the races).
    unsafe {
        let window = core::ptr::addr_of_mut!((*proc).thin_window_ns);
        let events = core::ptr::addr_of_mut!((*proc).thin_window_events);
        let factor = core::ptr::addr_of_mut!((*proc).thin_factor);
        let step = thin_step(
            core::ptr::read_volatile(window),
            core::ptr::read_volatile(events),
            core::ptr::read_volatile(factor),
            bpf_ktime_get_ns(),
            budget,
        );
        core::ptr::write_volatile(window, step.window_ns);
        core::ptr::write_volatile(events, step.window_events);
        core::ptr::write_volatile(factor, step.factor);
        step.factor
    }
}

fn try_free(ctx: &ProbeContext, pid: u32) -> Result<(), DropReason> {
    let spec = probe_spec(ctx)?;
    let ptr = read_arg(ctx, &spec.args[0]).ok_or(DropReason::ArgReadFailed)?;
    let key = LiveKey { pid, _pad: 0, ptr };
    // SAFETY: map values stay valid for the whole program run.
    let proc = PROCS.get_ptr_mut(pid).map(|p| unsafe { &*p });
    // SAFETY: copied out at once; the remove decides who retires it.
    let Some(sample) = unsafe { LIVE.get(key) }.copied() else {
        // SAFETY: only tested for presence.
        if unsafe { SEEDED_PIDS.get(pid) }.is_some() {
            // Perhaps a block from before attach: user space decides. Lost
            // when the ring is full (user space's ledger check catches it).
            let free = UnseenFree {
                pid,
                _pad: 0,
                ptr,
                // SAFETY: a helper without arguments.
                time_ns: unsafe { bpf_ktime_get_ns() },
            };
            let _ = UNSEEN_FREES.output::<UnseenFree>(&free, 0);
            return Ok(());
        }
        // Under back-pressure most frees are of events not kept: expected.
        return match proc {
            // SAFETY: an aligned read of a field others update atomically.
            Some(p) if unsafe { core::ptr::read_volatile(&p.thinned_events) } > 0 => Ok(()),
            _ => Err(DropReason::UnmatchedFree),
        };
    };
    if let Some(proc) = proc {
        add(&proc.free_events, 1);
    }
    // Whoever removes the entry (this free, a concurrent one, or user space
    // cleaning up after exec) is the one that subtracts it.
    if LIVE.remove(key).is_ok() {
        retire(pid, proc, &sample);
    }
    Ok(())
}

/// A sample whose bytes will be missing from the live sums: the process's
/// live estimate becomes a lower bound, and says by how much.
#[inline(always)]
fn lose(proc: &ProcCounters, delta: &SampleDelta, reason: DropReason) -> DropReason {
    add(&proc.lost_live_bytes, delta.bytes);
    reason
}

/// Subtracts a removed live sample from its aggregate and its process.
fn retire(pid: u32, proc: Option<&ProcCounters>, sample: &LiveSample) {
    let agg_key = AggKey {
        pid,
        generation: sample.generation,
        stack_id: sample.stack_id,
    };
    if let Some(agg) = AGGS.get_ptr_mut(agg_key) {
        // SAFETY: map values stay valid for the whole program run.
        let agg = unsafe { &*agg };
        let delta = sample.delta();
        sub(&agg.live_bytes, delta.bytes);
        sub(&agg.live_objects, delta.objects);
        sub(&agg.live_var, delta.var);
        sub(&agg.live_thin_var, delta.thin_var);
        sub(&agg.live_samples, 1);
    }
    if let Some(proc) = proc
        && proc.generation == sample.generation
    {
        sub(&proc.live_samples, 1);
    }
}

fn probe_spec(ctx: &ProbeContext) -> Result<&'static UsdtSpec, DropReason> {
    // SAFETY: the helper only reads the cookie of the running program's link.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    USDT_SPECS
        .get(cookie as u32)
        .ok_or(DropReason::ArgReadFailed)
}

/// Takes the user stack and files it under the hash of the process image and
/// its frames. The per-CPU scratch is shared by every program on this CPU,
/// and a uprobe program can be preempted (migration is disabled, preemption is not): a claim counter
/// lets one walk at a time use it; the others count a drop.
///
/// The back-pressure factor and the weight come back with the result: on
/// a walk they are parked in this CPU's `THIN_SCRATCH` (ours under the
/// claim) and read back, so the verifier sees one state at the walk
/// whichever way the factor was decided from them (the walk's callback is
/// verified once per distinct state reaching it: a branch on the weight
/// before it, kept in a register, would double the alloc program's
/// verified instructions, past the 1M limit).
fn take_stack(
    ctx: &ProbeContext,
    pid: u32,
    generation: u32,
    thinning: Parked,
) -> (Result<u64, DropReason>, Parked) {
    let Some(claims) = STACK_SCRATCH_CLAIMS.get_ptr_mut(0) else {
        return (Err(DropReason::StackFailed), thinning);
    };
    // SAFETY: a per-CPU map value, valid for the whole program run; every
    // access is an atomic add or an aligned volatile read.
    let claims = MapCounter(unsafe { &*claims });
    if !try_claim(&claims) {
        return (Err(DropReason::ScratchBusy), thinning);
    }
    let Some(parked) = THIN_SCRATCH.get_ptr_mut(0) else {
        release_claim(&claims);
        return (Err(DropReason::StackFailed), thinning);
    };
    // SAFETY: this CPU's slot, ours alone under the claim.
    unsafe { core::ptr::write_volatile(parked, thinning) };
    let result = take_stack_claimed(ctx, pid, generation, parked);
    // SAFETY: as above.
    let thinning = unsafe { core::ptr::read_volatile(parked) };
    release_claim(&claims);
    (result, thinning)
}

/// `len` (a stack length, at most `MAX_STACK_DEPTH`) through this CPU's
/// parked slot (see `take_stack_claimed`).
#[inline(always)]
fn settle(parked: *mut Parked, len: usize) -> usize {
    // SAFETY: this CPU's slot, ours under the scratch claim.
    unsafe {
        let slot = core::ptr::addr_of_mut!((*parked).len);
        core::ptr::write_volatile(slot, len as u64);
        // A mask, not a comparison: one state (MAX_STACK_DEPTH is 127).
        core::ptr::read_volatile(slot) as usize & 127
    }
}

/// A counter in a map value, shared between CPUs or preempted programs.
struct MapCounter<'a>(&'a u64);

impl ClaimCounter for MapCounter<'_> {
    #[inline(always)]
    fn add(&self, v: u64) {
        add(self.0, v);
    }

    #[inline(always)]
    fn load(&self) -> u64 {
        // SAFETY: an aligned read of a field others update atomically.
        unsafe { core::ptr::read_volatile(self.0) }
    }
}

fn take_stack_claimed(
    ctx: &ProbeContext,
    pid: u32,
    generation: u32,
    parked: *mut Parked,
) -> Result<u64, DropReason> {
    // Either walk writes the scratch's frames itself.
    let len = match crate::unwind::walk(ctx, pid) {
        Some(len) => len.min(MAX_STACK_DEPTH),
        None => crate::unwind::walk_without_tables(ctx).ok_or(DropReason::StackFailed)?,
    };
    // The Python part, if any, after the native one (the hash covers both).
    // The length goes through the parked slot before and after: read back
    // from a map, it is one unknown value to the verifier, so what follows
    // is verified once, not once per way the walks ended.
    let len = crate::python::append(pid, settle(parked, len));
    let len = settle(parked, len);
    let scratch = STACK_SCRATCH
        .get_ptr_mut(0)
        .ok_or(DropReason::StackFailed)?;
    // SAFETY: a per-CPU map value, ours alone while this program runs.
    let trace: &mut StackTrace = unsafe { &mut *scratch };
    trace.len = len as u64;
    let mut hash = stack_seed(pid, generation);
    for i in 0..MAX_STACK_DEPTH {
        if i >= len {
            break;
        }
        hash = stack_hash_step(hash, trace.frames[i]);
    }
    // Settled again: each way out of the loop bounds `len` otherwise, and
    // what follows would be verified once per way.
    let len = settle(parked, len);
    // A stack with a Python part is also the code objects its frames ran
    // (their prints, taken by the walk): the same frames running a code
    // object made where a freed one was are another stack.
    let last = trace.frames.get(len.wrapping_sub(1)).copied().unwrap_or(0);
    let python = py_ends_stack(last);
    if python {
        hash = stack_hash_step(hash, crate::python::prints_digest());
    }
    // Frames past `len` are left over from earlier stacks: user space reads
    // only `len` of them, so clearing them would be wasted work.
    let hash = stack_id(hash);
    // Most stacks are seen before: a lockless lookup is cheaper than an
    // insert that fails with EEXIST under the bucket lock. A known stack
    // always resolves, whatever the budget.
    if STACKS.get_ptr(hash).is_some() {
        return Ok(hash);
    }
    take_new_stack_budget(pid)?;
    // Before the stack: user space names its Python frames only by them.
    if python && !crate::python::file_prints(hash) {
        return Err(DropReason::StackMapFull);
    }
    // By reference: a StackTrace copied onto the 512-byte BPF stack won't fit.
    let trace: &StackTrace = trace;
    match STACKS.insert(hash, trace, u64::from(BPF_NOEXIST)) {
        Ok(()) => Ok(hash),
        Err(e) if e == -EEXIST => Ok(hash),
        Err(_) => Err(DropReason::StackMapFull),
    }
}

/// Spends one new stack of the process's budget. Threads of one process on
/// several CPUs may read the same budget and both write: a lost update lets
/// a few more stacks in than the rate (at most one per racing CPU), which is
/// fine for a flood guard, and costs no lock.
#[inline(always)]
fn take_new_stack_budget(pid: u32) -> Result<(), DropReason> {
    // No entry (deleted by user space since the sample began): no budget.
    let proc = PROCS.get_ptr_mut(pid).ok_or(DropReason::StackRateLimited)?;
    // SAFETY: a pointer to a field of a map value, valid for the whole
    // program run; racing plain writes are the approximation described above.
    let field = unsafe { core::ptr::addr_of_mut!((*proc).stack_budget_ns) };
    // SAFETY: the helper takes no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: an aligned field of a live map value (see above).
    let tat = unsafe { core::ptr::read_volatile(field) };
    let next = new_stack_budget(tat, now, new_stacks_per_second(), new_stacks_burst())
        .ok_or(DropReason::StackRateLimited)?;
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(field, next) };
    Ok(())
}

fn proc_state(pid: u32) -> Result<*mut ProcCounters, DropReason> {
    get_or_insert_ptr(&PROCS, &pid).ok_or(DropReason::ProcMapFull)
}

/// Records the probe's contract and what its weight says about the
/// process's weight form (`profiler_common::weight_check`). The minimum and
/// the contract bits are plain racy writes, as the stack budget: a lost
/// update of the minimum can only flag a weight as a non-multiple (an
/// interval then falls back to the wider model, or is unavailable), never
/// pass a wrong R; a lost contract bit is set again by the next probe.
#[inline(always)]
fn note_weight(proc: *mut ProcCounters, provider: u32, size: u64, weight: u64) {
    // SAFETY: pointers to fields of a map value, valid for the whole program
    // run; aligned reads and writes (see above for the races).
    unsafe {
        let contracts = core::ptr::addr_of_mut!((*proc).contracts);
        let bits = core::ptr::read_volatile(contracts);
        if bits & u64::from(provider) != u64::from(provider) {
            core::ptr::write_volatile(contracts, bits | u64::from(provider));
        }
        let min_field = core::ptr::addr_of_mut!((*proc).min_weight);
        let min = core::ptr::read_volatile(min_field);
        let check = weight_check(min, size, weight);
        if check.min_weight != min {
            core::ptr::write_volatile(min_field, check.min_weight);
        }
        let proc: &ProcCounters = &*proc;
        // One branch, then adds of 0 or 1 (fewer paths to verify than a
        // branch each): a well-formed weight, nearly every one, makes no
        // atomic write to the process's shared counters, whose cache line
        // would otherwise bounce between the CPUs of a busy process.
        if check.not_multiple | check.below_size | check.invalid {
            add(&proc.weights_not_multiple, u64::from(check.not_multiple));
            add(&proc.weights_below_size, u64::from(check.below_size));
            add(&proc.weights_invalid, u64::from(check.invalid));
        }
    }
}

/// Looks a value up, inserting a zeroed one first if absent.
#[inline(always)]
fn get_or_insert<K, V: Default>(
    map: &aya_ebpf::maps::HashMap<K, V>,
    key: &K,
) -> Option<&'static V> {
    // SAFETY: map values stay valid for the whole program run.
    get_or_insert_ptr(map, key).map(|v| unsafe { &*v })
}

/// As [`get_or_insert`], as a pointer (for fields written in place).
#[inline(always)]
fn get_or_insert_ptr<K, V: Default>(
    map: &aya_ebpf::maps::HashMap<K, V>,
    key: &K,
) -> Option<*mut V> {
    if let Some(v) = map.get_ptr_mut(key) {
        return Some(v);
    }
    // A concurrent insert of the same key wins; the lookup below finds it.
    let _ = map.insert(key, V::default(), u64::from(BPF_NOEXIST));
    map.get_ptr_mut(key)
}

/// Counts a drop; returns the process's count of that cause after it
/// (0 where the process has no state).
pub(crate) fn count_drop(pid: u32, reason: DropReason) -> u64 {
    if let Some(c) = DROPS.get_ptr_mut(reason as u32) {
        // SAFETY: a per-CPU counter, ours alone while this program runs.
        unsafe { *c += 1 };
    }
    if let Some(proc) = PROCS.get_ptr_mut(pid) {
        // SAFETY: map values stay valid for the whole program run.
        let proc = unsafe { &*proc };
        let i = reason as usize;
        if i < proc.drops.len() {
            add(&proc.drops[i], 1);
            // SAFETY: an aligned read of a field others update atomically.
            return unsafe { core::ptr::read_volatile(&proc.drops[i]) };
        }
    }
    0
}

#[inline(always)]
fn current_pid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

/// Atomic add on a field of a shared map value.
#[inline(always)]
pub fn add(field: &u64, v: u64) {
    // The BPF target has atomic adds but no compare-and-swap, so core's
    // AtomicU64 offers no fetch_add; the intrinsic lowers to BPF_ATOMIC_ADD.
    // SAFETY: map values are 8-byte aligned and shared between CPUs; every
    // writer goes through this atomic add.
    unsafe {
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(
            core::ptr::from_ref::<u64>(field) as *mut u64,
            v,
        )
    };
}

#[inline(always)]
fn sub(field: &u64, v: u64) {
    add(field, v.wrapping_neg());
}

trait LiveCount {
    fn live_samples_value(&self) -> u64;
}

impl LiveCount for ProcCounters {
    #[inline(always)]
    fn live_samples_value(&self) -> u64 {
        // SAFETY: an aligned read of a field others update atomically.
        unsafe { core::ptr::read_volatile(&self.live_samples) }
    }
}

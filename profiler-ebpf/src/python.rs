//! The allocating thread's Python frames, filed after its native ones
//! (`profiler_common::python`): for a process user space recognised as
//! CPython (`PY_PROCS`), find the thread's own thread state by its native
//! thread id (never the GIL holder's; in the process's own pid namespace,
//! a container's included), then walk its interpreter frames
//! innermost first, one user read per frame, bounded in depth. What the
//! frames mean is decided by `profiler_common::py_frame_step`, host-tested.

use aya_ebpf::{
    bindings::bpf_pidns_info,
    cty::c_void,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, generated},
};
use profiler_common::{
    MAX_STACK_DEPTH,
    python::{
        MAX_PYTHON_FRAMES, MAX_PYTHON_THREADS, PY_CODE_PRINT_WORDS, PY_FRAME_WORDS, PY_NO_FIELD,
        PY_NO_PRINT, PY_PRINTS_SEED, PY_RESERVED_SLOTS, PY_STACK_BEGIN, PY_TRUNCATED_FRAME,
        PyFrameStep, PyProcConfig, decode_python_frame, py_code_print, py_frame_step,
        py_mark_entry, py_moved_stack, py_plausible, py_prints_digest,
    },
    unwind::DEPTH_CUT_FRAME,
};

use crate::maps::{
    PY_PROCS, PY_SCRATCH, PY_STACK_PRINTS, PY_THREADS, PyScratch, PyThread, STACK_SCRATCH,
    py_recheck_ns,
};

/// How long a thread found without a thread state stays so before it is
/// looked for again (a native thread may take one later).
const NO_THREAD_STATE_NS: u64 = 1_000_000_000;

const CONTINUE: i64 = 0;
const STOP: i64 = 1;

/// Appends the current thread's Python part to the `len` frames of
/// `STACK_SCRATCH`; returns the new length (`len` when there is none).
/// Native frames past `MAX_STACK_DEPTH - PY_RESERVED_SLOTS` give way to
/// it (the last kept becomes `DEPTH_CUT_FRAME`), so a deep native stack
/// cannot crowd it out. Not inlined: its locals stay off the program's own
/// frame.
#[inline(never)]
pub fn append(pid: u32, len: usize) -> usize {
    let Some(cfg) = PY_PROCS.get_ptr(pid) else {
        return len;
    };
    // SAFETY: a map value, valid for the whole program run; only read.
    let cfg = unsafe { &*cfg };
    // Room for the marker, one frame and the truncation marker at least.
    if len + 3 > MAX_STACK_DEPTH {
        return len;
    }
    let Some(scratch) = PY_SCRATCH.get_ptr_mut(0) else {
        return len;
    };
    let Some(frame) = current_frame(cfg, scratch) else {
        return len;
    };
    let Some(trace) = STACK_SCRATCH.get_ptr_mut(0) else {
        return len;
    };
    // SAFETY: a per-CPU map value, ours under the scratch claim.
    let trace = unsafe { &mut *trace };
    const NATIVE_ROOM: usize = MAX_STACK_DEPTH - PY_RESERVED_SLOTS;
    let len = if len > NATIVE_ROOM {
        trace.frames[NATIVE_ROOM - 1] = DEPTH_CUT_FRAME;
        NATIVE_ROOM
    } else {
        len
    };
    // Reloaded, so the bound is checked on the register the store indexes by.
    // SAFETY: a read of a local.
    let slot = unsafe { core::ptr::read_volatile(&len) };
    let Some(begin) = trace.frames.get_mut(slot) else {
        return len;
    };
    *begin = PY_STACK_BEGIN;
    let frames = (MAX_STACK_DEPTH - 2 - len).min(MAX_PYTHON_FRAMES);
    // The walk's changing state lives in the per-CPU scratch, not on the
    // stack: the verifier checks the callback once, where a counter on the
    // stack would make each iteration a new state.
    // SAFETY: this CPU's scratch, ours under the stack scratch claim.
    unsafe {
        (*scratch).frame = frame;
        (*scratch).len = (len + 1) as u64;
        (*scratch).end = (len + 1 + frames) as u64;
        (*scratch).last = NO_FRAME;
        (*scratch).cut = 0;
        (*scratch).begin = (len + 1) as u64;
    }
    let mut walk = PyWalk { cfg };
    // Shims (3.12+) take loop steps but no slot: twice the frames.
    // SAFETY: the callback is a BPF subprogram taking (index, &mut PyWalk);
    // `walk` outlives the call.
    unsafe {
        generated::bpf_loop(
            2 * MAX_PYTHON_FRAMES as u32,
            frame_step as *mut c_void,
            (&raw mut walk).cast(),
            0,
        )
    };
    // SAFETY: as above.
    let (len, cut) = unsafe {
        // Steps left over with frames to go count as a cut too.
        (
            (*scratch).len as usize,
            (*scratch).cut != 0 || (*scratch).frame != 0,
        )
    };
    if !cut {
        return len;
    }
    // SAFETY: a read of a local (see above).
    let slot = unsafe { core::ptr::read_volatile(&len) };
    match trace.frames.get_mut(slot) {
        Some(frame) => {
            *frame = PY_TRUNCATED_FRAME;
            slot + 1
        }
        None => len.min(MAX_STACK_DEPTH),
    }
}

/// `PyScratch::last` before any frame is filed.
const NO_FRAME: u64 = u64::MAX;

/// What the walk's callbacks see on the stack: only what does not change.
#[repr(C)]
struct PyWalk {
    cfg: *const PyProcConfig,
}

#[inline(never)]
extern "C" fn frame_step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `append` passed its own `PyWalk` as the loop's context.
    let walk = unsafe { &*ctx.cast::<PyWalk>() };
    // SAFETY: a map value, valid for the whole program run; only read.
    let cfg = unsafe { &*walk.cfg };
    let Some(scratch) = PY_SCRATCH.get_ptr_mut(0) else {
        return STOP;
    };
    // SAFETY: this CPU's scratch, ours under the stack scratch claim.
    let w = unsafe { &mut *scratch };
    let at = w.frame;
    if at == 0 {
        return STOP;
    }
    if w.len >= w.end {
        w.cut = 1;
        return STOP;
    }
    // 8 to 128 bytes, whatever the entry says (user space writes a
    // multiple of 8 in that range): a bound the verifier sees on the very
    // register the helper takes.
    let size = 8 + (cfg.frame_read.wrapping_sub(8) & (PY_FRAME_WORDS as u32 * 8 - 8));
    // One read per frame: its header, into this CPU's copy.
    // SAFETY: the helper writes at most `size` (≤ the buffer) bytes into
    // this CPU's buffer, ours under the scratch claim, and reports a fault
    // instead of taking it.
    let err = unsafe {
        generated::bpf_probe_read_user(
            core::ptr::addr_of_mut!(w.words).cast(),
            size,
            at as *const c_void,
        )
    };
    if err != 0 {
        w.cut = 1;
        return STOP;
    }
    let Some(trace) = STACK_SCRATCH.get_ptr_mut(0) else {
        w.cut = 1;
        return STOP;
    };
    // SAFETY: a per-CPU map value, ours under the scratch claim.
    let trace = unsafe { &mut *trace };
    let previous = match py_frame_step(cfg, &w.words) {
        PyFrameStep::Frame { value, previous } => {
            let slot = w.len as usize;
            if slot >= MAX_STACK_DEPTH {
                w.cut = 1;
                return STOP;
            }
            trace.frames[slot] = value;
            w.last = slot as u64;
            w.len = slot as u64 + 1;
            previous
        }
        PyFrameStep::Shim { previous } => {
            // The frame filed just before is the first its eval call ran.
            let last = w.last as usize;
            if last < MAX_STACK_DEPTH {
                trace.frames[last] = py_mark_entry(trace.frames[last]);
            }
            previous
        }
        PyFrameStep::Bad => {
            w.cut = 1;
            return STOP;
        }
    };
    // A frame returning to itself, or to no pointer, is a scribbled chain:
    // cut after the frame filed, not looped or followed.
    if previous == at || (previous != 0 && !py_plausible(previous)) {
        w.cut = 1;
        return STOP;
    }
    w.frame = previous;
    if previous == 0 { STOP } else { CONTINUE }
}

/// For a new stack of `len` frames in `STACK_SCRATCH`: files the prints of
/// the code objects its Python frames run, read now, under `stack_id` in
/// `PY_STACK_PRINTS` (see `profiler_common::python`). False if they could
/// not be filed: the stack must not be either, or user space would name
/// its frames unchecked.
#[inline(never)]
pub fn file_prints(pid: u32, stack_id: u64, len: usize) -> bool {
    let Some(scratch) = print_frames(pid, len) else {
        return true; // no Python frame, or not a CPython process
    };
    // SAFETY: this CPU's scratch, ours under the stack scratch claim.
    let entry = unsafe { &mut (*scratch).prints };
    // SAFETY: a helper without arguments.
    entry.checked_ns = unsafe { bpf_ktime_get_ns() };
    entry.moved_to = 0;
    PY_STACK_PRINTS.insert(stack_id, entry, 0).is_ok()
}

/// The stack a sample of the known stack `stack` (of `len` frames in
/// `STACK_SCRATCH`) goes to: itself, or the one its samples moved to when
/// its frames last printed otherwise. Re-prints the frames when that
/// stack's last check is older than `PY_RECHECK_NS` (0: always); if they print
/// otherwise now, they move to a stack of their own, which the caller files
/// if it is not known yet.
#[inline(never)]
pub fn current_stack(pid: u32, stack: u64, len: usize) -> u64 {
    let Some(entry) = PY_STACK_PRINTS.get_ptr_mut(stack) else {
        return stack; // no Python frame
    };
    // SAFETY: a map value, valid for the whole program run; racing CPUs
    // write the same values (see below).
    let entry = unsafe { &mut *entry };
    let (target, checked) = match entry.moved_to {
        0 => (stack, core::ptr::from_mut(&mut *entry)),
        moved => match PY_STACK_PRINTS.get_ptr_mut(moved) {
            Some(checked) => (moved, checked),
            None => return moved, // to be filed by the caller
        },
    };
    // SAFETY: as above.
    let checked = unsafe { &mut *checked };
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if now.wrapping_sub(checked.checked_ns) < py_recheck_ns() {
        return target;
    }
    let Some(scratch) = print_frames(pid, len) else {
        return target;
    };
    // SAFETY: this CPU's scratch, ours under the stack scratch claim.
    let digest = unsafe { (*scratch).prints.digest };
    if digest == checked.digest {
        checked.checked_ns = now;
        return target;
    }
    // Other code objects in the same frames: their own stack from now on
    // (the same id on every CPU that sees them).
    let moved = py_moved_stack(stack, digest);
    entry.moved_to = moved;
    moved
}

/// Prints the code objects of the Python frames among the `len` frames of
/// `STACK_SCRATCH` into this CPU's `PyScratch::prints`; the scratch if the
/// process is CPython and the stack has Python frames.
#[inline(always)]
fn print_frames(pid: u32, len: usize) -> Option<*mut PyScratch> {
    let cfg = PY_PROCS.get_ptr(pid)?;
    let scratch = PY_SCRATCH.get_ptr_mut(0)?;
    let trace = STACK_SCRATCH.get_ptr(0)?;
    // From this sample's first Python frame, where the walk says it is
    // (the native part holds none); from the start if that slot is not one
    // after `PY_STACK_BEGIN` (no walk this sample: a native stack).
    // SAFETY: this CPU's scratch, ours under the stack scratch claim.
    let begin = unsafe { (*scratch).begin } as usize;
    // SAFETY: as above.
    let marked = unsafe { &*trace }
        .frames
        .get(begin.wrapping_sub(1))
        .is_some_and(|&f| f == PY_STACK_BEGIN);
    let start = if marked && begin <= len { begin } else { 0 };
    // SAFETY: as above.
    unsafe {
        (*scratch).printed = 0;
        (*scratch).print_slot = start as u64;
        (*scratch).print_code = 0;
        (*scratch).prints.digest = PY_PRINTS_SEED;
    }
    let mut walk = PyWalk { cfg };
    // SAFETY: the callback is a BPF subprogram taking (index, &mut PyWalk);
    // `walk` outlives the call.
    unsafe {
        generated::bpf_loop(
            (len.min(MAX_STACK_DEPTH) - start.min(len)) as u32,
            print_step as *mut c_void,
            (&raw mut walk).cast(),
            0,
        )
    };
    // SAFETY: as above.
    (unsafe { (*scratch).printed } != 0).then_some(scratch)
}

/// One slot of the new stack: a Python frame gets its code object's print.
#[inline(never)]
extern "C" fn print_step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `file_prints` passed its own `PyWalk` as the loop's context.
    let walk = unsafe { &*ctx.cast::<PyWalk>() };
    // SAFETY: a map value, valid for the whole program run; only read.
    let cfg = unsafe { &*walk.cfg };
    let Some(scratch) = PY_SCRATCH.get_ptr_mut(0) else {
        return STOP;
    };
    // SAFETY: this CPU's scratch, ours under the stack scratch claim.
    let w = unsafe { &mut *scratch };
    let Some(trace) = STACK_SCRATCH.get_ptr(0) else {
        return STOP;
    };
    let slot = w.print_slot as usize;
    w.print_slot += 1;
    // SAFETY: a per-CPU map value, ours under the scratch claim.
    let Some(&value) = (unsafe { &*trace }).frames.get(slot) else {
        return STOP;
    };
    let Some(frame) = decode_python_frame(value) else {
        return CONTINUE;
    };
    let printed = w.printed as usize;
    if printed >= MAX_PYTHON_FRAMES {
        return STOP;
    }
    // A frame running the code of the one before (recursion) takes its
    // print again, without a read.
    let print = if frame.code == w.print_code {
        w.last_print as u32
    } else {
        // 8 to 256 bytes: a bound the verifier sees on the helper's register.
        let size = 8 + (cfg.code_print.read.wrapping_sub(8) & (PY_CODE_PRINT_WORDS as u32 * 8 - 8));
        // SAFETY: the helper writes at most `size` (≤ the buffer) bytes
        // into this CPU's buffer, ours under the scratch claim, and reports
        // a fault instead of taking it.
        let err = unsafe {
            generated::bpf_probe_read_user(
                core::ptr::addr_of_mut!(w.code).cast(),
                size,
                frame.code as *const c_void,
            )
        };
        let print = if err != 0 || cfg.code_print.read == 0 {
            PY_NO_PRINT
        } else {
            py_code_print(&w.code, &cfg.code_print)
        };
        w.print_code = frame.code;
        w.last_print = u64::from(print);
        print
    };
    w.prints.prints[printed] = print;
    w.prints.digest = py_prints_digest(w.prints.digest, print);
    w.printed = printed as u64 + 1;
    CONTINUE
}

/// The current thread's innermost interpreter frame, if it has a thread
/// state with one.
#[inline(always)]
fn current_frame(cfg: &PyProcConfig, scratch: *mut PyScratch) -> Option<u64> {
    let tstate = thread_state(cfg, scratch)?;
    let holder = if cfg.tstate_cframe == PY_NO_FIELD {
        tstate
    } else {
        plausible(read_word(
            tstate.wrapping_add(u64::from(cfg.tstate_cframe)),
        )?)?
    };
    plausible(read_word(
        holder.wrapping_add(u64::from(cfg.current_frame)),
    )?)
}

/// The current thread's `PyThreadState`: from the per-thread hint, checked
/// by reading its native thread id back, else by a bounded walk of the
/// interpreter's thread list.
#[inline(always)]
fn thread_state(cfg: &PyProcConfig, scratch: *mut PyScratch) -> Option<u64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = thread_id(cfg, pid_tgid)?;
    // SAFETY: copied out at once.
    let hint = unsafe { PY_THREADS.get(pid_tgid) }.copied();
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(hint) = hint {
        if hint.tstate == 0 {
            if now.wrapping_sub(hint.checked_ns) < NO_THREAD_STATE_NS {
                return None;
            }
        } else if read_word(
            hint.tstate
                .wrapping_add(u64::from(cfg.tstate_native_thread_id)),
        ) == Some(tid)
        {
            return Some(hint.tstate);
        }
    }
    let interp = plausible(read_word(
        cfg.runtime
            .wrapping_add(u64::from(cfg.runtime_interpreters_head)),
    )?)?;
    let head = read_word(interp.wrapping_add(u64::from(cfg.interp_threads_head)))?;
    // SAFETY: this CPU's scratch, ours under the stack scratch claim (the
    // search's changing state lives there, as the frame walk's does).
    unsafe {
        (*scratch).frame = head;
        (*scratch).last = 0;
    }
    let mut search = ThreadSearch { cfg, tid };
    // SAFETY: the callback is a BPF subprogram taking (index, &mut
    // ThreadSearch); `search` outlives the call.
    unsafe {
        generated::bpf_loop(
            MAX_PYTHON_THREADS as u32,
            thread_step as *mut c_void,
            (&raw mut search).cast(),
            0,
        )
    };
    // SAFETY: as above.
    let found = unsafe { (*scratch).last };
    let _ = PY_THREADS.insert(
        pid_tgid,
        PyThread {
            tstate: found,
            checked_ns: now,
        },
        0,
    );
    (found != 0).then_some(found)
}

/// The current thread's id as its process's thread states hold it
/// (`native_thread_id`): in the process's own pid namespace. None if the
/// kernel cannot tell it (the namespace is not the thread's): then the
/// sample keeps its native frames, never another thread's.
#[inline(always)]
fn thread_id(cfg: &PyProcConfig, pid_tgid: u64) -> Option<u64> {
    if cfg.pidns_ino == 0 {
        return Some(u64::from(pid_tgid as u32));
    }
    let mut ns = bpf_pidns_info { pid: 0, tgid: 0 };
    // SAFETY: the helper writes at most `size` bytes into `ns`, a local of
    // that size, and checks the namespace itself.
    let err = unsafe {
        generated::bpf_get_ns_current_pid_tgid(
            cfg.pidns_dev,
            cfg.pidns_ino,
            &mut ns,
            size_of::<bpf_pidns_info>() as u32,
        )
    };
    (err == 0).then_some(u64::from(ns.pid))
}

#[repr(C)]
struct ThreadSearch {
    cfg: *const PyProcConfig,
    tid: u64,
}

/// One thread state of the list (`PyScratch::frame`; the one found goes
/// to `PyScratch::last`).
#[inline(never)]
extern "C" fn thread_step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `thread_state` passed its own `ThreadSearch` as the context.
    let search = unsafe { &*ctx.cast::<ThreadSearch>() };
    // SAFETY: a map value, valid for the whole program run; only read.
    let cfg = unsafe { &*search.cfg };
    let Some(scratch) = PY_SCRATCH.get_ptr_mut(0) else {
        return STOP;
    };
    // SAFETY: this CPU's scratch, ours under the stack scratch claim.
    let w = unsafe { &mut *scratch };
    let tstate = w.frame;
    if !py_plausible(tstate) {
        return STOP;
    }
    match read_word(tstate.wrapping_add(u64::from(cfg.tstate_native_thread_id))) {
        Some(id) if id == search.tid => {
            w.last = tstate;
            return STOP;
        }
        Some(_) => {}
        None => return STOP,
    }
    match read_word(tstate.wrapping_add(u64::from(cfg.tstate_next))) {
        Some(next) if next != tstate => {
            w.frame = next;
            CONTINUE
        }
        _ => STOP,
    }
}

#[inline(always)]
fn plausible(addr: u64) -> Option<u64> {
    py_plausible(addr).then_some(addr)
}

#[inline(always)]
fn read_word(addr: u64) -> Option<u64> {
    // SAFETY: the helper copies from user memory and reports a fault instead
    // of taking it.
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

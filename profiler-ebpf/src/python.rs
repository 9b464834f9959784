//! The allocating thread's Python frames, filed after its native ones
//! (`profiler_common::python`): for a process user space recognised as
//! CPython (`PY_PROCS`), find the thread's own thread state by its native
//! thread id (never the GIL holder's; in the process's own pid namespace,
//! a container's included), then walk its interpreter frames
//! innermost first, one user read per block of frames, bounded in depth. What the
//! frames mean is decided by `profiler_common::py_frame_step`, host-tested.

use aya_ebpf::{
    bindings::bpf_pidns_info,
    cty::c_void,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, generated},
};
use profiler_common::{
    MAX_STACK_DEPTH, StackTrace,
    python::{
        MAX_PYTHON_FRAMES, MAX_PYTHON_THREADS, PY_BLOCK_WORDS, PY_CODE_PRINT_WORDS, PY_FRAME_WORDS,
        PY_NAME_PRINT_WORDS, PY_NO_FIELD, PY_NO_PRINT, PY_PRINTS_SEED, PY_RESERVED_SLOTS,
        PY_STACK_BEGIN, PY_TRUNCATED_FRAME, PyFrameStep, PyProcConfig, decode_python_frame,
        py_code_print, py_frame_step, py_mark_entry, py_name_print, py_plausible, py_prints_digest,
    },
    unwind::DEPTH_CUT_FRAME,
};

use crate::maps::{
    PY_PROCS, PY_SCRATCH, PY_STACK_PRINTS, PY_THREADS, PyScratch, PyThread, STACK_SCRATCH,
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
        // Another thread's memory, maybe another process's.
        (*scratch).block_at = 0;
        (*scratch).block_end = 0;
        (*scratch).printed = 0;
        (*scratch).print_code = 0;
        (*scratch).prints.digest = PY_PRINTS_SEED;
    }
    let mut walk = PyWalk {
        cfg,
        scratch,
        trace: core::ptr::from_mut(trace),
    };
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

/// What the walk's callbacks see on the stack: only what does not change
/// (the maps' values, looked up once per walk, not once per frame).
#[repr(C)]
struct PyWalk {
    cfg: *const PyProcConfig,
    scratch: *mut PyScratch,
    trace: *mut StackTrace,
}

#[inline(never)]
extern "C" fn frame_step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `append` passed its own `PyWalk` as the loop's context.
    let walk = unsafe { &*ctx.cast::<PyWalk>() };
    // SAFETY: a map value, valid for the whole program run; only read.
    let cfg = unsafe { &*walk.cfg };
    // SAFETY: this CPU's scratch, ours under the stack scratch claim.
    let w = unsafe { &mut *walk.scratch };
    let at = w.frame;
    if at == 0 {
        return STOP;
    }
    if w.len >= w.end {
        w.cut = 1;
        return STOP;
    }
    let Some(word) = frame_in_block(cfg, w, at) else {
        w.cut = 1;
        return STOP;
    };
    // SAFETY: a per-CPU map value, ours under the scratch claim.
    let trace = unsafe { &mut *walk.trace };
    let previous = match py_frame_step(cfg, &w.block, word) {
        PyFrameStep::Frame { value, previous } => {
            let slot = w.len as usize;
            if slot >= MAX_STACK_DEPTH {
                w.cut = 1;
                return STOP;
            }
            trace.frames[slot] = value;
            w.last = slot as u64;
            w.len = slot as u64 + 1;
            if let Some(frame) = decode_python_frame(value) {
                print_code(cfg, w, frame.code);
            }
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

/// The word of `PyScratch::block` where the frame at `at` starts, reading
/// the block first unless the frame is in it already: one read per page of
/// frames, mostly, not one per frame (see `PY_BLOCK_WORDS`). None if the
/// frame cannot be read.
#[inline(always)]
fn frame_in_block(cfg: &PyProcConfig, w: &mut PyScratch, at: u64) -> Option<usize> {
    // 8 to 128 bytes, whatever the entry says (user space writes a
    // multiple of 8 in that range).
    let size = 8 + u64::from(cfg.frame_read.wrapping_sub(8) & (PY_FRAME_WORDS as u32 * 8 - 8));
    let end = at.wrapping_add(size);
    if at < w.block_at || end > w.block_end {
        // Down to the block's size below the frame's end, not past the
        // start of the frame's page: that page is mapped if the frame is.
        let from = end
            .saturating_sub(PY_BLOCK_BYTES)
            .max(at & !(PAGE_BYTES - 1));
        // `at` and `from` are aligned (`py_plausible`, checked by the
        // caller): a multiple of 8 from 8 to the block's size, a bound the
        // verifier sees on the very register the helper takes.
        let len = 8 + (end.wrapping_sub(from).wrapping_sub(8) & (PY_BLOCK_BYTES - 8));
        // SAFETY: the helper writes at most `len` (≤ the buffer) bytes into
        // this CPU's buffer, ours under the scratch claim, and reports a
        // fault instead of taking it.
        let err = unsafe {
            generated::bpf_probe_read_user(
                core::ptr::addr_of_mut!(w.block).cast(),
                len as u32,
                from as *const c_void,
            )
        };
        if err != 0 {
            w.block_end = w.block_at;
            return None;
        }
        w.block_at = from;
        w.block_end = from.wrapping_add(len);
    }
    Some((at.wrapping_sub(w.block_at) / 8) as usize)
}

const PY_BLOCK_BYTES: u64 = PY_BLOCK_WORDS as u64 * 8;
/// The smallest page: a frame's page is mapped up to the frame.
const PAGE_BYTES: u64 = 4096;

/// The digest of the prints the walk just took (see `append`).
#[inline(always)]
pub fn prints_digest() -> u64 {
    match PY_SCRATCH.get_ptr(0) {
        // SAFETY: this CPU's scratch, ours under the stack scratch claim.
        Some(scratch) => unsafe { (*scratch).prints.digest },
        None => PY_PRINTS_SEED,
    }
}

/// For a new stack whose Python part the walk just filed: files its code
/// objects' prints under `stack_id` in `PY_STACK_PRINTS` (see
/// `profiler_common::python`). False if they could not be filed: the stack
/// must not be either, or user space would name its frames unchecked.
#[inline(never)]
pub fn file_prints(stack_id: u64) -> bool {
    let Some(scratch) = PY_SCRATCH.get_ptr(0) else {
        return false;
    };
    // SAFETY: this CPU's scratch, ours under the stack scratch claim.
    let scratch = unsafe { &*scratch };
    // By reference: the prints copied onto the 512-byte BPF stack won't fit.
    let prints = &scratch.prints;
    scratch.printed == 0 || PY_STACK_PRINTS.insert(stack_id, prints, 0).is_ok()
}

/// The print of the code object at `code` (see `py_code_print`), into the
/// scratch's prints; the frame before ran the same code (recursion), its
/// print is taken again without a read.
#[inline(always)]
fn print_code(cfg: &PyProcConfig, w: &mut PyScratch, code: u64) {
    let printed = w.printed as usize;
    if printed >= MAX_PYTHON_FRAMES {
        return;
    }
    let print = if code == w.print_code {
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
                code as *const c_void,
            )
        };
        let print = if err != 0 || cfg.code_print.read == 0 {
            PY_NO_PRINT
        } else {
            print_with_name(cfg, w)
        };
        w.print_code = code;
        w.last_print = u64::from(print);
        print
    };
    w.prints.prints[printed] = print;
    w.prints.digest = py_prints_digest(w.prints.digest, print);
    w.printed = printed as u64 + 1;
}

/// The print of the code object read into `w.code`, its name read too;
/// [`PY_NO_PRINT`] if the name cannot be read.
#[inline(always)]
fn print_with_name(cfg: &PyProcConfig, w: &mut PyScratch) -> u32 {
    let print = &cfg.code_print;
    let name = w.code[usize::from(print.name_at) & (PY_CODE_PRINT_WORDS - 1)];
    let size = print.name_read(name);
    // A bound the verifier sees (`name_read` is at most 48 + 32 bytes).
    if size == 0 || size > PY_NAME_PRINT_WORDS as u32 * 8 {
        return PY_NO_PRINT;
    }
    // SAFETY: as for the code object's read, into the name's buffer.
    let err = unsafe {
        generated::bpf_probe_read_user(
            core::ptr::addr_of_mut!(w.name).cast(),
            size,
            name as *const c_void,
        )
    };
    if err != 0 {
        return PY_NO_PRINT;
    }
    py_code_print(&w.code, print, py_name_print(&w.name, print, size))
}

/// The current thread's innermost interpreter frame, if it has a thread
/// state with one.
#[inline(always)]
fn current_frame(cfg: &PyProcConfig, scratch: *mut PyScratch) -> Option<u64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = thread_id(cfg, pid_tgid)?;
    // SAFETY: copied out at once.
    let hint = unsafe { PY_THREADS.get(pid_tgid) }.copied();
    let holder_at = if cfg.tstate_cframe == PY_NO_FIELD {
        cfg.current_frame
    } else {
        cfg.tstate_cframe
    };
    if let Some(hint) = hint.filter(|hint| hint.tstate != 0) {
        // The common case: the thread's state as last found, checked by its
        // thread id, read at once with the field that leads to the frame
        // (unreadable or another thread's by now: looked for again below).
        // SAFETY: this CPU's scratch, ours under the stack scratch claim.
        let w = unsafe { &mut *scratch };
        if let Some((id, holder)) = read_two(w, hint.tstate, cfg.tstate_native_thread_id, holder_at)
            && id == tid
        {
            return frame_of(cfg, holder);
        }
    }
    let tstate = thread_state(cfg, scratch, pid_tgid, tid, hint)?;
    frame_of(cfg, read_word(tstate.wrapping_add(u64::from(holder_at)))?)
}

/// The frame from the thread state's field `holder_at` points to: the
/// frame itself (3.13+), or the `_PyCFrame` holding it.
#[inline(always)]
fn frame_of(cfg: &PyProcConfig, holder: u64) -> Option<u64> {
    let holder = plausible(holder)?;
    if cfg.tstate_cframe == PY_NO_FIELD {
        return Some(holder);
    }
    plausible(read_word(
        holder.wrapping_add(u64::from(cfg.current_frame)),
    )?)
}

/// The words at byte offsets `a` and `b` of the object at `at`, in one read
/// (into `PyScratch::block`, free before the frame walk) of what lies
/// between them: at most `PY_BLOCK_BYTES`, else garbage, never out of
/// bounds.
#[inline(always)]
fn read_two(w: &mut PyScratch, at: u64, a: u32, b: u32) -> Option<(u64, u64)> {
    let (a, b) = (u64::from(a & !7), u64::from(b & !7));
    let from = a.min(b);
    let len = 8 + ((a.max(b) - from) & (PY_BLOCK_BYTES - 8));
    // SAFETY: the helper writes at most `len` (≤ the buffer) bytes into this
    // CPU's buffer, ours under the scratch claim, and reports a fault
    // instead of taking it.
    let err = unsafe {
        generated::bpf_probe_read_user(
            core::ptr::addr_of_mut!(w.block).cast(),
            len as u32,
            at.wrapping_add(from) as *const c_void,
        )
    };
    if err != 0 {
        return None;
    }
    let word = |offset: u64| w.block[((offset - from) / 8) as usize & (PY_BLOCK_WORDS - 1)];
    Some((word(a), word(b)))
}

/// The current thread's `PyThreadState` when the hint is missing or stale:
/// by a bounded walk of the interpreter's thread list (a thread found
/// without one is not looked for again for a while).
#[inline(always)]
fn thread_state(
    cfg: &PyProcConfig,
    scratch: *mut PyScratch,
    pid_tgid: u64,
    tid: u64,
    hint: Option<PyThread>,
) -> Option<u64> {
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if hint.is_some_and(|hint| {
        hint.tstate == 0 && now.wrapping_sub(hint.checked_ns) < NO_THREAD_STATE_NS
    }) {
        return None;
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

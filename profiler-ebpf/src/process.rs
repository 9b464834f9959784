//! Process lifecycle: tell user space about exits and execs of the processes
//! we track (or of every process when profiling system-wide).

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use profiler_common::{
    DropReason, PROC_EVENT_EXEC, PROC_EVENT_EXIT, PROC_EVENT_FORK, PROC_EVENT_OOM, ProcEvent,
};

use crate::{
    maps::{
        FOLLOWED, PROC_EVENTS, PROCS, PY_PROCS, UNWIND_PROCS, follow_tree, report_all_execs,
        task_tgid_offset,
    },
    probes::count_drop,
};

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(_ctx: RawTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // Threads come and go; the process is gone when its leader exits.
    if tgid != tid {
        return 0;
    }
    // A followed process leaves the tree (its pid may be reused by anyone),
    // with the unwind entry its fork may have copied (user space may never
    // have known it).
    let followed = follow_tree() && FOLLOWED.remove(tgid).is_ok();
    if followed {
        let _ = UNWIND_PROCS.remove(tgid);
    }
    // Its Python entry may have come from its parent (a fork): gone with it.
    let _ = PY_PROCS.remove(tgid);
    if followed || PROCS.get_ptr(tgid).is_some() {
        send(tgid, PROC_EVENT_EXIT);
    }
    0
}

/// A process forked (or a thread was made: then nothing changes). With
/// `--pid`'s tree, the child of a followed process is followed from here
/// on, before it runs, so its first allocation is seen. A raw tracepoint
/// (`TP_PROTO(struct task_struct *parent, struct task_struct *child)`):
/// the child is not running yet, so its `tgid` is read from its task.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn sched_process_fork(ctx: RawTracePointContext) -> i32 {
    let offset = task_tgid_offset();
    if !follow_tree() || offset == 0 {
        return 0;
    }
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: only read.
    let Some(root) = (unsafe { FOLLOWED.get(parent) }).copied() else {
        return 0;
    };
    let task: u64 = ctx.arg(1);
    // SAFETY: the helper reads kernel memory and reports a fault instead of
    // taking it.
    let Ok(child) = (unsafe { bpf_probe_read_kernel((task + offset) as *const i32) }) else {
        return 0;
    };
    let child = child as u32;
    if child == parent {
        return 0; // a new thread of the same process
    }
    // Past the process cap (a fork bomb), the child is not followed: counted.
    if FOLLOWED
        .insert(child, root, u64::from(BPF_NOEXIST))
        .is_err()
    {
        count_drop(child, DropReason::ProcMapFull);
        return 0;
    }
    // The child maps what its parent did: walked with its parent's unwind
    // tables from its first sample, until user space writes its own.
    if let Some(tables) = UNWIND_PROCS.get_ptr(parent) {
        // By reference: the entry (kilobytes) would not fit the BPF stack.
        #[allow(clippy::needless_borrows_for_generic_args)]
        // SAFETY: a map value, valid for the whole program run; the update
        // copies it.
        let _ = UNWIND_PROCS.insert(child, unsafe { &*tables }, u64::from(BPF_NOEXIST));
    }
    // Its interpreter too, at the same addresses.
    if let Some(python) = PY_PROCS.get_ptr(parent) {
        // SAFETY: a map value, valid for the whole program run; copied.
        let config = unsafe { *python };
        let _ = PY_PROCS.insert(child, config, u64::from(BPF_NOEXIST));
    }
    let _ = PROC_EVENTS.output::<ProcEvent>(
        &ProcEvent {
            pid: child,
            kind: PROC_EVENT_FORK,
            parent,
            _pad: 0,
        },
        0,
    );
    0
}

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn sched_process_exec(_ctx: RawTracePointContext) -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let tracked = match PROCS.get_ptr_mut(tgid) {
        Some(proc) => {
            // SAFETY: map values stay valid for the whole program run.
            let proc = unsafe { &mut *proc };
            // A new image: its samples start a new generation; the old ones
            // are retired by user space.
            proc.generation = proc.generation.wrapping_add(1);
            proc.live_samples = 0;
            // The new image names itself at its first alloc event.
            proc.comm[0] = 0;
            true
        }
        None => false,
    };
    // SAFETY: only tested for presence.
    let followed = follow_tree() && unsafe { FOLLOWED.get(tgid) }.is_some();
    if followed {
        // The tables its fork may have copied would walk the new image wrong
        // (user space clears those it wrote at this event).
        let _ = UNWIND_PROCS.remove(tgid);
    }
    // The new image's interpreter, if any, is not the old one's.
    let _ = PY_PROCS.remove(tgid);
    if tracked || followed || report_all_execs() {
        send(tgid, PROC_EVENT_EXEC);
    }
    0
}

/// The OOM killer picked a victim: user space writes its final profile.
/// A raw tracepoint (no tracefs needed): its first argument is the
/// victim task (`TP_PROTO(struct task_struct *task, uid_t uid)`), a thread
/// of the process; the process is its `tgid`, at the offset user space
/// read from the kernel's BTF. The OOM killer may run on another task's
/// behalf, so the current task says nothing.
#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn oom_mark_victim(ctx: RawTracePointContext) -> i32 {
    let offset = task_tgid_offset();
    if offset == 0 {
        return 0; // not given: user space does not attach it
    }
    let task: u64 = ctx.arg(0);
    // SAFETY: the helper reads kernel memory and reports a fault instead of
    // taking it.
    let Ok(tgid) = (unsafe { bpf_probe_read_kernel((task + offset) as *const i32) }) else {
        return 0;
    };
    let pid = tgid as u32;
    if PROCS.get_ptr(pid).is_some() {
        send(pid, PROC_EVENT_OOM);
    }
    0
}

fn send(pid: u32, kind: u32) {
    // A full ring buffer only delays cleanup: user space also checks liveness.
    let _ = PROC_EVENTS.output::<ProcEvent>(
        &ProcEvent {
            pid,
            kind,
            parent: 0,
            _pad: 0,
        },
        0,
    );
}

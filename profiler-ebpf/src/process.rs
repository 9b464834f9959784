//! Process lifecycle: tell user space about exits and execs of the processes
//! we track (or of every process when profiling system-wide).

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};
use profiler_common::{PROC_EVENT_EXEC, PROC_EVENT_EXIT, PROC_EVENT_OOM, ProcEvent};

use crate::maps::{PROC_EVENTS, PROCS, report_all_execs};

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(_ctx: RawTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // Threads come and go; the process is gone when its leader exits.
    if tgid == tid && PROCS.get_ptr(tgid).is_some() {
        send(tgid, PROC_EVENT_EXIT);
    }
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
    if tracked || report_all_execs() {
        send(tgid, PROC_EVENT_EXEC);
    }
    0
}

/// `pid` in the `oom:mark_victim` record (its format file).
const MARK_VICTIM_PID: usize = 8;

/// The OOM killer picked a victim: user space writes its final profile. The
/// record names the victim task (the process's leader, or a thread of it:
/// only a leader is recognised).
#[tracepoint(category = "oom", name = "mark_victim")]
pub fn oom_mark_victim(ctx: TracePointContext) -> i32 {
    // SAFETY: a read at the field's offset in the tracepoint's record.
    let Ok(pid) = (unsafe { ctx.read_at::<i32>(MARK_VICTIM_PID) }) else {
        return 0;
    };
    let pid = pid as u32;
    if PROCS.get_ptr(pid).is_some() {
        send(pid, PROC_EVENT_OOM);
    }
    0
}

fn send(pid: u32, kind: u32) {
    // A full ring buffer only delays cleanup: user space also checks liveness.
    let _ = PROC_EVENTS.output::<ProcEvent>(&ProcEvent { pid, kind }, 0);
}

//! Evaluates a USDT argument description against the probe's registers.

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{bpf_probe_read_kernel, bpf_probe_read_user},
    programs::ProbeContext,
};
use profiler_common::{UsdtArg, UsdtArgKind};

const LAST_REGISTER: u16 = (size_of::<pt_regs>() - 8) as u16;

/// Reads one argument of a probe hit, or `None` if it is unreadable.
#[inline(always)]
pub fn read_arg(ctx: &ProbeContext, arg: &UsdtArg) -> Option<u64> {
    let kind = arg.kind;
    if kind == UsdtArgKind::Const as u8 {
        return Some(arg.normalize(arg.value as u64));
    }
    if kind != UsdtArgKind::Reg as u8 && kind != UsdtArgKind::RegDeref as u8 {
        return None;
    }
    if arg.reg_offset > LAST_REGISTER {
        return None;
    }
    // As libbpf's usdt.bpf.h: the register by its offset in pt_regs, read
    // through the helper (a variable-offset ctx load would not verify).
    let slot = (ctx.regs as *const u8).wrapping_add(arg.reg_offset as usize);
    // SAFETY: the helper copies from kernel memory and reports a fault
    // instead of taking it; the offset stays inside pt_regs.
    let mut raw = unsafe { bpf_probe_read_kernel(slot.cast::<u64>()) }.ok()?;
    if kind == UsdtArgKind::RegDeref as u8 {
        let addr = raw.wrapping_add(arg.value as u64);
        // SAFETY: as above, for user memory.
        raw = unsafe { bpf_probe_read_user(addr as *const u64) }.ok()?;
    }
    Some(arg.normalize(raw))
}

//! Evaluates a USDT argument description against the probe's registers.

use core::mem::offset_of;

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
    // SAFETY: the context of a uprobe is its pt_regs; constant-offset reads.
    let regs = unsafe { &*ctx.regs };
    // The argument registers of the calling convention (every argument of
    // allocprof's allocator and of the contract's kit) as constant-offset
    // context loads: the helper call below costs ~30 ns a read.
    let off = arg.reg_offset as usize;
    let mut raw = if off == offset_of!(pt_regs, rdi) {
        regs.rdi
    } else if off == offset_of!(pt_regs, rsi) {
        regs.rsi
    } else if off == offset_of!(pt_regs, rdx) {
        regs.rdx
    } else {
        // As libbpf's usdt.bpf.h: the register by its offset in pt_regs,
        // read through the helper (a variable-offset ctx load would not
        // verify).
        let slot = (ctx.regs as *const u8).wrapping_add(off);
        // SAFETY: the helper copies from kernel memory and reports a fault
        // instead of taking it; the offset stays inside pt_regs.
        unsafe { bpf_probe_read_kernel(slot.cast::<u64>()) }.ok()?
    };
    if kind == UsdtArgKind::RegDeref as u8 {
        let addr = raw.wrapping_add(arg.value as u64);
        // SAFETY: as above, for user memory.
        raw = unsafe { bpf_probe_read_user(addr as *const u64) }.ok()?;
    }
    Some(arg.normalize(raw))
}

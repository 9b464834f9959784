//! Per-thread sampler state in initial-exec TLS.
//!
//! A malloc replacement must not use global-dynamic TLS: `__tls_get_addr`
//! may allocate (recursing into us) and costs a call on every allocation.
//! Stable Rust cannot pick a TLS model, so the variable is defined in
//! `global_asm!` in `.tbss` and addressed the initial-exec way
//! (`var@gottpoff(%rip)` + `%fs:0`); the linker marks a shared object using
//! it `DF_STATIC_TLS` and relaxes the access to local-exec in executables.
//! All-zero is the valid "not yet initialised" state.

use core::ptr::addr_of_mut;
use core::sync::atomic::{Ordering, compiler_fence};

use crate::rate;
use crate::sampler::{self, Sampler};

#[repr(C)]
pub(crate) struct ThreadState {
    /// `sampler.remaining` is at offset 0 (fast path).
    sampler: Sampler,
    /// Process id at seeding time: a mismatch means we are in a fork child
    /// and must reseed so parent and child do not sample in lockstep.
    pid: i32,
    /// 0 until this thread's first slow path has seeded `sampler`.
    initialised: u32,
    /// Set while the slow path runs, so a signal handler allocating in the
    /// middle of it neither samples nor corrupts the half-updated state.
    busy: u32,
}

const _: () = assert!(core::mem::size_of::<ThreadState>() <= TLS_BYTES);
const TLS_BYTES: usize = 64;

core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".balign 64",
    ".globl __allocprof_thread_state",
    ".hidden __allocprof_thread_state",
    ".type __allocprof_thread_state,@tls_object",
    ".size __allocprof_thread_state,64",
    "__allocprof_thread_state:",
    ".zero 64",
    ".popsection",
);

/// This thread's state. Two instructions, no call.
#[inline(always)]
fn state() -> *mut ThreadState {
    let p: *mut ThreadState;
    // SAFETY: loads the TLS offset of a TLS symbol defined above from the
    // GOT and adds the thread pointer (%fs:0 holds its own address on
    // x86_64 Linux). Both inputs are constant for the thread, hence `pure`.
    unsafe {
        core::arch::asm!(
            "mov {p}, qword ptr [rip + __allocprof_thread_state@GOTTPOFF]",
            "add {p}, qword ptr fs:[0]",
            p = out(reg) p,
            options(pure, readonly, nostack),
        );
    }
    p
}

/// Fast path: account `size` bytes against this thread's countdown.
/// `true` means call [`resolve`].
#[inline(always)]
pub(crate) fn countdown(size: usize) -> bool {
    let st = state();
    // SAFETY: `st` points at this thread's live TLS block; plain field
    // access through a raw pointer (no reference is formed, so a signal
    // handler doing the same in between is merely a lost update).
    unsafe {
        let remaining = addr_of_mut!((*st).sampler.remaining);
        let r = (*remaining).wrapping_sub(size as i64);
        *remaining = r;
        r < 0
    }
}

/// Slow path after [`countdown`] returned `true`. Returns the sample weight
/// in bytes, or 0 if the allocation is not sampled.
#[cold]
#[inline(never)]
pub(crate) fn resolve(size: usize) -> u64 {
    let st = state();
    // SAFETY: `st` is this thread's TLS block (see `countdown`); the busy
    // flag makes this section non-reentrant on the thread, and no other
    // thread ever touches it.
    unsafe {
        if (*st).busy != 0 {
            return 0;
        }
        (*st).busy = 1;
        compiler_fence(Ordering::SeqCst);

        let pid = libc::getpid();
        let sampled = if (*st).initialised == 0 || (*st).pid != pid {
            let rate = rate::current();
            (*st).sampler = Sampler::new(seed(st as usize, pid), rate);
            (*st).pid = pid;
            (*st).initialised = 1;
            (*st).sampler.should_sample(size)
        } else {
            (*st).sampler.resolve()
        };
        let weight = if sampled {
            sampler::weight(size as u64, (*st).sampler.rate())
        } else {
            0
        };

        compiler_fence(Ordering::SeqCst);
        (*st).busy = 0;
        // A 0-byte allocation is never sampled, so 0 is unambiguous.
        weight
    }
}

/// Per-thread, per-process seed: TLS address differs per thread, pid per
/// fork child, and the TSC per run.
fn seed(tls_addr: usize, pid: i32) -> u64 {
    // SAFETY: rdtsc is unprivileged on Linux x86_64 and has no side effects.
    let tsc = unsafe { core::arch::x86_64::_rdtsc() };
    let mut s = tsc ^ (tls_addr as u64).rotate_left(32) ^ (pid as u64);
    sampler::splitmix64(&mut s) ^ sampler::splitmix64(&mut s)
}

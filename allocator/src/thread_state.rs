//! Per-thread sampler state in initial-exec TLS.
//!
//! A malloc replacement must not use global-dynamic TLS: `__tls_get_addr`
//! may allocate (recursing into us) and costs a call on every allocation.
//! Stable Rust cannot pick a TLS model, so the variable is defined in
//! `global_asm!` in `.tbss` and addressed the initial-exec way
//! (`var@gottpoff(%rip)` + `%fs:0`); the linker marks a shared object using
//! it `DF_STATIC_TLS` and relaxes the access to local-exec in executables.
//! All-zero is the valid "not yet initialised" state.

use core::ptr::{self, addr_of_mut};
use core::sync::atomic::{AtomicI32, AtomicPtr, AtomicU8, Ordering, compiler_fence};

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
    /// While the slow path runs, the stack pointer it entered with (else
    /// 0), so a signal handler allocating in the middle of it neither
    /// samples nor corrupts the half-updated state; see [`enter`] for a
    /// holder that a handler's `siglongjmp` left.
    busy_sp: usize,
    /// The ledger's stack walks: where this thread's stack is.
    stack: StackCache,
}

/// The mapping that held this thread's stack pointer when the kernel was
/// last asked (PROCMAP_QUERY; `lo == hi == 0`: never, or not found), and
/// how many times it was asked (the ledger caps that).
#[repr(C)]
pub(crate) struct StackCache {
    pub(crate) parses: u32,
    pub(crate) lo: usize,
    pub(crate) hi: usize,
}

const _: () = assert!(size_of::<ThreadState>() <= TLS_BYTES);
// The `malloc` entry of `export_c_allocator!` subtracts from the i64 at
// `__allocprof_thread_state + 0` in assembly: that must be the countdown.
const _: () = assert!(
    core::mem::offset_of!(ThreadState, sampler) == 0
        && core::mem::offset_of!(Sampler, remaining) == 0
);
// 128: with the sampler's held distance the state no longer fits in 64.
const TLS_BYTES: usize = 128;

core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".balign 64",
    ".globl __allocprof_thread_state",
    ".hidden __allocprof_thread_state",
    ".type __allocprof_thread_state,@tls_object",
    ".size __allocprof_thread_state,128",
    "__allocprof_thread_state:",
    ".zero 128",
    ".popsection",
);

/// Runs `f` on this thread's stack cache with the slow path marked busy,
/// so that an allocation inside `f` (a signal handler's, the unwinder's)
/// is not sampled. `None` (and `f` not run) if the slow path is already
/// busy on this thread. `f` must not panic.
pub(crate) fn exclusive<R>(f: impl FnOnce(&mut StackCache) -> R) -> Option<R> {
    let st = state();
    // SAFETY: `st` is this thread's TLS block (see `countdown`); the busy
    // flag makes this section non-reentrant on the thread, and no other
    // thread ever touches it.
    unsafe {
        if !enter(st) {
            return None;
        }
        let r = f(&mut *addr_of_mut!((*st).stack));
        leave(st);
        Some(r)
    }
}

/// Marks this thread's slow path busy; `false` if it already is, by a
/// holder still on the stack.
///
/// A signal handler that interrupts the slow path runs below the
/// interrupted stack pointer (the kernel puts its frame under the red
/// zone) or on the alternate signal stack, and so below the holder's entry
/// stack pointer. If it leaves with `siglongjmp` (as a timeout handler
/// may), the holder never clears the flag; a later slow path at or above
/// the holder's entry stack pointer, not on the alternate signal stack,
/// proves the holder's frames are gone and takes over. (A thread whose
/// every later allocation runs deeper than the abandoned one stays
/// unsampled: the price of never mistaking an interrupted holder for a
/// gone one.)
///
/// # Safety
/// `st` is this thread's state.
#[inline(always)]
unsafe fn enter(st: *mut ThreadState) -> bool {
    let sp = stack_pointer();
    // SAFETY: the caller's contract.
    let holder = unsafe { (*st).busy_sp };
    if holder != 0 && (sp < holder || on_alternate_stack()) {
        return false;
    }
    // SAFETY: as above.
    unsafe { (*st).busy_sp = sp.max(1) };
    compiler_fence(Ordering::SeqCst);
    true
}

/// # Safety
/// `st` is this thread's state, entered with [`enter`].
#[inline(always)]
unsafe fn leave(st: *mut ThreadState) {
    compiler_fence(Ordering::SeqCst);
    // SAFETY: the caller's contract.
    unsafe { (*st).busy_sp = 0 };
}

#[inline(always)]
fn stack_pointer() -> usize {
    let sp: usize;
    // SAFETY: copies a register.
    unsafe {
        core::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags));
    }
    sp
}

/// Whether this thread runs on its alternate signal stack (one raw
/// syscall; only asked when the slow path is found busy). If it cannot
/// tell, it says yes: the holder is then not taken over.
#[cold]
fn on_alternate_stack() -> bool {
    let mut ss = libc::stack_t {
        ss_sp: ptr::null_mut(),
        ss_flags: 0,
        ss_size: 0,
    };
    // SAFETY: sigaltstack with no new stack only writes the current one
    // into `ss`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sigaltstack,
            ptr::null::<libc::stack_t>(),
            &raw mut ss,
        )
    };
    r != 0 || ss.ss_flags & libc::SS_ONSTACK != 0
}

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
/// errno is preserved: seeding may make syscalls (mmap, madvise) that fail.
#[cold]
#[inline(never)]
pub(crate) fn resolve(size: usize) -> u64 {
    crate::errno::preserving(|| resolve_inner(size))
}

fn resolve_inner(size: usize) -> u64 {
    let st = state();
    // SAFETY: `st` is this thread's TLS block (see `countdown`); the busy
    // flag makes this section non-reentrant on the thread, and no other
    // thread ever touches it.
    unsafe {
        if !enter(st) {
            return 0;
        }

        let pid = current_pid();
        let sampled = if (*st).initialised == 0 || (*st).pid != pid {
            if (*st).initialised != 0 {
                // A fork child (also one whose fork bypassed the atfork
                // handlers): its budget's window and count start afresh.
                crate::budget::forget_in_fork_child(pid as u32);
            }
            let rate = rate::current();
            (*st).sampler = Sampler::new(seed(st as usize, pid), rate);
            (*st).pid = pid;
            (*st).initialised = 1;
            (*st).sampler.should_sample(size)
        } else {
            (*st).sampler.resolve()
        };
        let weight = if sampled {
            let w = sampler::weight(size as u64, (*st).sampler.rate());
            // The budget may drop it (0) or count it k times.
            crate::budget::apply(w, (*st).sampler.draw())
        } else {
            0
        };

        leave(st);
        // A 0-byte allocation is never sampled, so 0 is unambiguous.
        weight
    }
}

/// In a fork child the forking thread's countdown is its parent's, the
/// same in every child forked from that state: without this, siblings
/// would take their first samples at the same byte (and the same RNG
/// would keep them in lockstep until their first slow path). Zeroing the
/// countdown sends the child's first allocation to the slow path, which
/// sees the new pid and draws a fresh gap from a fresh seed (unbiased: the
/// gap is memoryless). One store; the handler runs in the child only,
/// single-threaded, before `fork` returns there.
unsafe extern "C" fn rearm_in_fork_child() {
    let st = state();
    // SAFETY: `st` is this (the only) thread's TLS block; a plain store, as
    // on the fast path.
    unsafe { (*st).sampler.remaining = 0 };
    // A fresh budget window: relaxed stores and at most getpid, nothing
    // that can block.
    crate::budget::forget_in_fork_child(current_pid() as u32);
}

/// Registers [`rearm_in_fork_child`] at load time (registration may take
/// glibc's atfork lock and allocate: never from the slow path). Forks that
/// bypass the handlers (`_Fork`, a raw `clone`) still reseed on the
/// child's first slow path, by the pid check.
#[used]
#[unsafe(link_section = ".init_array")]
static REGISTER_FORK_HANDLER: extern "C" fn() = {
    extern "C" fn register() {
        // SAFETY: the handler is a plain function of this object; glibc's
        // `pthread_atfork` passes our `__dso_handle`, so `dlclose` of a
        // library holding this crate unregisters it.
        unsafe { libc::pthread_atfork(None, None, Some(rearm_in_fork_child)) };
    }
    register
};

/// The process id, cached in a `MADV_WIPEONFORK` page: the page reads as
/// zero in a fork child, so the cache notices forks without a `getpid`
/// syscall per slow path (which was half the cost of a sample). Lock-free:
/// the page is set up once, by whichever thread gets there first.
static PID_PAGE: AtomicPtr<AtomicI32> = AtomicPtr::new(ptr::null_mut());
static PID_PAGE_STATE: AtomicU8 = AtomicU8::new(PID_PAGE_UNTRIED);
const PID_PAGE_UNTRIED: u8 = 0;
const PID_PAGE_TRYING: u8 = 1;
const PID_PAGE_DONE: u8 = 2;

fn current_pid() -> i32 {
    let page = PID_PAGE.load(Ordering::Acquire);
    if !page.is_null() {
        // SAFETY: once published, the page stays mapped for the life of the
        // process (and of its fork children, where it reads as zero).
        let cached = unsafe { &*page };
        let pid = cached.load(Ordering::Relaxed);
        if pid != 0 {
            return pid;
        }
        // First slow path in a fork child: every thread computes the same
        // value, so racing stores are harmless.
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        cached.store(pid, Ordering::Relaxed);
        return pid;
    }
    // SAFETY: as above.
    let pid = unsafe { libc::getpid() };
    if PID_PAGE_STATE
        .compare_exchange(
            PID_PAGE_UNTRIED,
            PID_PAGE_TRYING,
            Ordering::Relaxed,
            Ordering::Relaxed,
        )
        .is_ok()
    {
        map_pid_page(pid);
        PID_PAGE_STATE.store(PID_PAGE_DONE, Ordering::Relaxed);
    }
    pid
}

/// Byte `index` (< 64) of a per-process state area in the pid page, after
/// the pid: like the pid it reads as zero in a fork child. `None` while the
/// page is not mapped (before the first slow path, or without
/// `MADV_WIPEONFORK`).
pub(crate) fn fork_local_byte(index: usize) -> Option<&'static AtomicU8> {
    debug_assert!(index < 64);
    let page = PID_PAGE.load(Ordering::Acquire);
    if page.is_null() {
        return None;
    }
    // SAFETY: the published page is 4096 bytes, mapped for the life of the
    // process (and of its fork children); bytes 64..128 are used only here.
    Some(unsafe { &*page.cast::<u8>().add(64 + index).cast::<AtomicU8>() })
}

/// Map and publish the pid page; on a kernel without `MADV_WIPEONFORK`
/// (< 4.14) leave it unpublished, so every slow path calls getpid.
fn map_pid_page(pid: i32) {
    // SAFETY: fresh anonymous page at a kernel-chosen address.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return;
    }
    // SAFETY: our own page; madvise only changes its fork behaviour.
    if unsafe { libc::madvise(p, 4096, libc::MADV_WIPEONFORK) } != 0 {
        // SAFETY: releases the page mapped above, never published.
        unsafe { libc::munmap(p, 4096) };
        return;
    }
    let cached = p.cast::<AtomicI32>();
    // SAFETY: the page is ours, zeroed, suitably aligned for an AtomicI32.
    unsafe { (*cached).store(pid, Ordering::Relaxed) };
    PID_PAGE.store(cached, Ordering::Release);
}

/// Per-thread, per-process seed: TLS address differs per thread, pid per
/// fork child, and the TSC per run.
fn seed(tls_addr: usize, pid: i32) -> u64 {
    // SAFETY: rdtsc is unprivileged on Linux x86_64 and has no side effects.
    let tsc = unsafe { core::arch::x86_64::_rdtsc() };
    let mut s = tsc ^ (tls_addr as u64).rotate_left(32) ^ (pid as u64);
    sampler::splitmix64(&mut s) ^ sampler::splitmix64(&mut s)
}

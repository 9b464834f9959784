//! The ledger's stacks: taken in-process on the sampling slow path, by
//! frame pointers inside this thread's stack mapping, or by the ledger's
//! own CFI unwinder ([`super::cfi`]) where the chain does not end cleanly.

use core::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};

use profiler_common::ledger::{FLAG_TRUNCATED, FLAG_UNWOUND, FRAMES, MAX_ADDRESS};

use super::Captured;
use super::cfi::{self, End, Mem};
use crate::thread_state::StackCache;

// Why this cannot crash, recurse or deadlock the process:
//
// * The stack is read only inside the mapping that held this thread's
//   stack pointer, asked of the kernel with the PROCMAP_QUERY ioctl on
//   /proc/self/maps (Linux >= 6.11: one VMA lookup, O(log n) in the
//   mappings; raw syscalls, no allocation, no cancellation point), cached
//   per thread and asked again when the stack pointer leaves it, at most
//   MAX_QUERIES times per thread. Without PROCMAP_QUERY the mapping is not
//   known (reading all of /proc/self/maps would cost the thread's first
//   sample time in proportion to the mappings): the stack is then only the
//   allocator's own frames, which are mapped because they are running, and
//   malloc's caller, cut short (`FLAG_TRUNCATED`).
// * Frame pointers: each step checks the frame is 8-aligned, strictly above
//   the previous one and its two words below the mapping's end, so every
//   load is from mapped stack memory and the walk ends. A chain that ends
//   in a null frame pointer (as `_start` and glibc's thread start leave it)
//   or fills FRAMES is kept; any other end means code without frame
//   pointers, and the CFI unwinder takes the stack instead. Residual risk:
//   a thread that runs on stacks it unmaps and remaps (coroutines) could,
//   after a stale cache hit, read past its current mapping; a thread's own
//   stack is never unmapped while it runs.
// * The CFI unwinder ([`cfi`]) takes no lock and calls nothing that does:
//   never libgcc (`_Unwind_Backtrace` takes libgcc's `object_mutex`, which
//   this very thread may hold when libgcc mallocs inside
//   `_Unwind_Find_FDE` for frames registered with `__register_frame`),
//   never `dl_iterate_phdr` (the loader's lock); only glibc's lock-free
//   `_dl_find_object`. Its reads stay inside the object's readable segment
//   and the stack mapping.
// * Recursion: the capture runs under the thread's slow-path `busy` flag
//   (`thread_state::exclusive`), so an allocation made inside it (a signal
//   handler's) is never sampled and never captures again; the capture
//   itself never allocates.

/// Stack-mapping queries per thread: beyond, the stack is cut short.
const MAX_QUERIES: u32 = 8;

/// The unwinder's budget, ~1% of one core over time: each walk books this
/// many times as long as it took on a timeline (`UNWIND_BOOKED_NS`), and a
/// walk may start while that timeline is at most `UNWIND_BURST_NS` ahead of
/// the clock (a generic cell rate algorithm). The CFI walk costs ≈ 700
/// instructions a frame through call sites seen before (its row cache,
/// `cfi::cache`; ≈ 2,800 decoding each FDE, which was about what libgcc's
/// `_Unwind_Backtrace` cost): at the default rate a program makes a few
/// thousand samples a second and each gets its whole stack, but a churn
/// of small blocks makes 10^5 and would spend a tenth of its time
/// unwinding. Past the budget a stack is cut after malloc's
/// caller (`FLAG_TRUNCATED`), which frame pointers still give.
const UNWIND_COST_FACTOR: u64 = 100;
/// How far the booked timeline may run ahead: after a quiet second, ~10 ms
/// of walks (several thousand stacks) go through at once, so the burst that
/// builds a program's long-lived heap at start-up keeps whole stacks. Over
/// any span T, unwinding takes at most (T + this) / UNWIND_COST_FACTOR.
const UNWIND_BURST_NS: u64 = 1_000_000_000;
/// The unwinder's booked timeline (CLOCK_MONOTONIC ns), for all threads.
static UNWIND_BOOKED_NS: AtomicU64 = AtomicU64::new(0);

pub(super) fn take_stack(c: &mut Captured, cache: &mut StackCache) {
    let (sp, fp) = registers();
    learn_text();
    if !(cache.lo <= sp && sp < cache.hi) && cache.parses < MAX_QUERIES {
        cache.parses += 1;
        let (lo, hi) = stack_mapping(sp).unwrap_or((0, 0));
        cache.lo = lo;
        cache.hi = hi;
    }
    if !(cache.lo <= sp && sp < cache.hi) {
        // Where the stack ends is unknown: only what is sure to be mapped.
        c.n = own_frames(fp, &mut c.frames);
        c.flags |= FLAG_TRUNCATED;
        return;
    }
    let walked = match walk_frame_pointers(fp, sp, cache.hi, &mut c.frames) {
        Walk::Whole(n, truncated) => {
            c.n = n;
            if truncated {
                c.flags |= FLAG_TRUNCATED;
            }
            return;
        }
        Walk::Broken(n) => n,
    };
    let start = crate::clock::monotonic_ns();
    let booked = UNWIND_BOOKED_NS.load(Ordering::Relaxed);
    if walked > 0 && cfi::available() && start.saturating_add(UNWIND_BURST_NS) >= booked {
        // This function's frame (checked by the frame-pointer walk, which
        // read its two words): its return address, its caller's stack
        // pointer and rbp start the walk.
        // SAFETY: [fp, fp + 16) lies in this thread's stack mapping (the
        // walk above took a frame from it).
        let saved_rbp = unsafe { core::ptr::read_volatile(fp as *const usize) };
        let stack = Mem {
            lo: cache.lo,
            hi: cache.hi,
        };
        let (n, end) = cfi::walk(
            c.frames[0] as usize,
            fp + 16,
            saved_rbp,
            stack,
            &mut c.frames,
        );
        let end_ns = crate::clock::monotonic_ns();
        let cost = end_ns
            .saturating_sub(start)
            .saturating_mul(UNWIND_COST_FACTOR);
        // Relaxed and racy on purpose: threads unwinding at once may book
        // one walk instead of two, a bounded slip of the budget, no lock.
        UNWIND_BOOKED_NS.fetch_max(booked.max(start).saturating_add(cost), Ordering::Relaxed);
        c.n = n;
        c.flags |= FLAG_UNWOUND
            | if end == End::Bottom {
                0
            } else {
                FLAG_TRUNCATED
            };
        return;
    }
    // Over budget (or no unwinder): the allocator's frames and malloc's
    // caller (the first frame outside them), which the allocator's own
    // frame pointers give.
    c.n = cut_after_caller(&c.frames[..walked]);
    c.flags |= FLAG_TRUNCATED;
}

/// How many of `frames` (a frame-pointer walk's) to keep: the allocator's
/// own and the first one outside them, malloc's caller.
fn cut_after_caller(frames: &[u64]) -> usize {
    frames
        .iter()
        .position(|&f| !in_range(&OWN_TEXT, f as usize))
        .map_or(frames.len(), |i| i + 1)
}

/// The frames that are sure to be mapped without knowing the stack's
/// mapping: the frame at `fp` is the caller's (running, hence mapped); the
/// allocator's code keeps frame pointers, so while a return address lies
/// in its text the saved frame pointer is the next allocator frame. The
/// first return address outside it (malloc's caller) ends the walk. Without
/// knowing the allocator's text, nothing.
fn own_frames(mut fp: usize, out: &mut [u64; FRAMES]) -> usize {
    if OWN_TEXT[1].load(Ordering::Relaxed) == 0 {
        return 0;
    }
    let mut n = 0;
    while n < FRAMES && fp.is_multiple_of(8) && fp != 0 {
        // SAFETY: `fp` is a frame of the allocator's running code (the
        // first is this thread's current frame; each next one was saved by
        // an allocator function, which keeps frame pointers), so its two
        // words are mapped stack.
        let (next, ret) = unsafe {
            (
                core::ptr::read_volatile(fp as *const usize),
                core::ptr::read_volatile((fp + 8) as *const usize),
            )
        };
        out[n] = ret as u64;
        n += 1;
        if !in_range(&OWN_TEXT, ret) || next <= fp {
            break;
        }
        fp = next;
    }
    n
}

/// How a frame-pointer walk ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Walk {
    /// At the bottom of the stack, or after FRAMES frames (`true`: cut).
    Whole(usize, bool),
    /// The chain broke (code without frame pointers) after this many
    /// frames, which are in the output.
    Broken(usize),
}

/// This function's stack and frame pointers. Inlined, so the frame
/// pointer is that of its caller's frame (every function of this crate has
/// one: `-C force-frame-pointers=yes`; if not, the walk fails its checks).
#[inline(always)]
fn registers() -> (usize, usize) {
    let (sp, fp): (usize, usize);
    // SAFETY: copies two registers; touches no memory.
    unsafe {
        core::arch::asm!(
            "mov {sp}, rsp",
            "mov {fp}, rbp",
            sp = out(reg) sp,
            fp = out(reg) fp,
            options(nomem, nostack, preserves_flags),
        );
    }
    (sp, fp)
}

/// Follows the frame-pointer chain from `fp` (at or above `sp`), reading
/// only `[sp, hi)`: whole if it ends at the bottom of the stack (see
/// [`bottom_of_stack`]) or after FRAMES frames, broken anywhere else.
pub(super) fn walk_frame_pointers(
    mut fp: usize,
    sp: usize,
    hi: usize,
    out: &mut [u64; FRAMES],
) -> Walk {
    let end = |out: &[u64]| {
        if bottom_of_stack(out) {
            Walk::Whole(out.len(), false)
        } else {
            Walk::Broken(out.len())
        }
    };
    let mut low = sp;
    let mut n = 0;
    loop {
        // A null frame pointer is where `_start` and glibc's thread start
        // leave the chain, but code without frame pointers may hold 0 in
        // %rbp too: only an end in glibc after the program's frames is the
        // bottom (Debian's python3 had one-frame stacks otherwise).
        if fp == 0 {
            return end(&out[..n]);
        }
        if n == FRAMES {
            return Walk::Whole(n, true);
        }
        if !fp.is_multiple_of(8) || fp < low || fp.checked_add(16).is_none_or(|e| e > hi) {
            return end(&out[..n]);
        }
        // SAFETY: [fp, fp + 16) lies in [sp, hi), this thread's live stack
        // mapping (checked above); aligned word loads.
        let (next, ret) = unsafe {
            (
                core::ptr::read_volatile(fp as *const usize),
                core::ptr::read_volatile((fp + 8) as *const usize),
            )
        };
        if ret == 0 || ret as u64 >= MAX_ADDRESS {
            return end(&out[..n]);
        }
        out[n] = ret as u64;
        n += 1;
        low = fp + 16;
        fp = next;
    }
}

/// The text of glibc and of this allocator, learnt once ([`learn_text`];
/// never unmapped: libc is never unloaded, nor is the malloc in use).
/// 0..0 until found.
static LIBC_TEXT: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
static OWN_TEXT: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
static TEXT_LEARNT: AtomicU8 = AtomicU8::new(0);

fn in_range(r: &[AtomicUsize; 2], a: usize) -> bool {
    r[0].load(Ordering::Relaxed) <= a && a < r[1].load(Ordering::Relaxed)
}

/// Whether a chain that broke after `frames` ended where every stack
/// begins: in glibc (its process and thread start, built without frame
/// pointers, leave garbage in the frame pointer on Debian 12's glibc 2.36:
/// main's saved one is not a stack address), after a frame of the program
/// itself. That is as far as a frame-pointer walk goes (the kernel's
/// stops there too). A chain that breaks anywhere else, or in libc right
/// after the allocator's own frames (a libc function that uses %rbp
/// called malloc), met code without frame pointers.
fn bottom_of_stack(frames: &[u64]) -> bool {
    let Some((&last, rest)) = frames.split_last() else {
        return false;
    };
    in_range(&LIBC_TEXT, last as usize)
        && rest.iter().any(|&f| {
            let f = f as usize;
            !in_range(&LIBC_TEXT, f) && !in_range(&OWN_TEXT, f)
        })
}

/// Learns [`LIBC_TEXT`] and [`OWN_TEXT`] once per process: the
/// executable mappings holding `getpid` and this function (PROCMAP_QUERY),
/// else their objects' ranges (`_dl_find_object`). Threads racing here
/// store the same values.
pub(super) fn learn_text() {
    if TEXT_LEARNT.load(Ordering::Relaxed) != 0 {
        return;
    }
    let libc_at = libc::getpid as *const () as usize;
    let own_at = learn_text as *const () as usize;
    for (range, at) in [(&LIBC_TEXT, libc_at), (&OWN_TEXT, own_at)] {
        if let Some((lo, hi)) = mapping_of(at).or_else(|| cfi::object_of(at)) {
            range[0].store(lo, Ordering::Relaxed);
            range[1].store(hi, Ordering::Relaxed);
        }
    }
    TEXT_LEARNT.store(1, Ordering::Relaxed);
}

/// [lo, hi) of the mapping that holds `sp` (see [`mapping_of`]).
pub(super) fn stack_mapping(sp: usize) -> Option<(usize, usize)> {
    mapping_of(sp)
}

/// `struct procmap_query` (<linux/fs.h>, Linux 6.11).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: u64 =
    (3 << 30) | ((size_of::<ProcmapQuery>() as u64) << 16) | (0x66 << 8) | 17;

/// Whether PROCMAP_QUERY may work here: set to 0 the first time the kernel
/// says it does not know it (ENOTTY, EINVAL), so older kernels pay one
/// failed query per process, not per thread.
static QUERY_WORKS: AtomicU8 = AtomicU8::new(1);

/// [lo, hi) of the mapping holding `addr`, by one PROCMAP_QUERY ioctl on
/// /proc/self/maps (open, ioctl, close: raw syscalls, no cancellation
/// point, no allocation; the kernel looks the VMA up in its tree).
/// `None` where the kernel lacks the ioctl (Linux < 6.11) or /proc is not
/// mounted: never a read of the whole maps file.
pub(super) fn mapping_of(addr: usize) -> Option<(usize, usize)> {
    if QUERY_WORKS.load(Ordering::Relaxed) == 0 {
        return None;
    }
    #[cfg(test)]
    if tests_support::NO_QUERY.get() {
        return None;
    }
    // SAFETY: raw openat of a NUL-terminated path (syscall(): not a
    // cancellation point, unlike open()).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut q = ProcmapQuery {
        size: size_of::<ProcmapQuery>() as u64,
        query_addr: addr as u64,
        ..Default::default()
    };
    // SAFETY: the ioctl writes only into `q`, whose size it is told (no
    // name or build-id buffer: both sizes 0).
    let r = unsafe { libc::syscall(libc::SYS_ioctl, fd, PROCMAP_QUERY, &raw mut q) };
    if r < 0 {
        // SAFETY: errno's address is this thread's, always valid.
        let e = unsafe { *libc::__errno_location() };
        if e == libc::ENOTTY || e == libc::EINVAL {
            QUERY_WORKS.store(0, Ordering::Relaxed);
        }
    }
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    (r == 0 && q.vma_start < q.vma_end).then_some((q.vma_start as usize, q.vma_end as usize))
}

#[cfg(test)]
pub(super) mod tests_support {
    std::thread_local! {
        /// Makes [`super::mapping_of`] act, on this thread, as on a kernel
        /// without PROCMAP_QUERY.
        pub(crate) static NO_QUERY: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
    }
}

//! The ledger's stacks: taken in-process on the sampling slow path, by
//! frame pointers inside this thread's stack mapping, or by the CFI
//! unwinder where the chain does not end cleanly.

use core::ffi::c_void;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use profiler_common::ledger::{FLAG_TRUNCATED, FLAG_UNWOUND, FRAMES, MAX_ADDRESS};

use super::Captured;
use crate::thread_state::StackCache;

// Why this cannot crash, recurse or deadlock the process:
//
// * Frame pointers are followed only inside the mapping that held this
//   thread's stack pointer when /proc/self/maps was read (cached per thread,
//   re-read when the stack pointer leaves it, at most MAX_PARSES times per
//   thread). Each step checks the frame is 8-aligned, strictly above the
//   previous one and its two words below the mapping's end, so every load is
//   from mapped stack memory and the walk ends. A chain that ends in a null
//   frame pointer (as `_start` and glibc's thread start leave it) or fills
//   FRAMES is kept; any other end means code without frame pointers, and the
//   CFI unwinder takes the stack instead. /proc/self/maps is read with raw
//   syscalls (no allocation, no cancellation point) into a stack buffer.
//   Residual risk: a thread that runs on stacks it unmaps and remaps
//   (coroutines) could, after a stale cache hit, read past its current
//   mapping; a thread's own stack is never unmapped while it runs.
// * `_Unwind_Backtrace` (libgcc_s, already linked by Rust's std) reads only
//   what the unwind tables describe, as a C++ throw does. It finds them with
//   glibc's `_dl_find_object` (glibc >= 2.35 with libgcc >= 12, as on Debian
//   12: checked with `nm -D libgcc_s.so.1`), which takes no lock; older
//   pairs use `dl_iterate_phdr`, which takes the loader's recursive lock: the
//   same thread re-entering is fine, and our slow path holds no lock of its
//   own, so a deadlock needs another thread holding the loader lock (inside
//   dlopen/dlclose or a dl_iterate_phdr callback) to wait for a lock the
//   allocating thread holds: the residual risk on old systems, the same as
//   any unwinding malloc profiler's (jemalloc's prof, tcmalloc's). libgcc's
//   list of frames registered with `__register_frame` (JIT code) is guarded
//   by a mutex in libgcc 12, taken only when such frames exist: a signal
//   handler that mallocs while its thread unwinds those would deadlock.
// * Recursion: the capture runs under the thread's slow-path `busy` flag
//   (`thread_state::exclusive`), so an allocation made inside it (libgcc
//   initialising a registered object, a signal handler) is never sampled
//   and never captures again.

/// Re-reads of /proc/self/maps per thread: beyond, the unwinder.
const MAX_PARSES: u32 = 8;

/// The unwinder's budget, ~1% of one core over time: each walk books this
/// many times as long as it took on a timeline (`UNWIND_BOOKED_NS`), and a
/// walk may start while that timeline is at most `UNWIND_BURST_NS` ahead of
/// the clock (a generic cell rate algorithm). `_Unwind_Backtrace` costs
/// ~3 µs a stack (libgcc interprets the CFI of every frame): at the default
/// rate a program makes a few thousand samples a second and each gets its
/// whole stack, but a churn of small blocks makes 10^5 and would spend a
/// third of its time unwinding. Past the budget a stack is cut after
/// malloc's caller (`FLAG_TRUNCATED`), which frame pointers still give.
const UNWIND_COST_FACTOR: u64 = 100;
/// How far the booked timeline may run ahead: after a quiet second, ~10 ms
/// of walks (a few thousand stacks) go through at once, so the burst that
/// builds a program's long-lived heap at start-up keeps whole stacks. Over
/// any span T, unwinding takes at most (T + this) / UNWIND_COST_FACTOR.
const UNWIND_BURST_NS: u64 = 1_000_000_000;
/// The unwinder's booked timeline (CLOCK_MONOTONIC ns), for all threads.
static UNWIND_BOOKED_NS: AtomicU64 = AtomicU64::new(0);

pub(super) fn take_stack(c: &mut Captured, cache: &mut StackCache) {
    let (sp, fp) = registers();
    if !(cache.lo <= sp && sp < cache.hi) && cache.parses < MAX_PARSES {
        cache.parses += 1;
        let (lo, hi) = stack_mapping(sp).unwrap_or((0, 0));
        cache.lo = lo;
        cache.hi = hi;
    }
    let mut walked = 0;
    if cache.lo <= sp && sp < cache.hi {
        match walk_frame_pointers(fp, sp, cache.hi, &mut c.frames) {
            Walk::Whole(n, truncated) => {
                c.n = n;
                if truncated {
                    c.flags |= FLAG_TRUNCATED;
                }
                return;
            }
            Walk::Broken(n) => walked = n,
        }
    }
    let start = crate::clock::monotonic_ns();
    let booked = UNWIND_BOOKED_NS.load(Ordering::Relaxed);
    if start.saturating_add(UNWIND_BURST_NS) >= booked {
        let (n, truncated) = unwind(&mut c.frames);
        let end = crate::clock::monotonic_ns();
        let cost = end.saturating_sub(start).saturating_mul(UNWIND_COST_FACTOR);
        // Relaxed and racy on purpose: threads unwinding at once may book
        // one walk instead of two, a bounded slip of the budget, no lock.
        UNWIND_BOOKED_NS.fetch_max(booked.max(start).saturating_add(cost), Ordering::Relaxed);
        c.n = n;
        c.flags |= FLAG_UNWOUND | if truncated { FLAG_TRUNCATED } else { 0 };
        return;
    }
    // Over budget: the allocator's frames and malloc's caller (the first
    // frame outside them), which the allocator's own frame pointers give.
    c.n = c.frames[..walked]
        .iter()
        .position(|&f| !in_range(&OWN_TEXT, f as usize))
        .map_or(walked, |i| i + 1);
    c.flags |= FLAG_TRUNCATED;
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

/// The text of glibc and of this allocator, found by the first read of
/// /proc/self/maps (never unmapped: libc is never unloaded, nor is the
/// malloc in use). 0..0 until found.
static LIBC_TEXT: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
static OWN_TEXT: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

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

/// [lo, hi) of the mapping that holds `sp`, from /proc/self/maps (which
/// also gives [`LIBC_TEXT`] and [`OWN_TEXT`]).
pub(super) fn stack_mapping(sp: usize) -> Option<(usize, usize)> {
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
    let mut parser = MapsParser::new(sp, take_stack as *const () as usize);
    let mut buf = [0u8; 1024];
    loop {
        // SAFETY: reads at most buf.len() bytes into our buffer.
        let n = unsafe { libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), buf.len()) };
        if n <= 0 {
            break;
        }
        parser.feed(&buf[..n as usize]);
    }
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    for (range, found) in [(&LIBC_TEXT, parser.libc), (&OWN_TEXT, parser.own)] {
        if let Some((lo, hi)) = found {
            range[0].store(lo, Ordering::Relaxed);
            range[1].store(hi, Ordering::Relaxed);
        }
    }
    parser.stack
}

/// Streams /proc/self/maps lines (`lo-hi perms offset dev inode path`):
/// the mapping that holds `sp`, the executable mapping of libc.so.6 and
/// the one holding `own` (an address of this allocator's text). Chunk
/// boundaries may fall anywhere.
pub(crate) struct MapsParser {
    sp: usize,
    own_addr: usize,
    field: u8,
    lo: usize,
    hi: usize,
    exec: bool,
    /// The line's last 16 bytes (its path's end).
    tail: u128,
    pub(crate) stack: Option<(usize, usize)>,
    pub(crate) libc: Option<(usize, usize)>,
    pub(crate) own: Option<(usize, usize)>,
}

impl MapsParser {
    pub(crate) fn new(sp: usize, own_addr: usize) -> Self {
        MapsParser {
            sp,
            own_addr,
            field: 0,
            lo: 0,
            hi: 0,
            exec: false,
            tail: 0,
            stack: None,
            libc: None,
            own: None,
        }
    }

    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        const LIBC: &[u8] = b"/libc.so.6";
        for &b in bytes {
            if b == b'\n' {
                let (lo, hi) = (self.lo, self.hi);
                if self.field >= 2 && lo < hi {
                    if lo <= self.sp && self.sp < hi {
                        self.stack = Some((lo, hi));
                    }
                    if self.exec && lo <= self.own_addr && self.own_addr < hi {
                        self.own = Some((lo, hi));
                    }
                    let tail = self.tail.to_be_bytes();
                    if self.exec && self.libc.is_none() && tail.ends_with(LIBC) {
                        self.libc = Some((lo, hi));
                    }
                }
                *self = MapsParser {
                    field: 0,
                    lo: 0,
                    hi: 0,
                    exec: false,
                    tail: 0,
                    ..*self
                };
                continue;
            }
            self.tail = (self.tail << 8) | u128::from(b);
            match (self.field, b) {
                (0, b'-') => self.field = 1,
                (1, b' ') => self.field = 2,
                (2, b' ') => self.field = 3,
                (2, b'x') => self.exec = true,
                (0 | 1, _) => match (b as char).to_digit(16) {
                    Some(d) if self.field == 0 => self.lo = self.lo.wrapping_shl(4) | d as usize,
                    Some(d) => self.hi = self.hi.wrapping_shl(4) | d as usize,
                    None => self.field = 9, // not a maps line: skipped
                },
                _ => {}
            }
        }
    }
}

#[link(name = "gcc_s")]
unsafe extern "C" {
    fn _Unwind_Backtrace(
        trace: extern "C" fn(ctx: *mut c_void, arg: *mut c_void) -> i32,
        arg: *mut c_void,
    ) -> i32;
    fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
}

const URC_NO_REASON: i32 = 0;
const URC_NORMAL_STOP: i32 = 4;

struct UnwindState<'a> {
    frames: &'a mut [u64; FRAMES],
    n: usize,
    truncated: bool,
}

extern "C" fn unwind_step(ctx: *mut c_void, arg: *mut c_void) -> i32 {
    // SAFETY: `arg` is the UnwindState that `unwind` passed, alive for
    // the whole walk and used by nothing else meanwhile.
    let st = unsafe { &mut *arg.cast::<UnwindState>() };
    // SAFETY: `ctx` is the context libgcc passes to this callback.
    let ip = unsafe { _Unwind_GetIP(ctx) } as u64;
    if ip == 0 || ip >= MAX_ADDRESS {
        return URC_NORMAL_STOP;
    }
    if st.n == FRAMES {
        st.truncated = true;
        return URC_NORMAL_STOP;
    }
    st.frames[st.n] = ip;
    st.n += 1;
    URC_NO_REASON
}

/// The stack by the CFI unwinder: (frames, truncated).
#[inline(never)]
pub(super) fn unwind(frames: &mut [u64; FRAMES]) -> (usize, bool) {
    let mut st = UnwindState {
        frames,
        n: 0,
        truncated: false,
    };
    // SAFETY: the callback only writes into `st`, which outlives the call;
    // it never unwinds (it returns a reason code).
    unsafe { _Unwind_Backtrace(unwind_step, (&raw mut st).cast()) };
    (st.n, st.truncated)
}

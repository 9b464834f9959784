//! Cheap access to the C `errno` for the sampling layer's slow paths, which
//! must leave it as they found it. (The fast paths do not touch errno: the
//! backends keep it themselves, glibc by its own rules and liballocprof.so's
//! mimalloc in its OS primitives, preload/c/mimalloc_errno.c.)
//!
//! glibc's `errno` is an initial-exec TLS variable of libc.so, which is
//! always in the static TLS block: its address is the thread pointer plus
//! an offset that is the same in every thread. We learn that offset from
//! one `__errno_location()` call and afterwards compute the address with
//! two loads and an add, no call.

use core::sync::atomic::{AtomicIsize, Ordering};

const _: () = assert!(size_of::<AtomicIsize>() == 8);

/// `&errno - thread pointer`; 0 = not known yet (errno cannot sit at the
/// thread pointer itself: that is the TCB header's self pointer).
static TP_OFFSET: AtomicIsize = AtomicIsize::new(0);

#[inline(always)]
fn thread_pointer() -> isize {
    let tp: isize;
    // SAFETY: %fs:0 holds the thread pointer (its own address) on x86_64
    // Linux; reading it has no side effects and it is constant per thread.
    unsafe {
        core::arch::asm!(
            "mov {tp}, qword ptr fs:[0]",
            tp = out(reg) tp,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    tp
}

/// This thread's errno slot (what `__errno_location()` returns).
#[inline(always)]
pub fn location() -> *mut i32 {
    let off = load_relaxed_direct!(TP_OFFSET => isize);
    if off != 0 {
        thread_pointer().wrapping_add(off) as *mut i32
    } else {
        location_slow()
    }
}

#[cold]
#[inline(never)]
fn location_slow() -> *mut i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    let p = unsafe { libc::__errno_location() };
    // Any thread may publish it: every thread computes the same value.
    TP_OFFSET.store(
        (p as isize).wrapping_sub(thread_pointer()),
        Ordering::Relaxed,
    );
    p
}

/// Run `f`, then put errno back to its value before `f`.
#[inline(always)]
pub fn preserving<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: this thread's errno slot, valid for the thread's life.
    let saved = unsafe { *location() };
    let r = f();
    restore(saved);
    r
}

/// Writes `saved` back to errno once [`location`] has run on this thread.
/// Recomputing the address (three instructions, no branch: the offset is
/// known now) beats keeping it in a callee-saved register across the
/// caller's call: fewer pushes and pops.
#[inline(always)]
fn restore(saved: i32) {
    let e = thread_pointer().wrapping_add(load_relaxed_direct!(TP_OFFSET => isize));
    // SAFETY: this thread's errno slot (the offset is known: `location` ran).
    unsafe { *(e as *mut i32) = saved };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_errno_location_in_every_thread() {
        let check = || {
            for _ in 0..2 {
                // SAFETY: plain libc call.
                assert_eq!(location(), unsafe { libc::__errno_location() });
            }
            preserving(|| {
                // SAFETY: this thread's errno slot.
                unsafe { *libc::__errno_location() = 5 };
            });
        };
        // SAFETY: this thread's errno slot.
        unsafe { *libc::__errno_location() = 77 };
        check();
        // SAFETY: as above.
        assert_eq!(unsafe { *libc::__errno_location() }, 77);
        std::thread::spawn(check).join().unwrap();
    }
}

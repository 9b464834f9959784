//! `ALLOCPROF_RATE`: the mean sampling interval R in bytes.
//!
//! Read once, lazily, from the first allocation slow path, possibly before
//! `main` and from inside malloc: so no allocation, no std, no panics. A
//! slow path that runs before libc has set up `environ` (a `.preinit_array`
//! function's malloc) reads the process's initial environment instead
//! ([`crate::env`]), so the rate is never latched as unset by mistake.

use core::sync::atomic::{AtomicU64, Ordering};

pub use profiler_common::rate::{DEFAULT_RATE, RateError, parse_rate};

const UNREAD: u64 = u64::MAX;
static RATE: AtomicU64 = AtomicU64::new(UNREAD);

/// The process-wide rate, reading the environment on first use.
pub fn current() -> u64 {
    let r = RATE.load(Ordering::Relaxed);
    if r != UNREAD {
        return r;
    }
    let (rate, bad) = from_env();
    // Only the thread that publishes first warns, so the warning is printed
    // once even when several threads start together.
    match RATE.compare_exchange(UNREAD, rate, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => {
            if bad {
                warn_malformed();
            }
            rate
        }
        Err(published) => published,
    }
}

fn from_env() -> (u64, bool) {
    crate::env::with_var(c"ALLOCPROF_RATE", |value| match value.map(parse_rate) {
        None => (DEFAULT_RATE, false),
        Some(Ok(r)) => (r, false),
        // `ALLOCPROF_RATE= cmd` means "unset", not a typo.
        Some(Err(RateError::Empty)) => (DEFAULT_RATE, false),
        Some(Err(_)) => (DEFAULT_RATE, true),
    })
}

fn warn_malformed() {
    const MSG: &[u8] =
        b"allocprof: malformed ALLOCPROF_RATE (expected bytes, e.g. 524288, 512k, 4m; 0 disables); using 524288\n";
    // SAFETY: plain write(2) of a static buffer; the result is ignored on
    // purpose (nowhere to report a failed warning).
    unsafe {
        libc::syscall(libc::SYS_write, 2, MSG.as_ptr(), MSG.len());
    }
}

//! The one clock of the allocator's published figures: `CLOCK_MONOTONIC`,
//! the clock of the kernel's `bpf_ktime_get_ns`, so allocprof compares
//! them with its own samples' times.

/// `CLOCK_MONOTONIC` nanoseconds (vDSO: no syscall, no allocation).
pub(crate) fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

/// `CLOCK_MONOTONIC_COARSE` nanoseconds (vDSO, a few ns; the last tick's
/// time, 1–4 ms old): the budget's window clock, on the slow path only.
pub(crate) fn coarse_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec; CLOCK_MONOTONIC_COARSE exists since
    // Linux 2.6.32.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) };
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

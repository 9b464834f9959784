//! The one clock of the allocator's published figures: `CLOCK_MONOTONIC`,
//! the clock of the kernel's `bpf_ktime_get_ns`, so allocprof compares
//! them with its own samples' times.

/// `CLOCK_MONOTONIC` nanoseconds (vDSO: no syscall, no allocation).
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_MONOTONIC_COARSE` nanoseconds (vDSO, a few ns; the last tick's
/// time, 1–4 ms old): the budget's window clock, on the slow path only.
pub(crate) fn coarse_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec; both clocks above exist on every
    // kernel we run on (COARSE since Linux 2.6.32).
    unsafe { libc::clock_gettime(clock, &mut t) };
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

//! Back-pressure (`--max-event-rate`): how many of a process's alloc events
//! the kernel keeps, so that the kept ones stay near a rate per process. A
//! kept sample then counts the factor times its weight
//! ([`SampleDelta::thinned`](crate::SampleDelta::thinned)).

/// Back-pressure (`--max-event-rate`): the window over which a process's
/// alloc events are counted to decide how many to keep.
pub const THIN_WINDOW_NS: u64 = 100_000_000;
/// The most a sample can stand for: 1 kept in 2^20.
pub const MAX_THIN_FACTOR: u64 = 1 << 20;

/// A process's back-pressure state after one more alloc event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThinStep {
    pub window_ns: u64,
    pub window_events: u64,
    /// Keep this event with probability 1/factor (a power of two).
    pub factor: u64,
}

/// Decides how many alloc events of a process to keep so that the kept
/// ones stay near `per_second` (0: keep all). Each window of
/// [`THIN_WINDOW_NS`] starts from the factor the last window's rate asks
/// for, and within a window the factor rises as soon as the events so far
/// would exceed the window's allowance at it: a steady rate is held at the
/// budget, a burst costs at most a logarithmic overshoot. The factor is
/// decided before the event's own draw, so whichever it is, keeping 1 in
/// `factor` and scaling by `factor` is unbiased.
#[inline(always)]
pub fn thin_step(
    window_ns: u64,
    window_events: u64,
    factor: u64,
    now_ns: u64,
    per_second: u64,
) -> ThinStep {
    if per_second == 0 {
        return ThinStep {
            window_ns,
            window_events,
            factor: 1,
        };
    }
    // Clamped so the products below fit in 64 bits (the BPF target has no
    // 128-bit multiply, which saturating_mul would need).
    const MAX_RATE: u64 = 1_000_000_000;
    let per_second = if per_second < MAX_RATE {
        per_second
    } else {
        MAX_RATE
    };
    let allowance = {
        let a = per_second * THIN_WINDOW_NS / 1_000_000_000;
        if a == 0 { 1 } else { a }
    };
    let elapsed = now_ns.wrapping_sub(window_ns);
    let (window_ns, events, base) = if window_ns == 0 || elapsed >= THIN_WINDOW_NS {
        // The last window's rate, per window (0 after a long pause).
        let per_window = if window_ns == 0 || elapsed >= 16 * THIN_WINDOW_NS {
            0
        } else {
            let events = if window_events < MAX_RATE {
                window_events
            } else {
                MAX_RATE
            };
            events * THIN_WINDOW_NS / elapsed
        };
        (now_ns, 0, pow2_at_least(per_window / allowance))
    } else {
        (window_ns, window_events, factor)
    };
    let events = events + 1;
    let within = pow2_at_least(events.div_ceil(allowance));
    let factor = if within > base { within } else { base };
    ThinStep {
        window_ns,
        window_events: events,
        factor: if factor < MAX_THIN_FACTOR {
            factor
        } else {
            MAX_THIN_FACTOR
        },
    }
}

/// The smallest power of two ≥ `x` (1 for 0), saturating at 2^32; no loop
/// and no count-leading-zeros (the BPF target has neither).
#[inline(always)]
const fn pow2_at_least(x: u64) -> u64 {
    if x <= 1 {
        return 1;
    }
    if x > 1 << 32 {
        return 1 << 32;
    }
    let mut v = x - 1;
    v |= v >> 1;
    v |= v >> 2;
    v |= v >> 4;
    v |= v >> 8;
    v |= v >> 16;
    v + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_pressure_holds_a_steady_rate_at_the_budget() {
        // 100k events/s against a budget of 1000/s, for 2 s.
        let (budget, rate) = (1000u64, 100_000u64);
        let mut st = ThinStep {
            window_ns: 0,
            window_events: 0,
            factor: 1,
        };
        let mut kept_share = 0.0;
        let mut kept_second_half = 0.0;
        let n = 2 * rate;
        for i in 0..n {
            let now = 1_000 + i * 1_000_000_000 / rate;
            st = thin_step(st.window_ns, st.window_events, st.factor, now, budget);
            assert!(st.factor.is_power_of_two());
            kept_share += 1.0 / st.factor as f64;
            if i >= n / 2 {
                kept_second_half += 1.0 / st.factor as f64;
            }
        }
        // Steady state: at most the budget (powers of two: ≥ half of it).
        assert!(
            (500.0..=1000.0).contains(&kept_second_half),
            "{kept_second_half}"
        );
        // The first window's ramp costs a logarithmic overshoot only.
        assert!(kept_share <= 2.0 * 1000.0 + 1000.0, "{kept_share}");
        // No budget: all kept.
        assert_eq!(thin_step(0, 0, 1, 5, 0).factor, 1);
        // A pause forgets the old rate.
        let later = st.window_ns + 20 * THIN_WINDOW_NS;
        assert_eq!(
            thin_step(st.window_ns, st.window_events, st.factor, later, budget).factor,
            1
        );
    }

    #[test]
    fn powers_of_two_without_loops() {
        for (x, p) in [
            (0, 1),
            (1, 1),
            (2, 2),
            (3, 4),
            (4, 4),
            (5, 8),
            (1 << 20, 1 << 20),
        ] {
            assert_eq!(pow2_at_least(x), p, "{x}");
        }
        assert_eq!(pow2_at_least(u64::MAX), 1 << 32);
    }
}

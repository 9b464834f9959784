//! Pure sampling core: a per-byte Poisson process driven by a countdown.
//!
//! Every allocated byte is a sampling point with probability 1/R, so the gap
//! between sampled bytes is exponential with mean R. We keep the distance to
//! the next sampled byte in `remaining`; an allocation of `size` bytes is
//! sampled iff that point falls inside it, i.e. iff `remaining - size < 0`.
//! By memorylessness the gap after a sampled allocation is a fresh Exp(R)
//! draw, so the slow path never loops.
//!
//! The fast path sees at most [`BIG_BLOCK`]` - 1` of the distance (the rest
//! is `held`), so every allocation of [`BIG_BLOCK`] bytes or more takes the
//! slow path, sampled or not: big unsampled blocks can then be served from
//! the sample region's warm slots too (see `capi`). [`Sampler::resolve`]
//! adds the held part back before deciding, so the decisions are exactly
//! those of the plain countdown.
//!
//! Nothing here touches TLS or the OS: the process-wide slow path
//! (`thread_state`) wraps one `Sampler` per thread, and the statistical tests
//! drive this type directly with an explicit seed.

/// `remaining` value that turns sampling off (R = 0): no realistic byte count
/// reaches it, and if one ever does the slow path just re-arms it.
pub const DISABLED_COUNTDOWN: i64 = i64::MAX;

/// Allocations of at least this many bytes always take the slow path
/// (while sampling is on): the countdown the fast path sees is capped
/// below it. 1 MiB: from there up the backend's unsampled blocks, a few
/// percent of a big-block churn at the default rate, made the loop switch
/// between the region's warm slot and the backend's block (10-19% slower);
/// the cap costs one more slow path per 1 MiB of a longer gap, nothing on
/// the fast path.
pub const BIG_BLOCK: usize = 1 << 20;
const FAST_CAP: i64 = BIG_BLOCK as i64 - 1;

#[derive(Clone, Debug)]
#[repr(C)]
pub struct Sampler {
    /// Bytes until the next sampled byte. Read and written on every
    /// allocation; first field so the fast path addresses it at offset 0.
    pub(crate) remaining: i64,
    rng: u64,
    rate: u64,
    /// The rest of the distance to the next sampled byte, beyond
    /// `remaining` (which is at most `FAST_CAP` when armed).
    held: i64,
}

impl Sampler {
    /// A sampler with mean interval `rate` bytes (0 = never sample).
    pub fn new(seed: u64, rate: u64) -> Self {
        let mut s = Sampler {
            remaining: 0,
            rng: seed,
            rate,
            held: 0,
        };
        let gap = s.next_interval();
        s.arm(gap);
        s
    }

    /// Mean sampling interval R in bytes.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Fast path: account `size` bytes; `true` means the slow path
    /// ([`Sampler::resolve`]) must run. One subtraction and one branch.
    #[inline(always)]
    pub fn countdown(&mut self, size: usize) -> bool {
        self.remaining = self.remaining.wrapping_sub(size as i64);
        self.remaining < 0
    }

    /// Slow path after [`Sampler::countdown`] returned `true`: decides whether
    /// the allocation is sampled and re-arms the countdown.
    #[cold]
    pub fn resolve(&mut self) -> bool {
        if self.rate == 0 {
            self.remaining = DISABLED_COUNTDOWN;
            self.held = 0;
            return false;
        }
        // The whole distance left past this allocation.
        let left = self.remaining.saturating_add(self.held);
        if left >= 0 {
            // Only the capped part ran out: not sampled.
            self.arm(left);
            return false;
        }
        // The sampled byte fell inside the allocation; the next one is an
        // independent Exp(R) gap past its end.
        let gap = self.next_interval();
        self.arm(gap);
        true
    }

    /// Distance `gap` to the next sampled byte: the fast path sees at most
    /// `FAST_CAP` of it (none of that with sampling off).
    fn arm(&mut self, gap: i64) {
        if self.rate == 0 {
            self.remaining = DISABLED_COUNTDOWN;
            self.held = 0;
        } else {
            self.remaining = gap.min(FAST_CAP);
            self.held = gap - self.remaining;
        }
    }

    /// Whether an allocation of `size` bytes is sampled (both paths).
    #[inline]
    pub fn should_sample(&mut self, size: usize) -> bool {
        self.countdown(size) && self.resolve()
    }

    /// Draw one Exp(mean = R) interval, floored to whole bytes.
    pub fn next_interval(&mut self) -> i64 {
        if self.rate == 0 {
            return DISABLED_COUNTDOWN;
        }
        let u = self.next_unit();
        let x = -ln(u) * self.rate as f64;
        // `as` saturates, so a huge draw cannot wrap negative.
        x as i64
    }

    /// A uniform 64-bit draw of this sampler's generator (the budget's
    /// keep-or-drop draw).
    pub fn draw(&mut self) -> u64 {
        splitmix64(&mut self.rng)
    }

    /// Uniform in (0, 1]: never 0, so ln() stays finite.
    fn next_unit(&mut self) -> f64 {
        let bits = splitmix64(&mut self.rng) >> 11;
        (bits + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// splitmix64: tiny state, full period, good enough for sampling gaps.
#[inline]
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Probability that an allocation of `size` bytes is sampled at rate R.
pub fn inclusion_probability(size: u64, rate: u64) -> f64 {
    if rate == 0 {
        return 0.0;
    }
    -expm1(-(size as f64) / rate as f64)
}

/// Unbiasing weight `size / (1 - exp(-size/R))`, rounded to whole bytes.
pub fn weight(size: u64, rate: u64) -> u64 {
    if rate == 0 || size == 0 {
        return size;
    }
    let p = inclusion_probability(size, rate);
    let w = size as f64 / p;
    (w + 0.5) as u64
}

// libm directly: the crate is no_std (core has no ln/expm1), and glibc's
// libm neither allocates nor takes locks.
#[link(name = "m")]
unsafe extern "C" {
    #[link_name = "log"]
    fn c_log(x: f64) -> f64;
    #[link_name = "expm1"]
    fn c_expm1(x: f64) -> f64;
}

pub(crate) fn ln(x: f64) -> f64 {
    // SAFETY: log() is a pure libm function on a plain f64.
    unsafe { c_log(x) }
}

pub(crate) fn expm1(x: f64) -> f64 {
    // SAFETY: expm1() is a pure libm function on a plain f64.
    unsafe { c_expm1(x) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_matches_formula() {
        let r = 524_288;
        // Small sizes weigh about R; huge sizes weigh about themselves.
        let w = weight(64, r) as f64;
        assert!((w - (r as f64 + 32.0)).abs() < 2.0, "{w}");
        assert_eq!(weight(64 << 20, r), 64 << 20);
        assert_eq!(weight(0, r), 0);
    }

    #[test]
    fn disabled_never_samples() {
        let mut s = Sampler::new(1, 0);
        for _ in 0..1000 {
            assert!(!s.should_sample(1 << 30));
        }
    }

    /// The capped countdown decides exactly as the plain one (a countdown
    /// of the whole gap), draw for draw, over sizes around the cap, and
    /// sends every block of `BIG_BLOCK` bytes or more to the slow path.
    #[test]
    fn the_cap_changes_no_decision() {
        for rate in [1u64, 4096, 524_288, 64 << 20] {
            let mut capped = Sampler::new(99, rate);
            // The reference: the same draws, no cap.
            let mut rng = 99u64;
            let mut plain = Sampler {
                remaining: 0,
                rng: 0,
                rate,
                held: 0,
            };
            let mut draw = |rng: &mut u64| {
                plain.rng = *rng;
                let g = plain.next_interval();
                *rng = plain.rng;
                g
            };
            let mut left = draw(&mut rng);
            let mut x = 7u64;
            for i in 0..200_000 {
                let size = match splitmix64(&mut x) % 4 {
                    0 => (x >> 8) as usize % 256,
                    1 => (x >> 8) as usize % (4 << 20),
                    2 => BIG_BLOCK - 1 + (x >> 8) as usize % 3,
                    _ => (x >> 8) as usize % (256 << 10),
                };
                let slow = capped.countdown(size);
                if size >= BIG_BLOCK {
                    assert!(slow, "rate {rate}: {size} bytes took the fast path");
                }
                let sampled = slow && capped.resolve();
                left -= size as i64;
                let expect = left < 0;
                if expect {
                    left = draw(&mut rng);
                }
                assert_eq!(sampled, expect, "rate {rate}, allocation {i} of {size}");
            }
        }
    }

    #[test]
    fn rate_one_samples_everything() {
        let mut s = Sampler::new(7, 1);
        let hits = (0..10_000).filter(|_| s.should_sample(64)).count();
        // p = 1 - e^-64.
        assert_eq!(hits, 10_000);
    }
}

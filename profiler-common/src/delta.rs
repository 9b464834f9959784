//! What one sample adds to the sums, the single definition the kernel and
//! user space share: unbiased bytes, objects in fixed point and the
//! Horvitz-Thompson variance term in variance units, clamped so that the
//! BPF backend needs no 128-bit multiply; with back-pressure, the same for a
//! sample kept 1 in a factor.

use crate::MAX_THIN_FACTOR;

/// Estimated object counts are kept in fixed point: `objects * OBJECT_SCALE`.
/// The kernel cannot use floats; 1/65536 of an object is plenty of resolution.
pub const OBJECT_SCALE: u64 = 1 << 16;

/// What one sample adds to (and its free subtracts from) the sums: unbiased
/// bytes (the weight), objects (`weight / size`, fixed point) and the variance
/// term `w·(w - size)` in units of 2^[`VAR_UNIT_SHIFT`] bytes².
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleDelta {
    pub bytes: u64,
    pub objects: u64,
    pub var: u64,
    /// The part of `var` due to back-pressure (0 for a sample every event
    /// of which was kept): see [`SampleDelta::thinned`].
    pub thin_var: u64,
}

/// Variance sums count units of `2^VAR_UNIT_SHIFT` bytes², so that a u64 sum
/// holds 2^80 bytes²: about 2^42 samples of one stack at R = 512 KiB (no
/// wrap in decades at 1 GB/s), where bytes² would wrap after 2^26.
pub const VAR_UNIT_SHIFT: u32 = 16;
/// Each factor of `w·(w - size)` is rounded up to a multiple of 2^HALF, so
/// the variance is never understated (overstated by < 2^HALF / factor:
/// 0.05% at R = 512 KiB, 6% at the smallest useful R of 4 KiB).
const HALF_SHIFT: u32 = VAR_UNIT_SHIFT / 2;
/// Weights are clamped so the products fit in 64 bits without an overflow
/// check (the BPF backend has no 128-bit multiply): bytes and objects are
/// exact for weights up to 1 TiB; each variance factor is exact up to
/// 512 GiB, so any practical R (the excess `w - size` never exceeds about R).
pub const MAX_WEIGHT: u64 = 1 << 40;
const MAX_VAR_FACTOR: u64 = 1 << 39;

/// `x` clamped and rounded up to units of 2^HALF_SHIFT: at most 2^31.
#[inline(always)]
const fn var_factor(x: u64) -> u64 {
    let x = if x < MAX_VAR_FACTOR {
        x
    } else {
        MAX_VAR_FACTOR
    };
    (x + (1 << HALF_SHIFT) - 1) >> HALF_SHIFT
}

/// A variance sum in bytes².
pub fn variance_in_bytes2(units: u64) -> f64 {
    units as f64 * (1u64 << VAR_UNIT_SHIFT) as f64
}

impl SampleDelta {
    #[inline(always)]
    pub fn of(size: u64, weight: u64) -> SampleDelta {
        let weight = if weight < MAX_WEIGHT {
            weight
        } else {
            MAX_WEIGHT
        };
        let excess = weight.saturating_sub(size);
        let size = if size == 0 { 1 } else { size };
        SampleDelta {
            bytes: weight,
            objects: weight.wrapping_mul(OBJECT_SCALE) / size,
            var: var_factor(weight) * var_factor(excess),
            thin_var: 0,
        }
    }

    /// A sample kept with probability `1/factor` (back-pressure): it counts
    /// `w' = factor·weight` bytes, unbiased again. Its variance term is the
    /// Horvitz-Thompson one of the combined inclusion probability,
    /// `w'·(w' − size)`, which is the first stage's term scaled by `factor`
    /// plus the thinning's own `w'·(w' − w)` (kept apart in `thin_var`).
    /// Exact when `factor` came from [`thin_factor_for`] (the kernel's);
    /// a larger one would be clamped here, silently short.
    ///
    /// [`thin_factor_for`]: crate::thin_factor_for
    #[inline(always)]
    pub fn thinned(size: u64, weight: u64, factor: u64) -> SampleDelta {
        if factor <= 1 {
            return SampleDelta::of(size, weight);
        }
        let weight = if weight < MAX_WEIGHT {
            weight
        } else {
            MAX_WEIGHT
        };
        let factor = if factor < MAX_THIN_FACTOR {
            factor
        } else {
            MAX_THIN_FACTOR
        };
        // < 2^60: no overflow; clamped like any weight.
        let scaled = weight * factor;
        let mut d = SampleDelta::of(size, scaled);
        d.thin_var = var_factor(d.bytes) * var_factor(d.bytes - weight);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LiveSample;

    #[test]
    fn a_thinned_sample_counts_factor_times_with_both_stages_variance() {
        // p = 1/4, then kept 1 in 8: counts 32 objects, w' = 3.2 MB.
        let d = SampleDelta::thinned(100_000, 400_000, 8);
        assert_eq!(d.bytes, 3_200_000);
        assert_eq!(d.objects, 32 * OBJECT_SCALE);
        // w'(w' − size) = 8·w(w − size) + w'(w' − w), the HT variance of
        // the product of the two inclusion probabilities (never understated,
        // rounded up by < 0.1% here).
        let close = |units: u64, exact: f64| {
            let v = variance_in_bytes2(units);
            v >= exact && v <= exact * 1.001
        };
        assert!(close(d.var, 3.2e6 * 3.1e6), "{d:?}");
        assert!(close(d.thin_var, 3.2e6 * 2.8e6), "{d:?}");
        assert_eq!(SampleDelta::thinned(100, 400, 1), SampleDelta::of(100, 400));
        assert_eq!(SampleDelta::thinned(100, 400, 0), SampleDelta::of(100, 400));
        let sample = LiveSample {
            size: 100_000,
            weight: 400_000,
            thin_factor: 8,
            ..LiveSample::default()
        };
        assert_eq!(sample.delta(), d);
    }

    #[test]
    fn sample_delta_is_the_unbiased_contribution() {
        // Sampled with p = 1/4: counts as 4 objects, 4x the bytes.
        let d = SampleDelta::of(100, 400);
        assert_eq!(d.bytes, 400);
        assert_eq!(d.objects, 4 * OBJECT_SCALE);
        assert_eq!(variance_in_bytes2(d.var), 512.0 * 512.0);
        // A huge allocation is always sampled: no variance.
        assert_eq!(SampleDelta::of(1 << 30, 1 << 30).var, 0);
    }

    #[test]
    fn variance_is_exact_on_unit_multiples_and_never_understated() {
        let d = SampleDelta::of(256, 1024 * 256);
        assert_eq!(
            variance_in_bytes2(d.var),
            (1024.0 * 256.0) * (1023.0 * 256.0)
        );
        for (size, weight) in [(1, 4096), (100, 524_288), (8, 9), (4000, 70_000)] {
            let exact = weight as f64 * (weight - size) as f64;
            let kept = variance_in_bytes2(SampleDelta::of(size, weight).var);
            assert!(
                kept >= exact && kept <= exact * 1.07 + 65536.0,
                "{size} {weight}"
            );
        }
    }

    #[test]
    fn variance_of_a_large_rate_is_not_clamped() {
        // R = 1 GiB: a small block weighs about R; w·(w - size) ≈ 2^60 bytes².
        let r: u64 = 1 << 30;
        let kept = variance_in_bytes2(SampleDelta::of(64, r).var);
        let exact = r as f64 * (r - 64) as f64;
        assert!((kept - exact).abs() / exact < 1e-6, "{kept} vs {exact}");
        // The extreme weight still fits one term in u64 (no wrap).
        let top = SampleDelta::of(1, u64::MAX);
        assert_eq!(top.var, var_factor(MAX_WEIGHT) * var_factor(MAX_WEIGHT - 1));
        assert!(top.var <= 1 << 62);
    }

    #[test]
    fn a_stack_sum_does_not_wrap_where_bytes_squared_did() {
        // 2^27 samples of 100 B at R = 512 KiB: about 2^65 bytes², which
        // wrapped the old u64 sum. In variance units it is far from wrapping.
        let d = SampleDelta::of(100, 524_288);
        let samples: u64 = 1 << 27;
        let sum = d.var.checked_mul(samples).expect("no wrap");
        let exact = 524_288.0 * (524_288.0 - 100.0) * samples as f64;
        assert!((variance_in_bytes2(sum) - exact).abs() / exact < 1e-3);
        assert!(sum < u64::MAX >> 12, "room for 2^12 times more samples");
    }
}

//! How a process's weights estimate bytes (`size / p`, or `nsamples × R`),
//! told from one modulo per sample in the kernel; it decides which variance
//! user space reports.

use crate::{MAX_WEIGHT, ProcCounters};

/// What one alloc probe's weight says about the process's weight form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightCheck {
    /// The process's smallest valid weight after this one.
    pub min_weight: u64,
    /// Not a multiple of the smallest weight (or the smallest weight, now
    /// replaced by this one, is not a multiple of it).
    pub not_multiple: bool,
    /// Below the allocation's size: impossible for `size / p`.
    pub below_size: bool,
    /// 0, or so large the sums would be clamped ([`MAX_WEIGHT`]).
    pub invalid: bool,
}

/// One modulo per sample: keeps `min_weight` the smallest valid weight and
/// flags a weight that breaks "every weight is a multiple of the smallest".
/// Checking each new weight against the current minimum in both directions
/// keeps "no flag so far ⇒ every weight seen is a multiple of the minimum",
/// i.e. the gcd of the weights is their minimum: a new larger weight must be
/// a multiple of it, and a new smaller one must divide it (then it divides
/// every earlier weight too). The converse holds once the smallest weight
/// has been seen before any non-multiple of it: for `nsamples × R` weights
/// the minimum is R from the first sample that crossed a single sampling
/// point (nearly every allocation smaller than R, so in practice the first
/// samples), and every weight is a multiple of R, so the flag stays clear.
/// A process whose first samples all crossed several points may be flagged
/// (then its intervals use the `size / p` model, or are unavailable).
#[inline(always)]
pub fn weight_check(min_weight: u64, size: u64, weight: u64) -> WeightCheck {
    if weight == 0 || weight >= MAX_WEIGHT {
        return WeightCheck {
            min_weight,
            not_multiple: false,
            below_size: false,
            invalid: true,
        };
    }
    let (min, not_multiple) = if min_weight == 0 {
        (weight, false)
    } else if weight < min_weight {
        (weight, !min_weight.is_multiple_of(weight))
    } else {
        (min_weight, !weight.is_multiple_of(min_weight))
    };
    WeightCheck {
        min_weight: min,
        not_multiple,
        below_size: weight < size,
        invalid: false,
    }
}

/// How a process's weights estimate bytes, decided from its [`ProcCounters`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightForm {
    /// No alloc probe weighed yet.
    NoSamples,
    /// `size / p` (the inverse inclusion probability, allocprof's allocator):
    /// variance estimate `Σ w·(w − size)`, the kernel's variance sums.
    InverseProbability,
    /// `nsamples × R` (OpenTelemetry's design): every weight a multiple of
    /// the smallest, `interval` (R). Each sample's count of sampling points
    /// is Poisson(size/R), so its variance is R·size, estimated by R·w:
    /// the variance of a sum is R times its bytes.
    PointsTimesInterval { interval: u64 },
    /// Neither: an invalid weight (0, huge), or a weight below its size
    /// that is not a multiple of one R. No honest interval exists.
    Unrecognized,
}

impl ProcCounters {
    /// The weight form of this process's samples (all its images').
    pub fn weight_form(&self) -> WeightForm {
        if self.weights_invalid > 0 {
            WeightForm::Unrecognized
        } else if self.min_weight == 0 {
            WeightForm::NoSamples
        } else if self.weights_not_multiple == 0 {
            // Also true of a process with a single `size / p` sample, or
            // only identical ones: R·w ≥ w·(w − size) there, conservative.
            WeightForm::PointsTimesInterval {
                interval: self.min_weight,
            }
        } else if self.weights_below_size == 0 {
            WeightForm::InverseProbability
        } else {
            WeightForm::Unrecognized
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The weights a process fired, folded as the kernel does.
    fn form_of(samples: &[(u64, u64)]) -> WeightForm {
        let mut p = ProcCounters::default();
        for &(size, weight) in samples {
            let c = weight_check(p.min_weight, size, weight);
            p.min_weight = c.min_weight;
            p.weights_not_multiple += u64::from(c.not_multiple);
            p.weights_below_size += u64::from(c.below_size);
            p.weights_invalid += u64::from(c.invalid);
        }
        p.weight_form()
    }

    #[test]
    fn weight_form_is_detected_per_process() {
        const R: u64 = 4096;
        assert_eq!(form_of(&[]), WeightForm::NoSamples);
        // nsamples × R, in any order, sizes above and below R.
        let points = [(100, R), (20_000, 5 * R), (9000, 2 * R), (30, R), (4096, R)];
        assert_eq!(
            form_of(&points),
            WeightForm::PointsTimesInterval { interval: R }
        );
        // The minimum arriving last still divides everything before it.
        assert_eq!(
            form_of(&[(9000, 2 * R), (20_000, 6 * R), (10, R)]),
            WeightForm::PointsTimesInterval { interval: R }
        );
        // size / p: never below size, not multiples of one another.
        let ht = [(100, 4146), (8000, 9354), (64, 4128), (1 << 20, 1 << 20)];
        assert_eq!(form_of(&ht), WeightForm::InverseProbability);
        // Below size and not n·R; or invalid weights: no honest interval.
        assert_eq!(
            form_of(&[(100, 4146), (5000, 4097)]),
            WeightForm::Unrecognized
        );
        assert_eq!(form_of(&[(100, R), (8, 0)]), WeightForm::Unrecognized);
        assert_eq!(
            form_of(&[(100, R), (8, u64::MAX)]),
            WeightForm::Unrecognized
        );
        assert_eq!(form_of(&[(8, MAX_WEIGHT)]), WeightForm::Unrecognized);
    }

    #[test]
    fn weight_check_is_the_gcd_test() {
        // No flag ⇒ gcd(weights) == min(weights), and ⇔ when the minimum
        // came first, over small random sets.
        fn gcd(a: u64, b: u64) -> u64 {
            if b == 0 { a } else { gcd(b, a % b) }
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            let mut min = 0;
            let mut flagged = false;
            let (mut g, mut m, mut first) = (0, u64::MAX, 0);
            for _ in 0..1 + x % 5 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let w = 3 * (1 + x % 12);
                let c = weight_check(min, 1, w);
                min = c.min_weight;
                flagged |= c.not_multiple;
                g = gcd(g, w);
                m = m.min(w);
                if first == 0 {
                    first = w;
                }
            }
            assert_eq!(min, m);
            if !flagged {
                assert_eq!(g, m);
            }
            if first == m {
                assert_eq!(!flagged, g == m, "gcd {g} min {m}");
            }
        }
    }
}

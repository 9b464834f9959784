//! Unbiased estimates from the kernel's sums: each sample was unbiased in the
//! kernel (its weight), so totals are plain sums, and so are their variances
//! (samples are independent). 95% confidence intervals use the normal
//! approximation.

use std::ops::AddAssign;

use profiler_common::{OBJECT_SCALE, StackAgg, WeightForm, variance_in_bytes2};

/// z for a two-sided 95% interval.
pub const Z95: f64 = 1.959_963_984_540_054;

/// Pseudo-samples of R² each added to every variance, for the mass no
/// sample shows: the smallest whole number for which the interval
/// `n ± Z95·√(n + k)` covers a Poisson mean at ≥ 95% for every mean up to
/// 16 (k = 3: 94.3%; k = 2.34, a 3R half-width at n = 0: 93.7% at mean
/// 7.5); past 16 the count's discreteness keeps it near 94.6% whatever k.
/// With no sample the half-width is 3.9R.
pub const UNSEEN_SAMPLES: f64 = 4.0;

/// Unbiased totals of one stack, process, or any sum of them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Totals {
    pub live_bytes: f64,
    pub live_var: f64,
    pub live_objects: f64,
    pub live_samples: u64,
    pub alloc_bytes: f64,
    pub alloc_var: f64,
    pub alloc_objects: f64,
    pub alloc_samples: u64,
    /// The part of the variances due to back-pressure (see
    /// `StackAgg::live_thin_var`), already in `*_var` for `size / p`
    /// weights, added to them for `nsamples × R` ones.
    pub live_thin_var: f64,
    pub alloc_thin_var: f64,
    /// The variance of the bytes no sample shows (see
    /// [`Totals::with_weight_form`]): `UNSEEN_SAMPLES · R²`, added to both
    /// intervals. A sum's is the largest of its parts' (one unseen mass for
    /// the whole sum, not one per part), so it never grows with the number
    /// of stacks summed.
    pub unseen_var: f64,
    /// The live bytes by age (zero where unknown: gone processes, profiles
    /// read back from files).
    pub ages: crate::model::age::Ages,
    /// Of the live bytes, those of blocks allocated before allocprof
    /// attached (read from the process's live-sample ledger).
    pub before_attach_bytes: f64,
}

impl Totals {
    pub fn from_agg(agg: &StackAgg) -> Totals {
        let objects = |fixed: u64| fixed as f64 / OBJECT_SCALE as f64;
        Totals {
            live_bytes: agg.live_bytes as f64,
            live_var: variance_in_bytes2(agg.live_var),
            live_objects: objects(agg.live_objects),
            live_samples: agg.live_samples,
            alloc_bytes: agg.alloc_bytes as f64,
            alloc_var: variance_in_bytes2(agg.alloc_var),
            alloc_objects: objects(agg.alloc_objects),
            alloc_samples: agg.alloc_samples,
            live_thin_var: variance_in_bytes2(agg.live_thin_var),
            alloc_thin_var: variance_in_bytes2(agg.alloc_thin_var),
            unseen_var: 0.0,
            ages: crate::model::age::Ages::default(),
            before_attach_bytes: 0.0,
        }
    }

    /// The variances of the process's weight form: the kernel's sums are
    /// `Σ w·(w − size)`, right for `size / p` weights; `nsamples × R`
    /// weights have variance R per byte (R·Σw); unrecognized weights have
    /// no honest variance: NaN, which every sum it enters keeps, and every
    /// view shows as unavailable.
    ///
    /// Both sums see only the sampled blocks: where every sample is a huge
    /// block (inclusion probability ≈ 1) they are 0, while small blocks no
    /// sample fell in are missing from the estimate. Bytes that produced no
    /// sample were missed with probability `e^(−bytes/R)`, so up to ~3R of
    /// them may hide behind any figure; each sampled small block counts ≈ R
    /// with a variance term ≈ R², so a figure's n small samples are a
    /// Poisson count and its variance ≈ R²·n. Adding [`UNSEEN_SAMPLES`]
    /// pseudo-samples' `R²` makes the normal interval cover for every
    /// Poisson mean, zero samples included (docs/probe-contract.md).
    /// `rate` is the process's R for `size / p` weights (the points form
    /// knows its own), `thin_factor` the back-pressure in force (a kept
    /// sample stands for that many: R grows by it).
    pub fn with_weight_form(mut self, form: WeightForm, rate: u64, thin_factor: u64) -> Totals {
        let unseen = |r: u64| {
            let r = r as f64 * thin_factor.max(1) as f64;
            UNSEEN_SAMPLES * r * r
        };
        match form {
            WeightForm::NoSamples | WeightForm::InverseProbability => {
                self.unseen_var = unseen(rate);
            }
            WeightForm::PointsTimesInterval { interval } => {
                let r = interval as f64;
                self.live_var = r * self.live_bytes.max(0.0) + self.live_thin_var;
                self.alloc_var = r * self.alloc_bytes.max(0.0) + self.alloc_thin_var;
                self.unseen_var = unseen(interval);
            }
            WeightForm::Unrecognized => {
                self.live_var = f64::NAN;
                self.alloc_var = f64::NAN;
            }
        }
        self
    }

    /// Half-width of the 95% confidence interval of the live bytes; NaN
    /// when unavailable (weights of no known form).
    pub fn live_ci95(&self) -> f64 {
        ci95(self.live_var + self.unseen_var)
    }

    pub fn alloc_ci95(&self) -> f64 {
        ci95(self.alloc_var + self.unseen_var)
    }

    /// The live interval's half-width, if available.
    pub fn live_ci95_known(&self) -> Option<f64> {
        Some(self.live_ci95()).filter(|c| !c.is_nan())
    }

    pub fn alloc_ci95_known(&self) -> Option<f64> {
        Some(self.alloc_ci95()).filter(|c| !c.is_nan())
    }

    /// The quantity named by `value`.
    pub fn value(&self, value: Quantity) -> f64 {
        match value {
            Quantity::InuseBytes => self.live_bytes,
            Quantity::InuseObjects => self.live_objects,
            Quantity::AllocBytes => self.alloc_bytes,
            Quantity::AllocObjects => self.alloc_objects,
        }
    }
}

impl AddAssign for Totals {
    fn add_assign(&mut self, o: Totals) {
        self.live_bytes += o.live_bytes;
        self.live_var += o.live_var;
        self.live_objects += o.live_objects;
        self.live_samples += o.live_samples;
        self.alloc_bytes += o.alloc_bytes;
        self.alloc_var += o.alloc_var;
        self.alloc_objects += o.alloc_objects;
        self.alloc_samples += o.alloc_samples;
        self.live_thin_var += o.live_thin_var;
        self.alloc_thin_var += o.alloc_thin_var;
        self.unseen_var = self.unseen_var.max(o.unseen_var);
        self.ages.merge(&o.ages);
        self.before_attach_bytes += o.before_attach_bytes;
    }
}

impl std::iter::Sum for Totals {
    fn sum<I: Iterator<Item = Totals>>(iter: I) -> Totals {
        let mut total = Totals::default();
        for t in iter {
            total += t;
        }
        total
    }
}

fn ci95(var: f64) -> f64 {
    if var.is_nan() {
        f64::NAN
    } else {
        Z95 * var.max(0.0).sqrt()
    }
}

/// A confidence interval's half-width for people: `1.5 MiB`, or `?` when
/// unavailable.
pub fn human_ci(ci: f64) -> String {
    if ci.is_nan() {
        "?".into()
    } else {
        human_bytes(ci)
    }
}

/// The quantities a profile can be viewed by (pprof's sample types).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Quantity {
    /// Estimated live (in-use) bytes.
    #[default]
    InuseBytes,
    /// Estimated live objects.
    InuseObjects,
    /// Estimated bytes allocated since attach.
    AllocBytes,
    /// Estimated objects allocated since attach.
    AllocObjects,
}

impl Quantity {
    pub const ALL: [Quantity; 4] = [
        Quantity::InuseBytes,
        Quantity::InuseObjects,
        Quantity::AllocBytes,
        Quantity::AllocObjects,
    ];

    /// The name users give it (`--value NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Quantity::InuseBytes => "inuse-bytes",
            Quantity::InuseObjects => "inuse-objects",
            Quantity::AllocBytes => "alloc-bytes",
            Quantity::AllocObjects => "alloc-objects",
        }
    }

    /// One line saying what it is, for help texts.
    pub fn summary(self) -> &'static str {
        match self {
            Quantity::InuseBytes => "Estimated live (in-use) bytes",
            Quantity::InuseObjects => "Estimated live objects",
            Quantity::AllocBytes => "Estimated bytes allocated since attach",
            Quantity::AllocObjects => "Estimated objects allocated since attach",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Quantity::InuseBytes => "live bytes",
            Quantity::InuseObjects => "live objects",
            Quantity::AllocBytes => "allocated bytes",
            Quantity::AllocObjects => "allocated objects",
        }
    }
}

/// Bytes for people: `1.5 MiB`.
pub fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes.abs();
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    let sign = if bytes < 0.0 { "-" } else { "" };
    if unit == 0 {
        format!("{sign}{v:.0} B")
    } else {
        format!("{sign}{v:.1} {}", UNITS[unit])
    }
}

/// Counts for people: `12.3k`.
pub fn human_count(n: f64) -> String {
    match n.abs() {
        x if x >= 1e9 => format!("{:.1}G", n / 1e9),
        x if x >= 1e6 => format!("{:.1}M", n / 1e6),
        x if x >= 1e4 => format!("{:.1}k", n / 1e3),
        _ => format!("{n:.0}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_pressure_variance_is_added_to_n_times_r_weights_only() {
        let t = Totals {
            live_bytes: 1000.0,
            live_var: 5000.0,
            live_thin_var: 700.0,
            alloc_bytes: 2000.0,
            alloc_var: 9000.0,
            alloc_thin_var: 900.0,
            ..Default::default()
        };
        // size / p: the kernel's variance already holds the thinning's part.
        let ht = t.with_weight_form(WeightForm::InverseProbability, 0, 1);
        assert_eq!((ht.live_var, ht.alloc_var), (5000.0, 9000.0));
        // nsamples × R: R per byte, plus the thinning's part.
        let nr = t.with_weight_form(WeightForm::PointsTimesInterval { interval: 4 }, 0, 1);
        assert_eq!((nr.live_var, nr.alloc_var), (4700.0, 8900.0));
    }

    #[test]
    fn ci_is_z_sigma() {
        let t = Totals {
            live_bytes: 1000.0,
            live_var: 100.0,
            ..Default::default()
        };
        assert!((t.live_ci95() - Z95 * 10.0).abs() < 1e-9);
    }

    #[test]
    fn sums_unbias_then_add() {
        let a = Totals::from_agg(&StackAgg {
            live_bytes: 800,
            live_objects: 100 * OBJECT_SCALE,
            live_var: 5,
            live_samples: 1,
            ..Default::default()
        });
        let b = Totals::from_agg(&StackAgg {
            live_bytes: 8 << 20,
            live_objects: OBJECT_SCALE,
            live_samples: 1,
            ..Default::default()
        });
        let s: Totals = [a, b].into_iter().sum();
        assert_eq!(s.live_bytes, 800.0 + f64::from(8 << 20));
        assert_eq!(s.live_objects, 101.0);
        assert_eq!(
            s.live_var,
            5.0 * 65536.0,
            "kernel variance units are 2^16 bytes²"
        );
        assert_eq!(s.live_samples, 2);
    }

    #[test]
    fn weight_forms_pick_the_variance() {
        let t = Totals {
            live_bytes: 1000.0,
            live_var: 7.0,
            alloc_bytes: 3000.0,
            alloc_var: 9.0,
            ..Default::default()
        };
        let points = t.with_weight_form(WeightForm::PointsTimesInterval { interval: 100 }, 0, 1);
        assert_eq!((points.live_var, points.alloc_var), (100_000.0, 300_000.0));
        assert_eq!(t.with_weight_form(WeightForm::InverseProbability, 0, 1), t);
        let unknown = t.with_weight_form(WeightForm::Unrecognized, 0, 1);
        assert!(unknown.live_ci95().is_nan() && unknown.alloc_ci95_known().is_none());
        // Unavailable stays unavailable in any sum.
        let s: Totals = [t, unknown].into_iter().sum();
        assert_eq!(s.live_ci95_known(), None);
        assert_eq!(human_ci(s.live_ci95()), "?");
        assert_eq!(s.live_bytes, 2000.0);
    }

    #[test]
    fn no_sample_is_no_certainty_the_unseen_mass_widens_every_interval_once() {
        const R: f64 = 524_288.0;
        // One huge sampled block (p ≈ 1): its HT term is 0.
        let huge = Totals {
            live_bytes: 100e6,
            alloc_bytes: 100e6,
            ..Default::default()
        };
        let ht = huge.with_weight_form(WeightForm::InverseProbability, R as u64, 1);
        assert_eq!(ht.live_var, 0.0);
        let floor = Z95 * (UNSEEN_SAMPLES * R * R).sqrt();
        assert!((ht.live_ci95() - floor).abs() < 1e-6 * floor, "{ht:?}");
        assert!((ht.alloc_ci95() - floor).abs() < 1e-6 * floor);
        // ≈ 3.9R: wider than the ~3R of bytes zero samples allow at 95%.
        assert!(floor > R * 20f64.ln() && floor < 4.0 * R);
        // Back-pressure: a kept sample stands for 8, so does R.
        let thinned = huge.with_weight_form(WeightForm::InverseProbability, R as u64, 8);
        assert!((thinned.live_ci95() - 8.0 * floor).abs() < 1e-6 * floor);
        // The points form has its R from its weights.
        let points =
            huge.with_weight_form(WeightForm::PointsTimesInterval { interval: 4096 }, 0, 1);
        let expected = Z95 * (4096.0 * 100e6 + UNSEEN_SAMPLES * 4096.0 * 4096.0).sqrt();
        assert!((points.live_ci95() - expected).abs() < 1e-6 * expected);
        // A sum has one unseen mass, not one per part: a thousand stacks'
        // floors do not add up.
        let s: Totals = std::iter::repeat_n(ht, 1000).sum();
        assert!((s.live_ci95() - floor).abs() < 1e-6 * floor, "{s:?}");
        // Many small samples: the floor hardly widens an honest interval.
        let small = Totals {
            live_bytes: 1000.0 * R,
            live_var: 1000.0 * R * R,
            ..Default::default()
        }
        .with_weight_form(WeightForm::InverseProbability, R as u64, 1);
        let wald = Z95 * (1000.0 * R * R).sqrt();
        assert!(
            small.live_ci95() / wald < 1.0025,
            "{}",
            small.live_ci95() / wald
        );
        // Unavailable stays unavailable.
        let unknown = huge.with_weight_form(WeightForm::Unrecognized, R as u64, 1);
        assert!(unknown.live_ci95().is_nan());
    }

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(1536.0), "1.5 KiB");
        assert_eq!(human_bytes(3.0 * 1024.0 * 1024.0 * 1024.0), "3.0 GiB");
        assert_eq!(human_count(12_345.0), "12.3k");
    }
}

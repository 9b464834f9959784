//! Statistical properties of the seeded `Sampler` core: interval
//! distribution, per-size inclusion probability, unbiased weights.
//! Seeds are fixed, so the outcomes are deterministic; the bounds are
//! z = 4 (false-failure probability ~6e-5 per check for a correct sampler).

use allocator::Sampler;
use allocator::sampler::{inclusion_probability, weight};

const R: u64 = 524_288;
const Z: f64 = 4.0;

#[test]
fn intervals_are_exponential_with_mean_r() {
    let mut s = Sampler::new(0x1234_5678, R);
    let n = 200_000usize;
    let mut xs: Vec<f64> = (0..n).map(|_| s.next_interval() as f64).collect();
    let mean = xs.iter().sum::<f64>() / n as f64;
    // Exp(R) has sd R: the sample mean has sd R / sqrt(n).
    let bound = Z * R as f64 / (n as f64).sqrt();
    assert!(
        (mean - R as f64).abs() < bound,
        "mean {mean}, bound {bound}"
    );

    // Kolmogorov–Smirnov against F(x) = 1 - exp(-x/R); floor() shifts the
    // CDF by at most 1 byte in R, far below the KS resolution.
    xs.sort_by(f64::total_cmp);
    let mut d: f64 = 0.0;
    for (i, &x) in xs.iter().enumerate() {
        let f = 1.0 - (-(x + 0.5) / R as f64).exp();
        d = d
            .max((f - i as f64 / n as f64).abs())
            .max(((i + 1) as f64 / n as f64 - f).abs());
    }
    // Critical value at alpha = 0.001: 1.95 / sqrt(n).
    let crit = 1.95 / (n as f64).sqrt();
    assert!(d < crit, "KS D = {d}, critical {crit}");
}

#[test]
fn inclusion_probability_matches_one_minus_exp() {
    for (i, &size) in [1u64, 64, 1024, 8192, 65_536, 262_144, 524_288, 2 << 20]
        .iter()
        .enumerate()
    {
        let mut s = Sampler::new(42 + i as u64, R);
        let p = inclusion_probability(size, R);
        // Enough trials to expect >= ~400 samples for the small sizes.
        let n: u64 = (400.0 / p).clamp(20_000.0, 4_000_000.0) as u64;
        let hits = (0..n).filter(|_| s.should_sample(size as usize)).count() as f64;
        let expected = n as f64 * p;
        let sd = (n as f64 * p * (1.0 - p)).sqrt();
        assert!(
            (hits - expected).abs() <= Z * sd + 1.0,
            "size {size}: {hits} hits of {n}, expected {expected} ± {}",
            Z * sd
        );
    }
}

struct Class {
    size: u64,
    count: u64,
}

const MIXTURE: [Class; 4] = [
    Class {
        size: 64,
        count: 1_000_000,
    },
    Class {
        size: 8 << 10,
        count: 10_000,
    },
    Class {
        size: 1 << 20,
        count: 100,
    },
    Class {
        size: 8 << 20,
        count: 3,
    },
];

fn variance(size: u64, count: u64) -> f64 {
    let p = inclusion_probability(size, R);
    count as f64 * (size as f64).powi(2) * (1.0 - p) / p
}

/// Sum of weights per class for one interleaved run of the live mixture.
fn estimate(seed: u64) -> [f64; 4] {
    let mut s = Sampler::new(seed, R);
    let mut est = [0.0; 4];
    let mut left: Vec<u64> = MIXTURE.iter().map(|c| c.count).collect();
    // Interleave the classes deterministically (allocation order must not
    // matter for an unbiased per-allocation estimator).
    let mut rng = seed | 1;
    while left.iter().any(|&l| l > 0) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let total: u64 = left.iter().sum();
        let mut pick = rng % total;
        let k = left
            .iter()
            .position(|&l| {
                if pick < l {
                    true
                } else {
                    pick -= l;
                    false
                }
            })
            .unwrap();
        left[k] -= 1;
        let size = MIXTURE[k].size;
        if s.should_sample(size as usize) {
            est[k] += weight(size, R) as f64;
        }
    }
    est
}

#[test]
fn live_mixture_weights_are_unbiased_per_call_site_and_in_total() {
    let truth: Vec<f64> = MIXTURE.iter().map(|c| (c.size * c.count) as f64).collect();
    let sigma: Vec<f64> = MIXTURE
        .iter()
        .map(|c| variance(c.size, c.count).sqrt())
        .collect();
    let total_truth: f64 = truth.iter().sum();
    let total_sigma = MIXTURE
        .iter()
        .map(|c| variance(c.size, c.count))
        .sum::<f64>()
        .sqrt();
    let runs = 20;
    let mut mean_total = 0.0;
    for seed in 0..runs {
        let est = estimate(0xa110c + seed);
        // Separate call sites: each class on its own.
        for k in 0..MIXTURE.len() {
            // Weight rounding adds < 1 byte per sample.
            let tol = Z * sigma[k] + 64.0;
            assert!(
                (est[k] - truth[k]).abs() <= tol,
                "seed {seed} class {k}: estimate {} truth {} tol {tol}",
                est[k],
                truth[k]
            );
        }
        // One call site: the sum.
        let total: f64 = est.iter().sum();
        assert!(
            (total - total_truth).abs() <= Z * total_sigma + 256.0,
            "seed {seed}: total {total} truth {total_truth} sigma {total_sigma}"
        );
        mean_total += total / runs as f64;
    }
    // The average of independent runs tightens by sqrt(runs).
    let tol = Z * total_sigma / (runs as f64).sqrt() + 256.0;
    assert!(
        (mean_total - total_truth).abs() <= tol,
        "mean {mean_total} truth {total_truth}"
    );
}

/// The allocator's budget (`allocator::budget`): each sampled allocation
/// kept 1 in the process's factor k (decided from the window before its own
/// draw) and counted k·w. Over independent runs of a busy process (factor
/// 8–32, rising and falling with bursts), the sum of kept weights is
/// unbiased, and the per-sample variance `w'(w' − size)` the kernel sums
/// (the Horvitz–Thompson term of inclusion probability p/k) matches the
/// runs' empirical variance.
#[test]
fn thinned_weights_stay_unbiased_with_the_variance_the_kernel_sums() {
    use allocator::budget::{Window, thin};
    const RATE: u64 = 4096;
    const BUDGET: u64 = 1000;
    let sizes = [64u64, 64, 64, 200, 64, 64, 3000, 64];
    let n = 400_000u64;
    let truth: f64 = (0..n).map(|i| sizes[i as usize % sizes.len()] as f64).sum();
    let runs = 200;
    let (mut sum, mut sum2, mut var_est, mut kept, mut factors) = (0.0, 0.0, 0.0, 0u64, 0u64);
    for run in 0..runs {
        let mut s = Sampler::new(0xb0d9e7 + run, RATE);
        let w = Window::new();
        let (mut x, mut v) = (0.0, 0.0);
        let mut now = 1_000u64;
        for i in 0..n {
            let size = sizes[i as usize % sizes.len()];
            // Bursts: a quarter of the time 10× the allocation rate.
            now += if (i / 50_000) % 4 == 1 { 100 } else { 1_000 };
            if !s.should_sample(size as usize) {
                continue;
            }
            let weight = weight(size, RATE);
            let factor = w.step(now, BUDGET);
            factors = factors.max(factor);
            if let Some(wt) = thin(factor, weight, s.draw()) {
                let wt = wt as f64;
                x += wt;
                v += wt * (wt - size as f64);
                kept += 1;
            }
        }
        sum += x;
        sum2 += x * x;
        var_est += v;
    }
    let runs = runs as f64;
    let mean = sum / runs;
    let var = (sum2 - sum * sum / runs) / (runs - 1.0);
    let var_est = var_est / runs;
    assert!(
        factors >= 8,
        "the budget never thinned much: factor {factors}"
    );
    assert!(kept as f64 / runs < 2.0 * BUDGET as f64, "{kept} kept");
    // Mean within 4σ of the truth (σ of the mean of the runs).
    let tol = Z * (var / runs).sqrt();
    assert!(
        (mean - truth).abs() <= tol,
        "mean {mean} truth {truth} ± {tol}"
    );
    // The empirical variance of `runs` normal-ish sums has a relative
    // standard error of √(2/(runs−1)) = 10%: 4 of them either side.
    let rel = Z * (2.0 / (runs - 1.0)).sqrt();
    assert!(
        (var_est / var - 1.0).abs() <= rel,
        "estimated variance {var_est}, empirical {var} (±{:.0}%)",
        rel * 100.0
    );
}

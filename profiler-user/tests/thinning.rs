//! Is back-pressure (`--max-event-rate`) unbiased? The kernel keeps 1 in a
//! power of two of a process's sampled allocations (`thin_step`, decided
//! from the events before each one), draws with the low bits of a random
//! word, and counts each kept one `SampleDelta::thinned`. This runs
//! that very logic on the host, with a seeded generator in place of
//! `bpf_get_prandom_u32` and timestamps in place of the clock, over many
//! runs of a bursty stream at factors 16–32, and compares each run's
//! estimate with the unthinned one of the same events (what a session
//! without back-pressure would count): exact and untimed.

use allocator::sampler::{splitmix64, weight};
use profiler_common::{SampleDelta, ThinStep, thin_step, variance_in_bytes2};

const R: u64 = 524_288;
const RUNS: u64 = 400;
/// One second of events per run: 50 ms at 200k/s, 50 ms at 400k/s.
const SECONDS: u64 = 1;
/// 1,500 kept events per 100 ms window: factor 16 at 200k/s, 32 at 400k/s.
const BUDGET: u64 = 15_000;

struct Run {
    /// The unthinned estimate of the events, and the thinned one.
    full: f64,
    thinned: f64,
    /// The thinning's own variance (`Σ w'(w' − w)`): given the events.
    thin_var: f64,
    events: u64,
    kept: u64,
    /// Kept events by factor: 16, 32, other (the first window's ramp).
    by_factor: [u64; 3],
}

fn run(seed: u64) -> Run {
    let mut rng = seed;
    let mut st = ThinStep {
        window_ns: 0,
        window_events: 0,
        factor: 1,
    };
    let mut r = Run {
        full: 0.0,
        thinned: 0.0,
        thin_var: 0.0,
        events: 0,
        kept: 0,
        by_factor: [0; 3],
    };
    let start = 1_000_000_000 + splitmix64(&mut rng) % 100_000_000;
    let mut now = start;
    while now < start + SECONDS * 1_000_000_000 {
        let rate: f64 = if (now / 50_000_000).is_multiple_of(2) {
            200e3
        } else {
            400e3
        };
        // Exponential gaps: a Poisson stream at `rate`.
        let u = ((splitmix64(&mut rng) >> 11) + 1) as f64 / (1u64 << 53) as f64;
        now += (-u.ln() * 1e9 / rate) as u64 + 1;
        // Sampled allocations of 16 B – 64 KiB, weighted as the allocator.
        let size = 16 + splitmix64(&mut rng) % (64 << 10);
        let w = weight(size, R);
        r.full += w as f64;
        r.events += 1;
        st = thin_step(st.window_ns, st.window_events, st.factor, now, BUDGET);
        let factor = st.factor;
        // The kernel's draw: `bpf_get_prandom_u32() & (factor - 1) != 0`.
        let draw = u64::from(splitmix64(&mut rng) as u32);
        if factor > 1 && draw & (factor - 1) != 0 {
            continue;
        }
        let d = SampleDelta::thinned(size, w, factor);
        r.thinned += d.bytes as f64;
        r.thin_var += variance_in_bytes2(d.thin_var);
        r.kept += 1;
        r.by_factor[match factor {
            16 => 0,
            32 => 1,
            _ => 2,
        }] += 1;
    }
    r
}

#[test]
fn back_pressure_at_factors_16_to_32_is_unbiased() {
    let runs: Vec<Run> = (0..RUNS).map(|i| run(0x7417_0000 + i)).collect();
    let n = RUNS as f64;
    // Per run: the thinned estimate's relative difference, and its
    // standardized error by the variance the profile would show.
    let rel: Vec<f64> = runs.iter().map(|r| r.thinned / r.full - 1.0).collect();
    let z: Vec<f64> = runs
        .iter()
        .map(|r| (r.thinned - r.full) / r.thin_var.sqrt())
        .collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let sd = |v: &[f64]| {
        let m = mean(v);
        (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() as f64 - 1.0)).sqrt()
    };
    let (mean_rel, se_rel) = (mean(&rel), sd(&rel) / n.sqrt());
    let (mean_z, sd_z) = (mean(&z), sd(&z));
    let events: u64 = runs.iter().map(|r| r.events).sum();
    let kept: u64 = runs.iter().map(|r| r.kept).sum();
    let by: [u64; 3] = [0, 1, 2].map(|i| runs.iter().map(|r| r.by_factor[i]).sum());
    eprintln!(
        "{RUNS} runs, {events} events, {kept} kept (at 16: {}, at 32: {}, other: {}); \
         thinned / unthinned − 1: mean {:+.4}% ± {:.4}% (1 σ), per run sd {:.3}%; \
         z: mean {mean_z:+.3}, sd {sd_z:.3}",
        by[0],
        by[1],
        by[2],
        100.0 * mean_rel,
        100.0 * se_rel,
        100.0 * sd(&rel),
    );
    // Mostly at the factors of the observation (the rest: each run's
    // first window, ramping up from 1).
    assert!(by[0] + by[1] > 2 * by[2], "{by:?}");
    // No bias: the mean within 4 standard errors of 0, and the standard
    // error small enough that the observed −1.4% would stand 20σ out.
    assert!(mean_rel.abs() < 4.0 * se_rel, "{mean_rel} ± {se_rel}");
    assert!(se_rel < 0.0007, "{se_rel}");
    // And the intervals match the spread: z has mean 0 and sd 1.
    assert!(mean_z.abs() < 4.0 / n.sqrt(), "{mean_z}");
    assert!((0.9..1.1).contains(&sd_z), "{sd_z}");
}

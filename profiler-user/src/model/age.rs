//! Leaks by age: each live sample carries its allocation time (the
//! kernel's CLOCK_MONOTONIC), so the live bytes of a stack split by how
//! long they have been live. A leak's samples only grow older; a cache's
//! are replaced. Pure: the kernel's live samples and a clock reading in,
//! per-image-and-stack figures out.

use std::time::Duration;

use profiler_common::{AggKey, LiveKey, LiveSample, StackAgg};

/// The ages the views show live bytes past.
pub const OLD: Duration = Duration::from_secs(60);
pub const VERY_OLD: Duration = Duration::from_secs(600);

/// Live bytes of a stack by age (unbiased, like the live bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Ages {
    /// Live bytes allocated more than [`OLD`] ago.
    pub over_old: f64,
    /// Live bytes allocated more than [`VERY_OLD`] ago.
    pub over_very_old: f64,
    /// The oldest live sample's age (zero without samples).
    pub oldest: Duration,
}

impl Ages {
    /// Sums two stacks' figures (merged stacks, process totals).
    pub fn merge(&mut self, o: &Ages) {
        self.over_old += o.over_old;
        self.over_very_old += o.over_very_old;
        self.oldest = self.oldest.max(o.oldest);
    }
}

/// What the live samples say per (process image, stack).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StackAges {
    pub ages: Ages,
    /// The live sums of the samples older than the minimum age (see
    /// [`by_stack`]), in the kernel's aggregate form.
    pub old_enough: StackAgg,
}

/// [`StackAges`] of every (process image, stack) with live samples, sorted
/// by key: a system-wide agent holds one per stack of every process (65,000
/// at its load benchmark), kept from one profile to the next, and a hash
/// map of them (with `old_enough`, needed only for `--min-age`) was 17 MB.
#[derive(Debug, Default)]
pub struct AgesByStack {
    keys: Vec<AggKey>,
    ages: Vec<Ages>,
    /// Empty when the minimum age is zero (every sample is old enough).
    old_enough: Vec<StackAgg>,
}

impl AgesByStack {
    pub fn get(&self, key: &AggKey) -> Option<StackAges> {
        let i = self
            .keys
            .binary_search_by_key(&Self::order(key), Self::order)
            .ok()?;
        Some(StackAges {
            ages: self.ages[i],
            old_enough: self.old_enough.get(i).copied().unwrap_or_default(),
        })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn order(key: &AggKey) -> (u32, u32, u64) {
        (key.pid, key.generation, key.stack_id)
    }
}

/// The live samples' ages per (pid, generation, stack) at `now_ns` (same
/// clock as the samples'); `old_enough` sums those allocated at least
/// `min_age` ago (kept only for a non-zero `min_age`). A sample stamped
/// after `now_ns` (read after the clock) counts as age zero.
pub fn by_stack(live: &[(LiveKey, LiveSample)], now_ns: u64, min_age: Duration) -> AgesByStack {
    let key_of = |(key, sample): &(LiveKey, LiveSample)| AggKey {
        pid: key.pid,
        generation: sample.generation,
        stack_id: sample.stack_id,
    };
    let mut order: Vec<u32> = (0..live.len() as u32).collect();
    order.sort_unstable_by_key(|&i| AgesByStack::order(&key_of(&live[i as usize])));
    let mut out = AgesByStack::default();
    let keep_old_enough = !min_age.is_zero();
    for i in order {
        let (key, sample) = (key_of(&live[i as usize]), &live[i as usize].1);
        if out.keys.last() != Some(&key) {
            out.keys.push(key);
            out.ages.push(Ages::default());
            if keep_old_enough {
                out.old_enough.push(StackAgg::default());
            }
        }
        let age = Duration::from_nanos(now_ns.saturating_sub(sample.allocated_ns));
        let ages = out.ages.last_mut().expect("pushed above");
        // The kernel's own arithmetic, so the sums mean what its do.
        let d = sample.delta();
        let weight = d.bytes as f64;
        if age >= OLD {
            ages.over_old += weight;
        }
        if age >= VERY_OLD {
            ages.over_very_old += weight;
        }
        ages.oldest = ages.oldest.max(age);
        if let Some(old) = out.old_enough.last_mut()
            && age >= min_age
        {
            old.live_bytes = old.live_bytes.wrapping_add(d.bytes);
            old.live_objects = old.live_objects.wrapping_add(d.objects);
            old.live_var = old.live_var.wrapping_add(d.var);
            old.live_thin_var = old.live_thin_var.wrapping_add(d.thin_var);
            old.live_samples += 1;
        }
    }
    out.keys.shrink_to_fit();
    out.ages.shrink_to_fit();
    out.old_enough.shrink_to_fit();
    out
}

/// CLOCK_MONOTONIC now, in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the current time into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::SampleDelta;

    fn sample(stack_id: u64, weight: u64, allocated_s: u64) -> (LiveKey, LiveSample) {
        (
            LiveKey {
                pid: 7,
                _pad: 0,
                ptr: stack_id * 1000 + allocated_s,
            },
            LiveSample {
                stack_id,
                size: 64,
                weight,
                generation: 1,
                thin_factor: 0,
                allocated_ns: allocated_s * 1_000_000_000,
            },
        )
    }

    #[test]
    fn live_bytes_split_by_age_and_the_oldest_is_kept() {
        let now = 1000 * 1_000_000_000;
        let live = [
            sample(1, 100, 1000), // just now
            sample(1, 200, 930),  // 70 s
            sample(1, 400, 300),  // 700 s
            sample(2, 800, 999),
        ];
        let ages = by_stack(&live, now, Duration::from_secs(5));
        let key = |stack_id| AggKey {
            pid: 7,
            generation: 1,
            stack_id,
        };
        let a = ages.get(&key(1)).unwrap();
        assert_eq!(a.ages.over_old, 600.0);
        assert_eq!(a.ages.over_very_old, 400.0);
        assert_eq!(a.ages.oldest, Duration::from_secs(700));
        assert_eq!(a.old_enough.live_bytes, 600, "older than 5 s");
        assert_eq!(a.old_enough.live_samples, 2);
        let expected_var = SampleDelta::of(64, 200).var + SampleDelta::of(64, 400).var;
        assert_eq!(a.old_enough.live_var, expected_var);
        let b = ages.get(&key(2)).unwrap();
        assert_eq!(
            b.ages,
            Ages {
                over_old: 0.0,
                over_very_old: 0.0,
                oldest: Duration::from_secs(1),
            }
        );
        assert_eq!(b.old_enough, StackAgg::default(), "1 s is younger than 5 s");
    }

    #[test]
    fn samples_stamped_after_the_clock_reading_are_new() {
        let ages = by_stack(&[sample(1, 100, 10)], 5_000_000_000, Duration::ZERO);
        let key = AggKey {
            pid: 7,
            generation: 1,
            stack_id: 1,
        };
        assert_eq!(ages.get(&key).unwrap().ages.oldest, Duration::ZERO);
        assert_eq!(ages.len(), 1);
    }

    #[test]
    fn stacks_of_several_processes_in_any_order_are_each_found() {
        let mut live = Vec::new();
        for (pid, stack_id, weight) in [(9, 3, 1), (7, 5, 2), (9, 3, 4), (7, 1, 8), (8, 5, 16)] {
            let (mut key, sample) = sample(stack_id, weight, 1);
            key.pid = pid;
            live.push((key, sample));
        }
        let ages = by_stack(&live, 100 * 1_000_000_000, Duration::ZERO);
        assert_eq!(ages.len(), 4);
        let over_old = |pid, stack_id| {
            let key = AggKey {
                pid,
                generation: 1,
                stack_id,
            };
            ages.get(&key).map(|a| a.ages.over_old)
        };
        assert_eq!(over_old(9, 3), Some(5.0));
        assert_eq!(over_old(7, 5), Some(2.0));
        assert_eq!(over_old(7, 1), Some(8.0));
        assert_eq!(over_old(8, 5), Some(16.0));
        assert_eq!(over_old(8, 3), None);
    }

    #[test]
    fn merging_sums_bytes_and_keeps_the_oldest() {
        let mut a = Ages {
            over_old: 1.0,
            over_very_old: 0.0,
            oldest: Duration::from_secs(90),
        };
        a.merge(&Ages {
            over_old: 2.0,
            over_very_old: 2.0,
            oldest: Duration::from_secs(700),
        });
        assert_eq!(a.over_old, 3.0);
        assert_eq!(a.over_very_old, 2.0);
        assert_eq!(a.oldest, Duration::from_secs(700));
    }
}

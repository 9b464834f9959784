//! The per-CPU scratch protocol: programs that can preempt each other
//! claim a shared scratch buffer with an add and a read (no compare-and-swap
//! in the kernel), and at most one of them owns it.

/// A shared counter of walks claiming a scratch buffer: an atomic add and
/// an atomic read (the kernel side has no compare-and-swap).
pub trait ClaimCounter {
    fn add(&self, v: u64);
    fn load(&self) -> u64;
}

/// Claims a scratch buffer shared by programs that can preempt each other
/// (uprobe programs on one CPU): claim, then look. Only a claimant that sees
/// its own claim alone owns it; two racing claimants may both back off, but
/// never both proceed. Release with [`release_claim`] after a `true`.
#[inline(always)]
pub fn try_claim<C: ClaimCounter>(claims: &C) -> bool {
    claims.add(1);
    if claims.load() == 1 {
        return true;
    }
    claims.add(u64::MAX); // wrapping -1: withdraw our claim
    false
}

#[inline(always)]
pub fn release_claim<C: ClaimCounter>(claims: &C) {
    claims.add(u64::MAX);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_scratch_has_one_owner_at_a_time() {
        extern crate std;
        use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::{sync::Arc, thread, vec::Vec};

        struct Counter(AtomicU64);
        impl ClaimCounter for Counter {
            fn add(&self, v: u64) {
                self.0.fetch_add(v, Ordering::SeqCst);
            }
            fn load(&self) -> u64 {
                self.0.load(Ordering::SeqCst)
            }
        }
        let claims = Arc::new(Counter(AtomicU64::new(0)));
        let in_use = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let (claims, in_use) = (claims.clone(), in_use.clone());
                thread::spawn(move || {
                    let mut owned = 0u32;
                    for _ in 0..100_000 {
                        if try_claim(&*claims) {
                            assert!(!in_use.swap(true, Ordering::SeqCst), "two owners");
                            owned += 1;
                            core::hint::spin_loop();
                            in_use.store(false, Ordering::SeqCst);
                            release_claim(&*claims);
                        }
                    }
                    owned
                })
            })
            .collect();
        let owned: u32 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert!(owned > 0, "nobody ever owned the scratch");
        assert_eq!(claims.load(), 0, "every claim withdrawn or released");
    }
}

//! The Rust side of `cargo xtask bench alloc`: the C benchmark's workloads
//! (xtask/src/bench_alloc.rs) through the global allocator, built twice
//! (`alloc_bench_system`, `alloc_bench_sampling`) so that
//! `SamplingAllocator<System>` is compared with `System` itself.
//! Arguments: `MODE ITERS`; prints `<ns per malloc/free pair> <samples>`.
//! Every block stores its size in its first word, so frees (from any
//! thread) know the layout, and every block is touched.

use std::alloc::{Layout, alloc, dealloc};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::Instant;

fn xs(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn new_block(n: usize) -> *mut u8 {
    let n = n.max(8);
    // SAFETY: non-zero size, valid alignment; the block is at least 8
    // bytes and 8-aligned, so its first word is writable.
    unsafe {
        let p = alloc(Layout::from_size_align_unchecked(n, 8));
        assert!(!p.is_null(), "out of memory");
        p.cast::<usize>().write_volatile(n);
        p
    }
}

fn free_block(p: *mut u8) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` came from `new_block`, which stored the size it used.
    unsafe {
        let n = p.cast::<usize>().read();
        dealloc(p, Layout::from_size_align_unchecked(n, 8));
    }
}

/// Churn over `slots` live blocks: free a random one, allocate its
/// replacement. Sizes from `size(r)`.
fn churn(iters: u64, slots: usize, seed: u64, size: impl Fn(u64) -> usize) -> f64 {
    let mut win = vec![ptr::null_mut::<u8>(); slots];
    let mut s = seed;
    let t = Instant::now();
    for _ in 0..iters {
        let r = xs(&mut s);
        let k = ((r >> 32) % slots as u64) as usize;
        free_block(win[k]);
        win[k] = new_block(size(r));
    }
    let ns = t.elapsed().as_nanos() as f64 / iters as f64;
    win.into_iter().for_each(free_block);
    ns
}

fn small(r: u64) -> usize {
    8 + ((r >> 8) % 249) as usize
}

/// 95% 8-256 B, 5% 257 B-16 KiB.
fn churn_sizes(r: u64) -> usize {
    if (r & 0xff) < 243 {
        8 + ((r >> 8) % 249) as usize
    } else {
        257 + ((r >> 8) % 16128) as usize
    }
}

/// 88% 8-255 B, 12% 256 B-8 KiB, 0.4% 8 KiB-256 KiB (the C `mixed`).
fn mixed(r: u64) -> usize {
    let c = (r >> 8) & 1023;
    let x = (r >> 20) as usize;
    if c < 900 {
        8 + x % 248
    } else if c < 1020 {
        256 + x % 8000
    } else {
        8192 + x % 250000
    }
}

const RING: usize = 4096;

/// Two threads, each allocating into its ring and freeing what the other
/// allocated.
fn threads2(iters: u64) -> f64 {
    let rings: Vec<Vec<AtomicPtr<u8>>> = (0..2)
        .map(|_| (0..RING).map(|_| AtomicPtr::new(ptr::null_mut())).collect())
        .collect();
    let t = Instant::now();
    std::thread::scope(|sc| {
        for me in 0..2 {
            let rings = &rings;
            sc.spawn(move || {
                let mut s = 7 + me as u64;
                for i in 0..iters as usize {
                    let k = i & (RING - 1);
                    let p = new_block(8 + (xs(&mut s) % 249) as usize);
                    free_block(rings[me][k].swap(p, Ordering::AcqRel));
                    let q =
                        rings[1 - me][(k * 7) & (RING - 1)].swap(ptr::null_mut(), Ordering::AcqRel);
                    free_block(q);
                }
            });
        }
    });
    let ns = t.elapsed().as_nanos() as f64 / iters as f64;
    for ring in &rings {
        for slot in ring {
            free_block(slot.swap(ptr::null_mut(), Ordering::Relaxed));
        }
    }
    ns
}

/// `threads` threads, each churning 20,000 live blocks of `churn_sizes`.
fn churn_threads(iters: u64, threads: u64) -> f64 {
    let t = Instant::now();
    std::thread::scope(|sc| {
        for i in 0..threads {
            sc.spawn(move || churn(iters, 20_000, 88172645463325252 + i, churn_sizes));
        }
    });
    t.elapsed().as_nanos() as f64 / iters as f64
}

pub fn main(samples: fn() -> u64) {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map_or("small", String::as_str);
    let iters: u64 = args
        .get(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000_000);
    let ns = match mode {
        "small" => churn(iters, 256, 1, small),
        "mixed" => churn(iters, 256, 99, mixed),
        "threads2" => threads2(iters),
        "churn-1t" => churn_threads(iters, 1),
        "churn-2t" => churn_threads(iters, 2),
        _ => panic!("unknown mode {mode}"),
    };
    println!("{ns:.3} {}", samples());
}

//! The Rust twin of tests/workloads/alloc_sites.c, built with the allocprof
//! global allocator: known sites of very different sizes and counts.
//! Protocol: waits for a line, allocates, prints "ready", waits, exits.

use std::{alloc::System, hint::black_box, io::BufRead};

use allocator::SamplingAllocator;

#[global_allocator]
static GLOBAL: SamplingAllocator<System> = SamplingAllocator::new(System);

// Each site fills a container made by the caller, so that the container's
// own allocation is not charged to the site.

#[inline(never)]
fn site_small(out: &mut Vec<Vec<u8>>) {
    for _ in 0..200_000 {
        out.push(Vec::with_capacity(64));
    }
}

#[inline(never)]
fn site_medium(out: &mut Vec<Vec<u8>>) {
    for _ in 0..2_000 {
        out.push(Vec::with_capacity(8192));
    }
}

#[inline(never)]
fn site_large(out: &mut Vec<Vec<u8>>) {
    for _ in 0..8 {
        out.push(vec![1u8; 1 << 20]);
    }
}

#[inline(never)]
fn site_freed() {
    for _ in 0..100_000 {
        black_box(Vec::<u8>::with_capacity(256));
    }
}

fn main() {
    let mut lines = std::io::stdin().lock().lines();
    let (mut small, mut medium, mut large) = (
        Vec::with_capacity(200_000),
        Vec::with_capacity(2_000),
        Vec::with_capacity(8),
    );
    lines.next();
    site_small(&mut small);
    site_medium(&mut medium);
    site_large(&mut large);
    site_freed();
    println!("ready");
    lines.next();
    black_box((small, medium, large));
}

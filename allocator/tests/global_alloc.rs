//! `SamplingAllocator` as this test binary's global allocator. The rate is
//! read from the environment at the first allocation (before `main`), so the
//! test re-executes itself with `ALLOCPROF_RATE` set.

use std::alloc::System;
use std::process::Command;

use allocator::{SamplingAllocator, sample_region, stats};

#[global_allocator]
static GLOBAL: SamplingAllocator<System> = SamplingAllocator::new(System);

const CHILD: &str = "ALLOCPROF_TEST_CHILD";

fn exercise() {
    let before = stats();
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    for i in 0..2000usize {
        let mut v = vec![i as u8; 100 + i * 37];
        v.extend_from_slice(&[1, 2, 3]); // realloc
        blocks.push(v);
    }
    // Over-aligned allocations through the wrapper.
    #[repr(align(8192))]
    struct Big([u8; 8192]);
    let boxes: Vec<Box<Big>> = (0..50).map(|_| Box::new(Big([7; 8192]))).collect();
    for b in &boxes {
        assert_eq!(std::ptr::from_ref::<Big>(b.as_ref()) as usize % 8192, 0);
        assert!(b.0.iter().all(|&x| x == 7));
    }
    let zeroed = vec![0u64; 1 << 16];
    assert!(zeroed.iter().all(|&x| x == 0));
    let handles: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                (0..5000)
                    .map(|i| vec![t as u8; i % 700])
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let from_threads: Vec<Vec<Vec<u8>>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (i, v) in blocks.iter().enumerate() {
        assert_eq!(v.len(), 100 + i * 37 + 3);
        assert!(v[..v.len() - 3].iter().all(|&x| x == i as u8));
    }
    let in_region = blocks
        .iter()
        .filter(|v| sample_region::contains(v.as_ptr()))
        .count();
    drop((blocks, boxes, zeroed, from_threads));
    let after = stats();
    println!("in_region={in_region} {before:?} -> {after:?}");
    match std::env::var("ALLOCPROF_RATE").as_deref() {
        Ok("1") => {
            assert!(in_region > 1900, "rate 1: only {in_region} of 2000 sampled");
            assert!(after.sampled - before.sampled > 10_000);
        }
        Ok("0") => assert_eq!(after.sampled, 0),
        _ => assert!(after.sampled > before.sampled, "default rate never sampled"),
    }
    assert_eq!(after.unplaced_samples, 0);
}

#[test]
fn sampling_global_allocator() {
    if std::env::var_os(CHILD).is_some() {
        exercise();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for rate in ["1", "4k", "0", "64k"] {
        let out = Command::new(&exe)
            .args([
                "--exact",
                "sampling_global_allocator",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .env("ALLOCPROF_RATE", rate)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rate {rate}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn rust_binary_exports_no_malloc() {
    // The wrapper must not define C malloc in the user's binary.
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("nm")
        .arg("-D")
        .arg("--defined-only")
        .arg(&exe)
        .output();
    let Ok(out) = out else {
        panic!("`nm` not found: install it with `apt-get install binutils`");
    };
    let text = String::from_utf8_lossy(&out.stdout);
    for sym in ["malloc", "free", "calloc", "realloc"] {
        assert!(
            !text.lines().any(|l| l.ends_with(&format!(" {sym}"))),
            "binary defines {sym}"
        );
    }
}

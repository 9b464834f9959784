use super::*;

#[test]
fn classes_and_layouts() {
    assert_eq!(class_for(1, 16), Some(0));
    assert_eq!(class_for(2, 16), Some(1));
    assert_eq!(class_for(3, 16), Some(2));
    assert_eq!(class_for(1, 8192), Some(1));
    assert_eq!(class_for(1, MAX_ALIGN), Some(15));
    assert_eq!(class_for(1, MAX_ALIGN * 2), None);
    assert_eq!(class_for(MAX_SLOT / PAGE, 16), Some(CLASS_COUNT - 1));
    assert_eq!(class_for(MAX_SLOT / PAGE + 1, 16), None);
    let full = layout(0);
    assert_eq!(full.classes, CLASS_COUNT);
    assert_eq!(full.len, 100 << 30);
    assert_eq!(full.slots[10], 1024); // 4 MiB slots
    assert_eq!(full.slots[16], 16); // 256 MiB
    assert_eq!(full.slots[18], 4); // 1 GiB
    assert_eq!(full.slots[20], 4); // 4 GiB
    for (s, l) in LAYOUTS.iter().enumerate() {
        assert!(l.classes >= 12, "layout {s}");
        if s > 0 {
            assert!(l.len < LAYOUTS[s - 1].len, "layout {s} shrinks");
        }
        assert_eq!(l.len % MAX_ALIGN, 0);
        for k in 0..l.classes {
            assert!(l.slots[k] >= 1);
            assert_eq!(l.offset[k] % slot_bytes(k).min(MAX_ALIGN), 0);
            let end = l.offset[k] + l.slots[k] * slot_bytes(k);
            assert!(end <= l.len);
            if k + 1 < l.classes {
                assert!(end <= l.offset[k + 1], "layout {s} class {k}");
            }
        }
    }
    // Under `ulimit -v 8000000` (a quarter: ~1.9 GiB) a layout with
    // every class up to 128 MiB still fits.
    let fits = LAYOUTS
        .iter()
        .find(|l| l.len + MAX_ALIGN < 1900 << 20)
        .unwrap();
    assert_eq!(fits.classes, 16);
}

#[test]
fn warm_limits() {
    assert_eq!(warm_limit(0), 32);
    assert_eq!(warm_limit(3), 32); // 32 x 32 KiB = 1 MiB
    assert_eq!(warm_limit(4), 16);
    assert_eq!(warm_limit(8), 1);
    assert_eq!(warm_limit(9), 0);
    assert_eq!(warm_limit(CLASS_COUNT - 1), 0);
    let total: usize = (0..CLASS_COUNT)
        .map(|k| warm_limit(k) as usize * slot_bytes(k))
        .sum();
    assert!(total <= 7 << 20, "{total}");
    // Live samples raise the limit of the small-slot classes only.
    assert_eq!(warm_limit_with_live(0, 100), 132);
    assert_eq!(warm_limit_with_live(3, 100), 132);
    assert_eq!(warm_limit_with_live(4, 100), 16);
    assert_eq!(warm_limit_with_live(8, 3), 1);
    assert_eq!(warm_limit_with_live(9, 100), 0);
    assert_eq!(warm_limit_with_live(0, u32::MAX), u32::MAX);
    // From 2 MiB slots up, the process-wide byte budget decides.
    assert_eq!(slot_bytes(FIRST_BIG_CLASS), 2 << 20);
    assert_eq!(warm_limit(FIRST_BIG_CLASS - 1), 1);
}

/// Resident pages of `[p, p + len)` (mincore).
fn resident(p: *mut u8, len: usize) -> usize {
    let mut v = vec![0u8; len / PAGE];
    // SAFETY: p is page aligned and mapped; v holds len/PAGE entries.
    let rc = unsafe { libc::mincore(p.cast(), len, v.as_mut_ptr()) };
    assert_eq!(rc, 0);
    v.iter().filter(|&&b| b & 1 != 0).count()
}

/// Runs test `name` again in a child process with `env` set, for tests
/// that need a region in another mode or with class state of their own
/// (the region is process-wide, and the harness runs tests in
/// parallel). Returns true in the child.
fn in_child(name: &str, env: &str) -> bool {
    if std::env::var_os(env).is_some() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(env, "1")
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "child {name}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

// All tests of the default region in one function: the region and its
// caches are process-wide and the test harness runs tests in parallel.
#[test]
fn alloc_free_reuse_and_alignment() {
    let p = alloc(100, 16, 7, false).expect("placed");
    assert!(contains(p));
    assert_eq!(p as usize % PAGE, 0);
    assert_eq!(block_info(p), (100, 7));
    assert_eq!(usable_size(p), PAGE);
    // SAFETY: p has PAGE usable bytes.
    unsafe { p.write_bytes(0xab, PAGE) };
    assert_eq!(free(p).map(|c| (c.size, c.sampled)), Ok((100, true)));

    let q = alloc(3 * PAGE + 1, 1 << 20, 1, false).expect("placed");
    assert_eq!(q as usize % (1 << 20), 0);
    assert_eq!(usable_size(q), 4 * PAGE);
    assert_eq!(free(q).map(|c| c.size), Ok(3 * PAGE + 1));
    assert_eq!(free(q), Err(BadFree::DoubleFree));
    // SAFETY: q + PAGE is inside q's slot.
    assert_eq!(free(unsafe { q.add(PAGE) }), Err(BadFree::InvalidPointer));
    assert!(alloc(MAX_SLOT + 1, 16, 1, false).is_none());
    assert!(alloc(PAGE, MAX_ALIGN * 2, 1, false).is_none());
    assert!(!contains(ptr::null()));

    // Warm reuse: class 2 (3-4 pages) keeps freed slots resident while
    // its warm count is below the fixed limit plus its live samples;
    // `zero` clears stale contents of a warm slot. Freeing `n` live blocks
    // in order keeps the i-th (0-based) warm while i < fixed + (n - 1 - i).
    let k = 2;
    let fixed = warm_limit(k) as usize;
    let n = 2 * fixed + 8;
    let kept = (0..n).filter(|&i| i < fixed + (n - 1 - i)).count();
    assert!(kept < n, "some frees must overflow the warm cache");
    let blocks: Vec<*mut u8> = (0..n)
        .map(|_| {
            let b = alloc(3 * PAGE, 16, 1, true).expect("placed");
            // SAFETY: 3 pages usable; the block reads as zero.
            unsafe {
                assert!(
                    core::slice::from_raw_parts(b, 3 * PAGE)
                        .iter()
                        .all(|&x| x == 0)
                );
                b.write_bytes(0x5a, 3 * PAGE);
            }
            b
        })
        .collect();
    for &b in &blocks {
        assert_eq!(resident(b, 4 * PAGE), 3);
        free(b).unwrap();
    }
    // The first `kept` frees stayed warm, the rest were released.
    let warm = blocks[..kept]
        .iter()
        .filter(|&&b| resident(b, 4 * PAGE) == 3)
        .count();
    assert_eq!(warm, kept);
    for &b in &blocks[kept..] {
        assert_eq!(resident(b, 4 * PAGE), 0);
    }
    // Reuse order: warm slots first (stale data unless `zero`), then
    // cold ones (zero pages).
    let again: Vec<*mut u8> = (0..n)
        .map(|i| alloc(4 * PAGE, 16, 1, i % 2 == 0).expect("placed"))
        .collect();
    for (i, &b) in again.iter().enumerate() {
        assert!(blocks.contains(&b), "reused a freed slot");
        // SAFETY: 4 pages usable.
        let bytes = unsafe { core::slice::from_raw_parts(b, 4 * PAGE) };
        let was_warm = i < kept;
        if i % 2 == 0 || !was_warm {
            assert!(bytes.iter().all(|&x| x == 0), "block {i}");
        } else {
            assert!(bytes[..3 * PAGE].iter().all(|&x| x == 0x5a), "block {i}");
        }
    }
    for &b in &again {
        free(b).unwrap();
    }

    // calloc of a warm slot clears every usable byte, as glibc's does, not
    // only the `size` asked for.
    // (Class 3: no other test of this process uses it.)
    let size = 5 * PAGE + 100;
    let a = alloc(size, 16, 1, false).expect("placed");
    assert_eq!(usable_size(a), 6 * PAGE);
    // SAFETY: a has 6 usable pages.
    unsafe { a.write_bytes(0xee, usable_size(a)) };
    free(a).unwrap();
    let b = alloc(size, 16, 1, true).expect("placed");
    assert_eq!(a, b, "the warm slot is reused");
    // SAFETY: b has usable_size(b) bytes.
    let bytes = unsafe { core::slice::from_raw_parts(b, usable_size(b)) };
    assert!(bytes.iter().all(|&x| x == 0), "stale bytes past the size");
    free(b).unwrap();

    // Big slots stay warm within WARM_BIG_BYTES: a 4 MiB block freed and
    // asked for again comes back resident; of many freed at once, at most
    // the budget stays resident.
    let mib = 1 << 20;
    let c = alloc(4 * mib, 16, 1, false).expect("placed");
    // SAFETY: 4 MiB usable.
    unsafe { c.write_bytes(1, 4 * mib) };
    free(c).unwrap();
    assert_eq!(resident(c, 4 * mib), 4 * mib / PAGE, "kept warm");
    let d = alloc(4 * mib, 16, 1, false).expect("placed");
    assert_eq!(c, d, "the warm big slot is reused");
    free(d).unwrap();
    let big: Vec<*mut u8> = (0..40)
        .map(|_| {
            let b = alloc(3 * mib, 16, 1, false).expect("placed");
            // SAFETY: 3 MiB usable.
            unsafe { b.write_bytes(2, 3 * mib) };
            b
        })
        .collect();
    for &b in &big {
        free(b).unwrap();
    }
    let kept: usize = big.iter().map(|&b| resident(b, 4 * mib) * PAGE).sum();
    assert!(
        kept <= WARM_BIG_BYTES && kept >= WARM_BIG_BYTES - 4 * mib,
        "{kept} bytes of freed big slots resident"
    );

    // Unsampled blocks take warm slots only, are freed as unsampled (no
    // probe, no record: `sampled::release`), and a second free is caught.
    // (Class 5: no other test of this process uses it.)
    let size = 100 << 10;
    assert!(
        alloc_unsampled(size, 16, false).is_none(),
        "no warm slot yet: the backend's turn"
    );
    let s = alloc(size, 16, 9, false).expect("placed");
    // SAFETY: the block has `size` writable bytes.
    unsafe { s.write_bytes(0x77, size) };
    free(s).unwrap();
    let u = alloc_unsampled(size, 16, false).expect("the warm slot");
    assert_eq!(u, s);
    assert_eq!(block_info(u), (size, 0));
    assert_eq!(usable_size(u), 25 * PAGE);
    // SAFETY: `size` bytes usable.
    let last = unsafe { *u.add(size - 1) };
    assert_eq!(last, 0x77, "not cleared without zero");
    assert_eq!(
        free(u),
        Ok(Claimed {
            size,
            sampled: false
        })
    );
    assert_eq!(free(u), Err(BadFree::DoubleFree));
    let z = alloc_unsampled(size, 16, true).expect("the warm slot");
    assert_eq!(z, s);
    // SAFETY: z has usable_size(z) bytes.
    let bytes = unsafe { core::slice::from_raw_parts(z, usable_size(z)) };
    assert!(bytes.iter().all(|&x| x == 0), "calloc of a warm slot");
    assert!(free(z).is_ok());
}

/// Huge blocks get slots of their own, and a full class spills into
/// larger ones: 4 x 256 MiB, 1 GiB, 3 GiB and 1,500 x 3 MiB (the 4 MiB
/// class has 1,024 slots) are all placed at once. Nothing is touched,
/// so this costs address space only.
#[test]
fn huge_blocks_and_full_classes_are_placed() {
    if !in_child(
        "sample_region::tests::huge_blocks_and_full_classes_are_placed",
        "ALLOCPROF_TEST_HUGE",
    ) {
        return;
    }
    let mut live = Vec::new();
    for size in [256 << 20, 256 << 20, 256 << 20, 256 << 20, 1 << 30, 3 << 30] {
        let p = alloc(size, 16, 1, false).unwrap_or_else(|| panic!("{size} placed"));
        assert!(contains(p));
        assert_eq!(block_info(p).0, size);
        live.push(p);
    }
    for i in 0..1500 {
        let p = alloc(3 << 20, 16, 1, false).unwrap_or_else(|| panic!("3 MiB #{i} placed"));
        assert!(contains(p));
        live.push(p);
    }
    let mut sorted = live.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), live.len(), "no slot handed out twice");
    for p in live {
        free(p).unwrap();
    }
}

/// Lazy mode (strict overcommit): thousands of live samples keep the
/// region at a few VMAs per class.
#[test]
fn lazy_mode_keeps_vmas_bounded() {
    if !in_child(
        "sample_region::tests::lazy_mode_keeps_vmas_bounded",
        "ALLOCPROF_TEST_FORCE_LAZY",
    ) {
        return;
    }
    let maps = || {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .count()
    };
    let p = alloc(100, 16, 1, false).expect("placed");
    let (_, _, lazy) = bounds().unwrap();
    assert!(lazy, "ALLOCPROF_TEST_FORCE_LAZY must force lazy mode");
    let before = maps();
    let mut live = vec![p];
    for (i, size) in [
        (0usize, 100usize),
        (1, 5000),
        (2, 3 * PAGE),
        (3, 20_000),
        (6, 200_000),
    ]
    .iter()
    .flat_map(|&(k, size)| (0..(4000 >> k.min(3))).map(move |i| (i, size)))
    {
        let b = alloc(size, 16, 1, i % 2 == 0).expect("placed");
        // SAFETY: the block has `size` writable bytes.
        unsafe { b.write_bytes(0x11, size) };
        live.push(b);
    }
    // Free every other block, reuse, free all: cold releases must not
    // split the committed prefix either.
    for b in live.iter().skip(1).step_by(2) {
        free(*b).unwrap();
    }
    let after = maps();
    println!(
        "lazy: {} live samples, maps {before} -> {after}",
        live.len()
    );
    assert!(live.len() > 7000);
    // Two per class at most in each of the region, side table and ledger
    // table.
    assert!(
        after <= before + 6 * CLASS_COUNT,
        "lazy mode split the region: {before} -> {after} VMAs"
    );
    for b in live.iter().step_by(2) {
        free(*b).unwrap();
    }
}

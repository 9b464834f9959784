use super::*;
use crate::{sample_region, sampled};
use profiler_common::ledger::{
    FLAG_TRUNCATED, FLAG_UNWOUND, Record as Decoded, decode_header, decode_record,
};

fn header() -> profiler_common::ledger::Header {
    let a = snapshot_header();
    let b = snapshot_header();
    decode_header(&a, &b).expect("a header the reader accepts")
}

fn decoded(id: usize) -> Decoded {
    let h = header();
    let a = snapshot_record(id).expect("a record");
    let b = snapshot_record(id).expect("a record");
    decode_record(&a, &b, &h)
}

/// Places one sampled block; the record's frames must include the return
/// address into this function.
#[inline(never)]
fn sample_here(size: usize) -> *mut u8 {
    // The first placement in the process may find another test thread
    // creating the region (it is then unplaced, never waited for).
    for _ in 0..1000 {
        let p = sampled::place(size, 16, 1 << 20, false);
        if !p.is_null() {
            // Keeps the call above from being a tail call.
            return core::hint::black_box(p);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    panic!("the sample region never became ready")
}

fn in_function(f: usize, addr: u64, len: usize) -> bool {
    addr as usize > f && (addr as usize) < f + len
}

#[test]
fn a_sampled_block_is_recorded_with_its_stack_and_retired_when_freed() {
    let before = crate::clock::monotonic_ns();
    let p = sample_here(3000);
    let after = crate::clock::monotonic_ns();
    assert!(!p.is_null());
    let id = sample_region::slot_id(p).expect("a slot");
    let h = header();
    assert!(
        h.used_ranges()
            .any(|(f, n)| (f..f + n).contains(&(id as u64)))
    );
    let Decoded::Live(r) = decoded(id) else {
        panic!("not live: {:?}", decoded(id));
    };
    assert_eq!(r.ptr, p as u64);
    assert_eq!(r.size, 3000);
    assert_eq!(r.weight, 1 << 20);
    assert!(before <= r.time_ns && r.time_ns <= after);
    assert!(r.flags & FLAG_LIVE != 0);
    let f = sample_here as *const () as usize;
    assert!(
        r.frames().iter().any(|&a| in_function(f, a, 512)),
        "no frame in sample_here ({f:#x}): {:x?} flags {}",
        r.frames(),
        r.flags
    );
    println!("flags {} frames {}", r.flags, r.nframes);
    sampled::release(p);
    assert_eq!(decoded(id), Decoded::Free);
    assert_eq!(snapshot_record(id).unwrap()[record::SEQ], r.seq + 2);
}

#[test]
fn a_fork_child_sees_its_parents_live_records() {
    let p = sample_here(5000);
    let id = sample_region::slot_id(p).unwrap();
    // SAFETY: the child only reads memory and calls _exit (no allocation,
    // no lock): safe after fork in a multi-threaded process.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let ok = matches!(decoded(id), Decoded::Live(r) if r.ptr == p as u64 && r.size == 5000);
        // SAFETY: ends the child without running the parent's atexit work.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child saw no live record: status {status:#x}"
    );
    sampled::release(p);
}

/// The walk reads only inside [sp, hi), whatever the chain holds.
#[test]
fn frame_pointer_walks_stay_inside_the_stack() {
    let mut words = [0usize; 64];
    let stack = words.as_mut_ptr();
    let base = stack as usize;
    let at = |i: usize| base + 8 * i;
    // Written through the pointer the walk reads through.
    // SAFETY: i < 64, inside `words`, which outlives every use.
    let set = |i: usize, v: usize| unsafe { stack.add(i).write_volatile(v) };
    let hi = at(64);
    let mut out = [0; FRAMES];
    // Learns where glibc's text is.
    stack::learn_text();
    let in_libc = libc::getpid as *const () as usize + 1;
    // A clean chain: 0 -> 4 -> 10 -> null, ending in glibc (the process's
    // or a thread's start) after the program's frames.
    set(0, at(4));
    set(1, 0x40_1000);
    set(4, at(10));
    set(5, 0x40_2000);
    set(10, 0);
    set(11, in_libc);
    assert_eq!(walk_for_test(at(0), at(0), hi, &mut out), Some((3, false)));
    assert_eq!(&out[..3], [0x40_1000, 0x40_2000, in_libc as u64]);
    // A null frame pointer elsewhere is code without frame pointers
    // holding 0 in %rbp: not the bottom.
    set(11, 0x40_3000);
    assert_eq!(walk_for_test(at(0), at(0), hi, &mut out), None);
    set(11, in_libc);
    // A frame pointer below the last frame, unaligned, outside the stack,
    // or whose words cross its end: broken, never followed.
    for bad in [at(2), at(4) + 3, 0x10, usize::MAX - 8, hi - 8] {
        set(4, bad);
        assert_eq!(walk_for_test(at(0), at(0), hi, &mut out), None, "{bad:#x}");
    }
    // A null or kernel return address: broken.
    set(4, at(10));
    set(5, 0);
    assert_eq!(walk_for_test(at(0), at(0), hi, &mut out), None);
    set(5, 0xffff_8000_0000_0000);
    assert_eq!(walk_for_test(at(0), at(0), hi, &mut out), None);
    // More frames than FRAMES: truncated.
    for i in 0..31 {
        set(2 * i, at(2 * i + 2));
        set(2 * i + 1, 0x40_0000 + i);
    }
    // The 32nd frame's link is never followed.
    set(62, 0x1234);
    set(63, 0x40_5000);
    assert_eq!(
        walk_for_test(at(0), at(0), hi, &mut out),
        Some((FRAMES, true))
    );
}

/// One PROCMAP_QUERY gives the mapping /proc/self/maps lists.
#[test]
fn the_stack_mapping_is_asked_of_the_kernel() {
    let local = 0u64;
    let at = &raw const local as usize;
    let (lo, hi) = stack::mapping_of(at).expect("PROCMAP_QUERY (Linux >= 6.11)");
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let line = maps
        .lines()
        .find(|l| {
            let (a, b) = l
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            let (a, b) = (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            );
            a <= at && at < b
        })
        .unwrap();
    assert!(
        line.starts_with(&format!("{lo:x}-{hi:x} ")),
        "{line} vs {lo:x}-{hi:x}"
    );
    // Nothing mapped at 0.
    assert_eq!(stack::mapping_of(0), None);
}

/// Without PROCMAP_QUERY (Linux < 6.11) the stack's mapping is unknown:
/// only the allocator's own frames and its caller's, cut short, never a
/// read of the whole maps file.
#[test]
fn without_the_query_a_stack_is_cut_after_the_allocators_caller() {
    let (flags, frames) = std::thread::spawn(|| {
        stack::tests_support::NO_QUERY.set(true);
        let p = sample_here(700);
        let id = sample_region::slot_id(p).unwrap();
        let Decoded::Live(r) = decoded(id) else {
            panic!("not live");
        };
        sampled::release(p);
        (r.flags, r.frames().to_vec())
    })
    .join()
    .unwrap();
    assert_eq!(flags & (FLAG_TRUNCATED | FLAG_UNWOUND), FLAG_TRUNCATED);
    let f = sample_here as *const () as usize;
    assert!(
        frames.iter().any(|&a| in_function(f, a, 512)),
        "no frame in sample_here: {frames:x?}"
    );
}

#[test]
fn the_switch_reads_like_the_rate() {
    assert_eq!(parse_switch(b"0"), (false, false));
    assert_eq!(parse_switch(b"off"), (false, false));
    assert_eq!(parse_switch(b" OFF "), (false, false));
    assert_eq!(parse_switch(b"1"), (true, false));
    assert_eq!(parse_switch(b"on"), (true, false));
    assert_eq!(parse_switch(b""), (true, false));
    assert_eq!(parse_switch(b"maybe"), (true, true));
}

/// `ALLOCPROF_LEDGER=0`: no table, the header says so, samples still work.
#[test]
fn ledger_off_leaves_the_table_at_zero() {
    const NAME: &str = "ledger::tests::ledger_off_leaves_the_table_at_zero";
    if std::env::var_os("ALLOCPROF_LEDGER").is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
            .env("ALLOCPROF_LEDGER", "0")
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "child: {}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let p = sample_here(100);
    assert!(!p.is_null());
    let h = snapshot_header();
    assert_eq!(h[header::TABLE], 0);
    assert_eq!(
        decode_header(&h, &h),
        Err(profiler_common::ledger::HeaderError::Off)
    );
    sampled::release(p);
}

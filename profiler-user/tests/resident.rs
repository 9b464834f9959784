//! The heap next to resident memory, with real eBPF and a real process
//! whose heap is fragmented (many blocks, every other one freed): its
//! anonymous memory stays well above the live heap, and the figures
//! allocprof reports are those of `/proc/PID/status`.

mod common;

use std::process::Command;

use allocprof::ids::Pid;
use allocprof::{
    kernel::Limits,
    output::report::{self, ReportOptions},
    process::discover::parse_resident,
    session::{Session, Target},
};
use common::{Proc, RATE};

/// `N / 2` blocks of `SIZE` of fragment.c stay live.
const LIVE_BLOCKS: u64 = 10_000;
const SIZE: u64 = 4096;

#[test]
fn a_fragmented_heap_shows_resident_memory_well_above_the_live_heap() {
    common::require_bpf();
    let exe = common::compile_c("fragment.c", &[]);
    let mut w = Proc::spawn(Command::new(exe));
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    let mut session = Session::start(Target::Pids(vec![Pid(w.pid())]), Limits::default()).unwrap();
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", w.pid())).unwrap();
    let truth = parse_resident(&status).unwrap();

    let p = common::process(&profile, w.pid());
    let (heap, sigma) = common::truth_and_sigma(LIVE_BLOCKS, SIZE, RATE);
    assert!(
        (p.totals.live_bytes - heap).abs() <= 4.0 * sigma,
        "live heap {} vs {heap}",
        p.totals.live_bytes
    );
    let r = p.resident.expect("a running process's resident memory");
    // Read moments apart from a process that no longer allocates.
    let close = |a: u64, b: u64| (a as f64 - b as f64).abs() <= 0.05 * b as f64 + 65536.0;
    assert!(close(r.anon, truth.anon), "{r:?} vs /proc {truth:?}");
    assert!(close(r.file, truth.file), "{r:?} vs /proc {truth:?}");
    assert!(
        r.anon as f64 >= 1.6 * p.totals.live_bytes,
        "the freed half stays resident: anonymous {} vs heap {}",
        r.anon,
        p.totals.live_bytes
    );
    let text = report::render(&profile, ReportOptions::default());
    assert!(
        text.contains("of anonymous memory is not live heap"),
        "{text}"
    );
    w.send("exit");
}

/// The backend's own figures of the same fragmented heap, read from the
/// block `liballocprof*.so` keeps: mimalloc's say what it reserved and
/// committed, and agree with the live heap and with /proc. glibc's block
/// names the backend and no figure: glibc gives them only by walking its
/// heap under the arena locks (mallinfo2), which stalled a sampled malloc
/// for tens of milliseconds; the report says so instead of making any up.
#[test]
fn the_allocators_own_figures_show_what_it_holds_beyond_the_live_heap() {
    common::require_bpf();
    let exe = common::compile_c("fragment.c", &[]);
    let live = (LIVE_BLOCKS * SIZE) as f64;
    for (library, name) in [
        (common::preload_glibc_library(), "liballocprof_glibc.so"),
        (common::preload_library(), "liballocprof.so"),
    ] {
        let mut cmd = Command::new(&exe);
        cmd.env("LD_PRELOAD", &library)
            .env("ALLOCPROF_RATE", RATE.to_string());
        let mut w = Proc::spawn(cmd);
        common::wait_for_mapping(w.pid(), name);
        let mut session =
            Session::start(Target::Pids(vec![Pid(w.pid())]), Limits::default()).unwrap();
        w.send("go");
        w.expect("ready");
        let profile = session.complete_profile().unwrap();
        let status = std::fs::read_to_string(format!("/proc/{}/status", w.pid())).unwrap();
        let proc_resident = parse_resident(&status).unwrap();
        let p = common::process(&profile, w.pid());
        let b = p
            .backend_heap
            .unwrap_or_else(|| panic!("{name}: no allocator figures"));
        let mib = |v: Option<u64>| v.map(|v| v as f64 / 1_048_576.0);
        let what = format!(
            "{name}: {b:?} (in MiB: reserved {:?}, committed {:?}, in use {:?}, free {:?}), \
             live heap {live}, /proc {proc_resident:?}",
            mib(b.reserved),
            mib(b.committed),
            mib(b.in_use),
            mib(b.free)
        );
        eprintln!("{what}");
        let text = report::render(&profile, ReportOptions::default());
        // Sampled blocks (about 6% at this rate) live in the sample region,
        // not in the backend: its figures miss them.
        if name == "liballocprof_glibc.so" {
            assert_eq!(b.backend, "glibc");
            assert_eq!(
                (b.reserved, b.committed, b.in_use, b.free, b.mmapped),
                (None, None, None, None, None),
                "{what}"
            );
            assert!(text.contains("allocator glibc: figures unknown"), "{text}");
        } else {
            assert_eq!(b.backend, "mimalloc");
            let committed = b.committed.expect("mimalloc counts committed bytes") as f64;
            let reserved = b.reserved.expect("mimalloc counts reserved bytes") as f64;
            assert!(committed >= 0.8 * live, "{what}");
            assert!(committed <= reserved, "{what}");
            // What it committed and touched is resident: at least the heap.
            assert!(
                proc_resident.anon as f64 >= 0.8 * committed.min(2.0 * live),
                "{what}"
            );
            assert_eq!((b.in_use, b.free), (None, None), "{what}");
            assert!(b.age.as_secs() < 60, "{what}");
            assert!(text.contains("allocator mimalloc: reserved"), "{text}");
        }
        w.send("exit");
    }
}

/// liballocprof.so announces the memory its mimalloc maps from the system
/// (`otel_memory:mmap`/`munmap`): followed from the process's start (the
/// library armed before it runs), the mapped bytes are what mimalloc's own
/// statistics call reserved.
#[test]
fn liballocprof_announces_the_memory_its_mimalloc_maps() {
    common::require_bpf();
    let exe = common::compile_c("fragment.c", &[]);
    let mut session = Session::start(Target::All, Limits::default()).unwrap();
    assert!(session.arm(&common::preload_library()).unwrap());
    let mut w = Proc::spawn(Command::new(exe));
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, w.pid());
    let reserved = p
        .backend_heap
        .and_then(|b| b.reserved)
        .expect("mimalloc's reserved bytes") as f64;
    let mapped = p.mapped_bytes as f64;
    assert!(p.mmap_events >= 1, "{p:?}");
    // The 80 MB the workload allocated live in what mimalloc mapped.
    assert!(mapped >= 80e6, "mapped {mapped}");
    assert!(
        (mapped - reserved).abs() <= 64.0 * 1_048_576.0,
        "mapped {mapped} vs mimalloc's reserved {reserved}"
    );
    let text = report::render(&profile, ReportOptions::default());
    assert!(text.contains("on its own account"), "{text}");
    w.send("exit");
}

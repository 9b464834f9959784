//! The eBPF toolchain end to end: the kernel programs load, attach to the
//! `otel_memory` USDT probes of a real process, and their maps hold exactly
//! what the process fired.

mod common;

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
};

use allocprof::{
    kernel::{Kernel, Limits, Mode, Scope},
    process::discover,
    process::discover::ProbeKind,
};
use profiler_common::{DropReason, OBJECT_SCALE, SampleDelta, variance_in_bytes2};

#[test]
fn kernel_programs_account_probes_of_a_real_process() {
    common::require_bpf();
    let exe = common::compile_c("sdt_fire.c", &[]);
    let (sites, problems) = discover::probe_sites(&exe).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(
        sites.iter().filter(|s| s.kind == ProbeKind::Alloc).count(),
        1
    );
    assert_eq!(
        sites.iter().filter(|s| s.kind == ProbeKind::Free).count(),
        1
    );

    let (n, size, weight, freed, untracked) = (100u64, 1000u64, 4000u64, 30u64, 5u64);
    let mut child = Command::new(&exe)
        .args([n, size, weight, freed, untracked].map(|v| v.to_string()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();

    let mut kernel =
        Kernel::load(Limits::default(), Mode::Attached).expect("loading the eBPF programs");
    for site in &sites {
        kernel
            .attach(&exe, site, Scope::Process(allocprof::ids::Tid(pid)))
            .unwrap();
    }
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "go").unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "fired");

    let snap = kernel.snapshot(true).unwrap();
    let ours: Vec<_> = snap
        .aggregates
        .iter()
        .filter(|(k, _)| k.pid == pid)
        .collect();
    assert_eq!(ours.len(), 1, "one call site, so one stack: {ours:?}");
    let (key, agg) = ours[0];
    // Untracked samples (pointer 0) count as allocated, never as live.
    assert_eq!(agg.alloc_samples, n + untracked);
    assert_eq!(agg.alloc_bytes, (n + untracked) * weight);
    assert_eq!(agg.live_samples, n - freed);
    assert_eq!(agg.live_bytes, (n - freed) * weight);
    assert_eq!(
        agg.live_objects,
        (n - freed) * (weight / size) * OBJECT_SCALE
    );
    let term = SampleDelta::of(size, weight).var;
    assert_eq!(agg.live_var, (n - freed) * term);
    let exact = ((n - freed) * weight * (weight - size)) as f64;
    let kept = variance_in_bytes2(agg.live_var);
    assert!(kept >= exact && kept < exact * 1.2, "{kept} vs {exact}");
    let stack = kernel
        .stack(key.stack_id)
        .expect("the sample's stack is stored");
    assert!(
        stack.len() >= 2,
        "a user stack with the probe's caller: {stack:x?}"
    );
    let proc = snap.processes.get(&pid).expect("per-process state");
    assert_eq!(proc.live_samples, n - freed);
    assert_eq!(
        proc.drops[DropReason::Unplaced as usize],
        untracked,
        "{proc:?}"
    );
    assert_eq!(proc.drops.iter().sum::<u64>(), untracked, "{proc:?}");
    assert_eq!(proc.lost_live_bytes, untracked * weight);

    writeln!(stdin, "exit").unwrap();
    assert!(child.wait().unwrap().success());
}

/// Stable-only users build with the committed object: it must pass the
/// verifier too, not only be fresh (xtask checks freshness).
#[test]
fn committed_object_loads_and_verifies() {
    common::require_bpf();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../profiler-ebpf/prebuilt/profiler.bpf.o"
    );
    let object = std::fs::read(path).unwrap();
    // aya wants the object 8-byte aligned.
    let mut aligned = vec![0u64; object.len().div_ceil(8)];
    // SAFETY: u64 has no invalid bit patterns; we fill its bytes.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(aligned.as_mut_ptr().cast::<u8>(), object.len()) };
    bytes.copy_from_slice(&object);
    Kernel::load_object(bytes, Limits::default(), Mode::Attached)
        .expect("the committed object loads");
}

/// The alloc program does the most (thinning, the unwinder, the sums) and
/// sits closest to the verifier's 1M-instruction limit, which a small
/// change can cross (a branch before the stack walk doubles the walk's
/// states): every configuration that keeps code alive must leave margin.
#[test]
fn the_alloc_program_verifies_well_under_the_instruction_limit() {
    common::require_bpf();
    const LIMIT: u32 = 1_000_000;
    let configs = [
        ("defaults", Limits::default()),
        (
            "back-pressure",
            Limits {
                max_event_rate: 1000,
                ..Limits::default()
            },
        ),
        (
            "diagnostics",
            Limits {
                diagnostics: true,
                ..Limits::default()
            },
        ),
        (
            "back-pressure and diagnostics",
            Limits {
                max_event_rate: 1000,
                diagnostics: true,
                ..Limits::default()
            },
        ),
        (
            "back-pressure, no unwind tables",
            Limits {
                max_event_rate: 1000,
                max_unwind_rows: 0,
                ..Limits::default()
            },
        ),
    ];
    for (what, limits) in configs {
        let kernel = Kernel::load(limits, Mode::Attached).expect("the programs load");
        let counts = kernel.verified_instructions();
        eprintln!("{what}: {counts:?}");
        let alloc = counts
            .iter()
            .find(|(name, _)| *name == "otel_memory_alloc")
            .and_then(|(_, n)| *n)
            .expect("the kernel reports verified instructions");
        assert!(
            alloc < LIMIT / 10 * 9,
            "{what}: the alloc program took {alloc} verifier instructions, within 10% of the limit"
        );
    }
}

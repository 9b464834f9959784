//! Every drop cause the kernel can be driven into, and the invariants
//! ARCHITECTURE.md states about them: each unaccounted event is counted by
//! cause, a live sample is retired exactly once, and the bytes missing from
//! the live sums are reported. Real kernel programs, small limits, and a
//! scripted emitter that fires one probe per command.

mod common;

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader, Lines, Write},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::Instant,
};

use allocprof::{
    kernel::{Kernel, KernelSnapshot, Limits, Mode, Scope},
    process::discover,
};
use profiler_common::{DropReason, NO_STACK, OVERFLOW_STACK, StackAgg};

const SIZE: u64 = 1000;
const WEIGHT: u64 = 4000;

/// The scripted emitter with the kernel programs attached to it alone.
struct Emitter {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    kernel: Kernel,
}

impl Emitter {
    fn start(limits: Limits) -> Emitter {
        common::require_bpf();
        let exe = common::compile_c("sdt_script.c", &[]);
        let (sites, problems) = discover::probe_sites(&exe).unwrap();
        assert!(problems.is_empty() && sites.len() == 4, "{problems:?}");
        let mut child = Command::new(&exe)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut kernel = Kernel::load(limits, Mode::Attached).expect("loading the eBPF programs");
        for site in &sites {
            kernel
                .attach(&exe, site, Scope::Process(allocprof::ids::Tid(child.id())))
                .unwrap();
        }
        Emitter {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::new(child.stdout.take().unwrap()).lines(),
            child,
            kernel,
        }
    }

    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").unwrap();
        let answer = self.stdout.next().expect("the emitter answers").unwrap();
        assert_eq!(answer, "ok", "{command}");
    }

    fn alloc_at(&mut self, ptr: u64, depth: u32) {
        self.send(&format!("a {ptr:x} {SIZE} {WEIGHT} {depth}"));
    }

    fn alloc(&mut self, ptr: u64) {
        self.alloc_at(ptr, 1);
    }

    fn free(&mut self, ptr: u64) {
        self.send(&format!("f {ptr:x}"));
    }

    /// The stack ids `pid`'s aggregates use, reserved ids aside.
    fn stacks_of(&self, pid: u32) -> BTreeSet<u64> {
        self.snapshot()
            .aggregates
            .iter()
            .filter(|(k, _)| k.pid == pid && k.stack_id != NO_STACK && k.stack_id != OVERFLOW_STACK)
            .map(|(k, _)| k.stack_id)
            .collect()
    }

    fn snapshot(&self) -> KernelSnapshot {
        self.kernel.snapshot(true).unwrap()
    }

    /// This process's aggregates summed over its stacks.
    fn sums(&self) -> StackAgg {
        let pid = self.child.id();
        let mut sum = StackAgg::default();
        for (_, agg) in self
            .snapshot()
            .aggregates
            .iter()
            .filter(|(k, _)| k.pid == pid)
        {
            sum.live_bytes = sum.live_bytes.wrapping_add(agg.live_bytes);
            sum.live_samples = sum.live_samples.wrapping_add(agg.live_samples);
            sum.alloc_bytes += agg.alloc_bytes;
            sum.alloc_samples += agg.alloc_samples;
        }
        sum
    }

    /// The global count; the process's own agrees where it has state (an
    /// event before its first alloc is counted globally only).
    fn drops(&self, reason: DropReason) -> u64 {
        let snap = self.snapshot();
        let global = snap.drops[reason as usize];
        if let Some(proc) = snap.processes.get(&self.child.id()) {
            assert_eq!(proc.drops[reason as usize], global, "{reason:?}");
        }
        global
    }

    fn lost_live_bytes(&self) -> u64 {
        let snap = self.snapshot();
        snap.processes
            .get(&self.child.id())
            .map_or(0, |p| p.lost_live_bytes)
    }

    /// Every drop cause other than `expected` is zero.
    fn assert_only_drops(&self, expected: &[DropReason]) {
        let snap = self.snapshot();
        for reason in DropReason::ALL {
            if !expected.contains(&reason) {
                assert_eq!(snap.drops[reason as usize], 0, "{reason:?}");
            }
        }
    }
}

impl Drop for Emitter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn limits() -> Limits {
    Limits {
        max_live_samples: 1024,
        max_live_per_process: 1024,
        max_stacks: 1024,
        max_aggregates: 1024,
        max_processes: 1024,
        ..Limits::default()
    }
}

#[test]
fn per_process_cap_drops_live_samples_and_reports_their_bytes() {
    let mut e = Emitter::start(Limits {
        max_live_per_process: 3,
        ..limits()
    });
    for i in 0..5 {
        e.alloc(0x1000 + 64 * i);
    }
    assert_eq!(e.drops(DropReason::ProcessCap), 2);
    let sums = e.sums();
    assert_eq!((sums.alloc_samples, sums.alloc_bytes), (5, 5 * WEIGHT));
    assert_eq!((sums.live_samples, sums.live_bytes), (3, 3 * WEIGHT));
    assert_eq!(e.lost_live_bytes(), 2 * WEIGHT);
    e.assert_only_drops(&[DropReason::ProcessCap]);
}

#[test]
fn full_live_table_drops_the_rest_and_reports_their_bytes() {
    let mut e = Emitter::start(Limits {
        max_live_samples: 4,
        ..limits()
    });
    let n = 10;
    for i in 0..n {
        e.alloc(0x1000 + 64 * i);
    }
    let dropped = e.drops(DropReason::LiveMapFull);
    let sums = e.sums();
    assert!(dropped >= n - 4, "{dropped}");
    assert_eq!(sums.live_samples + dropped, n);
    assert_eq!(sums.alloc_samples, n);
    assert_eq!(e.lost_live_bytes(), dropped * WEIGHT);
    e.assert_only_drops(&[DropReason::LiveMapFull]);
}

#[test]
fn an_alloc_over_a_live_sample_retires_the_old_one_once() {
    let mut e = Emitter::start(limits());
    e.alloc(0x5000);
    e.alloc(0x5000); // its free was missed
    assert_eq!(e.drops(DropReason::ReplacedLive), 1);
    let sums = e.sums();
    assert_eq!((sums.live_samples, sums.live_bytes), (1, WEIGHT));
    e.free(0x5000);
    // A second free of the same pointer finds nothing: retired exactly once.
    e.free(0x5000);
    assert_eq!(e.drops(DropReason::UnmatchedFree), 1);
    let sums = e.sums();
    assert_eq!((sums.live_samples, sums.live_bytes), (0, 0));
    assert_eq!(sums.alloc_samples, 2);
    assert_eq!(e.snapshot().processes[&e.child.id()].live_samples, 0);
    e.assert_only_drops(&[DropReason::ReplacedLive, DropReason::UnmatchedFree]);
}

#[test]
fn a_free_of_a_sample_never_seen_is_counted() {
    let mut e = Emitter::start(limits());
    e.free(0x9000);
    assert_eq!(e.drops(DropReason::UnmatchedFree), 1);
    assert_eq!(e.lost_live_bytes(), 0);
    e.assert_only_drops(&[DropReason::UnmatchedFree]);
}

#[test]
fn full_stack_table_keeps_samples_under_an_unavailable_stack() {
    let mut e = Emitter::start(Limits {
        max_stacks: 2,
        ..limits()
    });
    for depth in 1..=5 {
        e.alloc_at(0x1000 * u64::from(depth), depth);
    }
    let dropped = e.drops(DropReason::StackMapFull);
    assert!(dropped >= 3, "{dropped}");
    let sums = e.sums();
    // Every sample is still accounted, live and allocated.
    assert_eq!((sums.live_samples, sums.alloc_samples), (5, 5));
    let pid = e.child.id();
    let unavailable: u64 = e
        .snapshot()
        .aggregates
        .iter()
        .filter(|(k, _)| k.pid == pid && k.stack_id == 0)
        .map(|(_, a)| a.live_samples)
        .sum();
    assert_eq!(unavailable, dropped);
    assert_eq!(e.lost_live_bytes(), 0);
    e.assert_only_drops(&[DropReason::StackMapFull]);
}

#[test]
fn full_aggregate_table_drops_and_reports_the_bytes() {
    let mut e = Emitter::start(Limits {
        max_aggregates: 2,
        ..limits()
    });
    for depth in 1..=5 {
        e.alloc_at(0x1000 * u64::from(depth), depth);
    }
    let dropped = e.drops(DropReason::AggMapFull);
    assert!(dropped >= 3, "{dropped}");
    let sums = e.sums();
    assert_eq!(sums.alloc_samples + dropped, 5);
    assert_eq!(e.lost_live_bytes(), dropped * WEIGHT);
    e.assert_only_drops(&[DropReason::AggMapFull]);
}

#[test]
fn full_process_table_drops_the_events_of_processes_beyond_it() {
    let mut e = Emitter::start(Limits {
        max_processes: 1,
        ..limits()
    });
    e.alloc(0x1000); // the emitter takes the only slot
    // A second emitter process, attached to the same programs.
    let (mut other, mut stdin, mut stdout) = second_emitter(&mut e);
    writeln!(stdin, "a 2000 {SIZE} {WEIGHT} 1").unwrap();
    assert_eq!(stdout.next().unwrap().unwrap(), "ok");
    let snap = e.snapshot();
    let _ = other.kill();
    let _ = other.wait();
    assert_eq!(snap.drops[DropReason::ProcMapFull as usize], 1);
    assert!(!snap.processes.contains_key(&other.id()));
    // The first process is unaffected.
    assert_eq!(e.sums().live_samples, 1);
}

#[test]
fn a_stack_flood_is_kept_under_the_overflow_stack_and_spares_other_processes() {
    let (rate, burst) = (1, 8);
    let mut e = Emitter::start(Limits {
        max_new_stacks_per_second: rate,
        new_stacks_burst: burst,
        ..limits()
    });
    // Distinct stacks as fast as the emitter answers: a flood.
    let n: u32 = 64;
    let start = Instant::now();
    for depth in 1..=n {
        e.alloc_at(0x1000 * u64::from(depth), depth);
    }
    let elapsed = start.elapsed().as_secs() + 1;
    let pid = e.child.id();
    let flooded = e.drops(DropReason::StackRateLimited);
    let own = e.stacks_of(pid);
    // The table holds what the budget allows (one emitter thread: no races
    // between CPUs), and every other sample is filed under the overflow stack.
    assert!(flooded > 0, "{n} stacks within {elapsed} s at {rate}/s");
    assert!(own.len() as u64 <= burst + rate * elapsed, "{own:?}");
    assert_eq!(own.len() as u64 + flooded, u64::from(n));
    let table: BTreeSet<u64> = e.kernel.stack_ids().into_iter().collect();
    assert_eq!(
        table, own,
        "only the stacks it could afford are in the table"
    );
    // Every sample is still accounted, live and allocated.
    let sums = e.sums();
    assert_eq!(
        (sums.alloc_samples, sums.live_samples),
        (n.into(), n.into())
    );
    assert_eq!(sums.alloc_bytes, u64::from(n) * WEIGHT);
    let overflow: u64 = e
        .snapshot()
        .aggregates
        .iter()
        .filter(|(k, _)| k.pid == pid && k.stack_id == OVERFLOW_STACK)
        .map(|(_, a)| a.alloc_samples)
        .sum();
    assert_eq!(overflow, flooded);
    assert_eq!(e.lost_live_bytes(), 0);
    // A stack already in the table resolves, whatever the budget.
    e.alloc_at(0x10_0000, 1);
    assert_eq!(e.drops(DropReason::StackRateLimited), flooded);
    assert_eq!(e.stacks_of(pid), own);

    // A well-behaved process in the same run keeps its own stacks: the same
    // frames (the same program) under ids of its own.
    let (mut other, mut stdin, mut stdout) = second_emitter(&mut e);
    for depth in 1..=3 {
        writeln!(stdin, "a {:x} {SIZE} {WEIGHT} {depth}", 0x1000 * depth).unwrap();
        assert_eq!(stdout.next().unwrap().unwrap(), "ok");
    }
    let snap = e.snapshot();
    let theirs = e.stacks_of(other.id());
    let _ = other.kill();
    let _ = other.wait();
    assert_eq!(theirs.len(), 3, "{theirs:?}");
    assert!(theirs.is_disjoint(&own), "stack ids belong to one process");
    let table: BTreeSet<u64> = e.kernel.stack_ids().into_iter().collect();
    assert!(theirs.is_subset(&table));
    assert_eq!(
        snap.processes[&other.id()].drops[DropReason::StackRateLimited as usize],
        0
    );
    assert_eq!(e.drops(DropReason::StackRateLimited), flooded);
    e.assert_only_drops(&[DropReason::StackRateLimited]);
}

#[test]
fn forgotten_stacks_leave_the_stack_table() {
    let mut e = Emitter::start(limits());
    for depth in 1..=3 {
        e.alloc_at(0x1000 * u64::from(depth), depth);
    }
    let mut ids = e.kernel.stack_ids();
    ids.sort_unstable();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(ids.iter().all(|id| e.kernel.stack(*id).is_some()));
    assert_eq!(e.kernel.forget_stacks(&ids[..2]), 2);
    assert_eq!(e.kernel.forget_stacks(&ids[..2]), 0, "already gone");
    assert_eq!(e.kernel.stack_ids(), vec![ids[2]]);
    assert!(e.kernel.stack(ids[0]).is_none() && e.kernel.stack(ids[1]).is_none());
    assert!(e.kernel.stack(ids[2]).is_some());
}

/// Another scripted emitter process, attached to `e`'s programs.
fn second_emitter(e: &mut Emitter) -> (Child, ChildStdin, Lines<BufReader<ChildStdout>>) {
    let exe = common::compile_c("sdt_script.c", &[]);
    let (sites, _) = discover::probe_sites(&exe).unwrap();
    let mut other = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    for site in &sites {
        e.kernel
            .attach(&exe, site, Scope::Process(allocprof::ids::Tid(other.id())))
            .unwrap();
    }
    let stdin = other.stdin.take().unwrap();
    let stdout = BufReader::new(other.stdout.take().unwrap()).lines();
    (other, stdin, stdout)
}

#[test]
fn mmap_and_munmap_probes_count_the_bytes_mapped_beside_the_heap() {
    let mut e = Emitter::start(limits());
    e.send("m 7f0000000000 1048576");
    e.send("m 7f0000200000 4096");
    e.send("u 7f0000000000 1048576");
    e.alloc(0x1000);
    let snap = e.snapshot();
    let proc = snap.processes[&e.child.id()];
    assert_eq!((proc.mapped_bytes, proc.mmap_events), (4096, 2));
    // The heap's figures are untouched.
    assert_eq!(e.sums().alloc_bytes, WEIGHT);
    e.assert_only_drops(&[]);
}

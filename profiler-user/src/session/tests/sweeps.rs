//! What a refresh reads of the processes it follows: between sweeps, only
//! what changed (new processes, exits reported by the kernel, stacks outside
//! the known maps); every `sweep_every`, each process; at a full scan, only
//! the processes without probes that changed.

use std::time::Instant;

use super::super::{FULL_SCAN_EVERY, RESCAN_EVERY, RESCAN_SPREAD, rescan_period};
use super::*;

const HOUR: Duration = Duration::from_secs(3600);

#[test]
fn between_sweeps_a_settled_process_is_not_read() {
    let world = World::default();
    world.spawn(100, "app");
    world.process(100).code_size = Some(1000);
    let mut s = session(&world, Target::All);
    s.sweep_every = HOUR;
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.refresh().unwrap();
    let scans = world.scans_of(100);
    // A dlopen that no stack shows yet waits for the sweep.
    world.process(100).code_size = Some(2000);
    s.refresh().unwrap();
    s.refresh().unwrap();
    assert_eq!(world.scans_of(100), scans, "read between sweeps");
    s.sweep_every = Duration::ZERO;
    s.refresh().unwrap();
    assert_eq!(world.scans_of(100), scans + 1, "the sweep sees the dlopen");
}

#[test]
fn between_sweeps_a_stack_outside_the_maps_is_rescanned_at_once() {
    let world = World::default();
    world.spawn(100, "app");
    world.process(100).code_size = Some(1000);
    world.process(100).not_mapped = Some(address_in(beta_site));
    let mut s = session(&world, Target::All);
    s.sweep_every = HOUR;
    world.sample(100, 7, &[address_in(beta_site)], 1 << 20);
    s.complete_profile().unwrap();
    let scans = world.scans_of(100);
    world.process(100).not_mapped = None;
    let p = s.complete_profile().unwrap();
    assert!(world.scans_of(100) > scans, "rescanned without a sweep");
    let live = only_image(&p, 100, ProcessState::Live);
    assert!(has_function(live, "beta_site"), "{:?}", functions(live));
}

#[test]
fn a_lost_exit_event_is_noticed_at_the_sweep() {
    let world = World::default();
    world.spawn(100, "app");
    world.process(100).code_size = Some(1000);
    let mut s = session(&world, Target::All);
    s.sweep_every = HOUR;
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.refresh().unwrap();
    world.exit(100);
    world.0.borrow_mut().kernel.events.clear();
    let p = s.refresh().unwrap();
    only_image(&p, 100, ProcessState::Live);
    s.sweep_every = Duration::ZERO;
    let p = s.refresh().unwrap();
    only_image(&p, 100, ProcessState::Exited);
    assert_eq!(images(&p, 100).len(), 1, "{p:#?}");
}

#[test]
fn an_exit_event_is_acted_on_between_sweeps() {
    let world = World::default();
    world.spawn(100, "app");
    world.process(100).code_size = Some(1000);
    let mut s = session(&world, Target::All);
    s.sweep_every = HOUR;
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.refresh().unwrap();
    world.exit(100);
    let p = s.refresh().unwrap();
    only_image(&p, 100, ProcessState::Exited);
}

#[test]
fn a_full_scan_reads_again_only_processes_without_probes_that_changed() {
    let world = World::default();
    world.spawn(300, "bash");
    world.process(300).probe_files.clear();
    world.process(300).code_size = Some(10);
    let mut s = session(&world, Target::All);
    let full_scan = |s: &mut Session<FakeKernel, FakeProcesses>| {
        s.last_full_scan = Instant::now() - FULL_SCAN_EVERY;
        s.refresh().unwrap();
    };
    let scans = world.scans_of(300);
    assert_eq!(scans, 1, "the start scans every process");
    full_scan(&mut s);
    assert_eq!(world.scans_of(300), scans, "unchanged: not read again");
    // It dlopens a probe-carrying library: its code size changes.
    world.process(300).probe_files.push(probe_file_id(2));
    world.process(300).code_size = Some(20);
    full_scan(&mut s);
    assert_eq!(world.scans_of(300), scans + 1);
    assert!(s.is_attached(Pid(300), probe_file_id(2)));
}

/// A thousand processes scanned together come due for their periodic
/// rescan spread over the sweeps of `RESCAN_SPREAD`, not all at one.
#[test]
fn processes_scanned_together_come_due_at_different_sweeps() {
    let sweeps = (RESCAN_SPREAD.as_secs() / FULL_SCAN_EVERY.as_secs()) as usize;
    let mut per_sweep = vec![0usize; sweeps];
    for pid in 1000..2000 {
        let period = rescan_period(Pid(pid));
        assert!(
            (RESCAN_EVERY..RESCAN_EVERY + RESCAN_SPREAD).contains(&period),
            "pid {pid}: {period:?}"
        );
        let late = (period - RESCAN_EVERY).as_secs() / FULL_SCAN_EVERY.as_secs();
        per_sweep[late as usize] += 1;
    }
    // About 1000 / 6 each; none near all of them.
    assert!(
        per_sweep.iter().all(|&n| (100..=250).contains(&n)),
        "{per_sweep:?}"
    );
    assert_eq!(rescan_period(Pid(1234)), rescan_period(Pid(1234)));
}

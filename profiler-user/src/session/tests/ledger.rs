//! Seeding from the live-sample ledger: what the kernel never saw is added
//! once, with its stack, and leaves when its block is freed.

use profiler_common::ledger::{FLAG_LIVE, FLAG_TRUNCATED, FRAMES, LiveRecord};

use super::*;
use crate::process::ledger::LedgerEntry;

/// A live record of `size` bytes at `ptr`, allocated at `time_ns`, on `frames`.
fn record(ptr: u64, size: u64, time_ns: u64, frames: &[u64]) -> LedgerEntry {
    let mut f = [0; FRAMES];
    f[..frames.len()].copy_from_slice(frames);
    LedgerEntry {
        // The record's address: derived from the pointer, unique per block.
        address: 0x10_0000 + ptr,
        record: LiveRecord {
            seq: 2,
            ptr,
            size,
            weight: size.max(RATE),
            time_ns,
            flags: FLAG_LIVE,
            nframes: frames.len(),
            frames: f,
        },
    }
}

fn give_ledger(world: &World, pid: u32, records: Vec<LedgerEntry>) {
    let seqs = records.iter().map(|e| (e.address, e.record.seq)).collect();
    world.process(pid).ledger = Some(FakeLedger {
        live: records,
        seqs,
        ..FakeLedger::default()
    });
}

fn live_of(profile: &Profile, pid: u32) -> (f64, f64) {
    let p = profile
        .processes
        .iter()
        .find(|p| p.key.pid.0 == pid)
        .expect("the process is in the profile");
    (p.totals.live_bytes, p.totals.before_attach_bytes)
}

#[test]
fn blocks_from_before_attach_are_seeded_once_with_their_stacks() {
    let world = World::default();
    world.spawn(10, "service");
    let alpha = [address_in(alpha_site)];
    let beta = [address_in(beta_site)];
    give_ledger(
        &world,
        10,
        vec![
            record(0x1000, 100, 1, &alpha),
            record(0x2000, 100, 1, &alpha),
            record(0x3000, 100, 1, &beta),
            // Allocated after attach: the kernel saw it.
            record(0x4000, 100, u64::MAX / 2, &beta),
        ],
    );
    let mut session = session(&world, Target::Pids(vec![Pid(10)]));
    // The kernel holds a live sample at 0x2000 (its probe fired after attach).
    world.0.borrow_mut().kernel.live.push((
        LiveKey {
            pid: 10,
            _pad: 0,
            ptr: 0x2000,
        },
        LiveSample::default(),
    ));
    session.finish_symbols();
    let profile = session.complete_profile().unwrap();
    let (live, before) = live_of(&profile, 10);
    assert_eq!(live, 2.0 * RATE as f64);
    assert_eq!(before, live);
    let p = &profile.processes[0];
    assert!(!p.since_attach, "its whole heap is seen");
    assert!(profile.ran_before_attach.is_empty());
    let status = p.ledger.unwrap();
    assert_eq!((status.seeded, status.seen), (2, 2));
    assert!(world.kernel().watched.contains(&10));
    // Symbolized like a kernel stack: one stack per site.
    let names: Vec<String> = p
        .stacks
        .iter()
        .map(|s| s.frames[0].function.to_string())
        .collect();
    assert!(names.iter().any(|n| n.contains("alpha_site")), "{names:?}");
    assert!(names.iter().any(|n| n.contains("beta_site")), "{names:?}");
}

#[test]
fn a_stack_the_allocator_cut_short_says_so() {
    let world = World::default();
    world.spawn(10, "service");
    let alpha = [address_in(alpha_site)];
    let mut cut = record(0x1000, 100, 1, &alpha);
    cut.record.flags |= FLAG_TRUNCATED;
    give_ledger(&world, 10, vec![cut, record(0x2000, 100, 1, &alpha)]);
    let mut session = session(&world, Target::Pids(vec![Pid(10)]));
    session.finish_symbols();
    let profile = session.complete_profile().unwrap();
    let p = &profile.processes[0];
    // The same site, whole and cut: two stacks, the cut one marked.
    let mut stacks: Vec<Vec<String>> = p
        .stacks
        .iter()
        .map(|s| s.frames.iter().map(|f| f.function.to_string()).collect())
        .collect();
    stacks.sort();
    assert_eq!(stacks.len(), 2, "{stacks:?}");
    assert!(
        stacks.iter().all(|s| s[0].contains("alpha_site")),
        "{stacks:?}"
    );
    assert!(
        stacks
            .iter()
            .filter(|s| s.last().unwrap() == "[cut short by the allocator]")
            .count()
            == 1,
        "{stacks:?}"
    );
}

#[test]
fn a_seed_leaves_when_its_free_is_reported_or_its_record_moves() {
    let world = World::default();
    world.spawn(10, "service");
    let alpha = [address_in(alpha_site)];
    give_ledger(
        &world,
        10,
        (1..=3)
            .map(|i| record(i * 0x1000, 100, 1, &alpha))
            .collect(),
    );
    let mut session = session(&world, Target::Pids(vec![Pid(10)]));
    assert_eq!(
        live_of(&session.refresh().unwrap(), 10).0,
        3.0 * RATE as f64
    );
    // The kernel reports the free of one; another's record was rewritten
    // (freed, its free lost).
    world.unseen_free(10, 0x1000);
    world
        .process(10)
        .ledger
        .as_mut()
        .unwrap()
        .seqs
        .insert(0x10_0000 + 0x2000, 4);
    let profile = session.complete_profile().unwrap();
    assert_eq!(live_of(&profile, 10).0, RATE as f64);
    assert_eq!(profile.processes[0].ledger.unwrap().retired, 2);
}

/// Blocks the process replaces while its ledger is read: the seeds of the
/// freed ones leave, and the blocks that replaced them are in the profile
/// (the kernel is read after the ledger, not only before it).
#[test]
fn blocks_replaced_while_the_ledger_is_read_are_in_the_profile() {
    let world = World::default();
    let mut session = session(&world, Target::All);
    // Found by the refresh that builds the profile: its ledger is read
    // between that refresh's two readings of the kernel.
    world.spawn(10, "service");
    let alpha = [address_in(alpha_site)];
    give_ledger(
        &world,
        10,
        (1..=4)
            .map(|i| record(i * 0x1000, 100, 1, &alpha))
            .collect(),
    );
    world
        .process(10)
        .ledger
        .as_mut()
        .unwrap()
        .replaced_while_read = vec![
        (0x1000, 7, alpha.to_vec(), 100),
        (0x2000, 7, alpha.to_vec(), 100),
    ];
    session.sweep_every = Duration::ZERO;
    session.full_scan_every = Duration::ZERO;
    let profile = session.refresh().unwrap();
    // Two seeds left, two kernel samples: four blocks, as the process holds.
    assert_eq!(
        live_of(&profile, 10),
        (4.0 * RATE as f64, 2.0 * RATE as f64)
    );
    assert_eq!(profile.processes[0].ledger.unwrap().retired, 2);
}

/// A process with four seeded blocks of 100 bytes, profiled once.
fn seeded_four(world: &World) -> Session<FakeKernel, FakeProcesses> {
    world.spawn(10, "service");
    let alpha = [address_in(alpha_site)];
    give_ledger(
        world,
        10,
        (1..=4)
            .map(|i| record(i * 0x1000, 100, 1, &alpha))
            .collect(),
    );
    let mut session = session(world, Target::Pids(vec![Pid(10)]));
    let profile = session.complete_profile().unwrap();
    assert_eq!(
        live_of(&profile, 10),
        (4.0 * RATE as f64, 4.0 * RATE as f64)
    );
    session
}

fn two_replaced() -> Vec<Replacement> {
    let alpha = [address_in(alpha_site)];
    vec![
        (0x1000, 7, alpha.to_vec(), 100),
        (0x2000, 7, alpha.to_vec(), 100),
    ]
}

/// Blocks freed after the seeds' sequences were checked and before the
/// kernel's maps were read: their replacements are in the snapshot, so
/// their seeds must not be (a churning process's heap was half again too
/// large when the session was slow between the two).
#[test]
fn seeds_freed_between_their_check_and_the_snapshot_are_counted_once() {
    let world = World::default();
    let mut session = seeded_four(&world);
    world.ledger(10).unwrap().replaced_after_check = two_replaced();
    let profile = session.complete_profile().unwrap();
    assert_eq!(
        live_of(&profile, 10),
        (4.0 * RATE as f64, 2.0 * RATE as f64)
    );
    assert_eq!(profile.processes[0].ledger.unwrap().retired, 2);
}

/// Blocks freed after the kernel's maps were read: their replacements are
/// not in that snapshot, so their seeds still are; the next one has the
/// replacements instead.
#[test]
fn seeds_freed_after_the_snapshot_stay_in_its_profile() {
    let world = World::default();
    let mut session = seeded_four(&world);
    world.ledger(10).unwrap().replaced_after_snapshot = two_replaced();
    let profile = session.refresh().unwrap();
    assert_eq!(
        live_of(&profile, 10),
        (4.0 * RATE as f64, 4.0 * RATE as f64)
    );
    let profile = session.refresh().unwrap();
    assert_eq!(
        live_of(&profile, 10),
        (4.0 * RATE as f64, 2.0 * RATE as f64)
    );
}

#[test]
fn a_process_without_a_ledger_keeps_the_since_attach_label() {
    let world = World::default();
    world.spawn(10, "foreign");
    let mut session = session(&world, Target::Pids(vec![Pid(10)]));
    world.sample(10, 7, &[address_in(alpha_site)], 100);
    let profile = session.complete_profile().unwrap();
    let p = &profile.processes[0];
    assert_eq!(p.ledger.map(|s| s.read), Some(false));
    assert!(world.kernel().watched.is_empty());
}

#[test]
fn an_exiting_process_freezes_with_its_seeds_and_stops_being_watched() {
    let world = World::default();
    world.spawn(10, "service");
    give_ledger(
        &world,
        10,
        vec![record(0x1000, 100, 1, &[address_in(alpha_site)])],
    );
    let mut session = session(&world, Target::Pids(vec![Pid(10)]));
    session.refresh().unwrap();
    world.exit(10);
    let profile = session.complete_profile().unwrap();
    let p = &profile.processes[0];
    assert_eq!(p.state, ProcessState::Exited);
    assert_eq!(p.totals.live_bytes, RATE as f64);
    assert_eq!(p.totals.before_attach_bytes, RATE as f64);
    assert!(world.kernel().watched.is_empty());
}

#[test]
fn seeds_obey_the_kernels_caps_and_what_they_drop_is_counted() {
    use crate::session::ledger::SeedLimits;
    let world = World::default();
    world.spawn(10, "forger");
    world.spawn(11, "other");
    let (alpha, beta) = (address_in(alpha_site), address_in(beta_site));
    // Six blocks on four stacks (one of them twice), of weight RATE each.
    give_ledger(
        &world,
        10,
        vec![
            record(0x1000, 100, 1, &[alpha]),
            record(0x2000, 100, 1, &[beta]),
            record(0x3000, 100, 1, &[alpha, beta]),
            record(0x4000, 100, 1, &[alpha]),
            record(0x5000, 100, 1, &[beta, alpha]),
            record(0x6000, 100, 1, &[beta, beta]),
        ],
    );
    give_ledger(
        &world,
        11,
        (1..=3)
            .map(|i| record(i * 0x1000, 100, 1, &[alpha]))
            .collect(),
    );
    let mut session = session(&world, Target::Pids(vec![Pid(10), Pid(11)]));
    // The kernel holds one live sample of 10 already.
    world.0.borrow_mut().kernel.procs.insert(
        10,
        ProcCounters {
            live_samples: 1,
            ..Default::default()
        },
    );
    session.seed_limits = SeedLimits {
        per_process: 5,
        total: 6,
        stacks_per_image: 2,
        total_stacks: 100,
    };
    let profile = session.complete_profile().unwrap();
    let p = images(&profile, 10)[0];
    let status = p.ledger.unwrap();
    // 5 live samples per process, of which the kernel holds 1: 4 seeds;
    // two stacks, then the overflow stack.
    assert_eq!((status.seeded, status.dropped), (4, 2), "{status:?}");
    assert_eq!(p.drops[DropReason::ProcessCap as usize], 2);
    assert_eq!(p.drops[DropReason::StackRateLimited as usize], 1);
    assert_eq!(p.lost_live_bytes, 2 * RATE);
    assert_eq!(p.totals.live_bytes, 4.0 * RATE as f64);
    assert!(
        p.stacks
            .iter()
            .any(|s| s.frames[0].function.to_string().contains("stack flood")),
        "{:?}",
        p.stacks
    );
    assert_eq!(profile.drops[DropReason::ProcessCap as usize], 2);
    // The session's total: 6 seeds in all, so 2 for the other process.
    let q = images(&profile, 11)[0].ledger.unwrap();
    assert_eq!((q.seeded, q.dropped), (2, 1), "{q:?}");
    assert_eq!(
        images(&profile, 11)[0].drops[DropReason::LiveMapFull as usize],
        1
    );
}

#[test]
fn seeded_weights_decide_the_weight_form_as_the_kernels_do() {
    let world = World::default();
    world.spawn(10, "exact");
    world.spawn(11, "invalid");
    let alpha = [address_in(alpha_site)];
    // Every weight equal to its size (p = 1): a variance of 0 if they were
    // taken as `size / p`; they are what `nsamples × R` weights look like.
    give_ledger(
        &world,
        10,
        (1..=3)
            .map(|i| {
                let mut r = record(i * 0x1000, RATE, 1, &alpha);
                r.record.weight = RATE;
                r
            })
            .collect(),
    );
    // A weight the kernel refuses (2^40): no interval.
    let mut bad = record(0x1000, 100, 1, &alpha);
    bad.record.weight = profiler_common::MAX_WEIGHT;
    give_ledger(&world, 11, vec![bad, record(0x2000, 100, 1, &alpha)]);
    let mut session = session(&world, Target::Pids(vec![Pid(10), Pid(11)]));
    let profile = session.complete_profile().unwrap();
    let exact = images(&profile, 10)[0];
    assert!(exact.totals.live_ci95() > 0.0, "{:?}", exact.totals);
    let invalid = images(&profile, 11)[0];
    assert!(invalid.totals.live_ci95().is_nan(), "{:?}", invalid.totals);
}

#[test]
fn an_image_with_only_seeds_is_frozen_when_it_execs() {
    let world = World::default();
    world.spawn(10, "service");
    give_ledger(
        &world,
        10,
        vec![record(0x1000, 100, 1, &[address_in(alpha_site)])],
    );
    let mut session = session(&world, Target::Pids(vec![Pid(10)]));
    session.refresh().unwrap();
    // No kernel sample: the kernel does not track it, its ledger alone
    // knows its heap.
    assert!(world.kernel().procs.is_empty());
    world.process(10).ledger = None;
    world.exec(10, "next");
    let profile = session.complete_profile().unwrap();
    let old = only_image(&profile, 10, ProcessState::Replaced);
    assert_eq!(old.name, "service");
    assert_eq!(old.totals.live_bytes, RATE as f64);
    assert_eq!(old.totals.before_attach_bytes, RATE as f64);
    assert!(
        old.stacks
            .iter()
            .any(|s| s.frames.iter().any(|f| f.function.contains("alpha_site"))),
        "{old:#?}"
    );
}

#[test]
fn stacks_ending_in_a_marker_do_not_keep_their_process_rescanned() {
    // Stacks that end in each marker: the ledger's (a record the allocator
    // cut short) and the kernel's (a walk cut short for want of a rule).
    // Neither address can ever be mapped, so no rescan can resolve it.
    let world = World::default();
    world.spawn(10, "service");
    world.process(10).code_size = Some(1000);
    let alpha = [address_in(alpha_site)];
    let mut cut = record(0x1000, 100, 1, &alpha);
    cut.record.flags |= FLAG_TRUNCATED;
    give_ledger(&world, 10, vec![cut]);
    let mut session = session(&world, Target::Pids(vec![Pid(10)]));
    world.sample(
        10,
        7,
        &[
            address_in(alpha_site),
            profiler_common::unwind::TRUNCATED_FRAME,
        ],
        1 << 20,
    );
    let profile = session.complete_profile().unwrap();
    let last: Vec<String> = profile.processes[0]
        .stacks
        .iter()
        .map(|s| s.frames.last().unwrap().function.to_string())
        .collect();
    assert!(
        last.iter().any(|f| f == "[cut short by the allocator]")
            && last.iter().any(|f| f.starts_with("[truncated")),
        "one stack ends in each marker: {last:?}"
    );
    assert!(
        session
            .tracked
            .values()
            .all(|t| t.symbols.unresolved.is_empty())
    );
    let scans = world.scans_of(10);
    for _ in 0..5 {
        session.refresh().unwrap();
    }
    assert_eq!(
        world.scans_of(10),
        scans,
        "nothing changed in the process: its maps are not read again"
    );
}

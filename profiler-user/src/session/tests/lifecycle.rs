//! A process's life: exit, exec, pid reuse, a lost exit event, and the
//! records that must not outlive their process.

use super::*;

#[test]
fn an_exit_freezes_the_image_and_frees_its_kernel_state() {
    let world = World::default();
    world.spawn(100, "worker");
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 4 << 20);
    let before = s.complete_profile().unwrap();
    let live = only_image(&before, 100, ProcessState::Live);
    assert!(has_function(live, "alpha_site"), "{:?}", functions(live));
    assert_eq!(s.held_address_spaces(), 1);

    world.exit(100);
    let after = s.complete_profile().unwrap();
    let exited = only_image(&after, 100, ProcessState::Exited);
    assert_eq!(exited.totals.live_bytes, live.totals.live_bytes);
    assert_eq!(exited.alloc_events, 1, "counters frozen at exit");
    assert_eq!(exited.name, "worker");
    assert!(has_function(exited, "alpha_site"));
    assert_eq!(images(&after, 100).len(), 1);
    let kernel = world.kernel();
    assert!(kernel.aggregates.is_empty(), "aggregates forgotten");
    assert!(kernel.procs.is_empty(), "counters forgotten");
    assert!(kernel.stacks.is_empty(), "stacks reclaimed once symbolized");
    drop(kernel);
    assert_eq!(s.held_address_spaces(), 0, "its address space pruned");
}

#[test]
fn an_exec_keeps_the_old_image_apart_and_rescans_the_new_one() {
    let world = World::default();
    world.spawn(100, "sh");
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.complete_profile().unwrap();
    let scans = world.scans_of(100);

    world.exec(100, "server");
    world.sample(100, 8, &[address_in(beta_site)], 3 << 20);
    let p = s.complete_profile().unwrap();
    assert!(world.scans_of(100) > scans, "rescanned after exec");
    let old = only_image(&p, 100, ProcessState::Replaced);
    let new = only_image(&p, 100, ProcessState::Live);
    assert_eq!((old.key.generation, new.key.generation), (0, 1));
    assert_eq!((old.name.as_str(), new.name.as_str()), ("sh", "server"));
    assert!(has_function(old, "alpha_site") && !has_function(old, "beta_site"));
    assert!(has_function(new, "beta_site") && !has_function(new, "alpha_site"));
    assert!(new.totals.live_bytes > old.totals.live_bytes);
    let kernel = world.kernel();
    assert!(
        kernel.aggregates.keys().all(|k| k.generation == 1),
        "only the old image's aggregates are forgotten"
    );
    assert!(
        kernel.procs.contains_key(&100),
        "the process keeps its counters"
    );
}

#[test]
fn an_image_replaced_by_exec_keeps_its_weight_form_lost_bytes_and_drops() {
    let world = World::default();
    world.spawn(100, "emitter");
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    {
        // Weights of no known form, a sample it could not track, a drop.
        let mut w = world.0.borrow_mut();
        let proc = w.kernel.procs.get_mut(&100).unwrap();
        proc.min_weight = 3;
        proc.weights_not_multiple = 2;
        proc.weights_below_size = 1;
        proc.lost_live_bytes = 5 << 20;
        proc.drops[DropReason::Unplaced as usize] = 1;
    }
    let before = s.complete_profile().unwrap();
    let live = only_image(&before, 100, ProcessState::Live);
    assert_eq!(live.weight_form, profiler_common::WeightForm::Unrecognized);
    assert_eq!(live.totals.live_ci95_known(), None);

    world.exec(100, "emitter");
    // Frozen at the poll that sees the exec; the new image samples after.
    s.complete_profile().unwrap();
    world.sample(100, 8, &[address_in(beta_site)], 2 << 20);
    let after = s.complete_profile().unwrap();
    let old = only_image(&after, 100, ProcessState::Replaced);
    assert_eq!(old.weight_form, profiler_common::WeightForm::Unrecognized);
    assert_eq!(
        old.totals.live_ci95_known(),
        None,
        "no interval after the exec either"
    );
    assert_eq!(old.lost_live_bytes, 5 << 20, "still a lower bound");
    assert_eq!(old.drops[DropReason::Unplaced as usize], 1);
    assert_eq!(old.alloc_events, 1);
    // The new image's counters are its own: nothing counted twice.
    let new = only_image(&after, 100, ProcessState::Live);
    assert_eq!(new.lost_live_bytes, 0);
    assert_eq!(new.dropped(), 0);
    assert_eq!(new.alloc_events, 1);
    assert_eq!(after.lost_live_bytes(), 5 << 20);
    // And when it exits, its own again.
    world.exit(100);
    let gone = s.complete_profile().unwrap();
    let exited = only_image(&gone, 100, ProcessState::Exited);
    assert_eq!((exited.lost_live_bytes, exited.alloc_events), (0, 1));
    assert_eq!(gone.lost_live_bytes(), 5 << 20);
}

#[test]
fn a_reused_pid_is_another_process_with_its_own_figures_and_names() {
    let world = World::default();
    world.spawn(100, "first");
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.complete_profile().unwrap();
    world.exit(100);
    s.complete_profile().unwrap();

    // Another process gets pid 100, and a stack id the first one used:
    // ids are per (pid, generation), which the new process starts over.
    world.spawn(100, "second");
    world.sample(100, 7, &[address_in(beta_site)], 8 << 20);
    world.sample(100, 7, &[address_in(beta_site)], 8 << 20);
    let p = s.complete_profile().unwrap();
    let first = only_image(&p, 100, ProcessState::Exited);
    let second = only_image(&p, 100, ProcessState::Live);
    assert_eq!(
        (first.name.as_str(), second.name.as_str()),
        ("first", "second")
    );
    assert!(has_function(first, "alpha_site") && !has_function(first, "beta_site"));
    assert!(
        has_function(second, "beta_site") && !has_function(second, "alpha_site"),
        "the new process's stack is symbolized for it: {:?}",
        functions(second)
    );
    assert_eq!(first.totals.live_samples, 1);
    assert_eq!(second.totals.live_samples, 2);
}

/// Runs processes through start, exec, exit and pid reuse (system-wide
/// and per process), and checks what the session holds per process: each
/// live process one record, and nothing once every process has exited and
/// the images kept of them are dropped.
fn nothing_outlives_its_process(target: Target) {
    let world = World::default();
    world.spawn(100, "app");
    world.spawn(200, "quiet");
    let mut s = session(&world, target.clone());
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    world.oom(200);
    s.complete_profile().unwrap();
    assert!(s.tracked.contains_key(&Pid(100)) && s.per_process_entries() > 0);

    // An exec: the record stays, the old image is frozen with its names.
    world.exec(100, "app2");
    world.sample(100, 8, &[address_in(beta_site)], 1 << 20);
    s.complete_profile().unwrap();
    assert_eq!(images(&s.complete_profile().unwrap(), 100).len(), 2);

    // Both exit (the quiet one never sampled, after its OOM event).
    world.exit(100);
    world.exit(200);
    s.complete_profile().unwrap();
    assert!(
        s.tracked.is_empty(),
        "records of exited processes: {:?}",
        s.tracked.keys().collect::<Vec<_>>()
    );
    assert_eq!(s.per_process_entries(), 0);

    // Another process reuses pid 100, execs and exits.
    world.spawn(100, "again");
    if let Target::Pids(_) = target {
        s.scan(Pid(100)).unwrap();
    }
    world.sample(100, 7, &[address_in(beta_site)], 1 << 20);
    s.complete_profile().unwrap();
    let again = s.tracked[&Pid(100)].incarnation;
    assert!(
        s.frozen.iter().all(|f| f.incarnation != again),
        "a new incarnation"
    );
    world.exec(100, "again2");
    s.complete_profile().unwrap();
    world.exit(100);
    s.complete_profile().unwrap();
    assert!(s.tracked.is_empty());
    assert_eq!(s.per_process_entries(), 0);
    assert!(s.symbols_held() > 0, "the frozen images keep their names");

    // The images kept of them go: nothing of any process is left.
    s.set_max_gone_memory(0);
    s.complete_profile().unwrap();
    assert!(s.frozen.is_empty());
    assert_eq!(s.symbols_held(), 0);
    assert_eq!(s.pending_requests(), 0);
    assert!(s.tracked.is_empty());
    assert_eq!(world.kernel().watched.len(), 0);
}

#[test]
fn nothing_outlives_its_process_system_wide() {
    nothing_outlives_its_process(Target::All);
}

#[test]
fn nothing_outlives_its_process_with_pid() {
    nothing_outlives_its_process(Target::Pids(vec![Pid(100), Pid(200)]));
}

#[test]
fn a_lost_exit_event_is_noticed_at_the_next_refresh() {
    let world = World::default();
    world.spawn(100, "app");
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.refresh().unwrap();
    // The ring buffer was full: the exit is never reported.
    world.exit(100);
    world.0.borrow_mut().kernel.events.clear();
    let p = s.refresh().unwrap();
    only_image(&p, 100, ProcessState::Exited);
    // The refresh that notices it shows it once: not also live, from the
    // snapshot taken before it was retired.
    assert_eq!(images(&p, 100).len(), 1, "{p:#?}");
    assert!(world.kernel().procs.is_empty());
}

#[test]
fn a_process_gone_before_it_is_read_keeps_the_name_the_kernel_saw() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    // Sampled and gone before the session ever read its /proc entry.
    world.sample(300, 9, &[address_in(alpha_site)], 4 << 20);
    {
        let mut w = world.0.borrow_mut();
        let proc = w.kernel.procs.get_mut(&300).unwrap();
        proc.comm[..9].copy_from_slice(b"shortjob\0");
    }
    world.exit(300);
    let profile = s.complete_profile().unwrap();
    let gone = only_image(&profile, 300, ProcessState::Exited);
    assert_eq!(gone.name, "shortjob");
}

#[test]
fn drops_are_reported_per_process_and_in_total() {
    let world = World::default();
    world.spawn(100, "app");
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    {
        let mut w = world.0.borrow_mut();
        w.kernel.drops[DropReason::StackMapFull as usize] = 5;
        w.kernel.drops[DropReason::UnmatchedFree as usize] = 2;
        let proc = w.kernel.procs.get_mut(&100).unwrap();
        proc.drops[DropReason::StackMapFull as usize] = 3;
        proc.lost_live_bytes = 12345;
    }
    let p = s.refresh().unwrap();
    assert_eq!(p.drops[DropReason::StackMapFull as usize], 5);
    assert_eq!(p.drops[DropReason::UnmatchedFree as usize], 2);
    let live = only_image(&p, 100, ProcessState::Live);
    assert_eq!(live.drops[DropReason::StackMapFull as usize], 3);
    assert_eq!(live.lost_live_bytes, 12345);

    // Frozen with the process when it exits.
    world.exit(100);
    let p = s.refresh().unwrap();
    let exited = only_image(&p, 100, ProcessState::Exited);
    assert_eq!(exited.drops[DropReason::StackMapFull as usize], 3);
    assert_eq!(exited.lost_live_bytes, 12345);
}

/// The kernel reports a process's exit while it is still in /proc (in its
/// exit: its maps and executable already gone): its final image keeps the
/// resource read while it lived.
fn an_exit_seen_while_exiting_keeps_the_resource(target: Target) {
    let world = World::default();
    world.spawn(100, "worker");
    let mut s = session(&world, target);
    world.sample(100, 7, &[address_in(alpha_site)], 4 << 20);
    let live = s.complete_profile().unwrap();
    let read = only_image(&live, 100, ProcessState::Live)
        .resource
        .clone()
        .expect("read while it lived");
    assert_eq!(read.executable_path.as_deref(), Some("/fake/worker"));

    let p = exit_seen_while_exiting(&world, &mut s, 100);
    let exited = only_image(&p, 100, ProcessState::Exited);
    assert_eq!(exited.resource.as_deref(), Some(&*read));
}

#[test]
fn an_exit_seen_while_exiting_keeps_the_resource_with_pid() {
    an_exit_seen_while_exiting_keeps_the_resource(Target::Pids(vec![Pid(100)]));
}

#[test]
fn an_exit_seen_while_exiting_keeps_the_resource_with_trees() {
    an_exit_seen_while_exiting_keeps_the_resource(Target::Trees(vec![Pid(100)]));
}

#[test]
fn a_tree_s_fork_children_are_followed_with_their_parent_even_gone_before_a_scan() {
    let world = World::default();
    world.spawn(100, "server");
    let mut s = session(&world, Target::Trees(vec![Pid(100)]));
    s.complete_profile().unwrap();
    let fork = |child: u32| {
        world.0.borrow_mut().kernel.events.push(ProcEvent {
            pid: child,
            kind: profiler_common::PROC_EVENT_FORK,
            parent: 100,
            _pad: 0,
        });
    };
    // A worker forks, allocates and exits between two polls: never scanned,
    // its stacks are named with its parent's maps.
    world.spawn(101, "server");
    fork(101);
    world.sample(101, 9, &[address_in(alpha_site)], 1 << 20);
    world.exit(101);
    // Another lives on: scanned at its fork.
    world.spawn(102, "server");
    fork(102);
    world.sample(102, 10, &[address_in(beta_site)], 1 << 20);
    let p = s.complete_profile().unwrap();
    let gone = only_image(&p, 101, ProcessState::Exited);
    assert_eq!(gone.parent, Some(Pid(100)));
    // Who its parent is (it never exec'ed), under its own pid.
    let resource = gone.resource.as_deref().expect("its parent's resource");
    assert_eq!(resource.executable_path.as_deref(), Some("/fake/server"));
    assert_eq!(resource.container_id.as_deref(), Some("container-100"));
    assert_eq!(resource.host_pid, Some(101));
    assert!(has_function(gone, "alpha_site"), "{:?}", functions(gone));
    let live = only_image(&p, 102, ProcessState::Live);
    assert_eq!(live.parent, Some(Pid(100)));
    let resource = live.resource.as_deref().expect("read at its fork");
    assert_eq!(resource.container_id.as_deref(), Some("container-102"));
    assert!(has_function(live, "beta_site"), "{:?}", functions(live));
    assert!(world.scans_of(102) > 0, "scanned at its fork");
}

/// The kernel reports a process's exit while it is still in /proc, its
/// environ gone: the rescans that follow keep the rate read while it lived
/// (read again, it would be the default, and its intervals wrong).
#[test]
fn an_exit_seen_while_exiting_keeps_the_rate() {
    let world = World::default();
    world.spawn(100, "worker");
    world.process(100).rate = 4096;
    let mut s = session(&world, Target::Trees(vec![Pid(100)]));
    world.sample(100, 7, &[address_in(alpha_site)], 4 << 20);
    let live = s.complete_profile().unwrap();
    assert_eq!(only_image(&live, 100, ProcessState::Live).rate, 4096);
    let p = exit_seen_while_exiting(&world, &mut s, 100);
    assert_eq!(only_image(&p, 100, ProcessState::Exited).rate, 4096);
}

/// A fork child read only after it exec'ed, its exec event not polled yet:
/// its replaced image (a copy of its parent's) has its parent's rate, its
/// new image its own.
#[test]
fn a_fork_child_s_image_before_its_exec_has_its_parent_s_rate() {
    let world = World::default();
    world.spawn(100, "server");
    world.process(100).rate = 4096;
    let mut s = session(&world, Target::Trees(vec![Pid(100)]));
    s.complete_profile().unwrap();
    // Forked, sampled as the parent's copy, then exec'ed (rate 1 MiB)
    // before the session scanned it; the exec event comes a poll later.
    world.spawn(101, "tool");
    world.process(101).rate = 1 << 20;
    world.0.borrow_mut().kernel.events.push(ProcEvent {
        pid: 101,
        kind: profiler_common::PROC_EVENT_FORK,
        parent: 100,
        _pad: 0,
    });
    world.sample(101, 9, &[address_in(alpha_site)], 1 << 20);
    s.complete_profile().unwrap();
    world.exec(101, "tool");
    world.sample(101, 10, &[address_in(beta_site)], 1 << 20);
    let p = s.complete_profile().unwrap();
    assert_eq!(only_image(&p, 101, ProcessState::Replaced).rate, 4096);
    assert_eq!(only_image(&p, 101, ProcessState::Live).rate, 1 << 20);
}

/// The kernel's exit event of `pid` comes while it is still in /proc
/// (exiting: maps, executable and environ gone), a profile is built, then
/// it is gone (no second event: the kernel sent its one): the profile then.
fn exit_seen_while_exiting(
    world: &World,
    s: &mut Session<FakeKernel, FakeProcesses>,
    pid: u32,
) -> Profile {
    world.process(pid).exiting = true;
    world.0.borrow_mut().kernel.events.push(ProcEvent {
        pid,
        kind: PROC_EVENT_EXIT,
        ..ProcEvent::default()
    });
    s.complete_profile().unwrap();
    world.0.borrow_mut().processes.remove(&pid);
    s.complete_profile().unwrap()
}

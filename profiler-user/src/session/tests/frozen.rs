//! Gone images: kept within their caps, the oldest dropped with their
//! names, and the OOM killer's victims recorded.

use super::*;

#[test]
fn the_oldest_frozen_images_go_past_the_cap() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    s.max_frozen = 3;
    for pid in 100..105 {
        world.spawn(pid, &format!("job{pid}"));
        world.sample(pid, 7, &[address_in(alpha_site)], 1 << 20);
        s.complete_profile().unwrap();
        world.exit(pid);
        s.refresh().unwrap();
    }
    let p = s.complete_profile().unwrap();
    let mut pids: Vec<u32> = p.processes.iter().map(|p| p.key.pid.0).collect();
    pids.sort_unstable();
    assert_eq!(pids, vec![102, 103, 104], "the newest three are kept");
    assert_eq!(s.symbols_held(), 3, "the names of dropped images go too");
    assert_eq!(s.dropped_images, 2);
    assert_eq!(
        s.warnings
            .iter()
            .filter(|w| w.contains("no longer shown"))
            .count(),
        1,
        "said once: {:?}",
        s.warnings
    );
}

#[test]
fn the_oldest_frozen_images_go_past_the_memory_cap() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    let mut one_image = 0;
    for pid in 100..106 {
        world.spawn(pid, &format!("job{pid}"));
        world.sample(
            pid,
            7,
            &[address_in(alpha_site), address_in(beta_site)],
            1 << 20,
        );
        s.complete_profile().unwrap();
        world.exit(pid);
        s.complete_profile().unwrap();
        if pid == 100 {
            // Its figures and, once symbolized, its stack's names.
            one_image = s.gone_bytes;
            assert!(one_image > 200, "{one_image}");
            s.set_max_gone_memory(one_image * 5 / 2);
        }
    }
    let p = s.complete_profile().unwrap();
    let mut pids: Vec<u32> = p.processes.iter().map(|p| p.key.pid.0).collect();
    pids.sort_unstable();
    assert_eq!(pids, vec![104, 105], "the newest two fit");
    assert!(s.gone_bytes <= one_image * 5 / 2);
    assert_eq!(s.symbols_held(), 2, "the names of dropped images go too");
    assert_eq!(s.dropped_images, 4);
    assert!(
        s.warnings.iter().any(|w| w.contains("--max-gone-memory")),
        "{:?}",
        s.warnings
    );
}

#[test]
fn names_of_images_dropped_before_they_are_symbolized_are_not_kept() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    // Nothing gone may be kept: each image goes as it is frozen, while its
    // stacks are still with the symbolizer.
    s.set_max_gone_memory(1);
    for pid in 100..103 {
        world.spawn(pid, &format!("job{pid}"));
        world.sample(pid, 7, &[address_in(alpha_site)], 1 << 20);
        world.exit(pid);
        s.refresh().unwrap();
    }
    let p = s.complete_profile().unwrap();
    assert!(p.processes.is_empty(), "{p:#?}");
    assert_eq!(s.dropped_images, 3);
    assert_eq!(s.symbols_held(), 0, "names kept");
    assert_eq!(s.pending_requests(), 0);
    assert_eq!(s.gone_bytes, 0);
}

#[test]
fn an_oom_victim_that_reuses_an_earlier_victim_s_pid_is_recorded_too() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    let dir = tempfile::tempdir().unwrap();
    s.record_oom_kills(crate::oom::OomRecorder::new(dir.path(), 10).unwrap());
    let profiles = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".pb.gz")
            })
            .count()
    };
    // Two processes in turn with pid 100, both at generation 0, both
    // killed by the OOM killer.
    for victims in 1..=2 {
        world.spawn(100, "grow");
        world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
        s.refresh().unwrap();
        world.oom(100);
        world.exit(100);
        let p = s.complete_profile().unwrap();
        let killed: Vec<_> = images(&p, 100)
            .into_iter()
            .filter(|p| p.state == ProcessState::OomKilled)
            .collect();
        assert_eq!(killed.len(), victims, "{p:#?}");
        assert!(killed.iter().all(|k| k.key.generation == 0));
        assert_eq!(profiles(), victims, "{:?}", s.warnings);
    }
    // Each once.
    s.complete_profile().unwrap();
    assert_eq!(profiles(), 2);
}

#[test]
fn an_oom_victim_whose_main_thread_had_exited_is_recorded_as_oom_killed() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    world.spawn(100, "workers");
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.refresh().unwrap();
    // The main thread calls pthread_exit: the kernel reports its exit, the
    // other threads run on.
    world.0.borrow_mut().kernel.events.push(ProcEvent {
        pid: 100,
        kind: PROC_EVENT_EXIT,
        ..ProcEvent::default()
    });
    s.refresh().unwrap();
    // The OOM killer picks the process; its threads die with no exit
    // event of the main thread left to report.
    world.oom(100);
    s.refresh().unwrap();
    world.0.borrow_mut().processes.remove(&100);
    let p = s.complete_profile().unwrap();
    only_image(&p, 100, ProcessState::OomKilled);
}

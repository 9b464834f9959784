//! Which probe files are attached, and for whom.

use super::*;

#[test]
fn a_dlopened_probe_file_is_attached_at_the_next_refresh() {
    for target in [
        Target::All,
        Target::Pids(vec![Pid(100)]),
        Target::Trees(vec![Pid(100)]),
    ] {
        let world = World::default();
        world.spawn(100, "app");
        let mut s = session(&world, target.clone());
        world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
        s.refresh().unwrap();
        let plugin = probe_file_id(2);
        assert!(!s.is_attached(Pid(100), plugin));

        world.process(100).probe_files.push(plugin);
        s.refresh().unwrap();
        assert!(s.is_attached(Pid(100), plugin), "{target:?}");
        let scope = match target {
            Target::All | Target::Trees(_) => Scope::AllProcesses,
            Target::Pids(_) => Scope::Process(Tid(100)),
        };
        assert!(world.kernel().attached.contains(&(plugin, scope)));
    }
}

#[test]
fn with_pid_an_exit_detaches_the_process_s_own_attachments() {
    let world = World::default();
    world.spawn(100, "app");
    world.spawn(200, "other");
    let mut s = session(&world, Target::Pids(vec![Pid(100), Pid(200)]));
    assert_eq!(s.attachments(), 2);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.refresh().unwrap();

    world.exit(100);
    s.refresh().unwrap();
    assert_eq!(world.kernel().detached, vec![100]);
    assert_eq!(s.attachments(), 1, "the other target stays attached");
    assert!(s.targets_alive());
    world.exit(200);
    s.refresh().unwrap();
    assert!(!s.targets_alive());
}

#[test]
fn with_pid_a_target_that_sampled_nothing_yet_is_in_the_profile_at_0_b() {
    let world = World::default();
    world.spawn(100, "idle");
    world.spawn(200, "busy");
    let mut s = session(&world, Target::Pids(vec![Pid(100), Pid(200)]));
    world.sample(200, 7, &[address_in(alpha_site)], 1 << 20);
    let p = s.complete_profile().unwrap();
    let idle = only_image(&p, 100, ProcessState::Live);
    assert_eq!(idle.name, "idle");
    assert_eq!(idle.totals.live_bytes, 0.0);
    assert!(idle.stacks.is_empty());
    assert_eq!(p.processes.len(), 2, "{p:#?}");
    // Gone without a sample: nothing of it to show.
    world.exit(100);
    let p = s.complete_profile().unwrap();
    assert!(images(&p, 100).is_empty(), "{p:#?}");
}

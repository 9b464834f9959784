//! Stacks to names: waiting for a process's maps, and stacks into
//! libraries mapped after they were seen (rescans).

use super::*;

#[test]
fn a_stack_seen_before_its_process_s_maps_is_symbolized_once_they_are_known() {
    let world = World::default();
    world.spawn(100, "app");
    // Armed probes fired before a scan could read the process's maps
    // (right after exec, or /proc not readable yet).
    world.process(100).maps_readable = false;
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.refresh().unwrap();
    s.finish_symbols();
    let early = s.refresh().unwrap();
    let live = only_image(&early, 100, ProcessState::Live);
    assert!(
        functions(live)
            .iter()
            .all(|f| f.contains("not yet symbolized")),
        "not symbolized without its maps: {:?}",
        functions(live)
    );

    world.process(100).maps_readable = true;
    let p = s.complete_profile().unwrap();
    let live = only_image(&p, 100, ProcessState::Live);
    assert!(has_function(live, "alpha_site"), "{:?}", functions(live));
}

#[test]
fn a_stack_into_a_library_mapped_after_its_scan_is_symbolized_again() {
    let world = World::default();
    world.spawn(100, "app");
    // beta_site's code is in a library the process dlopen'ed after the
    // last scan: the scan does not map it yet (nor, here, the rest of this
    // binary's code, which shares its mapping).
    world.process(100).not_mapped = Some(address_in(beta_site));
    let mut s = session(&world, Target::All);
    world.sample(
        100,
        7,
        &[address_in(beta_site), address_in(alpha_site)],
        1 << 20,
    );
    let early = s.complete_profile().unwrap();
    let live = only_image(&early, 100, ProcessState::Live);
    assert!(!has_function(live, "beta_site"), "{:?}", functions(live));
    assert!(has_function(live, "[unknown"), "{:?}", functions(live));

    // The next scan sees the library: its frames get their names.
    world.process(100).not_mapped = None;
    let p = s.complete_profile().unwrap();
    let live = only_image(&p, 100, ProcessState::Live);
    assert!(has_function(live, "beta_site"), "{:?}", functions(live));
    assert_eq!(s.unresolved_stacks(), 0, "nothing left to resolve");
    // Asked for once: names that are complete are not asked for again.
    let again = s.complete_profile().unwrap();
    assert_eq!(s.pending_requests(), 0);
    assert!(has_function(
        only_image(&again, 100, ProcessState::Live),
        "beta_site"
    ));
}

#[test]
fn a_process_is_rescanned_when_its_code_changes_or_its_stacks_leave_its_maps() {
    let world = World::default();
    world.spawn(100, "app");
    world.process(100).code_size = Some(1000);
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.complete_profile().unwrap();
    let scans = world.scans_of(100);
    s.refresh().unwrap();
    s.refresh().unwrap();
    assert_eq!(world.scans_of(100), scans, "nothing changed: no rescan");

    // A dlopen: its code grows.
    world.process(100).code_size = Some(1200);
    s.refresh().unwrap();
    assert_eq!(world.scans_of(100), scans + 1);
    s.refresh().unwrap();
    assert_eq!(world.scans_of(100), scans + 1);

    // A stack outside the maps known (the library's size unchanged: one
    // dlclose'd, another dlopen'ed): rescanned until its names are in.
    world.process(100).not_mapped = Some(address_in(beta_site));
    s.forget_scans();
    s.refresh().unwrap();
    world.sample(100, 8, &[address_in(beta_site)], 1 << 20);
    s.complete_profile().unwrap();
    world.process(100).not_mapped = None;
    let p = s.complete_profile().unwrap();
    assert!(has_function(
        only_image(&p, 100, ProcessState::Live),
        "beta_site"
    ));
    let scans = world.scans_of(100);
    s.refresh().unwrap();
    assert_eq!(world.scans_of(100), scans, "resolved: no rescan");
}

#[test]
fn a_tick_looks_only_at_processes_that_sampled_since() {
    let world = World::default();
    world.spawn(100, "app");
    world.spawn(101, "other");
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    world.sample(101, 8, &[address_in(alpha_site)], 1 << 20);
    s.tick().unwrap();
    s.finish_symbols();
    let reads = world.kernel().stack_reads.get();
    assert!(reads >= 2, "both stacks read: {reads}");
    // Nothing new: the next beats look at no aggregate, read no stack.
    s.tick().unwrap();
    let looked = s.looked_at();
    s.tick().unwrap();
    s.tick().unwrap();
    assert_eq!(s.looked_at(), looked, "no process sampled");
    assert_eq!(world.kernel().stack_reads.get(), reads, "no new stack");
    assert_eq!(s.pending_requests(), 0);

    // One process samples a new stack and an old one: its two stacks are
    // looked at, only the new one read; the other process's are not.
    world.sample(100, 9, &[address_in(beta_site)], 1 << 10);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.tick().unwrap();
    assert_eq!(s.looked_at(), looked + 2, "stacks 7 and 9 only");
    assert_eq!(world.kernel().stack_reads.get(), reads + 1, "only stack 9");
    s.tick().unwrap();
    assert_eq!(world.kernel().stack_reads.get(), reads + 1);
    let p = s.complete_profile().unwrap();
    let live = only_image(&p, 100, ProcessState::Live);
    assert!(has_function(live, "beta_site"), "{:?}", functions(live));
    assert!(has_function(live, "alpha_site"), "{:?}", functions(live));
    let other = only_image(&p, 101, ProcessState::Live);
    assert!(has_function(other, "alpha_site"), "{:?}", functions(other));
}

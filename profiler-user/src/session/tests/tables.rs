//! Which processes the kernel walks with unwind tables, and when.

use super::*;

/// Waits (bounded) until `pid` has the table of this test binary's code.
fn wait_for_tables(s: &mut Session<FakeKernel, FakeProcesses>, world: &World, pid: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let here = address_in(alpha_site);
    let has_ours = |world: &World| {
        world.kernel().unwind_procs.get(&pid).is_some_and(|t| {
            t.mappings[..t.len as usize]
                .iter()
                .any(|m| m.start <= here && here < m.end)
        })
    };
    while !has_ours(world) {
        assert!(
            std::time::Instant::now() < deadline,
            "no unwind tables for {pid}: {:?}",
            s.warnings
        );
        s.poll_events();
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_process_gets_the_tables_of_its_code_and_loses_them_at_exec_and_exit() {
    let world = World::default();
    world.spawn(100, "app");
    world.spawn(101, "app");
    let mut s = session(&world, Target::All);
    wait_for_tables(&mut s, &world, 100);
    wait_for_tables(&mut s, &world, 101);
    let here = address_in(alpha_site);
    let first_version = world.kernel().unwind_procs[&100].version;
    assert!(
        first_version > 0,
        "0 marks the kernel's empty cache entries"
    );
    {
        let k = world.kernel();
        let table = k.unwind_procs[&100];
        let m = table.mappings[..table.len as usize]
            .iter()
            .find(|m| m.start <= here && here < m.end)
            .expect("our code's mapping has a table");
        let rows: Vec<UnwindRow> = (m.rows_start..m.rows_start + m.rows_len)
            .map(|i| k.unwind_rows[&i])
            .collect();
        let row = profiler_common::unwind::find_row(&rows, here - 1 - m.bias).unwrap();
        assert_ne!(
            rows[row].cfa_rule,
            profiler_common::unwind::cfa::UNKNOWN,
            "our function has a rule"
        );
    }
    world.exec(100, "other");
    s.poll_events();
    assert!(
        world.kernel().unwind_cleared.contains(&100),
        "the old image's tables go at exec"
    );
    // The new image (the same files here) gets them again from its scan,
    // under a new version: the kernel's row cache keeps nothing of the old.
    wait_for_tables(&mut s, &world, 100);
    assert!(world.kernel().unwind_procs[&100].version > first_version);
    // No two tables given share a version (two processes with the same
    // files included): the cache never serves one table what another found.
    let versions = world.kernel().unwind_versions.clone();
    let distinct: std::collections::HashSet<_> = versions.iter().collect();
    assert!(
        versions.len() >= 3 && distinct.len() == versions.len(),
        "{versions:?}"
    );
    world.exit(101);
    world.exit(100);
    s.refresh().unwrap();
    assert!(world.kernel().unwind_procs.is_empty(), "and at exit");
}

#[test]
fn a_process_gets_no_tables_while_any_of_its_files_is_loading() {
    // Its address space is this test binary's: the binary, libc, the
    // loader..., whose tables come in one by one (libc long before us).
    let world = World::default();
    world.spawn(100, "app");
    let mut s = session(&world, Target::All);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut polls = 0;
    while !world.kernel().unwind_procs.contains_key(&100) {
        assert!(std::time::Instant::now() < deadline, "{:?}", s.warnings);
        assert!(s.unwind_status().loading > 0, "every table in, none given");
        s.poll_events();
        polls += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    // Given in the poll that loaded the last one: walks never start in code
    // whose table is still on its way (they would end in a marker at once).
    let status = s.unwind_status();
    assert_eq!(status.loading, 0, "after {polls} polls: {status:?}");
    assert!(world.kernel().unwind_procs[&100].len > 1, "several files");
}

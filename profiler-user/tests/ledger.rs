//! The heap from before attach, with real eBPF and real processes: the
//! allocator's live-sample ledger gives allocprof what a process allocated
//! before it attached (late `--pid`, late system-wide, a forked child's
//! inheritance), each block counted once and retired when freed, and a
//! ledger the process scribbled on is checked, not followed.

mod common;

use std::{process::Command, time::Duration};

use allocprof::ids::Pid;
use allocprof::{
    kernel::Limits,
    model::profile::{ProcessProfile, Profile},
    model::stats::Totals,
    output::report::{self, ReportOptions},
    session::{Session, Target},
};
use common::{Proc, RATE, header_address, read_words, truth_and_sigma, write_words};

// heap_before.c's sites.
const A: (u64, u64) = (4000, 4096);
const B: (u64, u64) = (200, 65536);
const C: (u64, u64) = (3000, 2048);
const CHURN: (u64, u64) = (2 * 2000, 8192);

fn workload() -> Command {
    Command::new(common::compile_c("heap_before.c", &["-pthread"]))
}

/// `site`'s live bytes within 5σ of `n` blocks of `size` bytes.
fn assert_live(p: &ProcessProfile, site: &str, (n, size): (u64, u64)) -> Totals {
    let t = common::site(p, site);
    let (truth, sigma) = truth_and_sigma(n, size, RATE);
    assert!(
        (t.live_bytes - truth).abs() <= 5.0 * sigma,
        "{site}: live {} vs truth {truth} (sigma {sigma}) in {p:#?}",
        t.live_bytes
    );
    t
}

fn started(cmd: Command) -> Proc {
    let mut p = Proc::spawn(cmd);
    common::wait_for_mapping(p.pid(), "liballocprof.so");
    p.send("alloc");
    p.expect("ready");
    p
}

#[test]
fn a_late_pid_attach_sees_the_heap_from_before_and_what_is_freed_after() {
    common::require_bpf();
    let mut w = started(workload());
    let mut session = Session::start(Target::Pids(vec![Pid(w.pid())]), Limits::default()).unwrap();
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, w.pid());
    let a = assert_live(p, "site_a", A);
    let b = assert_live(p, "site_b", B);
    // All of it from before attach, and said so.
    assert_eq!(a.before_attach_bytes, a.live_bytes);
    assert_eq!(b.before_attach_bytes, b.live_bytes);
    assert!(!p.since_attach, "its whole heap is seen");
    assert!(profile.ran_before_attach.is_empty());
    let ledger = p.ledger.expect("its ledger was looked for");
    assert!(ledger.read && ledger.seeded > 0, "{ledger:?}");
    assert_eq!((ledger.garbage, ledger.unread), (0, 0));
    let text = report::render(&profile, ReportOptions::default());
    let header = text.lines().next().unwrap();
    assert!(header.contains("estimated live heap"), "{header}");
    assert!(text.contains("allocated before attach)"), "{text}");

    // Freed after attach: the kernel reports the frees it saw no
    // allocation for, and the seeds go.
    w.send("half");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, w.pid());
    assert_live(p, "site_a", (A.0 / 2, A.1));
    assert_live(p, "site_b", B);
    assert!(p.ledger.unwrap().retired > 0);
    w.send("exit");
}

#[test]
fn a_late_system_wide_attach_sees_the_heap_from_before() {
    common::require_bpf();
    let mut w = started(workload());
    let mut session = Session::start(Target::All, Limits::default()).unwrap();
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, w.pid());
    assert_live(p, "site_a", A);
    assert_live(p, "site_b", B);
    assert!(!profile.live_since_attach() || !profile.ran_before_attach.is_empty());
    w.send("exit");
}

/// Refreshes until `pid` is in the profile (a fork child is seen at its
/// first event, then scanned and its ledger read).
fn profile_with(session: &mut Session, pid: u32) -> Profile {
    for _ in 0..50 {
        let profile = session.complete_profile().unwrap();
        if profile.processes.iter().any(|p| {
            p.key.pid.0 == pid && p.ledger.is_some_and(|l| l.read) && p.totals.live_bytes > 0.0
        }) {
            return profile;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("process {pid} never showed with its ledger read");
}

#[test]
fn a_forked_child_holds_what_it_inherited_and_what_it_allocated() {
    common::require_bpf();
    let mut w = started(workload());
    let mut session = Session::start(Target::All, Limits::default()).unwrap();
    session.complete_profile().unwrap();
    w.send("fork");
    let line = w.line();
    let child: u32 = line
        .strip_prefix("child ")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("unexpected {line:?}"));
    let profile = profile_with(&mut session, child);
    let c = common::process(&profile, child);
    // Inherited: half of site_a (it freed the other half), all of site_b;
    // its own: site_c.
    let a = assert_live(c, "site_a", (A.0 / 2, A.1));
    assert_live(c, "site_b", B);
    let own = assert_live(c, "site_c", C);
    assert_eq!(a.before_attach_bytes, a.live_bytes, "inherited");
    assert_eq!(own.before_attach_bytes, 0.0, "seen by the kernel");
    // The parent still holds all of its heap.
    let p = common::process(&profile, w.pid());
    assert_live(p, "site_a", A);
    assert_live(p, "site_b", B);
    w.send("reap");
    assert_eq!(w.line(), "reaped 0");
    w.send("exit");
}

#[test]
fn blocks_churned_while_the_ledger_is_read_are_counted_once() {
    common::require_bpf();
    let mut w = Proc::spawn(workload());
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    w.send("churn");
    w.expect("ready");
    // Two threads replace their blocks without pause while allocprof reads
    // the ledger: each block is the ledger's or the kernel's, never both.
    let mut session = Session::start(Target::Pids(vec![Pid(w.pid())]), Limits::default()).unwrap();
    for _ in 0..3 {
        let profile = session.complete_profile().unwrap();
        let p = common::process(&profile, w.pid());
        let t = assert_live(p, "site_churn", CHURN);
        assert!(t.before_attach_bytes > 0.0 || t.live_bytes > 0.0);
        std::thread::sleep(Duration::from_millis(300));
    }
    w.send("exit");
}

#[test]
fn a_process_exiting_while_its_ledger_is_read_is_no_error() {
    common::require_bpf();
    for delay_ms in [0, 1, 3, 10] {
        let w = started(workload());
        let pid = w.pid();
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(delay_ms));
            drop(w); // SIGKILL, reaped
        });
        // Either it is gone before attach (no such process, no probes) or
        // it is followed and then retired; never a panic or a hang.
        if let Ok(mut session) = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()) {
            killer.join().unwrap();
            let profile = session.complete_profile().unwrap();
            if let Some(p) = profile.processes.iter().find(|p| p.key.pid.0 == pid) {
                assert_ne!(
                    p.state,
                    allocprof::model::profile::ProcessState::Live,
                    "{p:#?}"
                );
            }
        } else {
            killer.join().unwrap();
        }
    }
}

#[test]
fn a_ledger_filled_with_garbage_is_checked_not_followed() {
    use profiler_common::ledger::{HEADER_WORDS, RECORD_WORDS, header, record};
    common::require_bpf();
    // One process scribbles over its records, another over its header.
    let w = started(workload());
    let h = read_words(w.pid(), header_address(w.pid()), HEADER_WORDS);
    let table = h[header::TABLE];
    assert_ne!(table, 0, "the workload sampled: its table exists");
    let used = h[header::USED..header::USED + h[header::RANGES] as usize]
        .iter()
        .sum::<u64>();
    assert!(used > 0);
    let mut scribbled = 0;
    for k in 0..h[header::RANGES] as usize {
        let (first, n) = (h[header::FIRST + k], h[header::USED + k]);
        for i in first..first + n {
            let at = table + i * (RECORD_WORDS as u64 * 8);
            let mut r = read_words(w.pid(), at, RECORD_WORDS);
            // Every third record: a wild pointer, a huge size, bad frames.
            match i % 3 {
                0 => r[record::PTR] = 0xdead_beef_0000,
                1 => {
                    r[record::SIZE] = u64::MAX;
                    r[record::WEIGHT] = u64::MAX;
                }
                _ => continue,
            }
            write_words(w.pid(), at, &r);
            scribbled += 1;
        }
    }
    let v = started(workload());
    let vh = header_address(v.pid());
    // A table "at" address 1 and a capacity far past any bound.
    let mut bad = read_words(v.pid(), vh, HEADER_WORDS);
    bad[header::TABLE] = 8;
    bad[header::CAPACITY] = u64::MAX;
    write_words(v.pid(), vh, &bad);

    let mut session = Session::start(
        Target::Pids(vec![Pid(w.pid()), Pid(v.pid())]),
        Limits::default(),
    )
    .unwrap();
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, w.pid());
    let ledger = p.ledger.unwrap();
    assert!(ledger.read);
    assert!(
        ledger.garbage > 0 && ledger.garbage <= scribbled,
        "{ledger:?}, {scribbled} scribbled"
    );
    // What is left is plausible: no site holds more than the workload does.
    let (truth, sigma) = truth_and_sigma(A.0, A.1, RATE);
    assert!(common::site(p, "site_a").live_bytes <= truth + 5.0 * sigma);
    assert!(p.totals.live_bytes < 1e9, "{:?}", p.totals);
    // No usable header: nothing seeded, and the figures say so.
    assert!(
        profile
            .ran_before_attach
            .contains(&format!("heap_before ({})", v.pid())),
        "{:?}",
        profile.ran_before_attach
    );
    assert!(profile.live_since_attach());
    assert!(
        session.warnings.iter().any(|w| w.contains("ledger")),
        "{:?}",
        session.warnings
    );
    drop(w);
    drop(v);
}

#[test]
fn the_heap_from_before_attach_is_read_after_the_main_thread_called_pthread_exit() {
    common::require_bpf();
    // 2000 blocks of 64 KiB (125 MiB) from main_site, then pthread_exit.
    const MAIN: (u64, u64) = (2000, 65536);
    let mut w = Proc::spawn(Command::new(common::compile_c(
        "leader_exits_heap.c",
        &["-pthread"],
    )));
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    w.send("go");
    w.expect("leader-gone");
    // /proc/PID is a zombie's now, and process_vm_readv of PID fails
    // (ESRCH): the ledger and the allocator's block are read through a
    // live thread.
    let mut session = Session::start(Target::Pids(vec![Pid(w.pid())]), Limits::default()).unwrap();
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, w.pid());
    let t = assert_live(p, "main_site", MAIN);
    assert_eq!(t.before_attach_bytes, t.live_bytes);
    let ledger = p.ledger.expect("its ledger was looked for");
    assert!(ledger.read && ledger.seeded > 0, "{ledger:?}");
    assert!(!p.since_attach, "its whole heap is seen");
    assert!(
        p.backend_heap.is_some(),
        "the allocator's own figures are read too"
    );
    w.send("exit");
}

//! Figures that say what they know, with real eBPF and real processes: an
//! interval where no sample shows the small blocks (`sort -S 100M`), a
//! process image replaced by exec keeping its weight form and lost bytes,
//! frees of blocks from before attach not shown as drops.

mod common;

use std::{
    io::Write,
    process::{Command, Stdio},
    time::Duration,
};

use allocprof::ids::Pid;
use allocprof::{
    kernel::Limits,
    model::profile::{ProcessState, Profile},
    output::export::json,
    output::report::{self, ReportOptions},
    session::{Session, Target},
};
use common::Proc;
use profiler_common::{DropReason, WeightForm};

/// Refreshes until `ready` says the profile is the one wanted.
fn profile_until(session: &mut Session, what: &str, ready: impl Fn(&Profile) -> bool) -> Profile {
    for _ in 0..100 {
        let profile = session.complete_profile().unwrap();
        if ready(&profile) {
            return profile;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("never saw {what}");
}

/// Issue 26 item 22: `sort -S 100M` holds a 100 MB buffer (sampled surely,
/// a Horvitz–Thompson term of 0) and small blocks no sample falls in; its
/// figure used to read `± 0 B`.
#[test]
fn sort_with_a_huge_buffer_shows_no_interval_of_zero() {
    common::require_bpf();
    // The default rate, as a user would run it.
    let mut sort = Command::new("sort")
        .args(["-S", "100M"])
        .env("LD_PRELOAD", common::preload_library())
        .env_remove("ALLOCPROF_RATE")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("sort (coreutils)");
    let pid = sort.id();
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    let mut stdin = sort.stdin.take().unwrap();
    // Some lines: sort reads them into its buffer and waits for more.
    for i in 0..2000 {
        writeln!(stdin, "line {}", (i * 7919) % 2000).unwrap();
    }
    stdin.flush().unwrap();
    let profile = profile_until(&mut session, "sort's buffer", |p| {
        p.processes
            .iter()
            .any(|p| p.key.pid.0 == pid && p.totals.live_bytes >= 100e6)
    });
    drop(stdin);
    let _ = sort.wait();
    let p = common::process(&profile, pid);
    let ci = p.totals.live_ci95();
    eprintln!(
        "sort: live {} ± {ci} ({} samples, HT variance {})",
        p.totals.live_bytes, p.totals.live_samples, p.totals.live_var
    );
    assert_eq!(p.rate, 512 * 1024);
    // Never narrower than what the unseen small blocks allow: 3.9R.
    assert!(ci >= 3.9 * p.rate as f64, "{ci}");
    let text = report::render(&profile, ReportOptions::default());
    let line = text
        .lines()
        .find(|l| l.contains(&format!("({pid})")) && l.contains('±'))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(!line.contains("± 0 B"), "{line}");
    assert!(!text.contains("± 0 B"), "{text}");
    let r = json::report(&profile);
    let j = r.processes.iter().find(|j| j.pid == pid).unwrap();
    assert!(j.totals.live_bytes_ci95.is_some_and(|c| c > 0.0), "{j:?}");
}

/// Issue 26 item 17: an emitter whose weights fit no known form, and with a
/// sample it could not track, replaced by exec: the old image keeps no
/// interval and stays a lower bound.
#[test]
fn an_image_replaced_by_exec_keeps_its_weight_form_and_lost_bytes() {
    common::require_bpf();
    let exe = common::compile_c("exec_weights.c", &[]);
    let mut w = Proc::spawn(Command::new(&exe));
    let pid = w.pid();
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    w.send("go");
    w.expect("fired");
    let before = profile_until(&mut session, "its samples", |p| {
        p.processes
            .iter()
            .any(|p| p.key.pid.0 == pid && p.totals.live_samples >= 200)
    });
    let live = common::process(&before, pid);
    assert_eq!(live.weight_form, WeightForm::Unrecognized);
    assert_eq!(live.totals.live_ci95_known(), None);
    assert!(live.lost_live_bytes > 0);

    w.send("exec");
    w.expect("again");
    let after = profile_until(&mut session, "the replaced image", |p| {
        p.processes
            .iter()
            .any(|p| p.key.pid.0 == pid && p.state == ProcessState::Replaced)
    });
    let old = after
        .processes
        .iter()
        .find(|p| p.key.pid.0 == pid && p.state == ProcessState::Replaced)
        .unwrap();
    assert_eq!(old.weight_form, WeightForm::Unrecognized, "{old:#?}");
    assert_eq!(old.totals.live_ci95_known(), None, "{old:#?}");
    assert_eq!(old.lost_live_bytes, live.lost_live_bytes, "{old:#?}");
    assert_eq!(old.drops[DropReason::Unplaced as usize], 1);
    let r = json::report(&after);
    let j = r
        .processes
        .iter()
        .find(|j| j.pid == pid && j.state == "replaced")
        .unwrap();
    assert_eq!(j.totals.live_bytes_ci95, None, "{j:?}");
    assert_eq!(j.weight_form.as_deref(), Some("unrecognized"));
    assert_eq!(j.lost_live_bytes, live.lost_live_bytes);
    // Counted once: the new image's own counters start after the exec.
    assert_eq!(after.lost_live_bytes(), live.lost_live_bytes);
    let text = report::render(&after, ReportOptions::default());
    assert!(text.contains("lower bound"), "{text}");
}

/// Issue 26 item 23: blocks sampled before attach and freed after it are
/// no drops: nothing was lost (freed before the ledger was read, so never
/// seeded; or seeded and retired by the free).
#[test]
fn frees_of_blocks_from_before_attach_are_not_dropped_events() {
    common::require_bpf();
    let mut w = Proc::spawn(Command::new(common::compile_c(
        "heap_before.c",
        &["-pthread"],
    )));
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    w.send("alloc");
    w.expect("ready");
    let pid = w.pid();
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    // Freed after attach, before the ledger is read: the kernel finds no
    // live sample for them.
    w.send("half");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, pid);
    let site_a = common::site(p, "site_a");
    let (truth, sigma) = common::truth_and_sigma(2000, 4096, common::RATE);
    assert!(
        (site_a.live_bytes - truth).abs() <= 5.0 * sigma,
        "{} vs {truth}",
        site_a.live_bytes
    );
    // Counted by the kernel (per process too once it has a kernel entry:
    // here it had none yet, so only in the total).
    assert!(profile.unmatched_frees() > 0, "{:?}", profile.drops);
    assert_eq!(p.dropped(), 0, "{:?}", p.drops);
    assert_eq!(profile.dropped(), 0, "{:?}", profile.drops);
    let text = report::render(&profile, ReportOptions::default());
    assert!(!text.contains("DROPPED EVENTS"), "{text}");
    assert!(text.contains("matched no live sample"), "{text}");
    assert!(
        text.lines().next().unwrap().ends_with(" 0 dropped"),
        "{text}"
    );
    let r = json::report(&profile);
    assert_eq!(r.dropped, 0);
    assert!(!r.drops.contains_key("unmatched_free"));
    assert_eq!(r.unmatched_frees, profile.unmatched_frees());
    w.send("exit");
}

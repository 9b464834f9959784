//! Attaching late, with real eBPF and a real process without a live-sample
//! ledger (`ALLOCPROF_LEDGER=0`, as an older library or another emitter):
//! one that allocated its heap before allocprof attached is labelled as
//! such (its live figures are what it allocated since), never shown as if
//! that were its whole heap; a process started after attach is not. (With
//! a ledger, the heap from before is seen: tests/ledger.rs.)

mod common;

use std::process::Command;

use allocprof::{
    kernel::Limits,
    output::report::{self, ReportOptions},
    session::{Session, Target},
};
use common::Proc;

#[test]
fn a_process_with_a_heap_before_attach_is_labelled_since_attach() {
    common::require_bpf();
    let exe = common::compile_c("fragment.c", &[]);
    // Its 40 MB live heap is allocated before allocprof attaches.
    let mut early = Proc::spawn({
        let mut cmd = Command::new(&exe);
        cmd.env("ALLOCPROF_LEDGER", "0");
        cmd
    });
    common::wait_for_mapping(early.pid(), "liballocprof.so");
    early.send("go");
    early.expect("ready");

    let mut session = Session::start(Target::All, Limits::default()).unwrap();
    // Started after attach, allocating after attach.
    let mut late = Proc::spawn(Command::new(&exe));
    common::wait_for_mapping(late.pid(), "liballocprof.so");
    // It must be seen (scanned) before it allocates, as a system-wide
    // session sees a new process at its next refresh.
    session.complete_profile().unwrap();
    late.send("go");
    late.expect("ready");
    let profile = session.complete_profile().unwrap();

    let l = common::process(&profile, late.pid());
    assert!(!l.since_attach, "started after attach");
    assert!(l.totals.live_bytes > 0.0);
    let early_label = format!("fragment ({})", early.pid());
    assert!(
        profile.ran_before_attach.contains(&early_label),
        "{:?}",
        profile.ran_before_attach
    );
    assert!(
        !profile
            .ran_before_attach
            .contains(&format!("fragment ({})", late.pid())),
        "{:?}",
        profile.ran_before_attach
    );
    // Its 40 MB are not seen: the figure is not called its heap.
    let text = report::render(&profile, ReportOptions::default());
    let header = text.lines().next().unwrap();
    assert!(
        header.contains("live bytes allocated since attach ("),
        "{header}"
    );
    assert!(!header.contains("estimated live heap"), "{header}");
    assert!(
        text.contains(&format!("{early_label} ran before allocprof attached at")),
        "{text}"
    );
    late.send("exit");
    early.send("exit");
}

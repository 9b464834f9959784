//! Processes met before their unwind tables are in: never garbage, whole from the first sample with --pid.

use super::*;

#[test]
fn a_churn_without_frame_pointers_profiled_system_wide_keeps_one_site_in_a_handful_of_stacks() {
    common::require_bpf();
    let exe = common::compile_c("nofp_churn.c", &["-O2", "-fomit-frame-pointer", "-pthread"]);
    // Every allocation sampled: 400,000 samples of one call site.
    let mut cmd = Command::new(exe);
    cmd.env("LD_PRELOAD", common::preload_library())
        .env("ALLOCPROF_RATE", "1");
    let mut w = Proc::spawn(cmd);
    let pid = w.pid();
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut session = Session::start(Target::All, Limits::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        session.poll_events();
        let status = session.unwind_status();
        if status.loading == 0 && status.ready > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "unwind tables not loaded: {status:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = Instant::now();
    w.send("go");
    w.expect("done");
    let churned = started.elapsed();
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, pid);
    let stacks = stacks_of(p, "churn_alloc");
    let all: Vec<Vec<&str>> = stacks.iter().map(|s| names(s)).collect();
    let samples: u64 = stacks.iter().map(|s| s.totals.alloc_samples).sum();
    eprintln!(
        "{samples} samples of churn_alloc in {} stacks, {churned:?}: {all:#?}",
        stacks.len()
    );
    assert!(samples >= 390_000, "{samples} samples: {:?}", p.drops);
    assert!(stacks.len() <= 8, "{all:#?}");
    for s in &stacks {
        assert!(
            holds_chain(&s.frames, &["churn_alloc", "worker"]),
            "{:?}",
            names(s)
        );
    }
    for reason in [
        DropReason::StackMapFull,
        DropReason::AggMapFull,
        DropReason::StackRateLimited,
    ] {
        assert_eq!(p.drops[reason as usize], 0, "{reason:?}: {:?}", p.drops);
    }
    w.send("exit");
}

/// Whether the stack was cut where it could not be vouched for, having been
/// walked before its process's unwind tables were in.
fn before_tables(s: &StackProfile) -> bool {
    s.frames.last().map(|f| &*f.function) == Some(BEFORE_TABLES_MARKER)
}

#[test]
fn with_pid_a_program_sampling_while_allocprof_attaches_has_whole_stacks_from_the_first() {
    common::require_bpf();
    let exe = common::compile_c(
        "nofp_steady.c",
        &[
            "-O2",
            "-fomit-frame-pointer",
            "-fno-optimize-sibling-calls",
            "-pthread",
        ],
    );
    let mut cmd = Command::new(exe);
    cmd.env("LD_PRELOAD", common::preload_library())
        .env("ALLOCPROF_RATE", "65536");
    let mut w = Proc::spawn(cmd);
    let pid = w.pid();
    // Allocating already, and all the while allocprof attaches.
    w.expect("started");
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while session
        .refresh()
        .unwrap()
        .processes
        .iter()
        .find(|p| p.key.pid.0 == pid)
        .is_none_or(|p| p.alloc_events < 5000)
    {
        assert!(Instant::now() < deadline, "too few samples");
        std::thread::sleep(Duration::from_millis(50));
    }
    w.send("stop");
    w.expect("done");
    let profile = session.complete_profile().unwrap();
    let p = common::process(&profile, pid);
    // The kernel's walks (not the ledger's seeds from before attach).
    let walked: Vec<&StackProfile> = p
        .stacks
        .iter()
        .filter(|s| s.totals.alloc_samples > 0)
        .collect();
    let samples: u64 = walked.iter().map(|s| s.totals.alloc_samples).sum();
    let all: Vec<(u64, Vec<&str>)> = walked
        .iter()
        .map(|s| (s.totals.alloc_samples, names(s)))
        .collect();
    eprintln!("{samples} samples in {} stacks", walked.len());
    let partial: u64 = walked
        .iter()
        .filter(|s| !holds_chain(&s.frames, &["steady_site", "steady_loop", "main"]))
        .map(|s| s.totals.alloc_samples)
        .sum();
    assert_eq!(
        partial, 0,
        "{partial} of {samples} samples without the whole chain: {all:#?}"
    );
    for s in &walked {
        assert!(
            names(s).iter().all(|n| !n.starts_with('[')),
            "no markers, no unknown frames: {:?}",
            names(s)
        );
    }
    assert_eq!(p.drops[DropReason::StackBeforeTables as usize], 0);
    assert!(walked.len() <= 4, "{all:#?}");
    w.send("exit");
}

/// Runs `nofp_churn.c` built with `flags` as a process that starts after
/// a system-wide session attached and churns at once, before the session
/// even sees it: its first samples come before its unwind tables. Returns
/// its pid and the complete profile.
fn churn_started_after_attach(flags: &[&str]) -> (u32, Profile) {
    let exe = common::compile_c("nofp_churn.c", flags);
    let mut session = Session::start(Target::All, Limits::default()).unwrap();
    // As allocprof arms the library's path: covered from its first sample.
    assert!(session.arm(&common::preload_library()).unwrap());
    let mut cmd = Command::new(exe);
    // Every allocation sampled: 400,000 samples of one call site.
    cmd.env("LD_PRELOAD", common::preload_library())
        .env("ALLOCPROF_RATE", "1");
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    // Killed if the test fails half-way.
    let _w = KillOnDrop(child);
    writeln!(stdin, "go").unwrap();
    // The session runs as allocprof's loop does (events every 20 ms, a
    // profile every second) while the churn runs.
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let line = BufReader::new(stdout).lines().next().and_then(Result::ok);
        let _ = done_tx.send(line);
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last_profile = Instant::now();
    let line = loop {
        session.poll_events();
        if last_profile.elapsed() >= Duration::from_secs(1) {
            session.refresh().unwrap();
            last_profile = Instant::now();
        }
        if let Ok(line) = done.try_recv() {
            break line;
        }
        assert!(Instant::now() < deadline, "the churn did not finish");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(line.as_deref(), Some("done"), "the churn failed");
    let profile = session.complete_profile().unwrap();
    writeln!(stdin, "exit").unwrap();
    (pid, profile)
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_process_without_frame_pointers_started_after_attach_has_no_garbage_stacks() {
    common::require_bpf();
    let (pid, profile) = churn_started_after_attach(&["-O2", "-fomit-frame-pointer", "-pthread"]);
    let p = common::process(&profile, pid);
    let all: Vec<(u64, Vec<&str>)> = p
        .stacks
        .iter()
        .map(|s| (s.totals.alloc_samples, names(s)))
        .collect();
    let samples: u64 = p.stacks.iter().map(|s| s.totals.alloc_samples).sum();
    let before: u64 = p
        .stacks
        .iter()
        .filter(|s| before_tables(s))
        .map(|s| s.totals.alloc_samples)
        .sum();
    eprintln!(
        "{samples} samples in {} stacks, {before} before the tables: {all:#?}",
        p.stacks.len()
    );
    assert!(samples >= 390_000, "{samples} samples: {:?}", p.drops);
    // The situation: samples before the process's tables were in.
    assert!(before > 0, "no sample came before the tables: {all:#?}");
    assert_eq!(p.drops[DropReason::StackBeforeTables as usize], before);
    for s in &p.stacks {
        let names = names(s);
        assert!(
            names.iter().all(|n| !n.starts_with("[unknown"))
                && names.iter().rev().skip(1).all(|n| !n.starts_with('[')),
            "garbage, or a marker not last: {names:?}"
        );
    }
    let churn = stacks_of(p, "churn_alloc");
    for s in &churn {
        let names = names(s);
        if before_tables(s) {
            // Cut where it could not be vouched for: the leaf frames.
            assert!(holds_chain(&s.frames, &["churn_alloc"]), "{names:?}");
        } else {
            assert!(
                holds_chain(&s.frames, &["churn_alloc", "worker"])
                    && names.iter().all(|n| !n.starts_with('[')),
                "{names:?}"
            );
        }
    }
    assert!(p.stacks.len() <= 16, "{all:#?}");
    for reason in [DropReason::StackMapFull, DropReason::StackRateLimited] {
        assert_eq!(p.drops[reason as usize], 0, "{reason:?}: {:?}", p.drops);
    }
}

#[test]
fn a_process_with_frame_pointers_started_after_attach_keeps_its_frames() {
    common::require_bpf();
    // compile_c's own flags: -O1 with frame pointers.
    let (pid, profile) = churn_started_after_attach(&["-pthread"]);
    let p = common::process(&profile, pid);
    let all: Vec<(u64, Vec<&str>)> = p
        .stacks
        .iter()
        .map(|s| (s.totals.alloc_samples, names(s)))
        .collect();
    eprintln!("{} stacks: {all:#?}", p.stacks.len());
    for s in &p.stacks {
        let names = names(s);
        assert!(
            names.iter().all(|n| !n.starts_with("[unknown"))
                && names.iter().rev().skip(1).all(|n| !n.starts_with('[')),
            "garbage, or a marker not last: {names:?}"
        );
    }
    let churn = stacks_of(p, "churn_alloc");
    assert!(!churn.is_empty(), "{all:#?}");
    for s in &churn {
        let names = names(s);
        // Every frame of the program is there; a stack walked before the
        // tables ends after the first C library frame (which keeps no
        // frame pointer: its caller cannot be vouched for).
        assert!(
            holds_chain(&s.frames, &["churn_alloc", "worker"])
                && names.iter().all(|n| !n.starts_with("[unknown")),
            "{names:?}"
        );
        if before_tables(s) {
            let worker = names.iter().position(|n| *n == "worker").unwrap();
            assert!(names.len() - worker <= 3, "{names:?}");
        }
    }
    assert!(p.stacks.len() <= 16, "{all:#?}");
}

//! `--pid`'s trees with real processes and real eBPF (issue 29): a
//! prefork parent's workers from before and after attach, short-lived
//! children, grandchildren, an exec'ed child; `--no-children`; a fork bomb
//! past the process cap; an exec'ed child's own sampling rate.

mod common;

use std::process::Command;

use allocprof::{
    ids::Pid,
    kernel::Limits,
    model::profile::{ProcessProfile, ProcessState, Profile},
    session::{Session, Target},
};

use profiler_common::DropReason;

use common::{Proc, RATE, compile_c, process, site, truth_and_sigma, wait_for_mapping};

/// prefork.c's worker, grandchild and exec'ed sites: blocks and size.
const WORKER_N: u64 = 1000;
const WORKER_SIZE: u64 = 4096;
/// Its short-lived children's site.
const SHORT_N: u64 = 16;
const SHORT_SIZE: u64 = 65536;

fn prefork() -> Proc {
    let p = Proc::spawn(Command::new(compile_c("prefork.c", &[])));
    wait_for_mapping(p.pid(), "liballocprof.so");
    p
}

/// Sends `fork N`; returns each worker's (number, pid).
fn fork_workers(p: &mut Proc, n: usize) -> Vec<(usize, u32)> {
    p.send(&format!("fork {n}"));
    let workers = (0..n)
        .map(|_| {
            let line = p.line();
            let mut words = line.split(' ');
            assert_eq!(words.next(), Some("worker"), "the workload failed: {line}");
            let k = words.next().unwrap().parse().unwrap();
            let pid = words.next().unwrap().parse().unwrap();
            (k, pid)
        })
        .collect();
    p.expect("ready");
    workers
}

/// The line `"{word} PID"`'s pid.
fn pid_line(p: &mut Proc, word: &str) -> u32 {
    let line = p.line();
    line.strip_prefix(&format!("{word} "))
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("the workload failed: {line}"))
}

/// `function`'s live bytes in `p` within 4σ of `n` blocks of `size`.
fn assert_live_within_4_sigma(p: &ProcessProfile, function: &str, n: u64, size: u64) {
    let (truth, sigma) = truth_and_sigma(n, size, RATE);
    let live = site(p, function).live_bytes;
    assert!(
        (live - truth).abs() <= 4.0 * sigma,
        "{} ({}): {function} live {live} vs truth {truth} (sigma {sigma})",
        p.name,
        p.key.pid
    );
}

fn final_profile(session: &mut Session) -> Profile {
    session.complete_profile().unwrap()
}

#[test]
fn a_prefork_parent_s_workers_before_and_after_attach_are_profiled() {
    common::require_bpf();
    let mut parent = prefork();
    let mut workers = fork_workers(&mut parent, 8);
    let root = parent.pid();
    let mut session = Session::start(Target::Trees(vec![Pid(root)]), Limits::default()).unwrap();
    workers.extend(fork_workers(&mut parent, 8));
    let profile = final_profile(&mut session);
    for (k, pid) in &workers {
        let p = process(&profile, *pid);
        assert_eq!(p.parent, Some(Pid(root)), "worker {k}'s parent");
        assert_eq!(p.state, ProcessState::Live);
        assert_live_within_4_sigma(p, &format!("worker_site_{k}"), WORKER_N, WORKER_SIZE);
        // Its site is its own: no other worker shows it.
        for (other, opid) in &workers {
            if other != k {
                let o = process(&profile, *opid);
                assert_eq!(site(o, &format!("worker_site_{k}")).alloc_samples, 0);
            }
        }
    }
    // `--merge-tree`: one profile, the root's, with every worker's site.
    let merged = profile.merge_trees();
    let tree = process(&merged, root);
    assert_eq!(
        merged.processes.len(),
        1,
        "the tree is one image: {merged:#?}"
    );
    for (k, _) in &workers {
        assert_live_within_4_sigma(tree, &format!("worker_site_{k}"), WORKER_N, WORKER_SIZE);
    }
    let (truth, sigma) = truth_and_sigma(16 * WORKER_N, WORKER_SIZE, RATE);
    let all: f64 = (0..16)
        .map(|k| site(tree, &format!("worker_site_{k}")).live_bytes)
        .sum();
    assert!(
        (all - truth).abs() <= 4.0 * sigma,
        "{all} vs {truth} ({sigma})"
    );
    parent.send("exit");
}

#[test]
fn no_children_profiles_the_parent_alone() {
    common::require_bpf();
    let mut parent = prefork();
    fork_workers(&mut parent, 8);
    let root = parent.pid();
    let mut session = Session::start(Target::Pids(vec![Pid(root)]), Limits::default()).unwrap();
    fork_workers(&mut parent, 8);
    let profile = final_profile(&mut session);
    let pids: Vec<u32> = profile.processes.iter().map(|p| p.key.pid.0).collect();
    assert_eq!(pids, vec![root], "only the parent: {profile:#?}");
    parent.send("exit");
}

#[test]
fn short_lived_children_are_all_accounted_for() {
    common::require_bpf();
    const CHILDREN: u64 = 200;
    let mut parent = prefork();
    let root = parent.pid();
    let mut session = Session::start(Target::Trees(vec![Pid(root)]), Limits::default()).unwrap();
    parent.send(&format!("short {CHILDREN}"));
    parent.expect("ready");
    let profile = final_profile(&mut session);
    let children: Vec<&ProcessProfile> = profile
        .processes
        .iter()
        .filter(|p| p.parent == Some(Pid(root)))
        .collect();
    assert_eq!(
        children.len() as u64,
        CHILDREN,
        "every child, each once: {:?}",
        children
            .iter()
            .map(|p| (p.key.pid, p.state))
            .collect::<Vec<_>>()
    );
    let mut allocated = 0.0;
    for c in &children {
        assert_eq!(c.state, ProcessState::Exited, "{} exited", c.key.pid);
        // Its parent's rate (the same environment), even gone before read.
        assert_eq!(c.rate, RATE, "child {}'s rate", c.key.pid);
        let t = site(c, "short_site");
        assert!(
            t.alloc_samples > 0,
            "child {} has no sample: {c:#?}",
            c.key.pid
        );
        allocated += t.alloc_bytes;
    }
    let (truth, sigma) = truth_and_sigma(CHILDREN * SHORT_N, SHORT_SIZE, RATE);
    let all: f64 = children.iter().map(|c| c.totals.alloc_bytes).sum();
    let drops: u64 = children.iter().map(|c| c.drops.iter().sum::<u64>()).sum();
    let others: Vec<_> = children
        .iter()
        .flat_map(|c| c.stacks.iter())
        .filter(|s| !s.frames.iter().any(|f| &*f.function == "short_site"))
        .map(|s| &s.frames)
        .take(3)
        .collect();
    assert!(
        (allocated - truth).abs() <= 4.0 * sigma,
        "short_site allocated {allocated} vs truth {truth} (sigma {sigma}); all stacks {all}, \
         drops {drops}, drops in total {:?}, other stacks {others:#?}",
        profile.drops
    );
    parent.send("exit");
}

#[test]
fn grandchildren_and_an_exec_ed_child_are_followed() {
    common::require_bpf();
    let mut parent = prefork();
    let root = parent.pid();
    let mut session = Session::start(Target::Trees(vec![Pid(root)]), Limits::default()).unwrap();
    parent.send("grand");
    let child = pid_line(&mut parent, "child");
    let grandchild = pid_line(&mut parent, "grandchild");
    parent.expect("ready");
    parent.send("exec");
    let execed = pid_line(&mut parent, "child");
    parent.expect("ready");
    let profile = final_profile(&mut session);
    let g = process(&profile, grandchild);
    assert_eq!(g.parent, Some(Pid(child)), "the grandchild's parent");
    assert_live_within_4_sigma(g, "grand_site", WORKER_N, WORKER_SIZE);
    let e = profile
        .processes
        .iter()
        .find(|p| p.key.pid.0 == execed && p.state == ProcessState::Live)
        .unwrap_or_else(|| panic!("the exec'ed child's image: {profile:#?}"));
    assert_eq!(e.parent, Some(Pid(root)), "the exec'ed child's parent");
    assert_live_within_4_sigma(e, "exec_site", WORKER_N, WORKER_SIZE);
    parent.send("exit");
}

/// A tree forking past the process cap: the children beyond it are not
/// followed and counted as `proc_map_full` drops; the session bounds what
/// it holds, and once they exit their slots serve the tree's next children.
#[test]
fn a_fork_bomb_past_the_process_cap_is_counted_and_the_tree_still_followed() {
    common::require_bpf();
    const CAP: u32 = 16;
    const BOMB: u64 = 48;
    let mut parent = prefork();
    let root = parent.pid();
    let limits = Limits {
        max_processes: CAP,
        ..Limits::default()
    };
    let mut session = Session::start(Target::Trees(vec![Pid(root)]), limits).unwrap();
    // All BOMB children alive at once, then all gone.
    parent.send(&format!("bomb {BOMB}"));
    parent.expect("ready");
    let after_bomb = session.refresh().unwrap();
    let dropped = after_bomb.drops[DropReason::ProcMapFull as usize];
    let bomb: Vec<&ProcessProfile> = after_bomb
        .processes
        .iter()
        .filter(|p| p.parent == Some(Pid(root)))
        .collect();
    // The root holds a slot: at most CAP - 1 children fit beside it.
    assert!(
        bomb.len() < CAP as usize,
        "{} children tracked past a cap of {CAP}",
        bomb.len()
    );
    assert!(
        dropped >= BOMB - bomb.len() as u64,
        "{dropped} proc_map_full drops for {} of {BOMB} children not followed",
        BOMB - bomb.len() as u64
    );
    let followed: Vec<Pid> = bomb.iter().map(|p| p.key.pid).collect();
    // The session keeps working: the tree's next children are followed.
    let workers = fork_workers(&mut parent, 4);
    let profile = final_profile(&mut session);
    for (k, pid) in &workers {
        let p = process(&profile, *pid);
        assert_eq!(p.parent, Some(Pid(root)), "worker {k}'s parent");
        assert_live_within_4_sigma(p, &format!("worker_site_{k}"), WORKER_N, WORKER_SIZE);
    }
    // The followed bomb children are profiled as usual.
    assert!(!followed.is_empty(), "no bomb child was followed");
    for pid in &followed {
        let c = process(&profile, pid.0);
        assert_eq!(c.state, ProcessState::Exited, "{pid} exited");
        assert!(
            site(c, "bomb_site").alloc_samples > 0,
            "bomb child {pid} has no sample: {c:#?}"
        );
    }
    assert!(
        profile.processes.len() <= 1 + CAP as usize + workers.len(),
        "{} processes held under a cap of {CAP}",
        profile.processes.len()
    );
    parent.send("exit");
}

/// A child's rate is its own image's: a preloaded shell whose environment
/// has no `ALLOCPROF_RATE` (its rate is the default) forks, after attach, a
/// child that execs `env ALLOCPROF_RATE=4096 leader_exits`. Its main thread
/// leaves with pthread_exit (an exit event while the process lives on: the
/// rescans that follow), then the process exits before the next rescan: a
/// rate read again then would be the default (its environ gone). Its image,
/// live and exited, shows R = 4096 and a site within 4σ with the interval R
/// gives.
#[test]
fn an_exec_ed_child_s_rate_is_its_own() {
    common::require_bpf();
    const CHILD_RATE: u64 = 4096;
    // leader_exits.c's main_site: blocks and size.
    const N: u64 = 20000;
    const SIZE: u64 = 1024;
    let prog = compile_c("leader_exits.c", &["-pthread"]);
    let lib = common::preload_library();
    let mut shell = Command::new("sh");
    shell
        .arg("-c")
        .arg(
            r#"read go; echo started
env ALLOCPROF_RATE=4096 "$PROG"; echo "exited $?"; read done"#,
        )
        .env_remove("ALLOCPROF_RATE")
        .env("PROG", &prog)
        // Preloaded itself (its rate the default), so that it carries probes.
        .env("LD_PRELOAD", &lib);
    let mut parent = Proc::spawn(shell);
    let root = parent.pid();
    wait_for_mapping(root, "liballocprof.so");
    let environ = std::fs::read(format!("/proc/{root}/environ")).unwrap();
    assert!(
        !environ
            .split(|&b| b == 0)
            .any(|v| v.starts_with(b"ALLOCPROF_RATE=")),
        "the parent's environment has ALLOCPROF_RATE"
    );
    let mut session = Session::start(Target::Trees(vec![Pid(root)]), Limits::default()).unwrap();
    parent.send("go");
    parent.expect("started");
    // The child is leader_exits once it mapped the library (the same pid
    // through both execs).
    let child = common::first_child(root);
    wait_for_mapping(child, "liballocprof.so");
    parent.send("main");
    parent.expect("leader-gone");
    // Its leader's exit event, while it lives on: its rescans start.
    session.poll_events();
    parent.send("worker");
    parent.expect("ready");
    let check = |p: &ProcessProfile, when: &str| {
        assert_eq!(p.rate, CHILD_RATE, "the child's rate ({when}): {p:#?}");
        assert_eq!(p.parent, Some(Pid(root)), "the child's parent ({when})");
        let (truth, sigma) = truth_and_sigma(N, SIZE, CHILD_RATE);
        let totals = site(p, "main_site");
        let live = totals.live_bytes;
        assert!(
            (live - truth).abs() <= 4.0 * sigma,
            "{when}: main_site live {live} vs truth {truth} (sigma {sigma})"
        );
        // The interval R = 4096 gives (the sampling variance and the
        // unseen mass's), not the default R's (some MiB).
        let r = CHILD_RATE as f64;
        let expected =
            1.96 * (sigma * sigma + allocprof::model::stats::UNSEEN_SAMPLES * r * r).sqrt();
        let ci = totals.live_ci95();
        assert!(
            ci > expected / 2.0 && ci < expected * 2.0,
            "{when}: main_site's interval ±{ci} vs ±{expected} at R = {CHILD_RATE}"
        );
    };
    let live = final_profile(&mut session);
    check(process(&live, child), "live");
    parent.send("exit");
    // Reaped by the shell: gone from /proc.
    parent.expect("exited 0");
    // Past the next rescan's time (not an assertion on time: the rescan of a
    // process gone must not lose what was read of it while it lived).
    std::thread::sleep(std::time::Duration::from_millis(250));
    session.poll_events();
    let gone = final_profile(&mut session);
    let e = gone
        .processes
        .iter()
        .find(|p| p.key.pid.0 == child && p.state == ProcessState::Exited)
        .unwrap_or_else(|| panic!("the child's exited image: {gone:#?}"));
    check(e, "exited");
    parent.send("done");
}

//! Discovery and process tracking against what targets can do: a main
//! thread that leaves with pthread_exit, a file swapped under the same path
//! in a private mount namespace.

mod common;

use common::{Proc, functions, process};

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use allocprof::ids::Pid;
use allocprof::{
    kernel::Limits,
    model::profile::ProcessState,
    process::discover,
    session::{Session, Target},
};

#[test]
fn a_process_whose_main_thread_called_pthread_exit_is_alive() {
    main_thread_leaves(|pid| Target::Pids(vec![pid]));
}

/// `--pid` with its tree: the kernel unfollows a process at its leader's
/// exit; one whose other threads run on is followed again.
#[test]
fn a_followed_tree_s_process_whose_main_thread_called_pthread_exit_stays_followed() {
    main_thread_leaves(|pid| Target::Trees(vec![pid]));
}

fn main_thread_leaves(target: fn(Pid) -> Target) {
    common::require_bpf();
    let exe = common::compile_c("leader_exits.c", &["-pthread"]);
    let mut w = Proc::spawn(Command::new(exe));
    let pid = w.pid();
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut session = Session::start(target(Pid(pid)), Limits::default()).unwrap();
    // The main thread allocates and leaves; the worker runs on.
    w.send("go");
    w.expect("leader-gone");
    assert!(
        discover::process_alive(Pid(pid)),
        "a process with a running thread is alive"
    );
    // Attaching now (the leader a zombie, /proc/PID/maps empty) works too.
    let late = Session::start(target(Pid(pid)), Limits::default());
    assert!(
        late.is_ok(),
        "attaching after pthread_exit: {:?}",
        late.err()
    );
    drop(late);
    let run = Command::new(env!("CARGO_BIN_EXE_allocprof"))
        .args(["--pid", &pid.to_string(), "--duration", "100ms"])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "allocprof --pid {pid}: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    session.refresh().unwrap();
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    let p = process(&profile, pid);
    assert_eq!(p.state, ProcessState::Live, "{p:#?}");
    assert_eq!(p.name, "leader_exits");
    let names = functions(p);
    for site in ["main_site", "worker_site"] {
        assert!(names.contains(&site), "{site} missing: {names:?}");
    }
    assert!(session.targets_alive());
    w.send("exit");
    assert!(w.child.wait().unwrap().success());
    assert!(!discover::process_alive(Pid(pid)));
}

#[test]
fn system_wide_a_process_whose_main_thread_called_pthread_exit_is_profiled() {
    common::require_bpf();
    let exe = common::compile_c("leader_exits.c", &["-pthread"]);
    let mut w = Proc::spawn(Command::new(exe));
    let pid = w.pid();
    common::wait_for_mapping(pid, "liballocprof.so");
    w.send("go");
    w.expect("leader-gone");
    // Started now, the scan of every process meets a zombie main thread.
    let mut session = Session::start(Target::All, Limits::default()).unwrap();
    assert!(
        session.is_attached_to(Pid(pid)),
        "the process's probes were not found through its live thread"
    );
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    let p = process(&profile, pid);
    assert_eq!(p.state, ProcessState::Live, "{p:#?}");
    assert_eq!(p.name, "leader_exits");
    let names = functions(p);
    assert!(names.contains(&"worker_site"), "{names:?}");
    w.send("exit");
    assert!(w.child.wait().unwrap().success());
}

/// alloc_sites.c built with its sites renamed: the same code at the same
/// offsets, other names (what a different program at that path would give).
fn impostor() -> std::path::PathBuf {
    common::compile_c(
        "alloc_sites.c",
        &[
            "-ldl",
            "-Dsite_small=host_small",
            "-Dsite_medium=host_medium",
            "-Dsite_large=host_large",
            "-Dsite_freed=host_freed",
        ],
    )
}

#[test]
fn a_process_in_its_own_mount_namespace_is_symbolized_from_its_own_file() {
    common::require_bpf();
    let real = common::compile_c("alloc_sites.c", &["-ldl"]);
    // The host sees the impostor at `path`; the process, in a private mount
    // namespace, sees its real program bind-mounted over it.
    let path = common::scratch_dir("mount-ns").join("program");
    std::fs::copy(impostor(), &path).unwrap();
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind "$1" "$2" && exec "$2""#)
        .arg("sh")
        .arg(&real)
        .arg(&path);
    let mut w = Proc::spawn(cmd);
    let pid = w.pid();
    // The shell maps the preloaded library too: wait for the program first.
    common::wait_for_mapping(pid, "mount-ns/program");
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    w.send("go");
    w.expect("ready");
    // It exits before anything was symbolized.
    w.send("exit");
    assert!(w.child.wait().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let profile = loop {
        let profile = session.complete_profile().unwrap();
        if process(&profile, pid).state == ProcessState::Exited {
            break profile;
        }
        assert!(Instant::now() < deadline, "the exit was never noticed");
        std::thread::sleep(Duration::from_millis(50));
    };
    let names = functions(process(&profile, pid));
    for site in ["site_small", "site_medium", "site_large"] {
        assert!(names.contains(&site), "{site} missing: {names:?}");
    }
    assert!(
        !names.iter().any(|n| n.starts_with("host_")),
        "symbolized from the host's file at {}: {names:?}",
        Path::new(&path).display()
    );
}

/// Waits for the first child of `pid` and returns its pid.
/// Kills a process on drop.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A pid namespace with its own /proc, kept alive by its init (`sleep`);
/// killing the init on drop ends everything in it.
struct PidNamespace {
    unshare: KillOnDrop,
    init: u32,
}

impl PidNamespace {
    fn new() -> PidNamespace {
        let unshare = KillOnDrop(
            Command::new("unshare")
                .args(["-p", "-f", "--mount-proc", "sleep", "600"])
                .spawn()
                .expect("unshare comes from util-linux"),
        );
        let init = common::first_child(unshare.0.id());
        // It mounts the namespace's /proc, then execs sleep: wait for that.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{init}/comm")).unwrap_or_default() != "sleep\n"
        {
            assert!(
                Instant::now() < deadline,
                "the namespace's init never started"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        PidNamespace { unshare, init }
    }

    /// Runs `program` inside (through nsenter, which forks it).
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg("-t")
            .arg(self.init.to_string())
            .args(["-p", "-m", "--"])
            .arg(program);
        cmd
    }
}

impl Drop for PidNamespace {
    fn drop(&mut self) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(self.init as i32, libc::SIGKILL) };
        let _ = self.unshare.0.wait();
    }
}

/// Runs the target and `allocprof --pid` inside a fresh pid namespace; the
/// target allocates, then exits (`exit`) or runs on (allocprof is stopped
/// with SIGTERM). Returns allocprof's report and the target's pid there and
/// on the host.
fn profile_in_a_pid_namespace(exit: bool) -> (String, u32, u32) {
    let ns = PidNamespace::new();
    let nsenter = |program: &Path| ns.command(program);
    // The target, inside it.
    let exe = common::compile_c("alloc_sites.c", &["-ldl"]);
    let mut w = Proc::spawn(nsenter(&exe));
    let host_pid = common::first_child(w.pid());
    let ns_pid = *common::ns_pids(host_pid).last().unwrap();
    assert_ne!(ns_pid, host_pid, "the target is not in the namespace");
    common::wait_for_mapping(host_pid, "liballocprof.so");
    // allocprof, inside it too, told the namespace's pid.
    let mut allocprof = nsenter(Path::new(env!("CARGO_BIN_EXE_allocprof")));
    allocprof
        .args(["--pid", &ns_pid.to_string(), "--duration", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut allocprof = KillOnDrop(allocprof.spawn().unwrap());
    let allocprof_pid = common::first_child(allocprof.0.id());
    let mut stderr = BufReader::new(allocprof.0.stderr.take().unwrap()).lines();
    // Its warnings first (--pid follows no children from a pid namespace).
    loop {
        let line = stderr
            .next()
            .expect("allocprof never said it attached")
            .unwrap();
        if line.contains("attached") {
            break;
        }
        assert!(line.contains("warning"), "before attaching: {line}");
    }
    w.send("go");
    w.expect("ready");
    if exit {
        // allocprof ends with a report once its target is gone.
        w.send("exit");
        assert!(w.child.wait().unwrap().success());
    } else {
        // SIGTERM ends the run with a report.
        // SAFETY: kill has no memory-safety preconditions.
        let sent = unsafe { libc::kill(allocprof_pid as i32, libc::SIGTERM) };
        assert_eq!(sent, 0, "signalling allocprof");
    }
    let mut report = String::new();
    std::io::Read::read_to_string(allocprof.0.stdout.as_mut().unwrap(), &mut report).unwrap();
    let status = allocprof.0.wait().unwrap();
    let rest: Vec<String> = stderr.map_while(Result::ok).collect();
    assert!(status.success(), "allocprof failed: {rest:?}");
    let label = format!("alloc_sites ({ns_pid})");
    assert!(report.contains(&label), "no {label} in:\n{report}");
    assert!(
        !report.contains(&format!("({host_pid})")),
        "the host pid leaked into:\n{report}"
    );
    for site in ["site_small", "site_medium", "site_large"] {
        assert!(report.contains(site), "{site} missing in:\n{report}");
    }
    (report, ns_pid, host_pid)
}

#[test]
fn allocprof_in_a_pid_namespace_reports_that_namespace_s_pids() {
    common::require_bpf();
    let (report, ..) = profile_in_a_pid_namespace(false);
    assert!(!report.contains("exited"), "the target runs:\n{report}");
}

#[test]
fn allocprof_in_a_pid_namespace_follows_its_target_s_exit() {
    common::require_bpf();
    let (report, ..) = profile_in_a_pid_namespace(true);
    assert!(report.contains("exited"), "the target exited:\n{report}");
}

#[test]
fn an_exec_storm_leaves_nothing_behind() {
    common::require_bpf();
    let exe = common::compile_c("exec_storm.c", &[]);
    let mut cmd = Command::new(exe);
    cmd.arg("50");
    let mut w = Proc::spawn(cmd);
    let pid = w.pid();
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    w.send("go");
    w.expect("ready");
    session.refresh().unwrap();
    w.send("exit");
    assert!(w.child.wait().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let profile = loop {
        let profile = session.complete_profile().unwrap();
        if profile
            .processes
            .iter()
            .any(|p| p.key.pid.0 == pid && p.state == ProcessState::Exited)
        {
            break profile;
        }
        assert!(Instant::now() < deadline, "the exit was never noticed");
        std::thread::sleep(Duration::from_millis(50));
    };
    let images = profile.processes.iter().filter(|p| p.key.pid.0 == pid);
    assert!(images.count() > 1, "the execs made images: {profile:#?}");
    assert_eq!(
        session.held_address_spaces(),
        0,
        "the address spaces (and open files) of a process that is gone are pruned"
    );
    assert!(!session.kernel_tracks(Pid(pid)));
}

#[test]
fn a_process_that_never_sampled_is_pruned_when_it_exits() {
    common::require_bpf();
    // Sampling off: it carries the probes but the kernel never hears of it
    // (no state, no exit event).
    let exe = common::compile_c("alloc_sites.c", &["-ldl"]);
    let mut child = Command::new(exe)
        .env("LD_PRELOAD", common::preload_library())
        .env("ALLOCPROF_RATE", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    session.refresh().unwrap();
    assert_eq!(session.held_address_spaces(), 1);
    drop(child.stdin.take());
    assert!(!child.wait().unwrap().success(), "it exits at end of input");
    session.refresh().unwrap();
    assert_eq!(
        session.held_address_spaces(),
        0,
        "the files of an exited process that never sampled are released"
    );
}

#[test]
fn an_idle_process_in_a_pid_namespace_shows_its_heap_from_before_attach() {
    common::require_bpf();
    let ns = PidNamespace::new();
    let exe = common::compile_c("alloc_sites.c", &["-ldl"]);
    let mut w = Proc::spawn(ns.command(&exe));
    let host_pid = common::first_child(w.pid());
    let ns_pid = *common::ns_pids(host_pid).last().unwrap();
    assert_ne!(ns_pid, host_pid, "the target is not in the namespace");
    common::wait_for_mapping(host_pid, "liballocprof.so");
    // Its heap is allocated before allocprof attaches; then it idles, so
    // the kernel never sees a stack of it.
    w.send("go");
    w.expect("ready");
    let out = ns
        .command(Path::new(env!("CARGO_BIN_EXE_allocprof")))
        .args(["--pid", &ns_pid.to_string(), "--duration", "3s"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let label = format!("alloc_sites ({ns_pid})");
    assert!(report.contains(&label), "no {label} in:\n{report}");
    // Read from its ledger: the sites it allocated before attach.
    for site in ["site_small", "site_medium", "site_large"] {
        assert!(report.contains(site), "{site} missing in:\n{report}");
    }
    w.send("exit");
    assert!(w.child.wait().unwrap().success());
}

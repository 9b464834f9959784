//! Discovery and process tracking against what targets can do: a main
//! thread that leaves with pthread_exit, a file swapped under the same path
//! in a private mount namespace.

mod common;

use std::{
    io::{BufRead, BufReader, Lines, Write},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use profiler_user::{
    discover,
    kernel::Limits,
    profile::{ProcessProfile, ProcessState, Profile},
    session::{Session, Target},
};

/// A child speaking a line protocol on stdin/stdout; killed on drop.
struct Proc {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Proc {
        let mut child = cmd
            .env("LD_PRELOAD", common::preload_library())
            .env("ALLOCPROF_RATE", common::RATE.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Proc {
            child,
            stdin,
            stdout,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
    }

    fn expect(&mut self, want: &str) {
        let line = self.stdout.next().expect("the workload died").unwrap();
        assert_eq!(line, want, "the workload failed");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn process(profile: &Profile, pid: u32) -> &ProcessProfile {
    profile
        .processes
        .iter()
        .find(|p| p.key.pid == pid)
        .unwrap_or_else(|| panic!("process {pid} is not in the profile: {profile:#?}"))
}

fn functions(p: &ProcessProfile) -> Vec<&str> {
    p.stacks
        .iter()
        .flat_map(|s| s.frames.iter().map(|f| f.function.as_str()))
        .collect()
}

#[test]
fn a_process_whose_main_thread_called_pthread_exit_is_alive() {
    common::require_bpf();
    let exe = common::compile_c("leader_exits.c", &["-pthread"]);
    let mut w = Proc::spawn(Command::new(exe));
    let pid = w.pid();
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut session = Session::start(Target::Pids(vec![pid]), Limits::default()).unwrap();
    // The main thread allocates and leaves; the worker runs on.
    w.send("go");
    w.expect("leader-gone");
    assert!(
        discover::process_alive(pid),
        "a process with a running thread is alive"
    );
    // Attaching now (the leader a zombie, /proc/PID/maps empty) works too.
    let late = Session::start(Target::Pids(vec![pid]), Limits::default());
    assert!(
        late.is_ok(),
        "attaching after pthread_exit: {:?}",
        late.err()
    );
    drop(late);
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
    assert!(!discover::process_alive(pid));
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
    let mut session = Session::start(Target::Pids(vec![pid]), Limits::default()).unwrap();
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

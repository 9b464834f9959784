//! Faults, created for real: a target killed while its probes fire,
//! allocprof itself killed, a full exit/exec ring buffer, a reused pid, a
//! dlclosed probe library, a probed file replaced on disk. Each test fails if
//! allocprof mishandles its fault.

mod common;

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use allocprof::ids::Pid;
use allocprof::{
    kernel::Limits,
    model::profile::{ProcessProfile, ProcessState, Profile},
    process::discover::FileId,
    session::{Session, Target},
};

use common::{
    Proc, Workload, assert_renamed_sites_within_bounds, assert_sites_within_bounds, functions,
    process, site,
};

/// How long any awaited condition may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);

/// Polls `done` until it holds; fails with `what` after [`PATIENCE`].
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Refreshes until `pid` has an image in `state`; returns that profile.
fn profile_once(session: &mut Session, pid: u32, state: ProcessState) -> Profile {
    let mut profile = None;
    wait_until(&format!("process {pid} shown {state:?}"), || {
        let p = session.refresh().unwrap();
        let found = p
            .processes
            .iter()
            .any(|i| i.key.pid.0 == pid && i.state == state);
        profile = Some(p);
        found
    });
    profile.unwrap()
}

/// The images of `pid` in `profile`.
fn images(profile: &Profile, pid: u32) -> Vec<&ProcessProfile> {
    profile
        .processes
        .iter()
        .filter(|p| p.key.pid.0 == pid)
        .collect()
}

/// `cmd` under liballocprof.so sampling every allocation (rate 1 byte).
fn every_allocation_sampled(mut cmd: Command) -> Command {
    cmd.env("LD_PRELOAD", common::preload_library())
        .env("ALLOCPROF_RATE", "1");
    cmd
}

/// Waits until the session has attached the probes `pid` maps.
fn wait_attached(session: &mut Session, pid: u32) {
    wait_until(&format!("process {pid} attached"), || {
        session.poll_events();
        session.is_attached_to(Pid(pid))
    });
}

#[test]
fn a_target_killed_mid_sample_is_accounted_and_forgotten() {
    common::require_bpf();
    // Every allocation sampled, on four threads, without pause.
    let mut cmd = Command::new(common::compile_c("hammer.c", &["-pthread"]));
    cmd.arg("4");
    let mut hammer = Proc::spawn(every_allocation_sampled(cmd));
    let pid = hammer.pid();
    let mut other = Workload::c(&[]);
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut session = Session::start(Target::All, Limits::default()).unwrap();
    wait_attached(&mut session, pid);
    hammer.expect("running");
    wait_until("the hammering process sampled", || {
        session.refresh().unwrap();
        session.kernel_tracks(Pid(pid))
    });
    // Killed while its probes fire; the session looks at once, while the
    // threads may still be dying, and keeps looking.
    // SAFETY: kill has no memory-safety preconditions.
    let sent = unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    assert_eq!(sent, 0, "killing the target");
    let profile = profile_once(&mut session, pid, ProcessState::Exited);
    let _ = hammer.child.wait();
    let gone = images(&profile, pid);
    assert_eq!(gone.len(), 1, "one image, exited: {gone:#?}");
    assert!(
        gone[0].totals.alloc_samples > 0 && gone[0].alloc_events > 0,
        "its figures are kept: {:#?}",
        gone[0]
    );
    for _ in 0..3 {
        let profile = session.refresh().unwrap();
        assert_eq!(
            images(&profile, pid).len(),
            1,
            "a late sample of a dying thread made another image"
        );
    }
    assert!(
        !session.kernel_tracks(Pid(pid)),
        "the kernel still holds state for the killed process"
    );
    // A target profiled in the same session all along is unaffected.
    other.allocate();
    let profile = session.complete_profile().unwrap();
    assert_sites_within_bounds(process(&profile, other.pid()));
    let after = images(&profile, pid);
    assert_eq!(after.len(), 1, "{after:#?}");
    assert!(
        functions(after[0]).contains(&"hammer_site"),
        "the killed process's stacks are symbolized"
    );
    other.exit();
}

/// The ids of the BPF programs `pid` holds open.
fn bpf_programs_of(pid: u32) -> HashSet<u64> {
    let mut ids = HashSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo")).unwrap() {
        let info = std::fs::read_to_string(entry.unwrap().path()).unwrap_or_default();
        for line in info.lines() {
            if let Some(id) = line.strip_prefix("prog_id:") {
                ids.insert(id.trim().parse().unwrap());
            }
        }
    }
    ids
}

/// Every BPF program loaded on the machine: id → name.
fn loaded_bpf_programs() -> HashMap<u64, String> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "-j"])
        .output()
        .expect("bpftool is needed (apt-get install bpftool)");
    assert!(out.status.success(), "bpftool prog show failed");
    let progs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    progs
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let name = p["name"].as_str().unwrap_or_default().to_owned();
            (p["id"].as_u64().unwrap(), name)
        })
        .collect()
}

/// Runs churn.c under liballocprof.so sampling every allocation and returns
/// it once it waits for its first line.
fn churn() -> Proc {
    let cmd = Command::new(common::compile_c("churn.c", &["-pthread"]));
    let w = Proc::spawn(every_allocation_sampled(cmd));
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    w
}

#[test]
fn killing_allocprof_leaves_targets_running_and_detached() {
    common::require_bpf();
    // What the target prints when no allocprof ever ran.
    let mut reference = churn();
    reference.send("go");
    reference.expect("started");
    let want = reference.line();
    drop(reference);

    let mut w = churn();
    let allocprof = Path::new(env!("CARGO_BIN_EXE_allocprof"));
    let mut profiler = common::spawn_attached(
        Command::new(allocprof)
            .args(["-d", "60s", "--probe-file"])
            .arg(common::preload_library())
            .stdout(Stdio::null()),
    );
    let programs = bpf_programs_of(profiler.id());
    let loaded = loaded_bpf_programs();
    // The kernel keeps 15 bytes of a name: otel_memory_all, otel_memory_fre,
    // otel_memory_mma, otel_memory_mun: one program per probe kind.
    let probes = programs
        .iter()
        .filter(|id| loaded.get(id).is_some_and(|n| n.starts_with("otel_memory")))
        .count();
    assert_eq!(
        probes,
        allocprof::process::discover::ProbeKind::ALL.len(),
        "allocprof's probe programs: {loaded:?}"
    );
    w.send("go");
    w.expect("started");
    // Its probes fire on both threads now.
    profiler.kill().unwrap();
    assert!(!profiler.wait().unwrap().success());
    assert_eq!(w.line(), want, "the target computed something else");
    wait_until("allocprof's BPF programs unloaded", || {
        let loaded = loaded_bpf_programs();
        !programs.iter().any(|id| loaded.contains_key(id))
    });

    // A new allocprof profiles it again.
    let out = common::scratch_dir("faults").join(format!("again-{}.json", std::process::id()));
    let mut again = common::spawn_attached(
        Command::new(allocprof)
            .args([
                "--pid",
                &w.pid().to_string(),
                "-d",
                "60s",
                "-f",
                "json",
                "-o",
            ])
            .arg(&out),
    );
    w.send("go");
    w.expect("ready");
    terminate(&mut again);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let live: f64 = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pid"] == w.pid())
        .map(|p| p["totals"]["live_bytes"].as_f64().unwrap())
        .sum();
    // 16 blocks of 1 MiB, each sampled (rate 1) with weight its size.
    let want_live = f64::from(16 << 20);
    assert!(
        (live - want_live).abs() <= want_live * 0.01,
        "the second allocprof saw {live} live bytes, not {want_live}"
    );
    assert!(
        report.to_string().contains("churn_keep"),
        "the second allocprof's stacks are symbolized: {report}"
    );
    w.send("exit");
    assert!(w.child.wait().unwrap().success());
}

/// Stops allocprof with SIGTERM (it then writes its report) and checks it
/// succeeded.
fn terminate(allocprof: &mut Child) {
    // SAFETY: kill has no memory-safety preconditions.
    let sent = unsafe { libc::kill(allocprof.id() as i32, libc::SIGTERM) };
    assert_eq!(sent, 0, "signalling allocprof");
    assert!(allocprof.wait().unwrap().success(), "allocprof failed");
}

#[test]
fn a_full_event_ring_loses_no_exit() {
    common::require_bpf();
    let mut w = Workload::c(&[]);
    let pid = w.pid();
    // System-wide, every exec is an event.
    let mut session = Session::start(Target::All, Limits::default()).unwrap();
    w.allocate();
    session.refresh().unwrap();
    assert!(session.kernel_tracks(Pid(pid)), "the target sampled");
    // 6000 execs, unread: far more than the 64 KiB ring holds (~4096).
    let storm = Command::new(common::compile_c("exec_storm.c", &[]))
        .args(["6000", "again"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    // Its last image finds no line to read.
    assert_eq!(storm.code(), Some(2), "the exec storm failed");
    // Its exit event finds the ring full.
    drop(w);
    let profile = profile_once(&mut session, pid, ProcessState::Exited);
    let shown = images(&profile, pid);
    assert_eq!(shown.len(), 1, "shown once, exited: {shown:#?}");
    let p = shown[0];
    assert!(
        site(p, "site_large").alloc_samples > 0,
        "its figures are kept: {p:#?}"
    );
    assert!(
        !session.kernel_tracks(Pid(pid)),
        "the kernel state of the killed process is freed"
    );
    let profile = session.complete_profile().unwrap();
    assert_sites_within_bounds(process(&profile, pid));
}

/// A pid no process has now, well behind the last one handed out: new pids
/// are handed out upwards from there, so none takes it before they wrap.
fn free_pid() -> u32 {
    let read = |file: &str| -> u32 {
        std::fs::read_to_string(file)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (last, max) = (
        read("/proc/sys/kernel/ns_last_pid"),
        read("/proc/sys/kernel/pid_max"),
    );
    let behind = (300..last.saturating_sub(1000)).rev();
    // Just after a wrap: the top of the range, far ahead.
    let top = (last.saturating_add(5000)..max).rev();
    behind
        .chain(top)
        .find(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        .expect("no free pid")
}

/// `program` run as process `pid` through tests/workloads/with_pid.c.
fn as_pid(pid: u32, program: &Path) -> Command {
    let mut cmd = Command::new(common::compile_c("with_pid.c", &[]));
    cmd.arg(pid.to_string()).arg(program);
    cmd
}

#[test]
fn a_reused_pid_keeps_its_figures_apart() {
    common::require_bpf();
    let a_exe = common::compile_c("alloc_sites.c", &["-ldl"]);
    let b_exe = common::compile_c(
        "alloc_sites.c",
        &[
            "-ldl",
            "-Dsite_small=b_small",
            "-Dsite_medium=b_medium",
            "-Dsite_large=b_large",
            "-Dsite_freed=b_freed",
        ],
    );
    let mut session = Session::start(Target::All, Limits::default()).unwrap();
    let pid = free_pid();

    let mut a = Proc::spawn(as_pid(pid, &a_exe));
    common::wait_for_mapping(pid, "liballocprof.so");
    wait_attached(&mut session, pid);
    a.send("go");
    a.expect("ready");
    session.refresh().unwrap();
    a.send("exit");
    assert!(a.child.wait().unwrap().success(), "process A failed");
    profile_once(&mut session, pid, ProcessState::Exited);

    let mut b = Proc::spawn(as_pid(pid, &b_exe));
    common::wait_for_mapping(pid, "liballocprof.so");
    wait_attached(&mut session, pid);
    b.send("go");
    b.expect("ready");
    let profile = session.complete_profile().unwrap();
    let images = images(&profile, pid);
    assert_eq!(images.len(), 2, "{images:#?}");
    let old = images
        .iter()
        .find(|p| p.state == ProcessState::Exited)
        .expect("A's image, exited");
    let new = images
        .iter()
        .find(|p| p.state == ProcessState::Live)
        .expect("B's image, live");
    assert_sites_within_bounds(old);
    assert_renamed_sites_within_bounds(new, "b_");
    let (old_names, new_names) = (functions(old), functions(new));
    assert!(
        !old_names.iter().any(|f| f.starts_with("b_")),
        "A's image has B's frames: {old_names:?}"
    );
    assert!(
        !new_names.iter().any(|f| f.starts_with("site_")),
        "B's image has A's frames: {new_names:?}"
    );
    b.send("exit");
    assert!(b.child.wait().unwrap().success(), "process B failed");
}

#[test]
fn a_dlclosed_probe_library_keeps_its_figures_and_frames() {
    common::require_bpf();
    let plugin = common::compile_c_library("plugin.c");
    let mut cmd = Command::new(common::compile_c("dlclose.c", &["-ldl"]));
    cmd.arg(&plugin);
    let mut w = Proc::spawn(cmd);
    let pid = w.pid();
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    w.send("go");
    w.expect("loaded");
    session.refresh().unwrap();
    assert!(
        session.is_attached(Pid(pid), FileId::of_path(&plugin).unwrap()),
        "the plugin's own probes are attached"
    );
    // dlclose unmaps it (the workload checks), then it allocates on.
    w.send("go");
    w.expect("ready");
    session.refresh().unwrap();
    let profile = session.complete_profile().unwrap();
    let p = process(&profile, pid);
    for (function, n, size) in [("plugin_alloc", 4000, 4096), ("main_alloc", 2000, 8192)] {
        let t = site(p, function);
        let (truth, sigma) = common::truth_and_sigma(n, size, common::RATE);
        assert!(
            (t.live_bytes - truth).abs() <= 5.0 * sigma,
            "{function}: live {} vs truth {truth} (sigma {sigma}) in {p:#?}",
            t.live_bytes
        );
    }
    // Refreshing goes on working with the library gone.
    for _ in 0..3 {
        let profile = session.refresh().unwrap();
        assert_eq!(process(&profile, pid).state, ProcessState::Live);
    }
    w.send("exit");
    assert!(w.child.wait().unwrap().success());
}

#[test]
fn a_probed_file_replaced_on_disk_is_still_the_one_profiled() {
    common::require_bpf();
    let dir = common::scratch_dir(&format!("replaced-{}", std::process::id()));
    let path = dir.join("liballocprof.so");
    std::fs::copy(common::preload_library(), &path).unwrap();
    let mapped = FileId::of_path(&path).unwrap();
    let mut cmd = Command::new(common::compile_c("alloc_sites.c", &["-ldl"]));
    cmd.env("LD_PRELOAD", &path)
        .env("ALLOCPROF_RATE", common::RATE.to_string());
    let mut w = Proc::spawn(cmd);
    let pid = w.pid();
    common::wait_for_mapping(pid, "replaced");
    // Another file takes its path while the target maps the old one.
    replace(&path, Path::new("/bin/true"));
    assert_ne!(FileId::of_path(&path).unwrap(), mapped);
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default())
        .expect("attaching through the mapped file");
    assert!(session.is_attached(Pid(pid), mapped), "not the mapped file");
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    assert_sites_within_bounds(process(&profile, pid));
    w.send("exit");
    assert!(w.child.wait().unwrap().success());
}

/// Puts a copy of `with` at `path` by rename, as package managers do.
fn replace(path: &Path, with: &Path) {
    let tmp = PathBuf::from(format!("{}.new", path.display()));
    std::fs::copy(with, &tmp).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The kernel (6.18+) turns a fast probe site, once hit, into a call to a
/// `[uprobes-trampoline]` page of the process; fork copies the rewritten
/// text but not that page. A fork child must not call into the void: the
/// allocator gives it the trap sites instead, and its samples still arrive.
/// Both ways of attaching: to the parent only, and to every process (which
/// profiles the children too).
#[test]
fn fork_children_of_a_probed_process_survive_their_samples() {
    common::require_bpf();
    let program = common::compile_c("fork_after_sample.c", &[]);
    for all in [false, true] {
        let mut w = Proc::spawn(every_allocation_sampled(Command::new(&program)));
        let pid = w.pid();
        common::wait_for_mapping(pid, "liballocprof.so");
        let target = if all {
            Target::All
        } else {
            Target::Pids(vec![Pid(pid)])
        };
        let mut session = Session::start(target, Limits::default()).unwrap();
        wait_attached(&mut session, pid);
        w.send("go");
        let trampoline = w.line();
        assert!(
            trampoline == "trampoline yes" || trampoline == "trampoline no",
            "{trampoline}"
        );
        if trampoline == "trampoline no" {
            eprintln!("this kernel does not optimize uprobes: nothing to inherit");
        }
        w.expect("ready");
        if all {
            // Each child's 1 MiB block (rate 1: weight = size), seen live.
            let mut seen = 0;
            wait_until("the children's blocks", || {
                let profile = session.refresh().unwrap();
                seen = profile
                    .processes
                    .iter()
                    .filter(|p| p.key.pid.0 != pid)
                    .filter(|p| site(p, "fork_child_keep").live_bytes == f64::from(1 << 20))
                    .count();
                seen == 20
            });
        }
        w.send("exit");
        w.expect("children 20 crashed 0");
        assert!(w.child.wait().unwrap().success());
    }
}

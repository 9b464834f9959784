//! The OOM flight recorder, with a real OOM kill: a process under
//! liballocprof.so grows one stack in a memory cgroup limited to 64 MiB
//! until the kernel's OOM killer kills it; `allocprof --oom-dir` writes
//! its heap at that moment, which attributes the growth to that stack.
//! allocprof runs in a mount namespace of its own without tracefs, as on
//! machines that boot without it: the OOM tracepoint needs none, and a
//! profile, with or without `--oom-dir`, mounts nothing.

mod common;

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use allocprof::output::export::pprof;
use common::Proc;

const LIMIT: u64 = 64 << 20;

/// A memory cgroup limited to [`LIMIT`] (v1 where its memory controller is
/// mounted, as on our machines; else v2's `memory.max`), removed on drop.
struct MemoryCgroup {
    dir: PathBuf,
}

impl MemoryCgroup {
    fn new() -> MemoryCgroup {
        let name = format!("allocprof-oom-test-{}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        let (dir, limit_file) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(&name), "memory.limit_in_bytes")
        } else if fs::read_to_string(v2).is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
        {
            (Path::new("/sys/fs/cgroup").join(&name), "memory.max")
        } else {
            panic!(
                "no memory cgroup controller is mounted (cgroup v1 at /sys/fs/cgroup/memory, or \
                 v2 with memory in /sys/fs/cgroup/cgroup.controllers): this test needs one"
            );
        };
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        fs::write(dir.join(limit_file), LIMIT.to_string()).unwrap();
        MemoryCgroup { dir }
    }

    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Empty once its process is gone (and reaped).
        for _ in 0..100 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `cmd` (allocprof) in a new mount namespace (private: nothing it mounts
/// reaches the host's) from which tracefs is unmounted first; once it
/// exits, the namespace's mount table is written to `mountinfo`.
fn without_tracefs(cmd: &Command, mountinfo: &Path) -> Command {
    let script = r#"
        for i in 1 2 3 4; do
            for d in /sys/kernel/tracing /sys/kernel/debug/tracing; do
                umount -l "$d" 2>/dev/null
            done
        done
        if grep -q ' - tracefs ' /proc/self/mountinfo; then
            echo "tracefs could not be unmounted in the test's namespace" >&2
            exit 99
        fi
        out="$1"; shift
        "$@"; rc=$?
        cat /proc/self/mountinfo > "$out"
        exit $rc
    "#;
    let mut wrapped = Command::new("unshare");
    wrapped
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(mountinfo)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    wrapped
}

/// The tracefs mounts of a mount table written by [`without_tracefs`].
fn tracefs_mounts(mountinfo: &Path) -> Vec<String> {
    fs::read_to_string(mountinfo)
        .unwrap_or_else(|e| panic!("{}: {e}", mountinfo.display()))
        .lines()
        .filter(|l| l.contains(" - tracefs "))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_profile_without_oom_dir_mounts_nothing() {
    common::require_bpf();
    let mut w = common::Workload::c(&[]);
    let out = common::scratch_dir(&format!("no-tracefs-{}", std::process::id()));
    let mountinfo = out.join("mountinfo");
    let mut allocprof = Command::new(env!("CARGO_BIN_EXE_allocprof"));
    allocprof
        .args(["--pid", &w.pid().to_string(), "-d", "1s", "-o"])
        .arg(out.join("report.txt"));
    let mut profiler =
        common::spawn_attached(without_tracefs(&allocprof, &mountinfo).stdout(Stdio::null()));
    w.allocate();
    let status = profiler.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let report = fs::read_to_string(out.join("report.txt")).unwrap();
    assert!(report.contains("alloc_sites"), "{report}");
    let mounts = tracefs_mounts(&mountinfo);
    assert!(mounts.is_empty(), "allocprof mounted tracefs: {mounts:?}");
    w.exit();
}

#[test]
fn an_oom_killed_process_leaves_its_heap_in_the_oom_dir() {
    common::require_bpf();
    let exe = common::compile_c("oom_grow.c", &[]);
    let cgroup = MemoryCgroup::new();
    let out = common::scratch_dir(&format!("oom-{}", std::process::id()));
    // The shell moves itself into the cgroup, then becomes the workload.
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "echo $$ > {} && exec \"$0\"",
            cgroup.procs().display()
        ))
        .arg(&exe);
    let mut w = Proc::spawn(cmd);
    w.expect("started");
    let mountinfo = out.join("mountinfo");
    let mut allocprof = Command::new(env!("CARGO_BIN_EXE_allocprof"));
    allocprof
        .args([
            "--pid",
            &w.pid().to_string(),
            "-d",
            "120s",
            "-f",
            "json",
            "-o",
        ])
        .arg(out.join("final.json"))
        .arg("--oom-dir")
        .arg(&out);
    let mut profiler =
        common::spawn_attached(without_tracefs(&allocprof, &mountinfo).stdout(Stdio::null()));
    w.send("go");
    let status = w.child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(9),
        "the OOM killer's SIGKILL: {status:?}"
    );
    // allocprof stops once its one target is gone, after writing.
    let deadline = Instant::now() + Duration::from_secs(60);
    while profiler.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "allocprof did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }

    let files: Vec<PathBuf> = fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("oom-"))
        .collect();
    let named = |suffix: &str| {
        files
            .iter()
            .find(|f| f.to_string_lossy().ends_with(suffix))
            .unwrap_or_else(|| panic!("no {suffix} in {files:?}"))
            .clone()
    };
    assert_eq!(files.len(), 2, "{files:?}");
    let pb = named(".pb.gz");
    let name = pb.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&format!("oom-oom_grow-{}-", w.pid())),
        "{name}"
    );
    let profile = pprof::decode(&fs::read(&pb).unwrap()).unwrap();
    let p = common::process(&profile, w.pid());
    let top = &p.stacks[0];
    assert!(
        top.frames.iter().any(|f| &*f.function == "grow_site"),
        "the growth is on grow_site: {:#?}",
        p.stacks
    );
    // Killed near the 64 MiB limit: most of it was grow_site's.
    assert!(
        top.totals.live_bytes >= 0.5 * LIMIT as f64 && top.totals.live_bytes <= 1.5 * LIMIT as f64,
        "{}",
        top.totals.live_bytes
    );
    let text = fs::read_to_string(named(".txt")).unwrap();
    assert!(
        text.contains("oom-killed") && text.contains("grow_site"),
        "{text}"
    );
    let json = fs::read_to_string(out.join("final.json")).unwrap();
    assert!(json.contains("\"oom_killed\""), "{json}");
    // Recorded without tracefs, and none was mounted.
    let mounts = tracefs_mounts(&mountinfo);
    assert!(mounts.is_empty(), "allocprof mounted tracefs: {mounts:?}");
    drop(w);
}

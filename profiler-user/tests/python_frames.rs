//! Python frames on heap samples, end to end (issue 30): real CPython
//! (Debian's `/usr/bin/python3`, pyenv's `python3` on PATH, pyenv's 3.12
//! and 3.13; Debian's in a pid namespace of its own too) running
//! tests/workloads/python_sites.py under liballocprof.so with
//! `PYTHONMALLOC=malloc`, the kernel walking each sampled thread's frames,
//! user space resolving and merging them. Each site's live bytes are within
//! 4σ of the truth under the Python function and line that allocate them:
//! nested calls, recursion, a generator, an asyncio coroutine, a json hook
//! and an re callback (C between Python frames), an `__exit__` while an
//! exception unwinds, a ctypes `malloc` made without the GIL, two threads
//! at once. Attached late, new samples get Python frames at once; the heap
//! from before attach (the ledger, captured inside `malloc`) is native-only.

mod common;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use allocprof::{
    ids::Pid,
    kernel::Limits,
    model::profile::{ProcessProfile, Profile},
    output::{
        export::json,
        report::{self, ReportOptions},
    },
    python::runtime::ObjectAllocator,
    session::{Session, Target},
    symbolize::{Frame, FrameKind},
};
use common::{DEBIAN_PYTHON, Proc, RATE, path_python, truth_and_sigma};

const SCRIPT: &str = "tests/workloads/python_sites.py";
/// The script's `SIZE` and `COUNT`.
const SIZE: u64 = 64 * 1024;
const COUNT: u64 = 64;

/// Each site of the script: its `# site:` name and the Python function
/// (qualified name) that allocates there.
const SITES: [(&str, &str); 11] = [
    ("nested", "inner"),
    ("recursion", "recurse"),
    ("generator", "blocks"),
    ("coroutine", "fill"),
    ("json_hook", "hook"),
    ("re_callback", "replace"),
    ("unwinding", "Cleanup.__exit__"),
    ("without_gil", "without_gil"),
    ("thread_a", "thread_a"),
    ("thread_b", "thread_b"),
    ("late", "late"),
];

/// The machine's pyenv builds of the newer minor versions.
const PYENV_312: &str = "/root/.pyenv/versions/3.12.1/bin/python3.12";
const PYENV_313: &str = "/root/.pyenv/versions/3.13.0/bin/python3.13";

fn pyenv(exe: &str) -> PathBuf {
    let exe = PathBuf::from(exe);
    assert!(
        exe.exists(),
        "{} is missing: this test needs pyenv's CPython of that version",
        exe.display()
    );
    exe
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(SCRIPT)
}

/// The line of each `# site: NAME` comment of the script.
fn site_lines() -> HashMap<String, u32> {
    std::fs::read_to_string(script())
        .unwrap()
        .lines()
        .zip(1..)
        .filter_map(|(l, n)| Some((l.split_once("# site: ")?.1.trim().to_string(), n)))
        .collect()
}

fn start(python: &Path) -> Proc {
    let mut cmd = Command::new(python);
    cmd.arg(script())
        .env("PYTHONMALLOC", "malloc")
        .env("LD_PRELOAD", common::preload_library())
        .env("ALLOCPROF_RATE", RATE.to_string());
    let proc = Proc::spawn(cmd);
    common::wait_for_mapping(proc.pid(), "liballocprof.so");
    proc
}

/// The script in a new pid namespace (a container's, as far as its thread
/// ids go: each thread state holds its namespace's id, not the host's),
/// its namespace's init; with its pid (the host's).
fn start_in_pid_namespace(python: &Path) -> (Proc, u32) {
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--kill-child", "env"])
        .arg(format!(
            "LD_PRELOAD={}",
            common::preload_library().display()
        ))
        .arg("PYTHONMALLOC=malloc")
        .arg(format!("ALLOCPROF_RATE={RATE}"))
        .arg(python)
        .arg(script())
        // unshare itself runs without the sampler.
        .env("LD_PRELOAD", "");
    let proc = Proc::spawn(cmd);
    let pid = common::first_child(proc.pid());
    common::wait_for_mapping(pid, "liballocprof.so");
    assert_eq!(
        common::ns_pids(pid),
        [pid, 1],
        "the script is its namespace's init"
    );
    (proc, pid)
}

/// The innermost Python frame of a stack, if it has one.
fn innermost_python(frames: &[Frame]) -> Option<&Frame> {
    frames.iter().find(|f| f.kind == FrameKind::Python)
}

/// Live bytes by the (function, line) of their stacks' innermost Python
/// frame.
fn by_python_site(p: &ProcessProfile) -> HashMap<(String, u32), f64> {
    let mut sites = HashMap::new();
    for s in &p.stacks {
        let Some(f) = innermost_python(&s.frames) else {
            continue;
        };
        let line = f
            .location
            .as_deref()
            .and_then(|l| l.rsplit_once(':'))
            .and_then(|(_, n)| n.parse().ok())
            .unwrap_or(0);
        *sites.entry((f.function.to_string(), line)).or_default() += s.totals.live_bytes;
    }
    sites
}

/// Python functions of the stacks whose innermost Python frame is `function`,
/// innermost first.
fn python_chains<'a>(p: &'a ProcessProfile, function: &str) -> Vec<Vec<&'a str>> {
    p.stacks
        .iter()
        .filter(|s| innermost_python(&s.frames).is_some_and(|f| &*f.function == function))
        .map(|s| {
            s.frames
                .iter()
                .filter(|f| f.kind == FrameKind::Python)
                .map(|f| &*f.function)
                .collect()
        })
        .collect()
}

/// Refreshes until every one of `sites` has samples under its Python frame.
fn profile_with(session: &mut Session, pid: u32, sites: &[&str]) -> Profile {
    let mut last = None;
    for _ in 0..100 {
        let profile = session.complete_profile().unwrap();
        let p = common::process(&profile, pid);
        let seen = by_python_site(p);
        if sites
            .iter()
            .all(|f| seen.keys().any(|(function, _)| function == f))
        {
            return profile;
        }
        last = Some(profile);
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("sites {sites:?} never all seen with Python frames: {last:#?}");
}

/// Where the script runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Namespace {
    /// allocprof's (the initial) pid namespace.
    Host,
    /// A new one.
    Own,
}

fn known_sites(python: &Path, version: (u8, u8), namespace: Namespace) {
    common::require_bpf();
    let (mut proc, pid) = match namespace {
        Namespace::Host => {
            let proc = start(python);
            let pid = proc.pid();
            (proc, pid)
        }
        Namespace::Own => start_in_pid_namespace(python),
    };
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    session.complete_profile().unwrap();
    proc.send("go");
    proc.expect("ready");
    proc.send("more");
    proc.expect("ready");
    let functions: Vec<&str> = SITES.iter().map(|(_, f)| *f).collect();
    let profile = profile_with(&mut session, pid, &functions);
    let p = common::process(&profile, pid);
    let python = p.python.expect("recognised as CPython");
    assert_eq!((python.version.major, python.version.minor), version);
    assert_eq!(python.objects, Some(ObjectAllocator::Malloc));
    let seen = by_python_site(p);
    let lines = site_lines();
    let (truth, sigma) = truth_and_sigma(COUNT, SIZE, RATE);
    for (site, function) in SITES {
        let line = lines[site];
        let live: f64 = seen
            .get(&(function.to_string(), line))
            .copied()
            .unwrap_or_else(|| panic!("{site}: nothing under {function} line {line}: {seen:#?}"));
        assert!(
            (live - truth).abs() <= 4.0 * sigma,
            "{site}: {live} live bytes under {function} line {line}, truth {truth} (σ {sigma})"
        );
    }
    // Every Python frame of the callers is there, in order.
    let chains = python_chains(p, "inner");
    assert!(
        chains
            .iter()
            .all(|c| c.starts_with(&["inner", "middle", "outer", "main", "<module>"])),
        "{chains:?}"
    );
    let chains = python_chains(p, "recurse");
    assert!(
        chains
            .iter()
            .all(|c| c.len() == 15 && c[..13].iter().all(|f| *f == "recurse")),
        "13 recursive calls, then main and <module>: {chains:?}"
    );
    // json's C scanner calls the hook: Python frames on both sides of it.
    let chains = python_chains(p, "hook");
    assert!(
        chains
            .iter()
            .all(|c| c[0] == "hook" && c.contains(&"loads") && c.ends_with(&["main", "<module>"])),
        "{chains:?}"
    );
    // A thread's frames are its own: each thread's site sits under
    // threading's bootstrap, not under main.
    for function in ["thread_a", "thread_b"] {
        let chains = python_chains(p, function);
        assert!(
            chains
                .iter()
                .all(|c| c.last() == Some(&"Thread._bootstrap") && !c.contains(&"main")),
            "{function}: {chains:?}"
        );
    }
    // The site is named by its Python frame.
    let stack = p
        .stacks
        .iter()
        .find(|s| innermost_python(&s.frames).is_some_and(|f| &*f.function == "inner"))
        .unwrap();
    let named = allocprof::symbolize::most_informative(&stack.frames).unwrap();
    assert_eq!(
        named.site_name(),
        format!("inner (python_sites.py:{})", lines["nested"])
    );
}

#[test]
fn debian_python_sites_are_named_by_their_python_function_and_line() {
    known_sites(Path::new(DEBIAN_PYTHON), (3, 11), Namespace::Host);
}

#[test]
fn pyenv_python_sites_are_named_by_their_python_function_and_line() {
    known_sites(&path_python(), (3, 11), Namespace::Host);
}

/// pyenv's 3.12 (`libpython3.12.so`): the frame starts with `f_code`, has
/// an `owner`, and each eval call pushes a shim frame (skipped, its
/// successor marked an entry frame).
#[test]
fn python_3_12_sites_are_named_by_their_python_function_and_line() {
    known_sites(&pyenv(PYENV_312), (3, 12), Namespace::Host);
}

/// pyenv's 3.13: offsets from its `_Py_DebugOffsets`, the current frame in
/// the thread state itself, `f_executable` and `instr_ptr`.
#[test]
fn python_3_13_sites_are_named_by_their_python_function_and_line() {
    known_sites(&pyenv(PYENV_313), (3, 13), Namespace::Host);
}

/// In its own pid namespace (a container), the interpreter's thread states
/// hold that namespace's thread ids: the kernel asks for the allocating
/// thread's there.
#[test]
fn python_in_another_pid_namespace_has_its_python_frames() {
    known_sites(Path::new(DEBIAN_PYTHON), (3, 11), Namespace::Own);
}

/// Attached to a running interpreter: the heap from before attach is there,
/// from the ledger, native frames only; new samples have Python frames.
#[test]
fn attached_late_new_samples_have_python_frames_and_the_ledger_s_do_not() {
    common::require_bpf();
    let mut proc = start(Path::new(DEBIAN_PYTHON));
    let pid = proc.pid();
    proc.send("go");
    proc.expect("ready");
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    session.complete_profile().unwrap();
    proc.send("more");
    proc.expect("ready");
    let profile = profile_with(&mut session, pid, &["late"]);
    let p = common::process(&profile, pid);
    let (with, without): (Vec<_>, Vec<_>) = p
        .stacks
        .iter()
        .filter(|s| s.totals.live_bytes > 0.0)
        .partition(|s| innermost_python(&s.frames).is_some());
    // After attach the script allocates at `late`, and little else (reading
    // a line, printing one), which a sample may still catch.
    let python: f64 = with.iter().map(|s| s.totals.live_bytes).sum();
    let late: f64 = with
        .iter()
        .filter(|s| &*innermost_python(&s.frames).unwrap().function == "late")
        .map(|s| s.totals.live_bytes)
        .sum();
    assert!(
        late >= 0.9 * python,
        "new samples are the late site's: {late} of {python} bytes with Python frames"
    );
    let before: f64 = without.iter().map(|s| s.totals.live_bytes).sum();
    let (truth, _) = truth_and_sigma(COUNT, SIZE, RATE);
    assert!(
        before > 5.0 * truth,
        "the ten sites from before attach are there, native-only: {before} bytes"
    );
}

/// Under pymalloc (the default), the profile says what it cannot see: the
/// report, the JSON, as the interpreter itself says it (read from its
/// `_PyRuntime`, not guessed from the environment).
#[test]
fn a_process_under_pymalloc_is_said_to_hide_its_small_objects() {
    common::require_bpf();
    for python in [Path::new(DEBIAN_PYTHON).to_path_buf(), path_python()] {
        let mut cmd = Command::new(&python);
        cmd.args(["-c", "import sys; x = [bytearray(100000) for _ in range(50)]; print('ready', flush=True); sys.stdin.read()"])
            .env_remove("PYTHONMALLOC")
            .env("LD_PRELOAD", common::preload_library())
            .env("ALLOCPROF_RATE", RATE.to_string());
        let mut proc = Proc::spawn(cmd);
        proc.expect("ready");
        let pid = proc.pid();
        let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
        let profile = session.complete_profile().unwrap();
        let p = common::process(&profile, pid);
        let runtime = p.python.expect("recognised as CPython");
        assert_eq!(
            runtime.objects,
            Some(ObjectAllocator::Pymalloc),
            "{}",
            python.display()
        );
        let text = report::render(&profile, ReportOptions::default());
        assert!(
            text.contains("objects through pymalloc") && text.contains("PYTHONMALLOC=malloc"),
            "{text}"
        );
        let report = json::report(&profile);
        let process = report.processes.iter().find(|j| j.pid == pid).unwrap();
        let py = process.python.as_ref().expect("the JSON's python");
        assert_eq!(py.objects, Some(ObjectAllocator::Pymalloc));
        assert_eq!(py.version, runtime.version.to_string());
    }
}

//! Python frames when the target is not what it claims, or lies to the
//! walk (issue 30's robustness tests), with real processes under
//! liballocprof.so (`PYTHONMALLOC=malloc` for CPython):
//! - a CPython without frame offsets (pyenv's 3.10.13, whose `_PyRuntime`
//!   is in its `libpython3.10.so`, and no `Py_Version`), two processes: both
//!   profiled, native frames only, one warning for the file;
//! - a C program exporting `_PyRuntime` and `Py_Version`
//!   (tests/workloads/fake_python.c): garbage there is refused by the
//!   session's runtime check and said once per file; zeros (an interpreter
//!   not initialised yet looks so) and a runtime of pointers to itself
//!   (which passes the check) reach the kernel, which files no Python
//!   frame; a `Py_Version` of 3.9 is said once as unsupported;
//! - a CPython 3.11 program scribbling over its own frame chain
//!   (tests/workloads/python_scribble.py: a cycle of one and of two, an
//!   unmapped and an unaligned `previous`): walks bounded and cut with the
//!   truncation marker, the process profiled, a site after the chain is
//!   restored named by its function and line;
//! - code objects freed between their samples and their resolution
//!   (tests/workloads/python_freed.py): named as they were or
//!   `[python code freed]`, never as the decoys made at their addresses,
//!   whether after the session first read their stacks or before.

mod common;

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use allocprof::{
    ids::{HostPid, Pid},
    kernel::Limits,
    model::profile::{ProcessProfile, Profile, StackProfile},
    python::cache::{FREED_MARKER, TRUNCATED_MARKER},
    session::{Session, Target},
    symbolize::{Frame, FrameKind},
};
use common::{DEBIAN_PYTHON, Proc, RATE, truth_and_sigma};
use profiler_common::{
    NO_STACK, OVERFLOW_STACK,
    python::{MAX_PYTHON_FRAMES, decode_python_frame, split_python},
};

/// pyenv's CPython 3.10: it exports `_PyRuntime` but has no `Py_Version`
/// and no frame offsets here.
const PYTHON_310: &str = "/root/.pyenv/versions/3.10.13/bin/python3.10";
/// Blocks and their size at each site of every workload here.
const SIZE: u64 = 64 * 1024;
const COUNT: u64 = 64;

fn workload(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads")
        .join(name)
}

/// Refreshes until `done` holds of the profile (at most 10 s).
fn profile_until(session: &mut Session, done: impl Fn(&Profile) -> bool) -> Profile {
    let mut last = None;
    for _ in 0..100 {
        let profile = session.complete_profile().unwrap();
        if done(&profile) {
            return profile;
        }
        last = Some(profile);
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the profile never got there: {last:#?}");
}

fn python_frames(p: &ProcessProfile) -> Vec<&Frame> {
    p.stacks
        .iter()
        .flat_map(|s| s.frames.iter())
        .filter(|f| f.kind == FrameKind::Python)
        .collect()
}

/// Live bytes of the stacks through `function` within 4σ of `count`
/// blocks of [`SIZE`].
fn assert_site(p: &ProcessProfile, function: &str, count: u64) {
    let live = common::site(p, function).live_bytes;
    let (truth, sigma) = truth_and_sigma(count, SIZE, RATE);
    assert!(
        (live - truth).abs() <= 4.0 * sigma,
        "process {}: {live} live bytes through {function}, truth {truth} (σ {sigma})",
        p.key.pid.0
    );
}

/// The session's warnings that name `path`.
fn warnings_about<'a>(session: &'a Session, path: &str) -> Vec<&'a String> {
    session
        .warnings
        .iter()
        .filter(|w| w.contains(path))
        .collect()
}

/// pyenv's 3.10 in two processes: each profiled with native frames only,
/// and one warning for the file that exports `_PyRuntime` (its libpython,
/// which both map).
#[test]
fn a_cpython_without_offsets_is_said_once_and_stays_profiled() {
    common::require_bpf();
    assert!(
        Path::new(PYTHON_310).exists(),
        "{PYTHON_310} is needed: CPython 3.10 is the version here without frame offsets \
         (pyenv install 3.10.13)"
    );
    let script = format!(
        "import sys\n\
         def site_310():\n    return [bytearray({SIZE}) for _ in range({COUNT})]\n\
         keep = []\n\
         for line in sys.stdin:\n    keep.append(site_310())\n    print('ready', flush=True)\n"
    );
    let mut procs: Vec<Proc> = (0..2)
        .map(|_| {
            let mut cmd = Command::new(PYTHON_310);
            cmd.args(["-c", &script]).env("PYTHONMALLOC", "malloc");
            let proc = Proc::spawn(cmd);
            common::wait_for_mapping(proc.pid(), "liballocprof.so");
            proc
        })
        .collect();
    let pids: Vec<u32> = procs.iter().map(Proc::pid).collect();
    // The file that exports `_PyRuntime`: its libpython, not the executable.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", pids[0])).unwrap();
    let libpython = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("libpython3.10.so"))
        .unwrap_or_else(|| panic!("{PYTHON_310} maps no libpython3.10.so:\n{maps}"))
        .to_string();
    let mut session = Session::start(
        Target::Pids(pids.iter().map(|&p| Pid(p)).collect()),
        Limits::default(),
    )
    .unwrap();
    session.complete_profile().unwrap();
    for proc in &mut procs {
        proc.send("go");
        proc.expect("ready");
    }
    // bytearray(n) allocates in bytearray___init__ (libpython's symbols).
    let profile = profile_until(&mut session, |profile| {
        pids.iter().all(|&pid| {
            profile.processes.iter().any(|p| {
                p.key.pid.0 == pid && common::site(p, "bytearray___init__").live_samples > 0
            })
        })
    });
    for &pid in &pids {
        let p = common::process(&profile, pid);
        assert_site(p, "bytearray___init__", COUNT);
        assert!(
            python_frames(p).is_empty(),
            "native frames only: {:?}",
            python_frames(p)
        );
        assert!(p.python.is_none(), "{:?}", p.python);
        assert!(
            session.kernel().process_python(HostPid(pid)).is_none(),
            "no kernel entry for {pid}"
        );
    }
    let said = warnings_about(&session, &libpython);
    assert_eq!(
        said.len(),
        1,
        "one warning for {libpython}: {:?}",
        session.warnings
    );
    assert!(said[0].contains("no Py_Version"), "{said:?}");
    assert_eq!(
        session
            .warnings
            .iter()
            .filter(|w| w.contains("_PyRuntime"))
            .count(),
        1,
        "{:?}",
        session.warnings
    );
}

/// fake_python.c built with `defines`, and started (preloaded) `n` times.
fn fakes(defines: &[&str], n: usize) -> (PathBuf, Vec<Proc>) {
    let mut args = vec!["-rdynamic"];
    args.extend_from_slice(defines);
    let exe = common::compile_c("fake_python.c", &args);
    let procs = (0..n)
        .map(|_| {
            let proc = Proc::spawn(Command::new(&exe));
            common::wait_for_mapping(proc.pid(), "liballocprof.so");
            proc
        })
        .collect();
    (exe, procs)
}

/// Lets every fake allocate, and profiles until each has its site.
fn fakes_profile(session: &mut Session, procs: &mut [&mut Proc]) -> Profile {
    for proc in procs.iter_mut() {
        proc.send("go");
        proc.expect("ready");
    }
    let pids: Vec<u32> = procs.iter().map(|p| p.pid()).collect();
    profile_until(session, |profile| {
        pids.iter().all(|&pid| {
            profile
                .processes
                .iter()
                .any(|p| p.key.pid.0 == pid && common::site(p, "site_fake").live_samples > 0)
        })
    })
}

/// Files that claim CPython over something else: garbage in `_PyRuntime`
/// (its interpreter list no pointer) is refused by the session's runtime
/// check, a 3.9 by its version; each said once for two processes, all
/// four profiled with native frames only and no kernel entry.
#[test]
fn a_false_cpython_is_said_once_and_stays_profiled() {
    common::require_bpf();
    let (garbage, mut garbage_procs) = fakes(&["-DPATTERN=0x41"], 2);
    let (old, mut old_procs) = fakes(&["-DPY_VERSION_HEX=0x030912f0"], 2);
    let pids: Vec<u32> = garbage_procs
        .iter()
        .chain(&old_procs)
        .map(Proc::pid)
        .collect();
    let mut session = Session::start(
        Target::Pids(pids.iter().map(|&p| Pid(p)).collect()),
        Limits::default(),
    )
    .unwrap();
    session.complete_profile().unwrap();
    let mut all: Vec<&mut Proc> = garbage_procs.iter_mut().chain(&mut old_procs).collect();
    let profile = fakes_profile(&mut session, &mut all);
    for &pid in &pids {
        let p = common::process(&profile, pid);
        assert_site(p, "site_fake", COUNT);
        assert!(python_frames(p).is_empty(), "{:?}", python_frames(p));
        assert!(p.python.is_none(), "{:?}", p.python);
        assert!(session.kernel().process_python(HostPid(pid)).is_none());
    }
    let garbage = garbage.display().to_string();
    let said = warnings_about(&session, &garbage);
    assert_eq!(said.len(), 1, "{:?}", session.warnings);
    assert!(
        said[0].contains("claims CPython 3.11.4") && said[0].contains("no pointer"),
        "{said:?}"
    );
    let old = old.display().to_string();
    let said = warnings_about(&session, &old);
    assert_eq!(said.len(), 1, "{:?}", session.warnings);
    assert!(
        said[0].contains("CPython 3.9.18: no frame offsets"),
        "{said:?}"
    );
}

/// Runtimes the session's check cannot refuse: zeros (as a CPython's before
/// `Py_Initialize`) and a runtime whose every word points at itself (its
/// interpreter points back at it). The kernel gets their entries, finds no
/// thread state through them and files no Python frame; nothing is said.
#[test]
fn a_runtime_of_zeros_or_of_self_pointers_walks_nothing() {
    common::require_bpf();
    let (zeros, mut zero_procs) = fakes(&[], 1);
    let (selfish, mut self_procs) = fakes(&["-DSELF_POINTERS"], 1);
    let pids = [zero_procs[0].pid(), self_procs[0].pid()];
    let mut session = Session::start(
        Target::Pids(pids.iter().map(|&p| Pid(p)).collect()),
        Limits::default(),
    )
    .unwrap();
    session.complete_profile().unwrap();
    for pid in pids {
        assert!(
            session.kernel().process_python(HostPid(pid)).is_some(),
            "{pid} reached the kernel"
        );
    }
    let mut all: Vec<&mut Proc> = zero_procs.iter_mut().chain(&mut self_procs).collect();
    let profile = fakes_profile(&mut session, &mut all);
    for pid in pids {
        let p = common::process(&profile, pid);
        assert_site(p, "site_fake", COUNT);
        assert!(python_frames(p).is_empty(), "{:?}", python_frames(p));
    }
    for exe in [zeros, selfish] {
        let exe = exe.display().to_string();
        assert!(
            warnings_about(&session, &exe).is_empty(),
            "{:?}",
            session.warnings
        );
    }
}

/// The line of each `# site: NAME` comment of a script.
fn site_lines(script: &Path) -> HashMap<String, u32> {
    std::fs::read_to_string(script)
        .unwrap()
        .lines()
        .zip(1..)
        .filter_map(|(l, n)| Some((l.split_once("# site: ")?.1.trim().to_string(), n)))
        .collect()
}

/// The Python frames of a stack, innermost first, markers included.
fn python_chain(frames: &[Frame]) -> Vec<&Frame> {
    frames
        .iter()
        .filter(|f| f.kind == FrameKind::Python)
        .collect()
}

fn line_of(frame: &Frame) -> Option<u32> {
    frame.location.as_deref()?.rsplit_once(':')?.1.parse().ok()
}

/// python_scribble.py's stacks whose innermost Python frame is `function`
/// at its allocation site `line`; those at its other lines are checked to
/// be whole (`function`, `main`, `<module>`, never cut).
fn site_or_intact<'a>(p: &'a ProcessProfile, function: &str, line: u32) -> Vec<&'a StackProfile> {
    let (site, around): (Vec<_>, Vec<_>) = p
        .stacks
        .iter()
        .filter(|s| {
            python_chain(&s.frames)
                .first()
                .is_some_and(|f| &*f.function == function)
        })
        .partition(|s| line_of(python_chain(&s.frames)[0]) == Some(line));
    for s in &around {
        let chain: Vec<&str> = python_chain(&s.frames)
            .iter()
            .map(|f| &*f.function)
            .collect();
        assert_eq!(chain, [function, "main", "<module>"], "{:?}", s.frames);
    }
    site
}

/// A CPython 3.11 program points its frame chain at itself (a cycle of one,
/// of two), at an unmapped address and at no pointer, allocating each time:
/// each walk is bounded and ends in the truncation marker, every byte is
/// there; with the chain restored, a site is named by its function and line
/// under its callers; the program and the session live on.
#[test]
fn a_frame_chain_scribbled_by_the_target_is_cut_and_stays_profiled() {
    common::require_bpf();
    let script = workload("python_scribble.py");
    let lines = site_lines(&script);
    let mut cmd = Command::new(DEBIAN_PYTHON);
    cmd.arg(&script).env("PYTHONMALLOC", "malloc");
    let mut proc = Proc::spawn(cmd);
    let pid = proc.pid();
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    session.complete_profile().unwrap();
    assert!(
        session.kernel().process_python(HostPid(pid)).is_some(),
        "recognised as CPython: {:?}",
        session.warnings
    );
    let modes = ["self", "pair", "wild", "odd"];
    for command in modes.iter().chain(&["restored"]) {
        proc.send(command);
        proc.expect("ready");
    }
    let innermost_is = |frames: &[Frame], function: &str| {
        python_chain(frames)
            .first()
            .is_some_and(|f| &*f.function == function)
    };
    let profile = profile_until(&mut session, |profile| {
        profile.processes.iter().any(|p| {
            p.key.pid.0 == pid && p.stacks.iter().any(|s| innermost_is(&s.frames, "restored"))
        })
    });
    let p = common::process(&profile, pid);

    // The kernel's own stacks: never more Python frames than its bound.
    let kernel = session.kernel();
    let snap = kernel.snapshot(false).unwrap();
    let mut walked = 0;
    for (k, _) in snap
        .aggregates
        .iter()
        .filter(|(k, _)| k.pid == pid && k.stack_id != NO_STACK && k.stack_id != OVERFLOW_STACK)
    {
        let Some(raw) = kernel.stack(k.stack_id) else {
            continue;
        };
        let (_, python) = split_python(&raw);
        let frames = python
            .iter()
            .filter(|&&f| decode_python_frame(f).is_some())
            .count();
        assert!(frames <= MAX_PYTHON_FRAMES, "{frames} frames: {raw:x?}");
        walked = walked.max(frames);
    }
    assert!(
        walked > 10,
        "the cycle of two was walked up to a bound: at most {walked} frames"
    );

    // While scribbled: the site named by its line, then the marker. The
    // function's other lines allocate too (its frame object, ctypes
    // objects, integers), sampled now and then, before the chain is
    // scribbled or after it is restored: whole chains, not the site's.
    let scribbled = site_or_intact(p, "scribbled", lines["scribbled"]);
    let mut cycles = 0;
    for s in &scribbled {
        let chain = python_chain(&s.frames);
        assert_eq!(
            chain
                .iter()
                .filter(|f| &*f.function == TRUNCATED_MARKER)
                .count(),
            1,
            "a scribbled chain is cut once: {chain:?}"
        );
        let named = chain.len() - 1;
        assert!(named <= MAX_PYTHON_FRAMES, "{named} Python frames");
        // The cycle of two: the frame and its caller, again and again.
        if named > 2 {
            cycles += 1;
            let walk: Vec<&str> = chain
                .iter()
                .map(|f| &*f.function)
                .filter(|f| *f != TRUNCATED_MARKER)
                .collect();
            assert!(
                walk.iter()
                    .enumerate()
                    .all(|(i, f)| *f == ["scribbled", "main"][i % 2]),
                "{walk:?}"
            );
        } else {
            assert_eq!(chain.len(), 2, "the frame, then the marker: {chain:?}");
        }
    }
    assert!(cycles > 0, "no stack of the cycle of two: {scribbled:#?}");
    let live: f64 = scribbled.iter().map(|s| s.totals.live_bytes).sum();
    let (truth, sigma) = truth_and_sigma(modes.len() as u64 * COUNT, SIZE, RATE);
    assert!(
        (live - truth).abs() <= 4.0 * sigma,
        "{live} live bytes while scribbled, truth {truth} (σ {sigma})"
    );

    // Restored: the function, its line and its callers.
    let restored = site_or_intact(p, "restored", lines["restored"]);
    for s in &restored {
        let chain: Vec<(&str, Option<u32>)> = python_chain(&s.frames)
            .iter()
            .map(|f| (&*f.function, line_of(f)))
            .collect();
        assert_eq!(chain[0], ("restored", Some(lines["restored"])));
        assert_eq!(
            chain.iter().map(|(f, _)| *f).collect::<Vec<_>>(),
            ["restored", "main", "<module>"]
        );
    }
    let live: f64 = restored.iter().map(|s| s.totals.live_bytes).sum();
    let (truth, sigma) = truth_and_sigma(COUNT, SIZE, RATE);
    assert!(
        (live - truth).abs() <= 4.0 * sigma,
        "{live} live bytes at restored, truth {truth} (σ {sigma})"
    );

    // Both sides live on.
    proc.send("exit");
    assert!(proc.child.wait().unwrap().success(), "the target crashed");
    session.complete_profile().unwrap();
}

/// What python_freed.py's `make` printed: each function's name by the
/// address its code object had.
fn read_made(proc: &mut Proc) -> HashMap<u64, String> {
    proc.expect("made");
    let mut made = HashMap::new();
    loop {
        let line = proc.line();
        if line == "end" {
            return made;
        }
        let (name, address) = line.split_once(' ').unwrap();
        made.insert(address.parse().unwrap(), name.to_string());
    }
}

/// python_freed.py's 32 functions made, each allocating, while attached;
/// freed with their code objects at once, or kept until `free`.
struct Freed {
    proc: Proc,
    session: Session,
    pid: u32,
    /// The first made functions' names, by their code objects' addresses.
    made: HashMap<u64, String>,
    /// Every made function's name.
    names: HashSet<String>,
    /// The line `make` calls them from.
    call: u32,
}

const FUNCTIONS: u64 = 32;
/// Blocks each function allocates (python_freed.py's COUNT).
const EACH: u64 = 16;

/// A made function's site: its innermost frame's function (or a marker),
/// line and live bytes.
type MadeSite = (String, Option<u32>, f64);

/// The made functions' stacks: their caller is `make` where it calls them
/// at line `call` (the script's own code, alive). Never a decoy's name or
/// file in any of their frames.
fn made_sites(p: &ProcessProfile, call: u32) -> Vec<MadeSite> {
    p.stacks
        .iter()
        .filter_map(|s| {
            let chain = python_chain(&s.frames);
            let caller = chain.get(1)?;
            if &*caller.function != "make" || line_of(caller) != Some(call) {
                return None;
            }
            for f in s.frames.iter() {
                assert!(
                    !f.function.starts_with("decoy_")
                        && f.location
                            .as_deref()
                            .is_none_or(|l| !l.starts_with("decoys.py")),
                    "a decoy's name on a freed function's stack: {:?}",
                    s.frames
                );
            }
            Some((
                chain[0].function.to_string(),
                line_of(chain[0]),
                s.totals.live_bytes,
            ))
        })
        .collect()
}

impl Freed {
    fn start(keep: bool) -> Freed {
        common::require_bpf();
        let mut cmd = Command::new(DEBIAN_PYTHON);
        cmd.arg(workload("python_freed.py"))
            .env("PYTHONMALLOC", "malloc");
        let mut proc = Proc::spawn(cmd);
        let pid = proc.pid();
        common::wait_for_mapping(pid, "liballocprof.so");
        let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
        session.complete_profile().unwrap();
        let command = if keep { "keep" } else { "make" };
        proc.send(&format!("{command} {FUNCTIONS}"));
        let made = read_made(&mut proc);
        assert_eq!(made.len(), FUNCTIONS as usize, "each its own code object");
        Freed {
            proc,
            session,
            pid,
            names: made.values().cloned().collect(),
            made,
            call: site_lines(&workload("python_freed.py"))["call"],
        }
    }

    /// Makes decoys (code objects of other names, kept) at the freed ones'
    /// addresses; returns how many sit where a freed one was.
    fn decoys(&mut self) -> usize {
        self.proc.send("decoys 400");
        let reused: usize = self
            .proc
            .line()
            .strip_prefix("decoys ")
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            reused > 0,
            "no decoy was made where a freed code object was: the test shows nothing"
        );
        reused
    }

    /// The first profile with the made functions' stacks in it.
    fn first_profile(&mut self) -> Profile {
        let (pid, call) = (self.pid, self.call);
        profile_until(&mut self.session, |profile| {
            profile
                .processes
                .iter()
                .any(|p| p.key.pid.0 == pid && !made_sites(p, call).is_empty())
        })
    }

    /// Each site named by its own function at one of its lines, or freed;
    /// with `bytes`, all the functions' live bytes within 4σ.
    fn check(&self, profile: &Profile, bytes: bool) -> Vec<MadeSite> {
        let sites = made_sites(common::process(profile, self.pid), self.call);
        for (function, line, _) in &sites {
            // Line 3 allocates the blocks; line 2's `range` and its iterator
            // are mallocs too under PYTHONMALLOC=malloc, sampled now and then.
            assert!(
                function == FREED_MARKER
                    || (self.names.contains(function) && matches!(line, Some(2 | 3))),
                "{function} line {line:?}: {sites:?}"
            );
        }
        let live: f64 = sites.iter().map(|(_, _, b)| b).sum();
        let (truth, sigma) = truth_and_sigma(FUNCTIONS * EACH, SIZE, RATE);
        assert!(
            !bytes || (live - truth).abs() <= 4.0 * sigma,
            "{live} live bytes of the freed functions, truth {truth} (σ {sigma}): {sites:?}"
        );
        sites
    }

    fn exit(mut self) {
        self.proc.send("exit");
        assert!(
            self.proc.child.wait().unwrap().success(),
            "the target crashed"
        );
    }
}

/// The sites of `sites` named by a function, not a marker.
fn named(sites: &[MadeSite]) -> Vec<&MadeSite> {
    sites.iter().filter(|(f, ..)| f != FREED_MARKER).collect()
}

/// Functions made at run time allocate, and are freed with their code
/// objects before the session first resolves their stacks: what their
/// memory still holds is never trusted (a freed code object's header reads
/// as it was but for its first word, its name and table may be another
/// object's), so every stack is `[python code freed]`, every byte there.
/// Decoys (code objects of other names) made at their addresses after
/// that change nothing, however often the profile is built again.
#[test]
fn code_objects_freed_before_their_resolution_are_never_named() {
    let mut freed = Freed::start(false);
    // Freed, nothing but other objects made since: the first resolution.
    let profile = freed.first_profile();
    let first = freed.check(&profile, true);
    assert!(named(&first).is_empty(), "freed code named: {first:?}");
    freed.decoys();
    for _ in 0..2 {
        let profile = freed.session.complete_profile().unwrap();
        // The same stacks, the same bytes: a stack is named once.
        let mut again = freed.check(&profile, false);
        let mut first = first.clone();
        let order = |a: &MadeSite, b: &MadeSite| (&a.0, a.2).partial_cmp(&(&b.0, b.2)).unwrap();
        again.sort_by(order);
        first.sort_by(order);
        assert_eq!(again, first, "names keep to their stacks");
    }
    freed.exit();
}

/// The same functions, freed, and decoys made at their addresses before
/// the session first reads their stacks: the decoys are alive, and the
/// kernel's prints of the code objects at the samples tell them apart.
/// Every byte is there, no stack is named by a decoy (`made_sites`) nor
/// by a freed function.
#[test]
fn code_objects_freed_and_reused_before_their_resolution_are_never_misnamed() {
    let mut freed = Freed::start(false);
    let reused = freed.decoys();
    let profile = freed.first_profile();
    let sites = freed.check(&profile, true);
    assert!(
        named(&sites).is_empty(),
        "{reused} functions' code objects were taken by decoys, all were freed, yet some are named: {sites:?}"
    );
    eprintln!("{reused} addresses reused by decoys; {} sites", sites.len());
    freed.exit();
}

/// The functions, kept alive until the session has named them, freed and
/// made again where they were (the same template, names of the same
/// length, the same file), called from the same line: the same frames in
/// every stack. The kernel's stack ids cover the code objects' prints, so
/// the second's samples are filed under stacks of their own (freed: they
/// are gone before the session reads them), never under the first's: the
/// first functions' bytes are theirs alone.
#[test]
fn code_objects_made_again_in_the_same_frames_never_take_the_first_names() {
    let mut freed = Freed::start(true);
    let profile = freed.first_profile();
    let first: HashMap<String, u64> = freed
        .made
        .iter()
        .map(|(address, name)| (name.clone(), *address))
        .collect();
    let named_first = freed.check(&profile, true);
    assert!(
        named_first.iter().all(|(f, ..)| first.contains_key(f)),
        "the first functions, alive, are named: {named_first:?}"
    );
    freed.proc.send("free");
    freed.proc.expect("freed");
    freed.proc.send(&format!("make {FUNCTIONS}"));
    let second = read_made(&mut freed.proc);
    let reused = second.keys().filter(|a| freed.made.contains_key(a)).count();
    assert!(
        reused > 0,
        "no function made again where a first one was: the test shows nothing"
    );
    freed.names.extend(second.into_values());
    let profile = profile_until(&mut freed.session, |profile| {
        let sites = made_sites(common::process(profile, freed.pid), freed.call);
        sites.iter().any(|(f, ..)| !first.contains_key(f))
    });
    let sites = freed.check(&profile, false);
    let (truth, sigma) = truth_and_sigma(FUNCTIONS * EACH, SIZE, RATE);
    let first_bytes: f64 = sites
        .iter()
        .filter(|(f, ..)| first.contains_key(f))
        .map(|s| s.2)
        .sum();
    let all: f64 = sites.iter().map(|s| s.2).sum();
    eprintln!(
        "{reused} addresses made again; the first functions' sites {first_bytes} B, all {all} B"
    );
    // The first functions' bytes are theirs; with the second's samples in
    // their stacks they would double.
    assert!(
        (first_bytes - truth).abs() <= 4.0 * sigma,
        "the first functions' sites hold {first_bytes} B, theirs are {truth} (σ {sigma}): {sites:?}"
    );
    let (truth, sigma) = truth_and_sigma(2 * FUNCTIONS * EACH, SIZE, RATE);
    assert!(
        (all - truth).abs() <= 4.0 * sigma,
        "{all} live bytes of both, truth {truth} (σ {sigma}): {sites:?}"
    );
    freed.exit();
}

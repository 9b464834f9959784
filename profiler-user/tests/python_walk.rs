//! Python frames in the kernel's stacks, with real CPython (Debian's
//! `/usr/bin/python3` 3.11.2, whose interpreter is in the executable, and
//! the `python3` on PATH, pyenv's 3.11.7, whose interpreter is in
//! `libpython3.11.so`), under liballocprof.so with `PYTHONMALLOC=malloc`:
//! the stacks a session files carry `PY_STACK_BEGIN` and then the
//! allocating thread's own frames, innermost first, as the script's code
//! objects (`id()` is the address), at the instructions of the lines that
//! allocate or call, a recursion over several pages of the thread's data
//! stack (the kernel reads frames a block at a time) included; a malloc made without the GIL (ctypes) while another
//! thread spins in Python gets its own thread's frames; `--python off`
//! files none.

mod common;

use std::{
    collections::HashMap,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use allocprof::{
    ids::{HostPid, Pid},
    kernel::Limits,
    session::{Session, Target},
};
use common::{DEBIAN_PYTHON, Proc, path_python};
use profiler_common::{
    NO_STACK, OVERFLOW_STACK,
    python::{PY_STACK_BEGIN, PY_TRUNCATED_FRAME, PyFrame, decode_python_frame, split_python},
};

/// The running script: its functions' code objects and the instruction
/// indexes of their allocating or calling lines.
struct Script {
    proc: Proc,
    codes: HashMap<String, (u64, Vec<u32>)>,
}

impl Script {
    fn start(python: &Path) -> Script {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/python_frames.py");
        let mut cmd = Command::new(python);
        cmd.arg(script).env("PYTHONMALLOC", "malloc");
        let mut proc = Proc::spawn(cmd);
        let mut codes = HashMap::new();
        loop {
            let line = proc.line();
            if line == "ready" {
                break;
            }
            let mut words = line.split_whitespace();
            let name = words.next().unwrap().to_string();
            let code: u64 = words.next().unwrap().parse().unwrap();
            let units = words.map(|w| w.parse().unwrap()).collect();
            codes.insert(name, (code, units));
        }
        Script { proc, codes }
    }

    fn pid(&self) -> u32 {
        self.proc.pid()
    }

    fn code(&self, name: &str) -> u64 {
        self.codes[name].0
    }

    /// Asserts `frame` runs `name`'s code at one of its line's instructions.
    fn check(&self, frame: &PyFrame, name: &str, stack: &[PyFrame]) {
        let (code, units) = &self.codes[name];
        assert_eq!(frame.code, *code, "{name}'s code object in {stack:?}");
        let instr = frame
            .instr
            .unwrap_or_else(|| panic!("{name}'s instruction is known in {stack:?}"));
        assert!(
            units.contains(&instr),
            "{name} at instruction {instr}, not on its line {units:?}: {stack:?}"
        );
    }
}

/// A sampled stack of the process: its Python frames and whether the walk
/// was cut short, with its samples.
struct PyStack {
    native: usize,
    frames: Vec<PyFrame>,
    truncated: bool,
    samples: u64,
}

/// Every stack the kernel filed for `pid` with its samples (those with no
/// Python part included, with no frames).
fn stacks_of(session: &Session, pid: u32) -> Vec<PyStack> {
    let kernel = session.kernel();
    let snap = kernel.snapshot(false).unwrap();
    snap.aggregates
        .iter()
        .filter(|(k, _)| k.pid == pid && k.stack_id != NO_STACK && k.stack_id != OVERFLOW_STACK)
        .filter_map(|(k, agg)| {
            let raw = kernel.stack(k.stack_id)?;
            let (native, python) = split_python(&raw);
            let has_begin = raw.contains(&PY_STACK_BEGIN);
            let truncated = python.last() == Some(&PY_TRUNCATED_FRAME);
            let frames: Vec<PyFrame> = python
                .iter()
                .filter_map(|&f| decode_python_frame(f))
                .collect();
            // Nothing but frames and the one marker after PY_STACK_BEGIN.
            assert_eq!(
                frames.len() + usize::from(truncated),
                python.len(),
                "{raw:x?}"
            );
            assert!(!has_begin || !frames.is_empty() || truncated, "{raw:x?}");
            Some(PyStack {
                native: native.len(),
                frames,
                truncated,
                samples: agg.alloc_samples,
            })
        })
        .collect()
}

fn attach(pid: u32, limits: Limits) -> Session {
    common::wait_for_mapping(pid, "liballocprof.so");
    Session::start(Target::Pids(vec![Pid(pid)]), limits).unwrap()
}

/// Runs `scenario` (40 rounds of 256 KiB allocated by `leaf`) and returns
/// the process's stacks whose innermost Python frame is `leaf`: at least 20
/// samples (each allocation sampled at a 64 KiB rate).
fn run_to_leaf(script: &mut Script, session: &Session, scenario: &str) -> Vec<PyStack> {
    script.proc.send(scenario);
    script.proc.expect("done");
    let leaf = script.code("leaf");
    let at_leaf: Vec<PyStack> = stacks_of(session, script.pid())
        .into_iter()
        .filter(|s| s.frames.first().is_some_and(|f| f.code == leaf))
        .collect();
    let samples: u64 = at_leaf.iter().map(|s| s.samples).sum();
    assert!(
        samples >= 20,
        "{scenario}: {samples} samples at leaf of 40 allocations of 256 KiB"
    );
    at_leaf
}

/// Nested calls and recursion: `<module>` → outer → recurse ×4 → leaf →
/// bytearray, 40 rounds of 256 KiB (each sampled at a 64 KiB rate).
fn nested_calls_and_recursion(python: &Path) {
    common::require_bpf();
    let mut script = Script::start(python);
    let session = attach(script.pid(), Limits::default());
    assert!(
        session
            .kernel()
            .process_python(HostPid(script.pid()))
            .is_some(),
        "{} was recognised as CPython: {:?}",
        python.display(),
        session.warnings
    );
    let at_leaf = run_to_leaf(&mut script, &session, "nested");
    for stack in &at_leaf {
        let f = &stack.frames;
        assert!(!stack.truncated, "{f:?}");
        assert!(stack.native > 2, "native frames come first");
        assert_eq!(f.len(), 7, "leaf, recurse ×4, outer, <module>: {f:?}");
        script.check(&f[0], "leaf", f);
        script.check(&f[1], "recurse_leaf", f);
        for frame in &f[2..5] {
            script.check(frame, "recurse_self", f);
        }
        script.check(&f[5], "outer", f);
        assert_eq!(f[6].code, script.code("module"), "{f:?}");
        assert!(f[6].instr.is_some());
        // 3.11 runs Python calls inside one eval call: only the module's
        // frame started one.
        let entries: Vec<bool> = f.iter().map(|p| p.entry).collect();
        assert_eq!(entries, [false, false, false, false, false, false, true]);
    }
    script.proc.send("exit");
}

/// A recursion 70 frames deep, each frame large with locals: over several
/// pages of the thread's data stack and past its first chunk, where the
/// kernel's block reads of frames begin anew. Every frame is there, in
/// order, at its line.
fn a_recursion_over_pages_of_the_data_stack(python: &Path) {
    common::require_bpf();
    let mut script = Script::start(python);
    let session = attach(script.pid(), Limits::default());
    let at_leaf = run_to_leaf(&mut script, &session, "deep");
    for stack in &at_leaf {
        let f = &stack.frames;
        assert!(!stack.truncated, "{f:?}");
        assert_eq!(f.len(), 73, "leaf, wide ×70, deep_outer, <module>: {f:?}");
        script.check(&f[0], "leaf", f);
        script.check(&f[1], "wide_leaf", f);
        for frame in &f[2..71] {
            script.check(frame, "wide_self", f);
        }
        script.check(&f[71], "deep_outer", f);
        assert_eq!(f[72].code, script.code("module"), "{f:?}");
    }
    script.proc.send("exit");
}

/// A thread mallocs through ctypes (the GIL released) while another spins
/// in Python holding it: its samples carry its own frames, never the
/// spinner's.
fn a_malloc_without_the_gil_gets_its_own_frames(python: &Path) {
    common::require_bpf();
    let mut script = Script::start(python);
    let session = attach(script.pid(), Limits::default());
    script.proc.send("threads");
    script.proc.expect("started");
    let gil_free = script.code("gil_free_alloc");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let samples: u64 = stacks_of(&session, script.pid())
            .iter()
            .filter(|s| s.frames.iter().any(|f| f.code == gil_free))
            .map(|s| s.samples)
            .sum();
        if samples >= 20 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {samples} samples from the ctypes thread"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    script.proc.send("stop");
    script.proc.expect("done");

    let (spin, module) = (script.code("spin"), script.code("module"));
    let stacks = stacks_of(&session, script.pid());
    let mut spinner = 0;
    for stack in &stacks {
        let f = &stack.frames;
        if f.iter().any(|p| p.code == gil_free) {
            script.check(&f[0], "gil_free_alloc", f);
            assert!(
                f.iter().all(|p| p.code != spin && p.code != module),
                "the ctypes thread's malloc took another thread's frames: {f:?}"
            );
            // Thread.run, _bootstrap_inner, _bootstrap follow.
            assert_eq!(f.len(), 4, "{f:?}");
        }
        if f.first().is_some_and(|p| p.code == spin) {
            spinner += stack.samples;
            assert!(f.iter().all(|p| p.code != gil_free), "{f:?}");
        }
    }
    // The spinner allocated small lists meanwhile, sampled now and then:
    // not needed for the point, so not asserted beyond its frames.
    let _ = spinner;
    script.proc.send("exit");
}

#[test]
fn debian_python_nested_calls_and_recursion() {
    nested_calls_and_recursion(Path::new(DEBIAN_PYTHON));
}

#[test]
fn pyenv_python_nested_calls_and_recursion() {
    nested_calls_and_recursion(&path_python());
}

#[test]
fn debian_python_recursion_over_pages_of_the_data_stack() {
    a_recursion_over_pages_of_the_data_stack(Path::new(DEBIAN_PYTHON));
}

#[test]
fn pyenv_python_recursion_over_pages_of_the_data_stack() {
    a_recursion_over_pages_of_the_data_stack(&path_python());
}

#[test]
fn debian_python_malloc_without_the_gil() {
    a_malloc_without_the_gil_gets_its_own_frames(Path::new(DEBIAN_PYTHON));
}

#[test]
fn pyenv_python_malloc_without_the_gil() {
    a_malloc_without_the_gil_gets_its_own_frames(&path_python());
}

#[test]
fn python_off_files_no_python_frames() {
    common::require_bpf();
    let mut script = Script::start(Path::new(DEBIAN_PYTHON));
    let session = attach(
        script.pid(),
        Limits {
            python: false,
            ..Limits::default()
        },
    );
    assert!(
        session
            .kernel()
            .process_python(HostPid(script.pid()))
            .is_none()
    );
    script.proc.send("nested");
    script.proc.expect("done");
    let stacks = stacks_of(&session, script.pid());
    let samples: u64 = stacks.iter().map(|s| s.samples).sum();
    assert!(samples >= 20, "{samples} samples");
    for stack in &stacks {
        assert!(
            stack.frames.is_empty() && !stack.truncated,
            "{:?}",
            stack.frames
        );
    }
    script.proc.send("exit");
}

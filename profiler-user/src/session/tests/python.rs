//! A Python process's stacks: the kernel's Python part resolved from the
//! process's memory (here our own, where the test lays out 3.11 code
//! objects), merged in place of the native eval frame, and shown by the
//! exports.

use profiler_common::python::{
    PY_CODE_PRINT_WORDS, PY_NAME_PRINT_WORDS, PY_STACK_BEGIN, encode_python_frame, py_code_print,
    py_name_print,
};

use super::*;
use crate::{
    output::export::{collapsed, json},
    python::{PyVersion, code::Layout},
    symbolize::FrameKind,
};

const PY_311: PyVersion = PyVersion {
    major: 3,
    minor: 11,
    micro: 2,
};

/// The interpreter's eval function, as the symbolizer will name it from
/// this binary's symbols.
#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn _PyEval_EvalFrameDefault() -> u64 {
    std::hint::black_box(3)
}

fn eval_address() -> u64 {
    _PyEval_EvalFrameDefault as *const () as u64 + 1
}

/// Objects laid out as CPython 3.11's, in our memory (kept alive here).
#[derive(Default)]
struct Objects(Vec<Box<[u64]>>);

impl Objects {
    fn place(&mut self, bytes: &[u8]) -> u64 {
        let mut words = vec![0u64; bytes.len().div_ceil(8) + 1].into_boxed_slice();
        for (i, b) in bytes.iter().enumerate() {
            words[i / 8] |= u64::from(*b) << (8 * (i % 8));
        }
        let address = words.as_ptr() as u64;
        self.0.push(words);
        address
    }

    /// A type object named `name`.
    fn type_object(&mut self, name: &'static [u8]) -> u64 {
        let mut ty = vec![0u8; 64];
        ty[24..32].copy_from_slice(&(name.as_ptr() as u64).to_le_bytes());
        self.place(&ty)
    }

    fn string(&mut self, text: &str) -> u64 {
        let mut s = vec![0u8; 48];
        s[16..24].copy_from_slice(&(text.len() as u64).to_le_bytes());
        s[32] = 0b1110_0100; // ready, ascii, compact, kind 1
        s.extend_from_slice(text.as_bytes());
        // Its terminator, and as far as a print reads.
        s.resize(s.len().max(PY_NAME_PRINT_WORDS * 8), 0);
        self.place(&s)
    }

    /// The print the kernel takes of the code object at `code`.
    fn print(&self, code: u64) -> u32 {
        let placed = self.0.iter().find(|w| w.as_ptr() as u64 == code).unwrap();
        let mut words = [0u64; PY_CODE_PRINT_WORDS];
        for (w, p) in words.iter_mut().zip(placed.iter()) {
            *w = *p;
        }
        let print = Layout::for_version(PY_311).unwrap().code_print();
        let qualname = words[usize::from(print.name_at)];
        let placed = self
            .0
            .iter()
            .find(|w| w.as_ptr() as u64 == qualname)
            .unwrap();
        let mut name = [0u64; PY_NAME_PRINT_WORDS];
        for (w, p) in name.iter_mut().zip(placed.iter()) {
            *w = *p;
        }
        let read = print.name_read(qualname);
        py_code_print(&words, &print, py_name_print(&name, &print, read))
    }

    /// A code object whose instructions are one a line from `first`.
    fn code(&mut self, ty: u64, name: &str, file: &str, first: i32, units: u64) -> u64 {
        let (qualname, filename) = (self.string(name), self.string(file));
        let mut table = vec![0u8; 32];
        table[16..24].copy_from_slice(&(2 * units).to_le_bytes());
        for i in 0..units {
            table.extend([0x80 | (13 << 3), if i == 0 { 0 } else { 2 }]);
        }
        let table = self.place(&table);
        let mut code = vec![0u8; 200];
        code[..8].copy_from_slice(&1u64.to_le_bytes()); // alive: one reference
        code[8..16].copy_from_slice(&ty.to_le_bytes());
        code[16..24].copy_from_slice(&units.to_le_bytes());
        code[72..76].copy_from_slice(&first.to_le_bytes());
        code[112..120].copy_from_slice(&filename.to_le_bytes());
        code[128..136].copy_from_slice(&qualname.to_le_bytes());
        code[136..144].copy_from_slice(&table.to_le_bytes());
        self.place(&code)
    }
}

#[test]
fn python_frames_take_the_place_of_the_eval_frame_in_every_export() {
    let mut objects = Objects::default();
    let code_type = objects.type_object(b"code\0");
    let handler = objects.code(
        code_type,
        "Handler.handle_request",
        "/srv/app/server.py",
        40,
        8,
    );
    let serve = objects.code(code_type, "serve", "/srv/app/main.py", 10, 8);

    let world = World::default();
    world.spawn(100, "python3");
    let mut s = session(&world, Target::All);
    s.track_pid(Pid(100)).python = Some(PY_311);
    // malloc's caller (alpha_site) ← the eval loop running handle_request
    // (line 42) called from serve (line 13, the entry frame) ← beta_site.
    world.sample(
        100,
        7,
        &[
            address_in(alpha_site),
            eval_address(),
            address_in(beta_site),
            PY_STACK_BEGIN,
            encode_python_frame(handler, 2, false),
            encode_python_frame(serve, 3, true),
        ],
        1 << 20,
    );
    world.python_prints(7, &[objects.print(handler), objects.print(serve)]);
    let p = s.complete_profile().unwrap();
    let live = only_image(&p, 100, ProcessState::Live);
    let stack = &live.stacks[0].frames;
    let names: Vec<&str> = stack.iter().map(|f| &*f.function).collect();
    let at = |name: &str| {
        names
            .iter()
            .position(|n| n.contains(name))
            .unwrap_or_else(|| panic!("{name} in {names:?}"))
    };
    assert!(!names.contains(&"_PyEval_EvalFrameDefault"), "{names:?}");
    assert!(at("alpha_site") < at("Handler.handle_request"));
    assert_eq!(at("Handler.handle_request") + 1, at("serve"));
    assert!(at("serve") < at("beta_site"));
    let python = &stack[at("Handler.handle_request")];
    assert_eq!(python.kind, FrameKind::Python);
    assert_eq!(python.location.as_deref(), Some("/srv/app/server.py:42"));
    assert_eq!(python.site_name(), "Handler.handle_request (server.py:42)");
    assert_eq!(
        crate::symbolize::most_informative(stack).map(|f| f.site_name()),
        Some(python.site_name())
    );

    // Collapsed stacks (and so the SVG flamegraph): each Python frame by
    // function and line, in order.
    let folded = collapsed::render(&p, crate::model::stats::Quantity::InuseBytes);
    let line = folded
        .lines()
        .find(|l| l.contains("serve"))
        .expect("the stack folded");
    assert!(
        line.contains("serve (main.py:13);Handler.handle_request (server.py:42)"),
        "{line}"
    );
    // JSON: each frame says what it is.
    let report = json::report(&p);
    let frames = &report
        .processes
        .iter()
        .find(|p| p.pid == 100)
        .unwrap()
        .stacks[0]
        .frames;
    let kinds: Vec<(&str, &str)> = frames
        .iter()
        .map(|f| (f.function.as_str(), f.kind.as_str()))
        .collect();
    assert!(
        kinds.contains(&("Handler.handle_request", "python")),
        "{kinds:?}"
    );
    assert!(
        kinds
            .iter()
            .any(|(f, k)| f.contains("alpha_site") && *k == "native")
    );
    let handler_frame = frames.iter().find(|f| f.function == "serve").unwrap();
    assert_eq!(
        (handler_frame.file.as_deref(), handler_frame.line),
        (Some("/srv/app/main.py"), Some(13))
    );
    drop(objects);
}

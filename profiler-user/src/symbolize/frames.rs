//! Which frames are whose: the allocator's own (dropped from every stack),
//! the standard libraries' (skipped when naming a stack), and the frame that
//! says most about a stack.

use std::path::Path;

use super::{Frame, FrameKind, basename};

/// Drops the innermost frames that belong to the allocator itself (the
/// LD_PRELOAD library, the Rust global allocator and the standard library's
/// allocation shims): a stack starts where the program asked for memory.
pub(crate) fn strip_allocator_frames(frames: Vec<Frame>) -> Vec<Frame> {
    let keep_from = frames
        .iter()
        .position(|f| !is_allocator_frame(f))
        .unwrap_or(0);
    frames.into_iter().skip(keep_from).collect()
}

pub fn is_allocator_frame(frame: &Frame) -> bool {
    const PREFIXES: &[&str] = &[
        "allocator::",
        "<allocator::",
        "preload::",
        "__rust_alloc",
        "__rust_realloc",
        "__rust_dealloc",
        "__rustc::__rust",
        "__rdl_",
        "alloc::alloc::",
        "<alloc::alloc::Global",
    ];
    let in_preload = frame
        .module
        .as_deref()
        .is_some_and(|m| basename(Path::new(m)).starts_with("liballocprof"));
    in_preload || PREFIXES.iter().any(|p| frame.function.starts_with(p))
}

/// A frame of the language's standard library or the C runtime: rarely the
/// answer to "who allocated this". Rust's (`alloc::`, `core::`, `std::`,
/// their sources), C++'s (`operator new`, `std::` and `__gnu_cxx::`
/// templates such as `std::vector<…>::_M_realloc_insert`, whatever return
/// type the demangler put first; any frame of libstdc++ or libc++) and libc's.
pub fn is_library_frame(frame: &Frame) -> bool {
    const PREFIXES: &[&str] = &[
        "alloc::",
        "core::",
        "std::",
        "<alloc::",
        "<core::",
        "<std::",
        "__libc_",
        "_start",
        "__gnu_cxx::",
        "operator new",
        "operator delete",
        "__cxa_",
    ];
    const MODULES: &[&str] = &["libstdc++", "libc++"];
    // /rustc/ is the standard library's source, /rust/deps/ the crates it
    // vendors (hashbrown behind HashMap).
    let name = qualified_name(&frame.function);
    frame
        .location
        .as_deref()
        .is_some_and(|l| l.starts_with("/rustc/") || l.starts_with("/rust/deps/"))
        || frame.module.as_deref().is_some_and(|m| {
            let file = basename(Path::new(m));
            MODULES.iter().any(|lib| file.starts_with(lib))
        })
        || PREFIXES.iter().any(|p| name.starts_with(p))
}

/// A demangled C++ name without the return type the demangler writes
/// before template functions' names: `void std::vector<int>::_M_realloc_insert<int>(…)`
/// → `std::vector<int>::_M_realloc_insert<int>(…)`. The name starts after
/// the last space outside brackets before the parameter list; `operator
/// new(…)` and Rust names (no such space) are kept whole.
fn qualified_name(name: &str) -> &str {
    if name.starts_with("operator ") {
        return name;
    }
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in name.char_indices() {
        match c {
            '<' | '[' | '{' => depth += 1,
            '>' | ']' | '}' => depth -= 1,
            '(' if depth == 0 => break,
            '(' => depth += 1,
            ')' => depth -= 1,
            ' ' if depth == 0 => {
                if name[i + 1..].starts_with("operator ") {
                    return &name[i + 1..];
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    &name[start..]
}

/// The frame that best names a stack: in a Python process, the innermost
/// Python function (what the program's author wrote; the interpreter's
/// frames inside it are how it allocates); else the first that is neither
/// allocator nor standard library, else the innermost.
pub fn most_informative(frames: &[Frame]) -> Option<&Frame> {
    frames
        .iter()
        .find(|f| f.kind == FrameKind::Python && f.location.is_some())
        .or_else(|| {
            frames
                .iter()
                .find(|f| !is_allocator_frame(f) && !is_library_frame(f))
        })
        .or_else(|| frames.first())
}

//! The offsets of the fields the kernel reads, per CPython minor version
//! (`profiler_common::python::PyProcConfig`, without the runtime's
//! address): written down for 3.11 (checked against the headers of 3.11.2
//! and 3.11.7) and 3.12 (against 3.12.1's); 3.13 and later publish theirs
//! in `_PyRuntime`'s `_Py_DebugOffsets`, read by [`from_debug_offsets`].

use profiler_common::python::{
    PY_CODE_TAGGED, PY_ENTRY_BY_OWNER, PY_FRAME_WORDS, PY_NO_FIELD, PyCodePrint, PyProcConfig,
};

use super::{PyVersion, code::Layout};

/// The code-object words the kernel prints (see `python::code::Layout`);
/// none for a version whose code objects are not read.
fn code_print(version: PyVersion) -> PyCodePrint {
    Layout::for_version(version).map_or(PyCodePrint::default(), |layout| layout.code_print())
}

/// The offsets of a version without `_Py_DebugOffsets`; `None` for one
/// allocprof has none for (before 3.11, or 3.13+ without its debug
/// offsets).
pub fn for_version(version: PyVersion) -> Option<PyProcConfig> {
    match (version.major, version.minor) {
        // Include/internal/pycore_runtime.h, pycore_interp.h,
        // cpython/pystate.h, internal/pycore_frame.h, cpython/code.h.
        (3, 11) => Some(PyProcConfig {
            runtime: 0,
            runtime_interpreters_head: 40,
            interp_threads_head: 16,
            tstate_next: 8,
            tstate_native_thread_id: 160,
            tstate_cframe: 56,
            current_frame: 8,
            frame_code: 32,
            frame_previous: 48,
            frame_instr: 56,
            frame_entry: 68, // is_entry
            frame_read: 72,
            code_adaptive: 184,
            flags: 0,
            code_print: code_print(version),
            pidns_dev: 0,
            pidns_ino: 0,
        }),
        // Checked against 3.12.1's headers (offsetof, Py_BUILD_CORE): the
        // interpreter gained its monitoring versions, _PyCFrame lost
        // `use_tracing`, the frame starts with f_code and has `owner`
        // (shims: CSTACK). 3.12's `_finalizing_id` is at the runtime's end:
        // `interpreters.head` stays where 3.11 has it (48 is `.main`, the
        // same interpreter while there is only one).
        (3, 12) => Some(PyProcConfig {
            runtime: 0,
            runtime_interpreters_head: 40,
            interp_threads_head: 72,
            tstate_next: 8,
            tstate_native_thread_id: 144,
            tstate_cframe: 56,
            current_frame: 0,
            frame_code: 0,
            frame_previous: 8,
            frame_instr: 56,
            frame_entry: 70, // owner
            frame_read: 72,
            code_adaptive: 192,
            flags: PY_ENTRY_BY_OWNER,
            code_print: code_print(version),
            pidns_dev: 0,
            pidns_ino: 0,
        }),
        _ => None,
    }
}

/// Bytes of `_Py_DebugOffsets` read (up to its code-object offsets).
pub const DEBUG_OFFSETS_LEN: usize = 8 * 44;

/// Why a `_Py_DebugOffsets` was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DebugOffsetsError {
    #[error("no _Py_DebugOffsets cookie")]
    NoCookie,
    #[error("_Py_DebugOffsets says version {0:#x}, Py_Version another")]
    Version(u64),
    #[error("a free-threaded build (not supported)")]
    FreeThreaded,
    #[error("implausible _Py_DebugOffsets ({0})")]
    Implausible(&'static str),
}

/// The offsets a 3.13+ interpreter publishes at the start of `_PyRuntime`
/// (`bytes`, at least [`DEBUG_OFFSETS_LEN`] of them, as read from the file:
/// the structure is initialized data). Hostile input: every offset is
/// checked against its structure's size and the frame read's bound.
/// Layout of 3.13/3.14's `Include/internal/pycore_debug_offsets.h`
/// (3.13.0's checked against its headers, and its frame walk tested;
/// 3.14 untested).
pub fn from_debug_offsets(
    bytes: &[u8],
    version: PyVersion,
) -> Result<PyProcConfig, DebugOffsetsError> {
    use DebugOffsetsError::*;
    if bytes.len() < DEBUG_OFFSETS_LEN || &bytes[..8] != b"xdebugpy" {
        return Err(NoCookie);
    }
    let word = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
    let hex = word(1);
    if (hex >> 24, (hex >> 16) & 0xff) != (u64::from(version.major), u64::from(version.minor)) {
        return Err(Version(hex));
    }
    if word(2) != 0 {
        return Err(FreeThreaded);
    }
    // Each structure: its size, then its fields' offsets (word indexes).
    const RUNTIME: usize = 3; // size, finalizing, interpreters_head
    const INTERP: usize = 6; // size, id, next, threads_head, ... (13 words)
    const TSTATE: usize = 19; // size, prev, next, interp, current_frame, thread_id, native_thread_id, ...
    const FRAME: usize = 28; // size, previous, executable, instr_ptr, localsplus, owner
    const CODE: usize = 34; // size, filename, ..., co_code_adaptive (10th)
    let field = |base: usize, i: usize, what: &'static str| -> Result<u32, DebugOffsetsError> {
        let size = word(base);
        let at = word(base + i);
        if size == 0 || size > 1 << 20 || at >= size {
            return Err(Implausible(what));
        }
        Ok(at as u32)
    };
    let pointer = |base, i, what| {
        field(base, i, what).and_then(|at| {
            if at % 8 == 0 {
                Ok(at)
            } else {
                Err(Implausible(what))
            }
        })
    };
    let frame_previous = pointer(FRAME, 1, "frame previous")?;
    let frame_code = pointer(FRAME, 2, "frame executable")?;
    let frame_instr = pointer(FRAME, 3, "frame instr_ptr")?;
    let frame_entry = field(FRAME, 5, "frame owner")?;
    let end = [
        frame_previous + 8,
        frame_code + 8,
        frame_instr + 8,
        frame_entry + 1,
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let frame_read = end.div_ceil(8) * 8;
    if frame_read as usize > PY_FRAME_WORDS * 8 {
        return Err(Implausible("frame fields too far"));
    }
    let tagged = (version.major, version.minor) >= (3, 14);
    Ok(PyProcConfig {
        runtime: 0,
        runtime_interpreters_head: pointer(RUNTIME, 2, "interpreters head")?,
        interp_threads_head: pointer(INTERP, 3, "threads head")?,
        tstate_next: pointer(TSTATE, 2, "thread next")?,
        tstate_native_thread_id: pointer(TSTATE, 6, "native thread id")?,
        tstate_cframe: PY_NO_FIELD,
        current_frame: pointer(TSTATE, 4, "current frame")?,
        frame_code,
        frame_previous,
        frame_instr,
        frame_entry,
        frame_read,
        code_adaptive: field(CODE, 9, "co_code_adaptive")?,
        flags: PY_ENTRY_BY_OWNER | if tagged { PY_CODE_TAGGED } else { 0 },
        code_print: code_print(version),
        pidns_dev: 0,
        pidns_ino: 0,
    })
}

#[cfg(test)]
mod tests {

    use super::*;

    fn v(minor: u8) -> PyVersion {
        PyVersion {
            major: 3,
            minor,
            micro: 0,
        }
    }

    #[test]
    fn versions_with_offsets() {
        assert!(for_version(v(10)).is_none());
        assert!(for_version(v(13)).is_none());
        for minor in [11, 12] {
            let c = for_version(v(minor)).unwrap();
            for off in [c.frame_code, c.frame_previous, c.frame_instr] {
                assert!(off + 8 <= c.frame_read);
            }
            assert!(c.frame_entry < c.frame_read);
            assert!(c.frame_read as usize <= PY_FRAME_WORDS * 8);
            // The kernel reads what user space reads of a code object's
            // header (up to co_linetable), the six fields' words only.
            assert_eq!(c.code_print.words().count(), 6);
            assert_eq!(c.code_print.read, 136 + 8);
        }
    }

    /// A 3.13 `_Py_DebugOffsets` as its initializer would lay it out.
    fn debug_offsets_313() -> Vec<u8> {
        let mut words = vec![0u64; DEBUG_OFFSETS_LEN / 8];
        words[0] = u64::from_le_bytes(*b"xdebugpy");
        words[1] = 0x030d_01f0;
        words[3..6].copy_from_slice(&[1000, 16, 40]);
        words[6..10].copy_from_slice(&[9000, 8, 0, 48]);
        words[19..26].copy_from_slice(&[400, 0, 8, 16, 72, 152, 160]);
        words[28..34].copy_from_slice(&[80, 8, 0, 56, 80, 74]);
        words[34] = 220;
        words[43] = 200;
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn debug_offsets_decode() {
        let c = from_debug_offsets(&debug_offsets_313(), v(13)).unwrap();
        assert_eq!(
            (c.runtime_interpreters_head, c.interp_threads_head),
            (40, 48)
        );
        assert_eq!((c.tstate_next, c.tstate_native_thread_id), (8, 160));
        assert_eq!((c.tstate_cframe, c.current_frame), (PY_NO_FIELD, 72));
        assert_eq!(
            (c.frame_code, c.frame_previous, c.frame_instr, c.frame_entry),
            (0, 8, 56, 74)
        );
        assert_eq!((c.frame_read, c.code_adaptive), (80, 200));
        assert_eq!(c.flags, PY_ENTRY_BY_OWNER);
        assert_eq!(c.code_print.read, 136 + 8);
        // 3.14: frames walked, code objects not read, nothing printed.
        let mut words = debug_offsets_313();
        words[8..16].copy_from_slice(&0x030e_00f0u64.to_le_bytes());
        assert_eq!(
            from_debug_offsets(&words, v(14)).unwrap().code_print.read,
            0
        );
    }

    #[test]
    fn hostile_debug_offsets_are_refused() {
        let good = debug_offsets_313();
        assert_eq!(
            from_debug_offsets(&good, v(14)),
            Err(DebugOffsetsError::Version(0x030d_01f0))
        );
        assert_eq!(
            from_debug_offsets(&good[..100], v(13)),
            Err(DebugOffsetsError::NoCookie)
        );
        let patch = |i: usize, value: u64| {
            let mut b = good.clone();
            b[i * 8..i * 8 + 8].copy_from_slice(&value.to_le_bytes());
            b
        };
        assert_eq!(
            from_debug_offsets(&patch(2, 1), v(13)),
            Err(DebugOffsetsError::FreeThreaded)
        );
        for (i, value) in [(31, 4000), (31, 57), (28, 0), (25, 401), (43, 1 << 40)] {
            assert!(
                matches!(
                    from_debug_offsets(&patch(i, value), v(13)),
                    Err(DebugOffsetsError::Implausible(_))
                ),
                "word {i} = {value}"
            );
        }
    }
}

//! Python frames in a kernel stack: how the alloc program files the frames
//! of a CPython thread after its native frames, and how user space reads
//! them back.
//!
//! A stack of a thread running Python is
//! `[native frames…, PY_STACK_BEGIN, python frames…, (PY_TRUNCATED_FRAME)]`:
//! the native part as any stack (its own markers included), then the
//! thread's interpreter frames, innermost first, each one `u64`
//! ([`encode_python_frame`]). A walk cut short (depth, an unreadable or
//! implausible frame) ends in [`PY_TRUNCATED_FRAME`]. A thread with no
//! thread state, or no frame, has no Python part at all.
//!
//! One `u64` per frame: user addresses are below 2^47, so the code object's
//! address takes the low 47 bits and the rest says what user space needs to
//! place and resolve the frame:
//! - bit 63: a Python frame (native return addresses never set it; the
//!   markers, `0xffff_ffff_ffff_ffXX`, are told apart by their value);
//! - bit 62: the frame is an entry frame (3.11's `is_entry`: the first frame
//!   its `_PyEval_EvalFrameDefault` call ran), so user space knows which
//!   native eval frame each run of Python frames belongs to;
//! - bits 47–61: the index, in code units, of the instruction the frame is
//!   executing, saturated at [`PY_UNKNOWN_INSTR`] (never all ones, so no
//!   frame equals a marker).
//!
//! The same code object and instruction give the same value, so the stack
//! hash tells Python stacks apart by function and line for free.

/// Separates a stack's native frames from its Python frames.
pub const PY_STACK_BEGIN: u64 = 0xffff_ffff_ffff_ffa0;

/// Ends a Python walk that was cut short: too deep, or a frame that could not
/// be read or was not plausible (user space shows a marker there).
pub const PY_TRUNCATED_FRAME: u64 = 0xffff_ffff_ffff_ff90;

const PY_FRAME_TAG: u64 = 1 << 63;
const PY_ENTRY_BIT: u64 = 1 << 62;
const PY_INSTR_SHIFT: u32 = 47;
const PY_CODE_MASK: u64 = (1 << PY_INSTR_SHIFT) - 1;

/// The instruction index of a frame whose instruction is not known (before
/// its first instruction, or past what 15 bits hold: 64 KiB of bytecode).
pub const PY_UNKNOWN_INSTR: u32 = 0x7ffe;

/// One Python frame as the kernel files it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyFrame {
    /// Address of the frame's code object in the target.
    pub code: u64,
    /// Index, in code units, of the instruction being executed; `None` when
    /// unknown.
    pub instr: Option<u32>,
    /// The first frame of its `_PyEval_EvalFrameDefault` call.
    pub entry: bool,
}

/// The `u64` the kernel files for a frame executing code object `code` at
/// instruction index `instr` (code units from the code's first instruction;
/// negative, i.e. not started, or too large → [`PY_UNKNOWN_INSTR`]).
#[inline(always)]
pub fn encode_python_frame(code: u64, instr: i64, entry: bool) -> u64 {
    let instr = if instr < 0 || instr >= i64::from(PY_UNKNOWN_INSTR) {
        u64::from(PY_UNKNOWN_INSTR)
    } else {
        instr as u64
    };
    let entry = if entry { PY_ENTRY_BIT } else { 0 };
    PY_FRAME_TAG | entry | (instr << PY_INSTR_SHIFT) | (code & PY_CODE_MASK)
}

/// The Python frame a stack value encodes; `None` for native frames and
/// markers.
pub fn decode_python_frame(value: u64) -> Option<PyFrame> {
    if value & PY_FRAME_TAG == 0 || value >= PY_TRUNCATED_FRAME {
        return None;
    }
    let instr = ((value >> PY_INSTR_SHIFT) & 0x7fff) as u32;
    Some(PyFrame {
        code: value & PY_CODE_MASK,
        instr: (instr < PY_UNKNOWN_INSTR).then_some(instr),
        entry: value & PY_ENTRY_BIT != 0,
    })
}

/// A stack split at [`PY_STACK_BEGIN`]: its native frames and its Python
/// part (empty when the thread had none).
pub fn split_python(frames: &[u64]) -> (&[u64], &[u64]) {
    match frames.iter().position(|&f| f == PY_STACK_BEGIN) {
        Some(at) => (&frames[..at], &frames[at + 1..]),
        None => (frames, &[]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::{DEPTH_CUT_FRAME, NO_TABLES_DEPTH_FRAME, NO_TABLES_FRAME, TRUNCATED_FRAME};

    #[test]
    fn frames_round_trip() {
        let code = 0x7f12_3456_7890;
        for (instr, entry, want) in [
            (0, false, Some(0)),
            (12, true, Some(12)),
            (-1, false, None),
            (
                i64::from(PY_UNKNOWN_INSTR) - 1,
                true,
                Some(PY_UNKNOWN_INSTR - 1),
            ),
            (1 << 20, false, None),
        ] {
            let value = encode_python_frame(code, instr, entry);
            let frame = decode_python_frame(value).expect("a python frame");
            assert_eq!(frame.code, code);
            assert_eq!(frame.instr, want, "instr {instr}");
            assert_eq!(frame.entry, entry);
        }
    }

    #[test]
    fn native_frames_and_markers_are_not_python_frames() {
        for value in [
            0,
            0x5555_5555_1234,
            0x7fff_ffff_ffff,
            TRUNCATED_FRAME,
            DEPTH_CUT_FRAME,
            NO_TABLES_FRAME,
            NO_TABLES_DEPTH_FRAME,
            PY_STACK_BEGIN,
            PY_TRUNCATED_FRAME,
        ] {
            assert_eq!(decode_python_frame(value), None, "{value:#x}");
        }
        // Even the highest code address with every flag never reaches a marker.
        let top = encode_python_frame(0x7fff_ffff_ffff, i64::from(PY_UNKNOWN_INSTR), true);
        assert!(top < PY_TRUNCATED_FRAME);
    }

    #[test]
    fn a_stack_splits_at_its_python_part() {
        let py = encode_python_frame(0x1000, 3, true);
        let frames = [0x10, 0x20, PY_STACK_BEGIN, py, PY_TRUNCATED_FRAME];
        assert_eq!(
            split_python(&frames),
            (&frames[..2], &[py, PY_TRUNCATED_FRAME][..])
        );
        assert_eq!(split_python(&frames[..2]), (&frames[..2], &[][..]));
    }
}

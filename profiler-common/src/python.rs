//! Python frames in a kernel stack: how the alloc program files the frames
//! of a CPython thread after its native frames, and how user space reads
//! them back.
//!
//! A stack of a thread running Python is
//! `[native frames…, PY_STACK_BEGIN, python frames…, (PY_TRUNCATED_FRAME)]`:
//! the native part as any stack (its own markers included), then the
//! thread's interpreter frames, innermost first, each one `u64`
//! ([`encode_python_frame`]). A walk cut short (depth, an unreadable or
//! implausible frame, a `previous` that is no pointer or the frame itself)
//! ends in [`PY_TRUNCATED_FRAME`]. A thread with no
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
//!
//! A code object may be freed and another made at its address, before user
//! space reads it or while the same frames keep running. So the walk also
//! takes a print of each Python frame's code object ([`py_code_print`]:
//! two more reads per frame, the code object's start and its name's, none
//! for a frame running the same code as the one before): the stack's id
//! covers their digest, and a new stack files them by its id
//! ([`PyStackPrints`]); user space names a frame only if the object it
//! reads has the same print. The name's characters are covered, not only
//! its address: a code object made from the same template where a freed
//! one was can find its name, file and table objects where the freed one's
//! were too (an allocator reuses freed blocks last in, first out).

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

/// Where a process's Python frames are: the address of its `_PyRuntime` and
/// the byte offsets of the fields the kernel reads, per CPython minor
/// version (user space fills it, the kernel's `PY_PROCS` holds it by host
/// pid). Every offset of a frame field is below `frame_read`, which is at
/// most `PY_FRAME_WORDS * 8`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProcConfig {
    /// Address of `_PyRuntime` in the process.
    pub runtime: u64,
    /// `_PyRuntimeState` → `interpreters.head`.
    pub runtime_interpreters_head: u32,
    /// `PyInterpreterState` → `threads.head`.
    pub interp_threads_head: u32,
    /// `PyThreadState` → `next`.
    pub tstate_next: u32,
    /// `PyThreadState` → `native_thread_id`.
    pub tstate_native_thread_id: u32,
    /// `PyThreadState` → `cframe` (3.11, 3.12), or [`PY_NO_FIELD`] where
    /// the thread state holds its current frame itself (3.13+).
    pub tstate_cframe: u32,
    /// `_PyCFrame` → `current_frame` (or `PyThreadState` →
    /// `current_frame` without a cframe).
    pub current_frame: u32,
    /// `_PyInterpreterFrame` → `f_code` (3.13+: `f_executable`).
    pub frame_code: u32,
    /// `_PyInterpreterFrame` → `previous`.
    pub frame_previous: u32,
    /// `_PyInterpreterFrame` → `prev_instr` (3.13+: `instr_ptr`).
    pub frame_instr: u32,
    /// `_PyInterpreterFrame` → `is_entry` (3.11), or → `owner` with
    /// [`PY_ENTRY_BY_OWNER`] (3.12+).
    pub frame_entry: u32,
    /// Bytes of a frame read at once (every frame field above lies within).
    pub frame_read: u32,
    /// `PyCodeObject` → `co_code_adaptive` (the first instruction).
    pub code_adaptive: u32,
    /// [`PY_ENTRY_BY_OWNER`], [`PY_CODE_TAGGED`].
    pub flags: u32,
    /// What of a code object its print covers (see [`py_code_print`]).
    pub code_print: PyCodePrint,
    /// The process's pid namespace (`stat /proc/PID/ns/pid`: the kernel's
    /// `dev_t` of nsfs, and the inode), when it is not the initial one: its
    /// thread states hold thread ids of that namespace, which the kernel
    /// gets with `bpf_get_ns_current_pid_tgid`. Both 0 in the initial
    /// namespace (host thread ids).
    pub pidns_dev: u64,
    pub pidns_ino: u64,
}

/// A field a version does not have.
pub const PY_NO_FIELD: u32 = u32::MAX;
/// `frame_entry` is the frame's `owner` (3.12+): a frame owned by the C
/// stack is the shim `_PyEval_EvalFrameDefault` pushes on entry, not a
/// Python frame, and the frame it precedes is an entry frame.
pub const PY_ENTRY_BY_OWNER: u32 = 1;
/// The code pointer is a tagged stack reference (3.14+): its low bits are
/// flags.
pub const PY_CODE_TAGGED: u32 = 2;
/// `owner` of a shim frame (`FRAME_OWNED_BY_CSTACK`, 3.12+).
pub const PY_FRAME_OWNED_BY_CSTACK: u64 = 3;

/// Words of a frame the kernel reads at once, at most (a power of two).
pub const PY_FRAME_WORDS: usize = 16;
/// Words the kernel reads at once from a thread's frames: the frame it is at
/// and what lies below it in the same page. 3.11+ pushes a thread's frames
/// contiguously in its data stack, so the frames it returns to are mostly in
/// that block already (a power of two, at least `PY_FRAME_WORDS`).
pub const PY_BLOCK_WORDS: usize = 512;
/// Python frames a walk files at most (within the stack's 127 slots).
pub const MAX_PYTHON_FRAMES: usize = 96;
/// Slots a process with Python frames keeps free of native frames, so a
/// deep native stack cannot crowd out its Python part: the native walk of
/// such a process stops this much short of `MAX_STACK_DEPTH`.
pub const PY_RESERVED_SLOTS: usize = 40;
/// Threads of an interpreter looked through, at most, for the allocating
/// thread's state.
pub const MAX_PYTHON_THREADS: usize = 256;

/// Words of a code object's start a print may cover.
pub const PY_CODE_PRINT_WORDS: usize = 32;
/// Words of a code object's name (`co_qualname`, a `str`) a print may
/// read: its header, then [`PY_NAME_CHAR_WORDS`] of an ASCII name's
/// characters.
pub const PY_NAME_PRINT_WORDS: usize = 16;
/// Words of characters of an ASCII name a print covers (32 characters).
pub const PY_NAME_CHAR_WORDS: usize = 4;

/// The print of a code object that could not be read at the sample.
pub const PY_NO_PRINT: u32 = 0;

/// The prints of a stack's Python frames' code objects, in the order of the
/// frames in the stack (markers take none), as the walk took them
/// (`PY_STACK_PRINTS`, by stack id, for user space), and their digest,
/// which the stack's id covers with its frames: the same frames running
/// other code objects (one made where a freed one was) are another stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyStackPrints {
    /// [`py_prints_digest`] of `prints`, from [`PY_PRINTS_SEED`].
    pub digest: u64,
    pub prints: [u32; MAX_PYTHON_FRAMES],
}

/// The digest of a stack's prints, one print at a time from
/// [`PY_PRINTS_SEED`].
#[inline(always)]
pub fn py_prints_digest(digest: u64, print: u32) -> u64 {
    (digest ^ u64::from(print)).wrapping_mul(0x0000_0100_0000_01b3)
}

pub const PY_PRINTS_SEED: u64 = 0x8422_2325_cbf2_9ce4;

/// Whether a stack whose last frame is `last` has a Python part: it ends
/// in a Python frame or the walk's truncation marker.
#[inline(always)]
pub fn py_ends_stack(last: u64) -> bool {
    last == PY_TRUNCATED_FRAME || decode_python_frame(last).is_some()
}

/// The words of a code object's start its print covers, by index (a
/// list, not a mask: the kernel hashes only these, a few instructions
/// each, without a branch).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyCodePrint {
    /// Bytes read from the object's start: past the last word covered, at
    /// most `8 * PY_CODE_PRINT_WORDS`; 0: no prints (code objects of this
    /// version are not read).
    pub read: u32,
    /// The words' indexes (below `PY_CODE_PRINT_WORDS`); fewer words than
    /// slots repeat the last.
    pub at: [u8; 8],
    /// The word of the code object pointing to its name (`co_qualname`).
    pub name_at: u8,
    /// The word of a compact ASCII `str` where its characters start
    /// (`sizeof(PyASCIIObject) / 8`).
    pub chars_at: u8,
    pub _pad: [u8; 2],
}

impl PyCodePrint {
    /// The print of the words at these byte offsets (at most 8, each
    /// within the first `PY_CODE_PRINT_WORDS` words).
    pub fn of_offsets(offsets: &[usize]) -> PyCodePrint {
        let mut at = [0; 8];
        let mut read = 0;
        for (i, slot) in at.iter_mut().enumerate() {
            let Some(offset) = offsets.get(i).or(offsets.last()) else {
                break;
            };
            let word = offset / 8;
            assert!(
                word < PY_CODE_PRINT_WORDS,
                "offset {offset} past the print's words"
            );
            *slot = word as u8;
            read = read.max(8 * (word as u32 + 1));
        }
        assert!(offsets.len() <= at.len(), "more words than a print covers");
        PyCodePrint {
            read,
            at,
            ..PyCodePrint::default()
        }
    }

    /// The same, covering the name `co_qualname` (at byte `name` of the
    /// code object) points to: a `str` whose characters, if ASCII, start
    /// at its byte `chars`.
    pub fn with_name(self, name: usize, chars: usize) -> PyCodePrint {
        assert!(
            name / 8 < PY_CODE_PRINT_WORDS && (name / 8) as u32 * 8 < self.read,
            "the name's pointer lies outside what is read"
        );
        assert!(chars / 8 + PY_NAME_CHAR_WORDS <= PY_NAME_PRINT_WORDS);
        PyCodePrint {
            name_at: (name / 8) as u8,
            chars_at: (chars / 8) as u8,
            ..self
        }
    }

    /// Bytes read of the name at `name`: its header and up to 32 bytes of
    /// characters, not past the page where they start. A short name's
    /// object may end before 32 bytes, and the page after it may never
    /// have been touched, which the kernel's read cannot fault in; the
    /// page of its first character (or terminator) is its own.
    #[inline(always)]
    pub fn name_read(&self, name: u64) -> u32 {
        let header = u32::from(self.chars_at) * 8;
        let page_left = 4096 - (name.wrapping_add(u64::from(header)) & 4095) as u32;
        let chars = (PY_NAME_CHAR_WORDS as u32 * 8).min(page_left);
        header + chars
    }

    /// The distinct words covered, in order.
    pub fn words(&self) -> impl Iterator<Item = usize> + '_ {
        let at = &self.at;
        (0..at.len())
            .filter(move |&i| self.read != 0 && (i == 0 || at[i] != at[i - 1]))
            .map(move |i| usize::from(at[i]))
    }
}

/// What of a code object's name (`co_qualname`) its print covers
/// ([`py_name_print`] of the name's first `read` bytes,
/// [`PyCodePrint::name_read`]): the length, the string's kind bits (not
/// whether it is interned, which may change), and an ASCII name's
/// characters read, only those below its length (what follows is not the
/// string's). A name of another kind is covered by its length and kind
/// only: its characters lie past fields CPython fills lazily (the UTF-8
/// cache).
#[inline(always)]
pub fn py_name_print(name: &[u64; PY_NAME_PRINT_WORDS], print: &PyCodePrint, read: u32) -> u64 {
    const LENGTH: usize = 2;
    const STATE: usize = 4;
    let chars_read = u64::from(read).saturating_sub(u64::from(print.chars_at) * 8);
    let length = name[LENGTH];
    // interned:2, kind:3, compact:1, ascii:1, ready (3.11) or statically
    // allocated (3.12+):1, in the low byte of the word.
    let state = name[STATE] & 0xfc;
    let ascii = 0u64.wrapping_sub((state >> 6) & 1);
    let mut h = (length ^ (state << 56)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut i = 0;
    while i < PY_NAME_CHAR_WORDS {
        let word = name[(usize::from(print.chars_at) + i) & (PY_NAME_PRINT_WORDS - 1)];
        let left = length.min(chars_read).saturating_sub(8 * i as u64);
        let mask = if left >= 8 {
            u64::MAX
        } else {
            (1u64 << (8 * left)) - 1
        };
        h = h.wrapping_add(
            ((word & mask & ascii) ^ (i as u64 + 1).wrapping_mul(0xa076_1d64_78bd_642f))
                .wrapping_mul(0xbf58_476d_1ce4_e5b9),
        );
        i += 1;
    }
    h
}

/// What tells a code object from another made at its address later: a
/// digest of the words of its start `print` covers (the fields no running
/// code changes: its type, size, first line, and the name, file and
/// location-table objects it points to) and of its name's
/// [`py_name_print`], `name`. Never [`PY_NO_PRINT`].
#[inline(always)]
pub fn py_code_print(code: &[u64; PY_CODE_PRINT_WORDS], print: &PyCodePrint, name: u64) -> u32 {
    // Every slot, a word repeated or not: no branch per word; a product
    // per slot, independent of the others (no chain of multiplications).
    let mut h: u64 = 0x243f_6a88_85a3_08d3;
    for (slot, &word) in print.at.iter().enumerate() {
        let value = code[usize::from(word) & (PY_CODE_PRINT_WORDS - 1)];
        h = h.wrapping_add(
            (value ^ (slot as u64).wrapping_mul(0xa076_1d64_78bd_642f))
                .wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
    }
    h = h.wrapping_add((name ^ 0x5851_f42d_4c95_7f2d).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    h = (h ^ (h >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    match (h >> 32) as u32 ^ h as u32 {
        PY_NO_PRINT => 1,
        print => print,
    }
}

/// What one interpreter frame read by the kernel gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PyFrameStep {
    /// A Python frame: the value to file, and the frame it returns to (0:
    /// none; not [`py_plausible`]: the walk is cut after this frame).
    Frame { value: u64, previous: u64 },
    /// A shim frame (3.12+): nothing to file; the frame filed just before
    /// (the first its eval call ran) is an entry frame.
    Shim { previous: u64 },
    /// Not a plausible frame: the walk ends in [`PY_TRUNCATED_FRAME`].
    Bad,
}

/// Whether `addr` may be a user-space object's address (aligned, below
/// 2^47, not null).
#[inline(always)]
pub fn py_plausible(addr: u64) -> bool {
    addr != 0 && addr & 7 == 0 && addr < (1 << 47)
}

/// The word at byte `offset` (within `PY_FRAME_WORDS` words) of the frame
/// starting at word `at` of `words`; the index wraps, never out of bounds
/// (`N` is a power of two).
#[inline(always)]
fn frame_word<const N: usize>(words: &[u64; N], at: usize, offset: u32) -> u64 {
    words[(at + ((offset >> 3) as usize & (PY_FRAME_WORDS - 1))) & (N - 1)]
}

/// Decodes one `_PyInterpreterFrame` from its first words, at word `at` of
/// what was read from the target (hostile: any value may come): its code
/// object, the index of its instruction (`(instr − (code +
/// co_code_adaptive)) / 2`, −1 before the first, unknown if implausible),
/// and whether it is an entry frame. `N` is a power of two.
#[inline(always)]
pub fn py_frame_step<const N: usize>(
    cfg: &PyProcConfig,
    words: &[u64; N],
    at: usize,
) -> PyFrameStep {
    // An implausible `previous` (a chain scribbled over) is handed on: the
    // frame itself is good, and the walker cuts after it.
    let previous = frame_word(words, at, cfg.frame_previous);
    let flag = (frame_word(words, at, cfg.frame_entry) >> ((cfg.frame_entry & 7) * 8)) & 0xff;
    let by_owner = cfg.flags & PY_ENTRY_BY_OWNER != 0;
    if by_owner && flag == PY_FRAME_OWNED_BY_CSTACK {
        return PyFrameStep::Shim { previous };
    }
    let mut code = frame_word(words, at, cfg.frame_code);
    if cfg.flags & PY_CODE_TAGGED != 0 {
        code &= !7;
    }
    if !py_plausible(code) {
        return PyFrameStep::Bad;
    }
    let first = code.wrapping_add(u64::from(cfg.code_adaptive));
    let instr = frame_word(words, at, cfg.frame_instr);
    // Arithmetic shift: one code unit before the first instruction is −1.
    let index = (instr.wrapping_sub(first) as i64) >> 1;
    let entry = !by_owner && flag != 0;
    PyFrameStep::Frame {
        value: encode_python_frame(code, index, entry),
        previous,
    }
}

/// `value` (a filed Python frame) marked as an entry frame.
#[inline(always)]
pub fn py_mark_entry(value: u64) -> u64 {
    if value & PY_FRAME_TAG != 0 && value < PY_TRUNCATED_FRAME {
        value | PY_ENTRY_BIT
    } else {
        value
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

    fn config_311() -> PyProcConfig {
        PyProcConfig {
            frame_code: 32,
            frame_previous: 48,
            frame_instr: 56,
            frame_entry: 68,
            frame_read: 72,
            code_adaptive: 184,
            ..PyProcConfig::default()
        }
    }

    fn frame_311(code: u64, previous: u64, instr: u64, entry: bool) -> [u64; PY_FRAME_WORDS] {
        let mut w = [0u64; PY_FRAME_WORDS];
        w[4] = code;
        w[6] = previous;
        w[7] = instr;
        // stacktop (int) at 64, is_entry at 68, owner at 69.
        w[8] = 5 | (u64::from(entry) << 32) | (1 << 40);
        w
    }

    #[test]
    fn a_311_frame_decodes() {
        let cfg = config_311();
        let code = 0x7f00_0000_1000;
        let first = code + 184;
        let step = py_frame_step(
            &cfg,
            &frame_311(code, 0x7f00_0000_2000, first + 2 * 7, true),
            0,
        );
        assert_eq!(
            step,
            PyFrameStep::Frame {
                value: encode_python_frame(code, 7, true),
                previous: 0x7f00_0000_2000
            }
        );
        // Before the first instruction: unknown; not an entry.
        let PyFrameStep::Frame { value, previous } =
            py_frame_step(&cfg, &frame_311(code, 0, first - 2, false), 0)
        else {
            panic!("a frame");
        };
        assert_eq!(previous, 0);
        let frame = decode_python_frame(value).unwrap();
        assert_eq!((frame.code, frame.instr, frame.entry), (code, None, false));
    }

    #[test]
    fn frames_decode_where_a_block_holds_them() {
        // Two frames read at once: the innermost at word 40, the one it
        // returns to at word 3 (lower, as a data stack holds them).
        let cfg = config_311();
        let (outer, inner) = (0x7f00_0000_1000, 0x7f00_0000_5000);
        let mut block = [0u64; PY_BLOCK_WORDS];
        block[3..3 + PY_FRAME_WORDS].copy_from_slice(&frame_311(outer, 0, outer + 184, true));
        block[40..40 + PY_FRAME_WORDS].copy_from_slice(&frame_311(
            inner,
            0x7f00_0000_0018,
            inner + 184 + 6,
            false,
        ));
        let step = |at| match py_frame_step(&cfg, &block, at) {
            PyFrameStep::Frame { value, previous } => (decode_python_frame(value), previous),
            other => panic!("{other:?} at {at}"),
        };
        let (frame, previous) = step(40);
        let frame = frame.unwrap();
        assert_eq!(
            (frame.code, frame.instr, frame.entry),
            (inner, Some(3), false)
        );
        assert_eq!(previous, 0x7f00_0000_0018);
        let frame = step(3).0.unwrap();
        assert_eq!(
            (frame.code, frame.instr, frame.entry),
            (outer, Some(0), true)
        );
        // A frame at the block's end wraps to its start: garbage, never a
        // read out of bounds.
        let _ = py_frame_step(&cfg, &block, PY_BLOCK_WORDS - 1);
    }

    #[test]
    fn implausible_frames_are_refused() {
        let cfg = config_311();
        let code = 0x7f00_0000_1000;
        for code in [0, code + 3, 1 << 50] {
            assert_eq!(
                py_frame_step(&cfg, &frame_311(code, 0, code, false), 0),
                PyFrameStep::Bad,
                "{code:#x}"
            );
        }
        // A good frame with a scribbled `previous` is still filed; the
        // walker cuts after it (the previous is not plausible).
        for previous in [0x7f00_0000_2001, 0xffff_8000_0000_0000] {
            let PyFrameStep::Frame { value, previous: p } =
                py_frame_step(&cfg, &frame_311(code, previous, code, false), 0)
            else {
                panic!("a frame with previous {previous:#x}");
            };
            assert_eq!(decode_python_frame(value).unwrap().code, code);
            assert_eq!(p, previous);
            assert!(!py_plausible(p));
        }
        // A far-off instruction pointer is only an unknown instruction.
        let PyFrameStep::Frame { value, .. } =
            py_frame_step(&cfg, &frame_311(code, 0, 0, false), 0)
        else {
            panic!("a frame");
        };
        assert_eq!(decode_python_frame(value).unwrap().instr, None);
    }

    #[test]
    fn prints_digest_in_order() {
        let a = py_prints_digest(py_prints_digest(PY_PRINTS_SEED, 7), 8);
        let b = py_prints_digest(py_prints_digest(PY_PRINTS_SEED, 8), 7);
        assert_ne!(a, b);
        assert_ne!(a, py_prints_digest(py_prints_digest(PY_PRINTS_SEED, 7), 9));
        assert!(py_ends_stack(encode_python_frame(0x1000, 1, false)));
        assert!(py_ends_stack(PY_TRUNCATED_FRAME));
        assert!(!py_ends_stack(PY_STACK_BEGIN));
        assert!(!py_ends_stack(0x5555_5555_1234));
    }

    #[test]
    fn a_print_covers_its_words_only() {
        let mut code = [0u64; PY_CODE_PRINT_WORDS];
        for (i, w) in code.iter_mut().enumerate() {
            *w = 0x7f00_0000_0000 + i as u64 * 8;
        }
        let words = PyCodePrint::of_offsets(&[8, 16, 72, 112, 128, 136]);
        assert_eq!(words.at, [1, 2, 9, 14, 16, 17, 17, 17]);
        assert!(words.words().eq([1, 2, 9, 14, 16, 17]));
        assert_eq!(words.read, 18 * 8);
        let print = py_code_print(&code, &words, 7);
        assert_ne!(print, PY_NO_PRINT);
        // A refcount (word 0) or a warm-up counter (word 6) may change.
        let mut touched = code;
        touched[0] += 1;
        touched[6] ^= 0xffff;
        assert_eq!(py_code_print(&touched, &words, 7), print);
        // Any covered word tells another object, and so does the name.
        for i in [1, 2, 9, 14, 16, 17] {
            let mut other = code;
            other[i] ^= 0x10;
            assert_ne!(py_code_print(&other, &words, 7), print, "word {i}");
        }
        assert_ne!(py_code_print(&code, &words, 8), print);
        assert_eq!(PyCodePrint::of_offsets(&[]).read, 0);
        assert_eq!(PyCodePrint::of_offsets(&[]).words().count(), 0);
    }

    /// A compact ASCII `str` of 3.11's layout (characters at byte 48).
    fn ascii_name(text: &[u8]) -> [u64; PY_NAME_PRINT_WORDS] {
        let mut bytes = [0u8; PY_NAME_PRINT_WORDS * 8];
        bytes[16..24].copy_from_slice(&(text.len() as u64).to_le_bytes());
        bytes[32] = 0b1110_0100; // ready, ascii, compact, kind 1
        bytes[48..48 + text.len()].copy_from_slice(text);
        let mut words = [0u64; PY_NAME_PRINT_WORDS];
        for (w, b) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            *w = u64::from_le_bytes(b.try_into().unwrap());
        }
        words
    }

    #[test]
    fn a_name_print_covers_its_characters_up_to_its_length() {
        let print = PyCodePrint::of_offsets(&[8, 128, 136]).with_name(128, 48);
        assert_eq!(
            (print.name_at, print.chars_at, print.name_read(0x1000)),
            (16, 6, 80)
        );
        let fn8 = ascii_name(b"fn_0008");
        let of = |name: &[u64; PY_NAME_PRINT_WORDS]| py_name_print(name, &print, 80);
        assert_ne!(of(&fn8), of(&ascii_name(b"decoy_0008")));
        assert_ne!(of(&fn8), of(&ascii_name(b"fn_0009")));
        // Within the first 32 characters, any one tells.
        let long = b"Handler.handle_request.<locals>.nested";
        for i in 0..32 {
            let mut other = *long;
            other[i] ^= 1;
            assert_ne!(of(&ascii_name(long)), of(&ascii_name(&other)), "{i}");
        }
        // What follows the name, its refcount, hash and whether it is
        // interned may change.
        let mut touched = fn8;
        touched[6] ^= 0xff << 56; // the terminator after "fn_0008"
        touched[7] = 0x1234;
        touched[0] += 3;
        touched[3] = 0x5eed;
        touched[4] ^= 0b11;
        assert_eq!(of(&touched), of(&fn8));
        // Characters on the next page are not read (it may be untouched):
        // nor covered, whatever the buffer holds there.
        let at = 0x2000 - 48 - 5;
        assert_eq!(print.name_read(at), 48 + 5);
        assert_eq!(print.name_read(0x2000 - 40), 48 + 32);
        let mut cut = ascii_name(long);
        cut[6] ^= 0xff << 48;
        assert_eq!(
            py_name_print(&cut, &print, 48 + 5),
            py_name_print(&ascii_name(long), &print, 48 + 5)
        );
        assert_ne!(of(&cut), of(&ascii_name(long)));
        // A name of another kind: its length and kind only.
        let mut wide = fn8;
        wide[4] = 0b1010_1000; // ready, compact, kind 2
        let mut wide_other = wide;
        wide_other[6] ^= 0x10;
        assert_eq!(of(&wide), of(&wide_other));
        assert_ne!(of(&wide), of(&fn8));
    }

    #[test]
    fn shims_are_skipped_by_owner() {
        // 3.12: f_code 0, previous 8, prev_instr 56, owner at 70.
        let cfg = PyProcConfig {
            frame_code: 0,
            frame_previous: 8,
            frame_instr: 56,
            frame_entry: 70,
            frame_read: 72,
            code_adaptive: 192,
            flags: PY_ENTRY_BY_OWNER,
            ..PyProcConfig::default()
        };
        let mut w = [0u64; PY_FRAME_WORDS];
        w[0] = 0x7f00_0000_1000;
        w[1] = 0x7f00_0000_3000;
        w[7] = 0x7f00_0000_1000 + 192;
        w[8] = PY_FRAME_OWNED_BY_CSTACK << 48;
        assert_eq!(
            py_frame_step(&cfg, &w, 0),
            PyFrameStep::Shim {
                previous: 0x7f00_0000_3000
            }
        );
        w[8] = 0; // owned by the thread: a frame, never an entry by itself
        let PyFrameStep::Frame { value, .. } = py_frame_step(&cfg, &w, 0) else {
            panic!("a frame");
        };
        let frame = decode_python_frame(value).unwrap();
        assert_eq!((frame.instr, frame.entry), (Some(0), false));
        assert!(decode_python_frame(py_mark_entry(value)).unwrap().entry);
        assert_eq!(py_mark_entry(PY_STACK_BEGIN), PY_STACK_BEGIN);
        assert_eq!(py_mark_entry(0x1234), 0x1234);
    }
}

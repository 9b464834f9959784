//! Code objects read from a CPython process's memory: the qualified name,
//! file, first line and location table of the code a Python frame runs.
//!
//! The target owns every byte read here: each read is bounded, each field
//! validated (sizes, pointer alignment, string kinds, UTF-8), and anything
//! implausible is an error value. Reads go through [`Memory`]; the session's
//! is the bounded, non-blocking reader of `process::target_memory`.
//!
//! Layouts (64-bit), from CPython's headers (`cpython/code.h`,
//! `cpython/unicodeobject.h`, `cpython/bytesobject.h`): 3.11 tested against
//! Debian's and pyenv's 3.11; 3.12 and 3.13, whose offsets differ only in
//! `co_firstlineno` and the string headers, tested where pyenv has them
//! (see `python/tests`).

use profiler_common::python::{
    PY_CODE_PRINT_WORDS, PY_NAME_PRINT_WORDS, PY_NO_PRINT, PyCodePrint, py_code_print,
    py_name_print,
};
use thiserror::Error;

use super::{PyVersion, linetable};
use crate::process::target_memory::{LiveThread, ReadError, TargetMemory};

/// The longest name or file name read (longer ones are cut, marked `…`).
pub const MAX_NAME_CHARS: usize = 1024;
/// The largest location table read.
pub const MAX_LINE_TABLE: usize = 64 << 10;
/// The most code units a code object is believed to have (its size is
/// only checked against the frame's instruction index).
pub const MAX_CODE_UNITS: u64 = 1 << 24;
/// Above any reference count a live object holds: 3.12's and 3.13's
/// immortal objects hold `u32::MAX` (a little more if an extension built
/// for an older stable ABI increments them), while a freed block's
/// free-list link is an address of mapped memory, above 2^44 on x86-64
/// (mimalloc's segments, pymalloc's arenas; glibc, whose heap can sit
/// lower, also overwrites the type word).
const MAX_REFCOUNT: u64 = 1 << 40;

/// Why a code object was not read.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum CodeError {
    #[error("unreadable memory at {0:#x}")]
    Unreadable(u64),
    /// The reader would not read the process (see `process::target_memory`).
    #[error("its memory is not read: {0}")]
    Blocked(crate::process::target_memory::Unreadable),
    #[error("Python {0}: no code object layout for this version")]
    Unsupported(PyVersion),
    #[error("the interpreter's version is not known")]
    NoVersion,
    #[error("not a code object at {at:#x}: {why}")]
    NotCode { at: u64, why: &'static str },
    #[error("not a string at {at:#x}: {why}")]
    BadString { at: u64, why: &'static str },
    #[error("not a location table at {at:#x}: {why}")]
    BadLineTable { at: u64, why: &'static str },
}

/// Reads of a target's memory.
pub trait Memory {
    /// Exactly `len` bytes at `address`.
    fn read(&self, address: u64, len: usize) -> Result<Vec<u8>, CodeError>;
}

/// No memory to read (a process gone): every read fails as unreadable.
pub struct NoMemory;

impl Memory for NoMemory {
    fn read(&self, _address: u64, _len: usize) -> Result<Vec<u8>, CodeError> {
        Err(CodeError::Blocked(
            crate::process::target_memory::Unreadable::NoThread(std::io::ErrorKind::NotFound),
        ))
    }
}

/// A process's memory through the session's reader (never blocks the
/// caller longer than its deadline).
pub struct TargetReader<'a> {
    pub memory: &'a TargetMemory,
    pub thread: LiveThread,
}

impl Memory for TargetReader<'_> {
    fn read(&self, address: u64, len: usize) -> Result<Vec<u8>, CodeError> {
        // The reader copies words: the aligned words around the range.
        let start = address & !7;
        let end = address
            .checked_add(len as u64)
            .and_then(|e| e.checked_add(7))
            .ok_or(CodeError::Unreadable(address))?
            & !7;
        let words = ((end - start) / 8) as usize;
        let data = self
            .memory
            .read_words(self.thread, start, words)
            .map_err(|e| match e {
                ReadError::Unreadable(why) => CodeError::Blocked(why),
                ReadError::Io(_) => CodeError::Unreadable(address),
            })?;
        let bytes: Vec<u8> = data.iter().flat_map(|w| w.to_le_bytes()).collect();
        let skip = (address - start) as usize;
        Ok(bytes[skip..skip + len].to_vec())
    }
}

/// Where the fields read are, for one CPython minor version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    code_firstlineno: usize,
    /// `sizeof(PyASCIIObject)`: a compact ASCII string's characters follow.
    ascii_size: usize,
    /// `sizeof(PyCompactUnicodeObject)`: other compact strings' follow.
    compact_size: usize,
    /// 3.11's `state.ready` bit (gone in 3.12) must be set.
    ready_bit: bool,
}

// The same in every version supported.
const OB_REFCNT: usize = 0;
const OB_TYPE: usize = 8;
const OB_SIZE: usize = 16;
const CODE_FILENAME: usize = 112;
const CODE_QUALNAME: usize = 128;
const CODE_LINETABLE: usize = 136;
/// What is read of a code object: up to its `co_linetable`.
const CODE_HEADER: usize = CODE_LINETABLE + 8;
const STR_LENGTH: usize = 16;
const STR_STATE: usize = 32;
const BYTES_DATA: usize = 32;

impl Layout {
    pub fn for_version(version: PyVersion) -> Result<Layout, CodeError> {
        match (version.major, version.minor) {
            (3, 11) => Ok(Layout {
                code_firstlineno: 72,
                ascii_size: 48,
                compact_size: 72,
                ready_bit: true,
            }),
            (3, 12 | 13) => Ok(Layout {
                code_firstlineno: 68,
                ascii_size: 40,
                compact_size: 56,
                ready_bit: false,
            }),
            _ => Err(CodeError::Unsupported(version)),
        }
    }

    /// The words of a code object the kernel's print covers (see
    /// `profiler_common::python::py_code_print`): the fields of the
    /// [`Fingerprint`], each in a word no running code writes (3.11's
    /// `co_firstlineno` shares its word with `co_nlocalsplus`, 3.12's with
    /// `co_stacksize`). All within the header read here.
    pub fn code_print(&self) -> PyCodePrint {
        PyCodePrint::of_offsets(&[
            OB_TYPE,
            OB_SIZE,
            self.code_firstlineno,
            CODE_FILENAME,
            CODE_QUALNAME,
            CODE_LINETABLE,
        ])
        .with_name(CODE_QUALNAME, self.ascii_size)
    }
}

/// What identifies a code object at an address: its header's type, size,
/// the objects it points to and its first line. A code object freed and
/// another made at its address would have to match all of them to pass
/// for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    pub ob_type: u64,
    /// Its length in code units (`Py_SIZE`).
    pub units: u64,
    pub filename: u64,
    pub qualname: u64,
    pub linetable: u64,
    pub first_line: i32,
    /// The kernel's digest of the same fields and of the name's characters
    /// (`py_code_print`, `py_name_print`): a frame whose print at the
    /// sample differs ran another code object.
    pub kernel_print: u32,
}

/// A code object, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Code {
    pub fingerprint: Fingerprint,
    pub qualname: String,
    pub filename: String,
    pub linetable: Vec<u8>,
}

impl Code {
    /// The source line of instruction `instr` (code units), where known.
    pub fn line(&self, instr: u32) -> Option<i32> {
        linetable::line_of(&self.linetable, self.fingerprint.first_line, instr)
    }

    /// Whether `instr` is an instruction of this code.
    pub fn holds(&self, instr: u32) -> bool {
        u64::from(instr) < self.fingerprint.units
    }

    /// What it takes in the cache, roughly.
    pub fn heap_bytes(&self) -> usize {
        size_of::<Code>() + self.qualname.len() + self.filename.len() + self.linetable.len()
    }
}

fn word(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// `bytes` as little-endian words, the last one zero-padded, the rest 0.
fn le_words<const N: usize>(bytes: &[u8]) -> [u64; N] {
    let mut words = [0u64; N];
    for (w, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        *w = u64::from_le_bytes(word);
    }
    words
}

fn plausible_pointer(p: u64) -> bool {
    p != 0 && p.is_multiple_of(8) && p < 1 << 47
}

/// The header of the code object at `address`. With `code_type` (the
/// interpreter's `PyCode_Type`), an object of another type is refused.
pub fn read_fingerprint(
    memory: &dyn Memory,
    layout: &Layout,
    address: u64,
    code_type: Option<u64>,
) -> Result<Fingerprint, CodeError> {
    let not_code = |why| CodeError::NotCode { at: address, why };
    if !plausible_pointer(address) {
        return Err(not_code("not an object's address"));
    }
    let header = memory.read(address, CODE_HEADER)?;
    let words: [u64; PY_CODE_PRINT_WORDS] = le_words(&header);
    let first_line = i32::from_le_bytes(
        header[layout.code_firstlineno..layout.code_firstlineno + 4]
            .try_into()
            .expect("4 bytes"),
    );
    let mut print = Fingerprint {
        ob_type: word(&header, OB_TYPE),
        units: word(&header, OB_SIZE),
        filename: word(&header, CODE_FILENAME),
        qualname: word(&header, CODE_QUALNAME),
        linetable: word(&header, CODE_LINETABLE),
        first_line,
        kernel_print: PY_NO_PRINT,
    };
    if code_type.is_some_and(|t| t != print.ob_type) {
        return Err(not_code("its type is not the interpreter's code type"));
    }
    // A freed object's first word is 0 (its last reference dropped) or its
    // allocator's free-list link (a pointer, or 0), and mimalloc and
    // pymalloc write nothing else: the rest of a freed code object's
    // header, print included, still reads as it was, while the objects it
    // points to may be freed and reused.
    let refcount = word(&header, OB_REFCNT);
    if refcount == 0 || refcount > MAX_REFCOUNT {
        return Err(not_code("freed: its reference count is no count"));
    }
    if !plausible_pointer(print.ob_type) {
        return Err(not_code("no type"));
    }
    if print.units == 0 || print.units > MAX_CODE_UNITS {
        return Err(not_code("implausible size"));
    }
    if first_line < 0 {
        return Err(not_code("negative first line"));
    }
    if ![print.filename, print.qualname, print.linetable]
        .into_iter()
        .all(plausible_pointer)
    {
        return Err(not_code("a field is not an object"));
    }
    let code_print = layout.code_print();
    let read = code_print.name_read(print.qualname);
    let name = memory.read(print.qualname, read as usize)?;
    let name_words: [u64; PY_NAME_PRINT_WORDS] = le_words(&name);
    print.kernel_print = py_code_print(
        &words,
        &code_print,
        py_name_print(&name_words, &code_print, read),
    );
    Ok(print)
}

/// The code object at `address`, whole: alive before its name, file and
/// table are read and after, so they were its own while they were read (a
/// live code object holds them).
pub fn read_code(
    memory: &dyn Memory,
    layout: &Layout,
    address: u64,
    code_type: Option<u64>,
) -> Result<Code, CodeError> {
    let fingerprint = read_fingerprint(memory, layout, address, code_type)?;
    let code = Code {
        qualname: read_string(memory, layout, fingerprint.qualname)?,
        filename: read_string(memory, layout, fingerprint.filename)?,
        linetable: read_bytes_object(memory, fingerprint.linetable)?,
        fingerprint,
    };
    if read_fingerprint(memory, layout, address, code_type)? != fingerprint {
        return Err(CodeError::NotCode {
            at: address,
            why: "freed or changed while it was read",
        });
    }
    Ok(code)
}

/// The C string of the type at `type_address`'s `tp_name`, up to 32 bytes:
/// to recognise the interpreter's code type (`"code"`).
pub fn type_name(memory: &dyn Memory, type_address: u64) -> Result<String, CodeError> {
    const TP_NAME: u64 = 24;
    let bad = |why| CodeError::NotCode {
        at: type_address,
        why,
    };
    let name = word(&memory.read(type_address + TP_NAME, 8)?, 0);
    if name == 0 || name >= 1 << 47 {
        return Err(bad("its type has no name"));
    }
    // Byte by byte up to the end of its page: the name may end just before
    // an unmapped one.
    let mut text = Vec::new();
    let mut at = name;
    while text.len() < 32 {
        let chunk = (4096 - (at % 4096)).min(32) as usize;
        let bytes = memory.read(at, chunk)?;
        match bytes.iter().position(|&b| b == 0) {
            Some(end) => {
                text.extend_from_slice(&bytes[..end]);
                return String::from_utf8(text).map_err(|_| bad("its type's name is not UTF-8"));
            }
            None => text.extend_from_slice(&bytes),
        }
        at += chunk as u64;
    }
    Err(bad("its type's name is too long"))
}

/// A `str` object: compact (as every name in a code object is), ASCII or
/// of 1, 2 or 4 bytes a character; cut at [`MAX_NAME_CHARS`].
pub fn read_string(
    memory: &dyn Memory,
    layout: &Layout,
    address: u64,
) -> Result<String, CodeError> {
    let bad = |why| CodeError::BadString { at: address, why };
    if !plausible_pointer(address) {
        return Err(bad("not an object's address"));
    }
    let header = memory.read(address, layout.ascii_size)?;
    let length = word(&header, STR_LENGTH);
    // Only the low byte of the state's bit field is defined.
    let state = header[STR_STATE];
    let kind = (state >> 2) & 7;
    let compact = state & (1 << 5) != 0;
    let ascii = state & (1 << 6) != 0;
    let ready = state & (1 << 7) != 0;
    if !compact {
        return Err(bad("not a compact string"));
    }
    if layout.ready_bit && !ready {
        return Err(bad("not ready"));
    }
    if !matches!(kind, 1 | 2 | 4) || (ascii && kind != 1) {
        return Err(bad("no such kind"));
    }
    if length > 1 << 40 {
        return Err(bad("implausible length"));
    }
    let cut = length as usize > MAX_NAME_CHARS;
    let chars = (length as usize).min(MAX_NAME_CHARS);
    let data = if ascii {
        layout.ascii_size
    } else {
        layout.compact_size
    };
    let raw = memory.read(address + data as u64, chars * kind as usize)?;
    let mut text = String::with_capacity(chars);
    match kind {
        1 if ascii => {
            if !raw.is_ascii() {
                return Err(bad("an ASCII string with other bytes"));
            }
            text.extend(raw.iter().map(|&b| b as char));
        }
        // Latin-1: each byte is its code point.
        1 => text.extend(raw.iter().map(|&b| b as char)),
        2 => text.extend(
            raw.chunks_exact(2)
                .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
                .map(|c| char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER)),
        ),
        _ => {
            for c in raw.chunks_exact(4) {
                let c = u32::from_le_bytes(c.try_into().expect("4 bytes"));
                if c > 0x10ffff {
                    return Err(bad("not a code point"));
                }
                // Lone surrogates are valid Python text, not Rust's.
                text.push(char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER));
            }
        }
    }
    if cut {
        text.push('…');
    }
    Ok(text)
}

/// A `bytes` object's contents, at most [`MAX_LINE_TABLE`].
fn read_bytes_object(memory: &dyn Memory, address: u64) -> Result<Vec<u8>, CodeError> {
    let bad = |why| CodeError::BadLineTable { at: address, why };
    let header = memory.read(address, BYTES_DATA)?;
    let size = word(&header, OB_SIZE);
    if size as usize > MAX_LINE_TABLE || size > MAX_LINE_TABLE as u64 {
        return Err(bad("larger than a location table is read"));
    }
    memory.read(address + BYTES_DATA as u64, size as usize)
}

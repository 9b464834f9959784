//! Recognising CPython in a mapped file: the executable or a `libpython3.X`
//! that exports `_PyRuntime` and `Py_Version` (dynamic symbols: Debian's
//! `/usr/bin/python3` has no `.symtab`). The file is hostile input: parsed
//! lazily (`object`'s read cache), symbols looked through up to a bound,
//! and the few bytes read from it (the version, 3.13+'s debug offsets)
//! read at checked offsets.

use std::{fs::File, os::unix::fs::FileExt};

use object::{Object, ObjectSegment, ObjectSymbol, read::ReadCache};
use profiler_common::python::PyProcConfig;

use super::{
    PyVersion,
    offsets::{DEBUG_OFFSETS_LEN, for_version, from_debug_offsets},
};
use crate::process::normalize::AddressSpace;

/// Dynamic symbols looked through at most per file.
const MAX_SYMBOLS: usize = 1 << 20;

/// What a file says about CPython.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inspection {
    /// It does not export `_PyRuntime`: not an interpreter.
    NotPython,
    /// CPython: its version, where `_PyRuntime` lies in the file, and the
    /// offsets of its version (`runtime` still 0).
    Python(Interpreter),
    /// It exports `_PyRuntime` but is not a CPython allocprof can walk:
    /// why (said once, as a warning).
    Unsupported(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interpreter {
    pub version: PyVersion,
    /// File offset of `_PyRuntime` (initialized data: it has one).
    pub runtime_offset: u64,
    pub config: PyProcConfig,
}

/// Looks at a file a process maps executable.
pub fn inspect(file: &File) -> Inspection {
    let cache = ReadCache::new(file);
    let Ok(elf) = object::File::parse(&cache) else {
        return Inspection::NotPython;
    };
    let (mut runtime, mut version) = (None, None);
    for symbol in elf.dynamic_symbols().take(MAX_SYMBOLS) {
        if symbol.is_undefined() {
            continue;
        }
        match symbol.name_bytes() {
            Ok(b"_PyRuntime") => runtime = Some(symbol.address()),
            Ok(b"Py_Version") => version = Some(symbol.address()),
            _ => continue,
        }
        if runtime.is_some() && version.is_some() {
            break;
        }
    }
    let Some(runtime) = runtime else {
        return Inspection::NotPython;
    };
    let segments: Vec<(u64, u64, u64, u64)> = elf
        .segments()
        .map(|s| {
            let (offset, size) = s.file_range();
            (s.address(), size, offset, s.size())
        })
        .collect();
    let file_offset = |vaddr: u64| {
        segments
            .iter()
            .find(|&&(address, file_size, _, _)| vaddr >= address && vaddr - address < file_size)
            .map(|&(address, _, offset, _)| offset + (vaddr - address))
    };
    let Some(version) = version else {
        return Inspection::Unsupported(
            "exports _PyRuntime but no Py_Version (not CPython 3.11 or later)".into(),
        );
    };
    let mut hex = [0u8; 4];
    let read = file_offset(version).map(|at| file.read_exact_at(&mut hex, at));
    if !matches!(read, Some(Ok(()))) {
        return Inspection::Unsupported("its Py_Version cannot be read".into());
    }
    let hex = u32::from_le_bytes(hex);
    let version = PyVersion {
        major: (hex >> 24) as u8,
        minor: (hex >> 16) as u8,
        micro: (hex >> 8) as u8,
    };
    let Some(runtime_offset) = file_offset(runtime) else {
        return Inspection::Unsupported(format!(
            "CPython {version}: _PyRuntime has no file contents"
        ));
    };
    let config = if (version.major, version.minor) >= (3, 13) && version.major == 3 {
        let mut bytes = vec![0u8; DEBUG_OFFSETS_LEN];
        if file.read_exact_at(&mut bytes, runtime_offset).is_err() {
            return Inspection::Unsupported(format!(
                "CPython {version}: its _Py_DebugOffsets cannot be read"
            ));
        }
        match from_debug_offsets(&bytes, version) {
            Ok(config) => config,
            Err(e) => return Inspection::Unsupported(format!("CPython {version}: {e}")),
        }
    } else {
        match for_version(version) {
            Some(config) => config,
            None => {
                return Inspection::Unsupported(format!(
                    "CPython {version}: no frame offsets for this version (3.11 and later)"
                ));
            }
        }
    };
    Inspection::Python(Interpreter {
        version,
        runtime_offset,
        config,
    })
}

/// Where `_PyRuntime` is in a process: the mapping of `file` that maps
/// `runtime_offset`.
pub fn runtime_address(
    space: &AddressSpace,
    file: crate::ids::FileId,
    runtime_offset: u64,
) -> Option<u64> {
    space
        .mappings()
        .iter()
        .filter(|m| m.file.open.as_ref().is_some_and(|f| f.id == file))
        .find(|m| runtime_offset >= m.offset && runtime_offset - m.offset < m.end - m.start)
        .map(|m| m.start + (runtime_offset - m.offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &str) -> File {
        File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn debian_python_is_recognised() {
        // Debian 12's python3 (3.11.2): no .symtab, its symbols in .dynsym.
        let Inspection::Python(i) = inspect(&open("/usr/bin/python3.11")) else {
            panic!("/usr/bin/python3.11 is CPython");
        };
        assert_eq!((i.version.major, i.version.minor), (3, 11));
        assert_eq!(i.config, for_version(i.version).unwrap());
        assert!(i.runtime_offset > 0);
    }

    #[test]
    fn other_files_are_not_python() {
        for path in ["/bin/sh", "/etc/passwd", "/dev/null"] {
            assert_eq!(inspect(&open(path)), Inspection::NotPython, "{path}");
        }
    }
}

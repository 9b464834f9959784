//! How a CPython process allocates its objects, read from its interpreter's
//! state: `_PyRuntime.preconfig.allocator`, the allocator the interpreter
//! set up from `PYTHONMALLOC` and `-X dev` at start-up. Under pymalloc,
//! objects of 512 bytes and less come from arenas pymalloc maps itself,
//! which no `malloc` sampler sees; under `PYTHONMALLOC=malloc` every object
//! is a `malloc`.

use serde::{Deserialize, Serialize};

use super::{PyVersion, code::Memory};

/// What serves a CPython process's objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ObjectAllocator {
    /// pymalloc (the default): objects of 512 bytes and less are not seen.
    Pymalloc,
    /// `malloc` (`PYTHONMALLOC=malloc`): every object is seen.
    Malloc,
}

/// The largest object pymalloc serves (`SMALL_REQUEST_THRESHOLD`).
pub const PYMALLOC_MAX_OBJECT: u64 = 512;

/// A CPython process, as the profile says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PythonRuntime {
    pub version: PyVersion,
    /// `None`: its allocator could not be read.
    pub objects: Option<ObjectAllocator>,
}

impl PythonRuntime {
    /// What the profile shows of it, and what it does not.
    pub fn describe(&self) -> String {
        let version = self.version;
        match self.objects {
            Some(ObjectAllocator::Pymalloc) => format!(
                "CPython {version}, objects through pymalloc: those of {PYMALLOC_MAX_OBJECT} bytes \
                 and less come from its arenas, which no sample sees (start it with \
                 PYTHONMALLOC=malloc to profile them)"
            ),
            Some(ObjectAllocator::Malloc) => format!(
                "CPython {version}, objects through malloc (PYTHONMALLOC=malloc): all are sampled"
            ),
            None => format!("CPython {version}, its object allocator unreadable"),
        }
    }
}

/// Offset of `_PyRuntime.preconfig.allocator` (an `int`), per minor
/// version: `offsetof(_PyRuntimeState, preconfig) + offsetof(PyPreConfig,
/// allocator)` from each version's headers (3.11.7, 3.12.1 and 3.13.0,
/// checked against running interpreters: Debian's 3.11.2 agrees).
pub fn preconfig_allocator_offset(version: PyVersion) -> Option<u64> {
    match (version.major, version.minor) {
        (3, 11) => Some(600 + 36),
        (3, 12) => Some(3000 + 36),
        (3, 13) => Some(10360 + 36),
        _ => None,
    }
}

/// `PyMemAllocatorName` → what serves objects: the default, `pymalloc` and
/// the debug hooks over them are pymalloc; `malloc` and `malloc_debug` are
/// malloc. Anything else is not an allocator name.
pub fn object_allocator(name: i32) -> Option<ObjectAllocator> {
    match name {
        // NOT_SET, DEFAULT, DEBUG, PYMALLOC, PYMALLOC_DEBUG.
        0 | 1 | 2 | 5 | 6 => Some(ObjectAllocator::Pymalloc),
        // MALLOC, MALLOC_DEBUG.
        3 | 4 => Some(ObjectAllocator::Malloc),
        _ => None,
    }
}

/// What serves the objects of the interpreter whose `_PyRuntime` is at
/// `runtime` (one bounded read of the target).
pub fn read_object_allocator(
    memory: &dyn Memory,
    runtime: u64,
    version: PyVersion,
) -> Option<ObjectAllocator> {
    let at = runtime.checked_add(preconfig_allocator_offset(version)?)?;
    let bytes = memory.read(at, 4).ok()?;
    object_allocator(i32::from_ne_bytes(bytes.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_names_map_to_what_serves_objects() {
        assert_eq!(object_allocator(0), Some(ObjectAllocator::Pymalloc));
        assert_eq!(object_allocator(2), Some(ObjectAllocator::Pymalloc));
        assert_eq!(object_allocator(3), Some(ObjectAllocator::Malloc));
        assert_eq!(object_allocator(4), Some(ObjectAllocator::Malloc));
        assert_eq!(object_allocator(7), None);
        assert_eq!(object_allocator(-1), None);
    }

    /// The offsets read what each interpreter on this machine was started
    /// with (through its own memory: ctypes reads `_PyRuntime`).
    #[test]
    fn the_offsets_read_the_running_interpreters_allocator() {
        let mut pythons = vec!["/usr/bin/python3".to_string()];
        pythons.extend(
            ["3.11.7", "3.12.1", "3.13.0"]
                .iter()
                .map(|v| format!("/root/.pyenv/versions/{v}/bin/python3"))
                .filter(|p| std::path::Path::new(p).exists()),
        );
        for python in pythons {
            for (env, want) in [("malloc", 3), ("pymalloc", 5), ("debug", 2)] {
                let out = std::process::Command::new(&python)
                    .env("PYTHONMALLOC", env)
                    .args([
                        "-c",
                        "import ctypes, sys\n\
                         a = ctypes.addressof(ctypes.c_int.in_dll(ctypes.pythonapi, '_PyRuntime'))\n\
                         print(sys.version_info[0], sys.version_info[1], a)",
                    ])
                    .output()
                    .unwrap();
                let text = String::from_utf8(out.stdout).unwrap();
                let f: Vec<u64> = text
                    .split_whitespace()
                    .map(|w| w.parse().unwrap())
                    .collect();
                let version = PyVersion {
                    major: f[0] as u8,
                    minor: f[1] as u8,
                    micro: 0,
                };
                let offset = preconfig_allocator_offset(version).expect("a known version");
                let out = std::process::Command::new(&python)
                    .env("PYTHONMALLOC", env)
                    .args([
                        "-c",
                        &format!(
                            "import ctypes\n\
                             a = ctypes.addressof(ctypes.c_int.in_dll(ctypes.pythonapi, '_PyRuntime'))\n\
                             print(ctypes.c_int.from_address(a + {offset}).value)"
                        ),
                    ])
                    .output()
                    .unwrap();
                let read: i32 = String::from_utf8(out.stdout)
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap();
                assert_eq!(read, want, "{python} with PYTHONMALLOC={env}");
            }
        }
    }
}

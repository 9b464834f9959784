//! How a CPython process allocates its objects, read from its interpreter's
//! state: `_PyRuntime.preconfig.allocator`, the allocator the interpreter
//! set up from `PYTHONMALLOC` and `-X dev` at start-up. Under pymalloc,
//! objects of 512 bytes and less come from arenas pymalloc maps itself,
//! which no `malloc` sampler sees; under `PYTHONMALLOC=malloc` every object
//! is a `malloc`.

use serde::{Deserialize, Serialize};

use profiler_common::python::{PyProcConfig, py_plausible};

use super::{
    PyVersion,
    code::{CodeError, Memory},
};

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

/// Offset, in `PyInterpreterState`, of its `runtime`: the pointer back to
/// the `_PyRuntime` it belongs to, just after its `threads` (3.11, 3.12:
/// `next_unique_id`, `head`, `count`, `stacksize`; 3.13 added `main`).
/// Checked against running interpreters (`python/runtime.rs`' tests).
pub fn interp_runtime_offset(version: PyVersion, config: &PyProcConfig) -> Option<u64> {
    let after_head = match (version.major, version.minor) {
        (3, 11) | (3, 12) => 24,
        (3, 13) => 32,
        _ => return None,
    };
    Some(u64::from(config.interp_threads_head) + after_head)
}

/// Why a runtime is no CPython runtime.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotARuntime {
    #[error("its _PyRuntime's interpreter list ({0:#x}) is no pointer")]
    Head(u64),
    #[error("its _PyRuntime's interpreter ({0:#x}) cannot be read")]
    Unreadable(u64),
    #[error("its _PyRuntime's interpreter ({0:#x}) does not point back at it")]
    NoBackPointer(u64),
}

/// Whether the `_PyRuntime` at `runtime` of a file that claims to be
/// CPython `version` reads as one (two bounded reads of the target): its
/// `interpreters.head` is null (not initialised yet: the kernel finds no
/// thread state there, and a CPython caught before `Py_Initialize` must
/// not be refused) or a readable interpreter whose `runtime` points back
/// at `runtime`. `Ok` too when the target's memory is not read (the kernel
/// stays bounded whatever it reads: this is only to say it once).
pub fn check_runtime(
    memory: &dyn Memory,
    runtime: u64,
    version: PyVersion,
    config: &PyProcConfig,
) -> Result<(), NotARuntime> {
    let word = |at: u64| -> Result<u64, CodeError> {
        let bytes = memory.read(at, 8)?;
        let bytes = bytes.try_into().map_err(|_| CodeError::Unreadable(at))?;
        Ok(u64::from_ne_bytes(bytes))
    };
    let head = match word(runtime.wrapping_add(u64::from(config.runtime_interpreters_head))) {
        Ok(head) => head,
        // Not read now (blocked, gone): not judged.
        Err(CodeError::Blocked(_)) => return Ok(()),
        // `runtime` is where the file maps it: unreadable there is no runtime.
        Err(_) => return Err(NotARuntime::Unreadable(runtime)),
    };
    if head == 0 {
        return Ok(());
    }
    if !py_plausible(head) {
        return Err(NotARuntime::Head(head));
    }
    let Some(offset) = interp_runtime_offset(version, config) else {
        return Ok(());
    };
    match word(head.wrapping_add(offset)) {
        Ok(back) if back == runtime => Ok(()),
        Ok(_) => Err(NotARuntime::NoBackPointer(head)),
        Err(CodeError::Blocked(_)) => Ok(()),
        Err(_) => Err(NotARuntime::Unreadable(head)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Debian's python3 and pyenv's 3.11, 3.12 and 3.13: every CPython of
    /// this machine kind (a missing one fails the test, never skips it).
    fn machine_pythons() -> Vec<String> {
        let mut pythons = vec!["/usr/bin/python3".to_string()];
        for v in ["3.11.7", "3.12.1", "3.13.0"] {
            let python = format!("/root/.pyenv/versions/{v}/bin/python3");
            assert!(
                std::path::Path::new(&python).exists(),
                "{python} is missing: this machine kind has pyenv's CPython {v}"
            );
            pythons.push(python);
        }
        pythons
    }

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
        let pythons = machine_pythons();
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

    /// A target's memory: regions by address.
    struct Regions(Vec<(u64, Vec<u8>)>);

    impl Memory for Regions {
        fn read(&self, address: u64, len: usize) -> Result<Vec<u8>, CodeError> {
            self.0
                .iter()
                .find_map(|(start, bytes)| {
                    let from = usize::try_from(address.checked_sub(*start)?).ok()?;
                    bytes.get(from..from.checked_add(len)?).map(<[u8]>::to_vec)
                })
                .ok_or(CodeError::Unreadable(address))
        }
    }

    fn words(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn a_runtime_is_checked_through_its_interpreter() {
        let version = PyVersion {
            major: 3,
            minor: 11,
            micro: 4,
        };
        let config = crate::python::offsets::for_version(version).unwrap();
        let (runtime, interp) = (0x10_0000u64, 0x20_0000u64);
        let with_head = |head: u64| {
            let mut r = vec![0u64; 64];
            r[config.runtime_interpreters_head as usize / 8] = head;
            words(&r)
        };
        let mut interp_words = vec![0u64; 64];
        interp_words[interp_runtime_offset(version, &config).unwrap() as usize / 8] = runtime;
        let check = |regions: Vec<(u64, Vec<u8>)>| {
            check_runtime(&Regions(regions), runtime, version, &config)
        };
        // A real one, and one not initialised yet.
        assert_eq!(
            check(vec![
                (runtime, with_head(interp)),
                (interp, words(&interp_words))
            ]),
            Ok(())
        );
        assert_eq!(check(vec![(runtime, with_head(0))]), Ok(()));
        // Garbage, an unmapped interpreter, one of another runtime, no runtime.
        assert_eq!(
            check(vec![(runtime, with_head(0x4141_4141_4141_4141))]),
            Err(NotARuntime::Head(0x4141_4141_4141_4141))
        );
        assert_eq!(
            check(vec![(runtime, with_head(interp))]),
            Err(NotARuntime::Unreadable(interp))
        );
        assert_eq!(
            check(vec![
                (runtime, with_head(interp)),
                (interp, words(&[0; 64]))
            ]),
            Err(NotARuntime::NoBackPointer(interp))
        );
        assert_eq!(check(vec![]), Err(NotARuntime::Unreadable(runtime)));
        // Memory not read: not judged.
        assert_eq!(
            check_runtime(&crate::python::code::NoMemory, runtime, version, &config),
            Ok(())
        );
    }

    /// A target's memory through /proc/PID/mem.
    struct ProcMem(std::fs::File);

    impl Memory for ProcMem {
        fn read(&self, address: u64, len: usize) -> Result<Vec<u8>, CodeError> {
            use std::os::unix::fs::FileExt;
            let mut bytes = vec![0u8; len];
            self.0
                .read_exact_at(&mut bytes, address)
                .map_err(|_| CodeError::Unreadable(address))?;
            Ok(bytes)
        }
    }

    /// Every CPython on this machine passes the check once initialised:
    /// the back pointer's offset is right for each version (the runtime
    /// found as a session finds it: the mapped file that exports it).
    #[test]
    fn running_interpreters_pass_the_runtime_check() {
        use std::io::{BufRead, BufReader};
        let pythons = machine_pythons();
        for python in pythons {
            let mut child = std::process::Command::new(&python)
                .args([
                    "-c",
                    "import sys; print('ready', flush=True); sys.stdin.read()",
                ])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            BufReader::new(child.stdout.as_mut().unwrap())
                .read_line(&mut line)
                .unwrap();
            assert_eq!(line.trim(), "ready");
            let pid = child.id();
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
            let mut found = None;
            for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
                let Ok(file) = std::fs::File::open(path) else {
                    continue;
                };
                if let crate::python::discover::Inspection::Python(i) =
                    crate::python::discover::inspect(&file)
                {
                    found = Some((path.to_string(), i));
                    break;
                }
            }
            let (path, interp) = found.unwrap_or_else(|| panic!("{python}: no CPython mapped"));
            // The mapping of the file that holds the runtime's file offset.
            let runtime = maps
                .lines()
                .filter(|l| l.ends_with(&path))
                .find_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    let (start, end) = f[0].split_once('-')?;
                    let start = u64::from_str_radix(start, 16).ok()?;
                    let end = u64::from_str_radix(end, 16).ok()?;
                    let offset = u64::from_str_radix(f[2], 16).ok()?;
                    (interp.runtime_offset >= offset
                        && interp.runtime_offset - offset < end - start)
                        .then(|| start + interp.runtime_offset - offset)
                })
                .unwrap_or_else(|| panic!("{python}: its runtime is not mapped"));
            let memory = ProcMem(std::fs::File::open(format!("/proc/{pid}/mem")).unwrap());
            let head = memory
                .read(
                    runtime + u64::from(interp.config.runtime_interpreters_head),
                    8,
                )
                .unwrap();
            assert_ne!(head, [0; 8], "{python}: initialised, its list is not empty");
            assert_eq!(
                check_runtime(&memory, runtime, interp.version, &interp.config),
                Ok(()),
                "{python} ({})",
                interp.version
            );
            // Another address is not its runtime.
            assert!(
                check_runtime(&memory, runtime + 8, interp.version, &interp.config).is_err(),
                "{python}"
            );
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

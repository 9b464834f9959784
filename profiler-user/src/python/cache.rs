//! The code objects a process's stacks name, read once and kept while the
//! process lives (the session holds one cache per process image, dropped
//! with it), bounded in entries and bytes.
//!
//! A code object may be freed and another allocated at its address: each
//! time a new stack names a cached address, the object's header is read
//! again and must match the cached [`Fingerprint`] (type, size, the name,
//! file and table objects it points to, first line), else the code is read
//! anew; what no longer reads as a code object is shown as
//! [`FREED_MARKER`], never under the name it had. The kernel printed the
//! same fields of each frame's code object when the stack was new
//! (`profiler_common::python::py_code_print`): a frame whose object reads
//! with another print ran code since freed (even if another was made at
//! its address before the stack was first read), and is shown freed too.
//! So is a frame whose instruction index lies past its code's end.
//!
//! The interpreter's code type is learnt from the first object whose type
//! is named `"code"` (or given): every later object must have that type.

use std::{collections::HashMap, sync::Arc};

use profiler_common::python::{PY_TRUNCATED_FRAME, decode_python_frame};

use super::{
    code::{self, Code, CodeError, Layout, Memory},
    merge::PyItem,
};
use crate::symbolize::Frame;

/// A Python frame whose code object is gone (or never was one).
pub const FREED_MARKER: &str = "[python code freed]";
/// A Python frame whose process's memory is not read (see
/// `process::target_memory`).
pub const UNREADABLE_MARKER: &str = "[python code unreadable]";
/// Where the kernel cut a Python walk short.
pub const TRUNCATED_MARKER: &str = "[python stack truncated]";
/// A Python frame of an interpreter whose code objects cannot be read (a
/// version without a layout, or not recognised).
pub const UNSUPPORTED_MARKER: &str = "[python code of an unknown or unsupported version]";

/// How much a cache holds, at most.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub entries: usize,
    pub bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            entries: 16 << 10,
            bytes: 16 << 20,
        }
    }
}

/// One process image's code objects, by address.
#[derive(Default)]
pub struct CodeCache {
    entries: HashMap<u64, Arc<Code>>,
    bytes: usize,
    limits: Limits,
    /// The interpreter's `PyCode_Type`, given or learnt.
    code_type: Option<u64>,
}

impl CodeCache {
    pub fn with_limits(limits: Limits) -> CodeCache {
        CodeCache {
            limits,
            ..CodeCache::default()
        }
    }

    /// Sets the interpreter's code type, where known from its symbols.
    pub fn set_code_type(&mut self, address: u64) {
        self.code_type = Some(address);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The Python part of a kernel stack (after `PY_STACK_BEGIN`), each
    /// frame resolved or a marker in its place, innermost first. `prints`:
    /// the kernel's prints of its frames' code objects, one per frame in
    /// order, any past the last frame unread (a frame without one is shown
    /// freed); `None` where no prints were taken (the frames are then
    /// checked only against the cache).
    pub fn resolve(
        &mut self,
        memory: &dyn Memory,
        layout: Result<Layout, CodeError>,
        python: &[u64],
        prints: Option<&[u32]>,
    ) -> Vec<PyItem> {
        // Each address is checked once per stack.
        let mut seen: HashMap<u64, Result<Arc<Code>, CodeError>> = HashMap::new();
        let mut items = Vec::with_capacity(python.len());
        let mut prints = prints.map(|p| p.iter());
        for &value in python {
            if value == PY_TRUNCATED_FRAME {
                items.push(PyItem {
                    frame: Frame::python_marker(TRUNCATED_MARKER),
                    entry: true,
                });
                continue;
            }
            let Some(frame) = decode_python_frame(value) else {
                continue; // no other value follows PY_STACK_BEGIN
            };
            let code = match &layout {
                Ok(layout) => seen
                    .entry(frame.code)
                    .or_insert_with(|| self.lookup(memory, layout, frame.code))
                    .clone(),
                Err(e) => Err(e.clone()),
            };
            // The print the kernel took of this frame's code, if it took any.
            let sampled = prints.as_mut().map(|p| p.next().copied());
            let resolved = match code {
                Ok(code)
                    if frame.instr.is_none_or(|i| code.holds(i))
                        && sampled.is_none_or(|p| p == Some(code.fingerprint.kernel_print)) =>
                {
                    Frame::python(
                        &code.qualname,
                        &code.filename,
                        frame.instr.and_then(|i| code.line(i)),
                    )
                }
                Ok(_) => Frame::python_marker(FREED_MARKER),
                Err(CodeError::Blocked(_)) => Frame::python_marker(UNREADABLE_MARKER),
                Err(CodeError::Unsupported(_) | CodeError::NoVersion) => {
                    Frame::python_marker(UNSUPPORTED_MARKER)
                }
                Err(_) => Frame::python_marker(FREED_MARKER),
            };
            items.push(PyItem {
                frame: resolved,
                entry: frame.entry,
            });
        }
        items
    }

    /// The code object at `address`: the cached one if its header still
    /// matches, else read anew.
    fn lookup(
        &mut self,
        memory: &dyn Memory,
        layout: &Layout,
        address: u64,
    ) -> Result<Arc<Code>, CodeError> {
        if let Some(cached) = self.entries.get(&address) {
            match code::read_fingerprint(memory, layout, address, self.code_type) {
                Ok(print) if print == cached.fingerprint => return Ok(cached.clone()),
                Err(e @ CodeError::Blocked(_)) => return Err(e),
                // Freed, maybe reused: never the old name.
                _ => self.forget(address),
            }
        }
        let code = code::read_code(memory, layout, address, self.code_type)?;
        if self.code_type.is_none() {
            // Learnt from the first object that is a code object.
            if code::type_name(memory, code.fingerprint.ob_type)? != "code" {
                return Err(CodeError::NotCode {
                    at: address,
                    why: "its type is not named \"code\"",
                });
            }
            self.code_type = Some(code.fingerprint.ob_type);
        }
        let code = Arc::new(code);
        self.insert(address, code.clone());
        Ok(code)
    }

    fn insert(&mut self, address: u64, code: Arc<Code>) {
        let bytes = code.heap_bytes();
        if bytes > self.limits.bytes {
            return;
        }
        while self.entries.len() >= self.limits.entries || self.bytes + bytes > self.limits.bytes {
            // Any entry: a stack is resolved once, so no order is better.
            let Some(&victim) = self.entries.keys().next() else {
                break;
            };
            self.forget(victim);
        }
        self.bytes += bytes;
        self.entries.insert(address, code);
    }

    fn forget(&mut self, address: u64) {
        if let Some(old) = self.entries.remove(&address) {
            self.bytes -= old.heap_bytes();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::Cell, collections::BTreeMap};

    use profiler_common::python::{PY_NAME_PRINT_WORDS, PY_NO_PRINT, encode_python_frame};

    use super::*;
    use crate::python::PyVersion;

    /// A target's memory: regions by address; reads counted.
    #[derive(Default)]
    struct Fake {
        regions: BTreeMap<u64, Vec<u8>>,
        reads: Cell<usize>,
    }

    impl Memory for Fake {
        fn read(&self, address: u64, len: usize) -> Result<Vec<u8>, CodeError> {
            self.reads.set(self.reads.get() + 1);
            let (&start, bytes) = self
                .regions
                .range(..=address)
                .next_back()
                .ok_or(CodeError::Unreadable(address))?;
            let from = (address - start) as usize;
            bytes
                .get(from..from + len)
                .map(<[u8]>::to_vec)
                .ok_or(CodeError::Unreadable(address))
        }
    }

    const TYPE: u64 = 0x10_0000;
    const OTHER_TYPE: u64 = 0x11_0000;

    fn put(bytes: &mut [u8], at: usize, value: &[u8]) {
        bytes[at..at + value.len()].copy_from_slice(value);
    }

    impl Fake {
        /// The interpreter's code type (named "code") and another type.
        fn new() -> Fake {
            let mut fake = Fake::default();
            for (address, name) in [(TYPE, "code"), (OTHER_TYPE, "bytes")] {
                let mut ty = vec![0u8; 64];
                put(&mut ty, 24, &(address + 0x100).to_le_bytes());
                fake.regions.insert(address, ty);
                // A C string within its page (read up to the page's end).
                let mut name = format!("{name}\0").into_bytes();
                name.resize(64, 0xaa);
                fake.regions.insert(address + 0x100, name);
            }
            fake
        }

        /// Sets the first word (the reference count) of the object at
        /// `address`.
        fn first_word(&mut self, address: u64, value: u64) {
            let object = self.regions.get_mut(&address).expect("an object there");
            put(object, 0, &value.to_le_bytes());
        }

        /// A compact ASCII string (3.11's layout).
        fn string(&mut self, address: u64, text: &str) {
            let mut s = vec![0u8; 48];
            put(&mut s, 16, &(text.len() as u64).to_le_bytes());
            s[32] = 0b1110_0100; // ready, ascii, compact, kind 1
            s.extend_from_slice(text.as_bytes());
            // Its terminator, and as far as a print reads.
            s.resize(s.len().max(PY_NAME_PRINT_WORDS * 8), 0);
            self.regions.insert(address, s);
        }

        /// A code object of `units` code units, each on its own line from
        /// `first` (a no-column entry per unit).
        fn code(&mut self, address: u64, ty: u64, name: &str, first: i32, units: u64) {
            let (qualname, filename, table) =
                (address + 0x1000, address + 0x2000, address + 0x3000);
            self.string(qualname, name);
            self.string(filename, "/app/server.py");
            let mut bytes = vec![0u8; 32];
            put(&mut bytes, 16, &units.to_le_bytes());
            for i in 0..units {
                // No columns, one unit, line +1 after the first.
                bytes.push(0x80 | (13 << 3));
                bytes.push(if i == 0 { 0 } else { 2 });
            }
            put(&mut bytes, 16, &(2 * units).to_le_bytes());
            self.regions.insert(table, bytes);
            let mut code = vec![0u8; 200];
            put(&mut code, 0, &1u64.to_le_bytes()); // alive: one reference
            put(&mut code, 8, &ty.to_le_bytes());
            put(&mut code, 16, &units.to_le_bytes());
            put(&mut code, 72, &first.to_le_bytes());
            put(&mut code, 112, &filename.to_le_bytes());
            put(&mut code, 128, &qualname.to_le_bytes());
            put(&mut code, 136, &table.to_le_bytes());
            self.regions.insert(address, code);
        }
    }

    fn layout() -> Result<Layout, CodeError> {
        Layout::for_version(PyVersion {
            major: 3,
            minor: 11,
            micro: 2,
        })
    }

    fn names(items: &[PyItem]) -> Vec<String> {
        items
            .iter()
            .map(|i| match &i.frame.location {
                Some(l) => format!("{} {l}", i.frame.function),
                None => i.frame.function.to_string(),
            })
            .collect()
    }

    #[test]
    fn code_is_read_once_and_checked_by_its_header_after() {
        let mut fake = Fake::new();
        fake.code(0x40_0000, TYPE, "handle_request", 40, 10);
        fake.code(0x50_0000, TYPE, "Server.run", 7, 4);
        let mut cache = CodeCache::default();
        let stack = [
            encode_python_frame(0x40_0000, 2, false),
            encode_python_frame(0x50_0000, 3, true),
            encode_python_frame(0x40_0000, 9, true),
        ];
        let items = cache.resolve(&fake, layout(), &stack, None);
        assert_eq!(
            names(&items),
            [
                "handle_request /app/server.py:42",
                "Server.run /app/server.py:10",
                "handle_request /app/server.py:49"
            ]
        );
        assert_eq!(
            items.iter().map(|i| i.entry).collect::<Vec<_>>(),
            [false, true, true]
        );
        assert_eq!(cache.len(), 2);
        // A new stack naming them: one read of the header and one of the
        // name each.
        fake.reads.set(0);
        let again = cache.resolve(&fake, layout(), &stack[..2], None);
        assert_eq!(names(&again), names(&items[..2]));
        assert_eq!(fake.reads.get(), 4);
    }

    #[test]
    fn code_freed_and_reused_is_never_named_as_it_was() {
        let mut fake = Fake::new();
        fake.code(0x40_0000, TYPE, "doomed", 1, 4);
        let mut cache = CodeCache::default();
        let frame = [encode_python_frame(0x40_0000, 1, true)];
        assert_eq!(
            names(&cache.resolve(&fake, layout(), &frame, None)),
            ["doomed /app/server.py:2"]
        );
        // Another code object at the same address (its own strings).
        fake.code(0x40_0000, TYPE, "usurper", 1, 4);
        let mut moved = fake.regions[&0x40_0000].clone();
        put(&mut moved, 128, &0x70_0000u64.to_le_bytes());
        fake.string(0x70_0000, "usurper");
        fake.regions.insert(0x40_0000, moved);
        assert_eq!(
            names(&cache.resolve(&fake, layout(), &frame, None)),
            ["usurper /app/server.py:2"]
        );
        // An object of another type there: freed.
        fake.code(0x40_0000, OTHER_TYPE, "doomed", 1, 4);
        assert_eq!(
            names(&cache.resolve(&fake, layout(), &frame, None)),
            [FREED_MARKER]
        );
        assert!(cache.is_empty());
        // Unmapped: freed too.
        fake.regions.remove(&0x40_0000);
        assert_eq!(
            names(&cache.resolve(&fake, layout(), &frame, None)),
            [FREED_MARKER]
        );
    }

    /// What a freed block holds where its reference count was: the
    /// allocator's free-list link (a pointer into its page) or 0.
    const FREE_LINKS: [u64; 2] = [0x7f12_3456_7890, 0];

    /// A code object freed before a stack naming it is read keeps its
    /// header but for its first word; what it points to may be reused.
    #[test]
    fn code_freed_with_its_header_intact_is_never_named() {
        for link in FREE_LINKS {
            let mut fake = Fake::new();
            fake.code(0x40_0000, TYPE, "doomed", 1, 4);
            let sampled = [print_of(&fake, 0x40_0000)];
            let frame = [encode_python_frame(0x40_0000, 1, true)];
            let mut cache = CodeCache::default();
            assert_eq!(
                names(&cache.resolve(&fake, layout(), &frame, Some(&sampled))),
                ["doomed /app/server.py:2"]
            );
            fake.first_word(0x40_0000, link);
            // Cached, then freed; and first read once freed.
            assert_eq!(
                names(&cache.resolve(&fake, layout(), &frame, Some(&sampled))),
                [FREED_MARKER],
                "{link:#x}"
            );
            assert!(cache.is_empty());
            assert_eq!(
                names(&CodeCache::default().resolve(&fake, layout(), &frame, Some(&sampled))),
                [FREED_MARKER],
                "{link:#x}"
            );
        }
    }

    /// 3.12's and 3.13's immortal objects (deep-frozen code) hold
    /// `u32::MAX`, one more after an old stable-ABI extension's increment.
    #[test]
    fn immortal_code_is_alive() {
        for count in [u64::from(u32::MAX), u64::from(u32::MAX) + 1] {
            let mut fake = Fake::new();
            fake.code(0x40_0000, TYPE, "frozen", 1, 4);
            fake.first_word(0x40_0000, count);
            let frame = [encode_python_frame(0x40_0000, 1, true)];
            assert_eq!(
                names(&CodeCache::default().resolve(&fake, layout(), &frame, None)),
                ["frozen /app/server.py:2"],
                "{count:#x}"
            );
        }
    }

    /// Memory whose code object at `code` is freed once its header has
    /// been read `alive_reads` times.
    struct FreedWhileRead {
        fake: Fake,
        code: u64,
        alive_reads: usize,
        header_reads: Cell<usize>,
        link: u64,
    }

    impl Memory for FreedWhileRead {
        fn read(&self, address: u64, len: usize) -> Result<Vec<u8>, CodeError> {
            let mut bytes = self.fake.read(address, len)?;
            if address == self.code {
                self.header_reads.set(self.header_reads.get() + 1);
                if self.header_reads.get() > self.alive_reads {
                    bytes[..8].copy_from_slice(&self.link.to_le_bytes());
                }
            }
            Ok(bytes)
        }
    }

    /// Freed while its name, file and table were read: they may be
    /// another object's by then.
    #[test]
    fn code_freed_while_it_is_read_is_never_named() {
        for link in FREE_LINKS {
            let mut fake = Fake::new();
            fake.code(0x40_0000, TYPE, "doomed", 1, 4);
            let sampled = [print_of(&fake, 0x40_0000)];
            let memory = FreedWhileRead {
                fake,
                code: 0x40_0000,
                alive_reads: 1,
                header_reads: Cell::new(0),
                link,
            };
            let frame = [encode_python_frame(0x40_0000, 1, true)];
            let mut cache = CodeCache::default();
            cache.set_code_type(TYPE);
            assert_eq!(
                names(&cache.resolve(&memory, layout(), &frame, Some(&sampled))),
                [FREED_MARKER],
                "{link:#x}"
            );
            assert!(cache.is_empty());
        }
    }

    /// The print the kernel would have taken of the code object at
    /// `address` now.
    fn print_of(fake: &Fake, address: u64) -> u32 {
        code::read_fingerprint(fake, &layout().unwrap(), address, None)
            .unwrap()
            .kernel_print
    }

    #[test]
    fn a_frame_is_named_only_if_its_code_has_the_print_of_the_sample() {
        let mut fake = Fake::new();
        fake.code(0x40_0000, TYPE, "doomed", 1, 4);
        fake.code(0x50_0000, TYPE, "kept", 7, 4);
        let sampled = [print_of(&fake, 0x40_0000), print_of(&fake, 0x50_0000)];
        // Freed and another made at its address before the stack is read:
        // its own strings, the same first line and size.
        fake.code(0x40_0000, TYPE, "usurper", 1, 4);
        let mut moved = fake.regions[&0x40_0000].clone();
        put(&mut moved, 128, &0x70_0000u64.to_le_bytes());
        fake.string(0x70_0000, "usurper");
        fake.regions.insert(0x40_0000, moved);
        let stack = [
            encode_python_frame(0x40_0000, 1, false),
            PY_TRUNCATED_FRAME,
            encode_python_frame(0x50_0000, 0, true),
        ];
        let mut cache = CodeCache::default();
        let items = cache.resolve(&fake, layout(), &stack, Some(&sampled));
        assert_eq!(
            names(&items),
            [FREED_MARKER, TRUNCATED_MARKER, "kept /app/server.py:7"]
        );
        // The usurper itself, sampled now, is named (the cache holds it).
        let now = [print_of(&fake, 0x40_0000)];
        let items = cache.resolve(&fake, layout(), &stack[..1], Some(&now));
        assert_eq!(names(&items), ["usurper /app/server.py:2"]);
        // Unreadable at the sample, or no print filed: never named.
        for prints in [&[PY_NO_PRINT, sampled[1]][..], &[]] {
            let items = cache.resolve(&fake, layout(), &stack[2..], Some(prints));
            assert_eq!(names(&items), [FREED_MARKER], "{prints:?}");
        }
    }

    /// Freed, and another made from the same template where it was, its
    /// name, file and table objects where the freed one's were (an
    /// allocator reusing blocks last in, first out): every pointer and
    /// integer of the header the same, only the name's characters differ.
    #[test]
    fn code_made_again_over_all_of_a_freed_ones_objects_is_never_named_as_it() {
        let mut fake = Fake::new();
        fake.code(0x40_0000, TYPE, "fn_0008", 1, 4);
        let sampled = [print_of(&fake, 0x40_0000)];
        fake.string(0x40_1000, "decoy_0008");
        let frame = [encode_python_frame(0x40_0000, 1, true)];
        assert_eq!(
            names(&CodeCache::default().resolve(&fake, layout(), &frame, Some(&sampled))),
            [FREED_MARKER]
        );
        // The decoy itself, sampled now, is named.
        let now = [print_of(&fake, 0x40_0000)];
        assert_eq!(
            names(&CodeCache::default().resolve(&fake, layout(), &frame, Some(&now))),
            ["decoy_0008 /app/server.py:2"]
        );
    }

    #[test]
    fn the_code_type_is_learnt_from_its_name() {
        let mut fake = Fake::new();
        // The first object read is not a code object: refused, not learnt.
        fake.code(0x40_0000, OTHER_TYPE, "fake", 1, 4);
        fake.code(0x50_0000, TYPE, "real", 1, 4);
        let mut cache = CodeCache::default();
        let stack = [
            encode_python_frame(0x40_0000, 0, true),
            encode_python_frame(0x50_0000, 0, true),
        ];
        assert_eq!(
            names(&cache.resolve(&fake, layout(), &stack, None)),
            [FREED_MARKER, "real /app/server.py:1"]
        );
        assert_eq!(cache.code_type, Some(TYPE));
    }

    #[test]
    fn instructions_past_the_code_and_markers() {
        let mut fake = Fake::new();
        fake.code(0x40_0000, TYPE, "f", 1, 4);
        let mut cache = CodeCache::default();
        let stack = [
            encode_python_frame(0x40_0000, 4, false),
            encode_python_frame(0x40_0000, -1, true),
            PY_TRUNCATED_FRAME,
        ];
        let items = cache.resolve(&fake, layout(), &stack, None);
        assert_eq!(
            names(&items),
            [FREED_MARKER, "f /app/server.py", TRUNCATED_MARKER]
        );
        assert!(items[2].entry, "the marker ends its run");
        let unknown = cache.resolve(&fake, Err(CodeError::NoVersion), &stack[..1], None);
        assert_eq!(names(&unknown), [UNSUPPORTED_MARKER]);
        let gone = cache.resolve(&code::NoMemory, layout(), &stack[..1], None);
        assert_eq!(names(&gone), [UNREADABLE_MARKER]);
    }

    #[test]
    fn the_cache_is_bounded_in_entries_and_bytes() {
        let mut fake = Fake::new();
        for i in 0..10u64 {
            fake.code(0x40_0000 + i * 0x10_0000, TYPE, &format!("f{i}"), 1, 4);
        }
        let stack: Vec<u64> = (0..10u64)
            .map(|i| encode_python_frame(0x40_0000 + i * 0x10_0000, 0, true))
            .collect();
        let mut cache = CodeCache::with_limits(Limits {
            entries: 3,
            bytes: 1 << 20,
        });
        let items = cache.resolve(&fake, layout(), &stack, None);
        assert_eq!(items.len(), 10);
        assert!(items.iter().all(|i| i.frame.location.is_some()));
        assert_eq!(cache.len(), 3);
        let one = cache.bytes() / 3;
        let mut cache = CodeCache::with_limits(Limits {
            entries: 100,
            bytes: 2 * one + one / 2,
        });
        cache.resolve(&fake, layout(), &stack, None);
        assert_eq!(cache.len(), 2);
        assert!(cache.bytes() <= 2 * one + one / 2);
    }

    #[test]
    fn hostile_memory_never_panics() {
        let mut x = 0x9e37_79b9_u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..300 {
            let mut fake = Fake::new();
            let mut code = vec![0u8; 200];
            for b in code.iter_mut() {
                *b = next() as u8;
            }
            // Pointers into a scribbled region now and then.
            if next() % 2 == 0 {
                put(&mut code, 8, &TYPE.to_le_bytes());
                put(&mut code, 16, &(next() % 64).to_le_bytes());
                for at in [112, 128, 136] {
                    put(&mut code, at, &0x60_0000u64.to_le_bytes());
                }
                let junk: Vec<u8> = (0..256).map(|_| next() as u8).collect();
                fake.regions.insert(0x60_0000, junk);
            }
            fake.regions.insert(0x40_0000, code);
            let mut cache = CodeCache::default();
            cache.set_code_type(TYPE);
            let items = cache.resolve(
                &fake,
                layout(),
                &[encode_python_frame(0x40_0000, (next() % 70) as i64, true)],
                Some(&[next() as u32]),
            );
            assert_eq!(items.len(), 1);
        }
    }
}

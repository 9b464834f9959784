//! The code objects a process's stacks name, read once and kept while the
//! process lives (the session holds one cache per process image, dropped
//! with it), bounded in entries and bytes.
//!
//! A code object may be freed and another allocated at its address: each
//! time a new stack names a cached address, the object's header is read
//! again and must match the cached [`Fingerprint`] (type, size, the name,
//! file and table objects it points to, first line), else the code is read
//! anew; what no longer reads as a code object is shown as
//! [`FREED_MARKER`], never under the name it had. A frame whose instruction
//! index lies past its code's end did not run that code: also freed.
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
/// A Python frame of an interpreter whose code objects cannot be read.
pub const UNSUPPORTED_MARKER: &str = "[python code of an unsupported version]";

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
    /// frame resolved or a marker in its place, innermost first.
    pub fn resolve(
        &mut self,
        memory: &dyn Memory,
        layout: Result<Layout, CodeError>,
        python: &[u64],
    ) -> Vec<PyItem> {
        // Each address is checked once per stack.
        let mut seen: HashMap<u64, Result<Arc<Code>, CodeError>> = HashMap::new();
        let mut items = Vec::with_capacity(python.len());
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
            let resolved = match code {
                Ok(code) if frame.instr.is_none_or(|i| code.holds(i)) => Frame::python(
                    &code.qualname,
                    &code.filename,
                    frame.instr.and_then(|i| code.line(i)),
                ),
                Ok(_) => Frame::python_marker(FREED_MARKER),
                Err(CodeError::Blocked(_)) => Frame::python_marker(UNREADABLE_MARKER),
                Err(CodeError::Unsupported(_)) => Frame::python_marker(UNSUPPORTED_MARKER),
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

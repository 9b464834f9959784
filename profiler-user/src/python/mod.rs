//! CPython processes: their Python frames in heap stacks.
//!
//! The kernel files a thread's interpreter frames after its native ones
//! (`profiler_common::python`); user space recognises the interpreter of a
//! process and tells the kernel where its frames are, resolves each code
//! object the stacks name from the target's memory, and puts the Python
//! frames in the place of the native eval frames that ran them.

pub mod discover;
pub mod offsets;

/// A CPython version, as its `Py_Version` says (the layouts of its runtime,
/// frames and code objects depend on the minor version).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PyVersion {
    pub major: u8,
    pub minor: u8,
    pub micro: u8,
}

impl std::fmt::Display for PyVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)
    }
}

pub mod cache;
pub mod code;
pub mod linetable;
pub mod merge;
pub mod runtime;
#[cfg(test)]
mod tests;

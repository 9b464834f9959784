//! Unwind tables for code built without frame pointers (issue 11).
//!
//! [`compile`](compile_file) turns a file's call-frame information
//! (`.eh_frame`, `.debug_frame`) into the sorted [`UnwindRow`] table of
//! `profiler_common::unwind` that the kernel walks; [`unwind`] is that walk
//! on the host, the exact algorithm the kernel runs, so the tables are tested
//! against real stacks without BPF. Pure: no aya, no `/proc`.
//!
//! [`UnwindRow`]: profiler_common::unwind::UnwindRow

mod compile;
mod simulate;

pub use compile::{
    CompileError, ErrorKind, Limits, LoadSegment, TableStats, UnwindTable, compile_elf,
    compile_file, compile_open_file,
};
pub use simulate::{Mapping, Regs, Stop, Walk, unwind};

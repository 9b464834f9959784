//! Whole user stacks in code built without frame pointers (issue 11).
//!
//! [`compile`](compile_file) turns a file's call-frame information
//! (`.eh_frame`, `.debug_frame`) into the sorted [`UnwindRow`] table of
//! `profiler_common::unwind` that the kernel walks; [`unwind`] is that walk
//! on the host, the exact algorithm the kernel runs, so the tables are tested
//! against real stacks without BPF. Those two are pure: no aya, no `/proc`.
//! `tables.rs` takes each file's table from compile (on its own thread) to
//! the kernel's row array (ranges from `pool.rs`) and releases it when no
//! process maps the file.
//!
//! [`UnwindRow`]: profiler_common::unwind::UnwindRow

mod compile;
pub mod pool;
mod simulate;
pub mod tables;

pub(crate) use compile::compile_open_file;
pub use compile::{
    CompileError, ErrorKind, Limits, LoadSegment, TableStats, UnwindTable, bias, compile_elf,
    compile_file,
};
pub use simulate::{Mapping, Regs, Stop, Walk, unwind};

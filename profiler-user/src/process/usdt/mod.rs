//! USDT (SystemTap SDT) probe discovery: which probes a binary has, where to
//! attach a uprobe for each, and how to read their arguments.
//!
//! Two steps, deliberately separate so that one odd probe cannot hide the
//! others:
//!
//! 1. [`probes_in_open_file`] / [`probes_in_elf`] read the `.note.stapsdt` notes
//!    and translate each probe address into a file offset
//!    ([`UsdtProbe::file_offset`], a per-probe `Result`).
//! 2. [`parse_args`] (or [`UsdtProbe::spec`]) compiles a probe's argument
//!    string into the [`profiler_common::UsdtSpec`] the kernel evaluates.
//!    Callers run it only for the probes they attach to.

mod args;
mod notes;

pub use args::{ArgError, parse_args};
pub use notes::{
    ElfNotes, LocateError, NoteError, UsdtProbe, notes_in_elf, probes_in_elf, probes_in_file,
};
pub(crate) use notes::{notes_in_open_file, probes_in_open_file};

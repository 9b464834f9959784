//! Library half of allocprof, by what each part is:
//! - [`process`]: what is read from target processes (hostile input: every
//!   read bounded, none blocking): discovery, maps, pid namespaces, ledgers,
//!   allocator statistics, USDT notes;
//! - [`kernel`]: the kernel side (aya, BTF, batched map reads); the only
//!   module that talks to aya;
//! - [`model`]: the profile and its statistics (estimates, intervals, ages);
//! - [`symbolize`] and [`unwind`]: addresses to names, and `.eh_frame` to
//!   the kernel's unwind tables;
//! - [`session`]: a process's life, tying the above together;
//! - [`output`]: the text report, the export formats, atomic writes;
//! - [`agent`]: `allocprof agent`'s delivery of OTLP exports (queue,
//!   retries, OTLP/HTTP and OTLP/gRPC, TLS);
//! - [`oom`]: the images the OOM killer killed, written to disk;
//! - [`ids`]: the typed ids (host pid, our pid, thread, incarnation, file)
//!   every part above passes around.

pub mod agent;
pub mod ids;
pub mod kernel;
pub mod model;
pub mod oom;
pub mod output;
pub mod process;
pub mod python;
pub mod session;
pub mod symbolize;
pub mod unwind;

//! What allocprof reads from target processes. All of it is hostile input:
//! reads are bounded in size and time, files are known by device and inode,
//! and nothing here may block the session.

pub mod backend_stats;
pub mod discover;
pub mod ledger;
pub mod normalize;
pub(crate) mod pidns;
pub mod resource;
pub mod target_memory;
pub mod usdt;

//! The backend allocator's own figures (what it took from the system, what
//! is in use, what it holds free), published by `liballocprof*.so` in a
//! block of its memory for allocprof to read with `process_vm_readv`: the
//! profiled process is never called into, stopped or signalled.
//!
//! The block is [`WORDS`] little-endian `u64` words, indexed by [`word`]. The
//! library names it with an ELF note (section [`NOTE_SECTION`], owner
//! [`NOTE_OWNER`], type [`NOTE_TYPE`], descriptor: the block's link-time
//! address as one `u64`), so a reader finds it from the file alone.
//!
//! Writers follow a sequence lock: [`word::SEQ`] is odd while the figures
//! are rewritten and advances by 2 per refresh; a reader takes a copy whose
//! sequence is even and the same before and after (see [`decode`]).
//!
//! The block lives in memory the profiled program can write: every field is
//! checked and a block that fails a check is not used.

/// Section that carries the note naming the block.
pub const NOTE_SECTION: &[u8] = b".note.allocprof";
/// The note's owner.
pub const NOTE_OWNER: &[u8] = b"allocprof";
/// The note's type: "backend statistics block".
pub const NOTE_TYPE: u32 = 1;

/// First word of a block: `b"APBSTAT1"` read as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"APBSTAT1");
/// Layout version this crate reads and writes.
pub const VERSION: u64 = 1;

/// Word indices of the block.
pub mod word {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 1;
    /// Which backend filled it: [`super::BACKEND_MIMALLOC`] or [`super::BACKEND_GLIBC`].
    pub const BACKEND: usize = 2;
    /// Sequence lock: odd while the figures below are being rewritten.
    pub const SEQ: usize = 3;
    /// `CLOCK_MONOTONIC` nanoseconds of the last refresh; 0 before the first.
    pub const REFRESHED_NS: usize = 4;
    /// Address space the backend took from the system for the heap.
    pub const RESERVED: usize = 5;
    /// Of which committed (backed by memory when touched).
    pub const COMMITTED: usize = 6;
    /// In allocated blocks, allocator headers included.
    pub const IN_USE: usize = 7;
    /// Free, kept by the allocator for reuse.
    pub const FREE: usize = 8;
    /// In blocks mapped on their own (huge allocations).
    pub const MMAPPED: usize = 9;
}
/// Words in a block.
pub const WORDS: usize = 10;
/// Bytes in a block.
pub const BYTES: usize = WORDS * 8;

/// A figure the backend does not keep (mimalloc's release build does not
/// count bytes in use; glibc keeps none it gives cheaply).
pub const UNKNOWN: u64 = u64::MAX;

/// mimalloc: reserved and committed from its own statistics.
pub const BACKEND_MIMALLOC: u64 = 1;
/// glibc's malloc: every figure [`UNKNOWN`] (glibc gives them only by
/// walking its heap under its arena locks, too costly for a sampled `malloc`).
pub const BACKEND_GLIBC: u64 = 2;

/// Largest figure taken as real: 2^47 bytes (128 TiB), the x86-64 user
/// address space. Anything larger is garbage.
pub const MAX_FIGURE: u64 = 1 << 47;

/// The figures of a consistent block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendFigures {
    pub backend: u64,
    pub refreshed_ns: u64,
    pub reserved: Option<u64>,
    pub committed: Option<u64>,
    pub in_use: Option<u64>,
    pub free: Option<u64>,
    pub mmapped: Option<u64>,
}

/// Why a block's copy is not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockError {
    /// Not a block: wrong magic (not this library, or overwritten).
    Magic,
    /// A layout version this reader does not know.
    Version(u64),
    /// A backend this reader does not know.
    Backend(u64),
    /// Written while it was copied; copy again.
    Torn,
    /// The backend has not filled it yet.
    NotYetRefreshed,
    /// A figure beyond [`MAX_FIGURE`]. (Committed above reserved is not
    /// refused: the two counters are updated one after the other.)
    Implausible,
}

/// Decodes a block from two copies taken one after the other: they must
/// agree on an even sequence number (else [`BlockError::Torn`]).
pub fn decode(first: &[u64; WORDS], second: &[u64; WORDS]) -> Result<BackendFigures, BlockError> {
    let b = first;
    if b[word::MAGIC] != MAGIC {
        return Err(BlockError::Magic);
    }
    if b[word::VERSION] != VERSION {
        return Err(BlockError::Version(b[word::VERSION]));
    }
    let backend = b[word::BACKEND];
    if backend != BACKEND_MIMALLOC && backend != BACKEND_GLIBC {
        return Err(BlockError::Backend(backend));
    }
    let seq = b[word::SEQ];
    if seq % 2 == 1 || first != second {
        return Err(BlockError::Torn);
    }
    if b[word::REFRESHED_NS] == 0 {
        return Err(BlockError::NotYetRefreshed);
    }
    let figure = |i: usize| match b[i] {
        UNKNOWN => Ok(None),
        v if v <= MAX_FIGURE => Ok(Some(v)),
        _ => Err(BlockError::Implausible),
    };
    let figures = BackendFigures {
        backend,
        refreshed_ns: b[word::REFRESHED_NS],
        reserved: figure(word::RESERVED)?,
        committed: figure(word::COMMITTED)?,
        in_use: figure(word::IN_USE)?,
        free: figure(word::FREE)?,
        mmapped: figure(word::MMAPPED)?,
    };
    Ok(figures)
}

/// The backend's name, as reports show it.
pub fn backend_name(backend: u64) -> &'static str {
    match backend {
        BACKEND_MIMALLOC => "mimalloc",
        BACKEND_GLIBC => "glibc",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block() -> [u64; WORDS] {
        let mut b = [0; WORDS];
        b[word::MAGIC] = MAGIC;
        b[word::VERSION] = VERSION;
        b[word::BACKEND] = BACKEND_GLIBC;
        b[word::SEQ] = 4;
        b[word::REFRESHED_NS] = 1_000;
        b[word::RESERVED] = 1 << 20;
        b[word::COMMITTED] = 1 << 20;
        b[word::IN_USE] = 600 << 10;
        b[word::FREE] = 400 << 10;
        b[word::MMAPPED] = UNKNOWN;
        b
    }

    #[test]
    fn a_consistent_block_decodes_with_unknown_figures_as_none() {
        let b = block();
        let f = decode(&b, &b).unwrap();
        assert_eq!(f.backend, BACKEND_GLIBC);
        assert_eq!(f.in_use, Some(600 << 10));
        assert_eq!(f.mmapped, None);
    }

    #[test]
    fn torn_odd_foreign_and_garbage_blocks_are_refused() {
        let b = block();
        let mut odd = b;
        odd[word::SEQ] = 5;
        assert_eq!(decode(&odd, &odd), Err(BlockError::Torn));
        let mut moved = b;
        moved[word::SEQ] = 6;
        assert_eq!(decode(&b, &moved), Err(BlockError::Torn));
        let mut magic = b;
        magic[word::MAGIC] ^= 1;
        assert_eq!(decode(&magic, &magic), Err(BlockError::Magic));
        let mut version = b;
        version[word::VERSION] = 2;
        assert_eq!(decode(&version, &version), Err(BlockError::Version(2)));
        let mut backend = b;
        backend[word::BACKEND] = 7;
        assert_eq!(decode(&backend, &backend), Err(BlockError::Backend(7)));
        let mut fresh = b;
        fresh[word::REFRESHED_NS] = 0;
        assert_eq!(decode(&fresh, &fresh), Err(BlockError::NotYetRefreshed));
        let mut huge = b;
        huge[word::FREE] = MAX_FIGURE + 1;
        assert_eq!(decode(&huge, &huge), Err(BlockError::Implausible));
    }
}

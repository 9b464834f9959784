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
/// Layout version this crate writes. Version 1 (no thinning words, the
/// [`HEAD_WORDS`] only) is still read.
pub const VERSION: u64 = 2;

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
    /// Version 2 on. Not under the sequence lock: each word is written on
    /// its own (a counter and two settings), read as it is.
    ///
    /// Sampled allocations the allocator's budget dropped
    /// (`ALLOCPROF_MAX_EVENT_RATE`), since the process started or forked.
    pub const ALLOC_THINNED: usize = 10;
    /// The allocator's thinning factor last in force (1 kept in it; 1: all).
    pub const ALLOC_THIN_FACTOR: usize = 11;
    /// The allocator's budget, sampled allocations per second (0: none;
    /// [`super::UNKNOWN`] until the first sampled allocation read it).
    pub const ALLOC_MAX_EVENT_RATE: usize = 12;
}
/// Words under the sequence lock, the whole of a version-1 block.
pub const HEAD_WORDS: usize = 10;
/// Words in a (version 2) block.
pub const WORDS: usize = 13;
/// Bytes in a (version 2) block.
pub const BYTES: usize = WORDS * 8;
/// Bytes in a version-1 block (libraries built before the budget).
pub const HEAD_BYTES: usize = HEAD_WORDS * 8;

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
    /// The block's layout version (1 or 2).
    pub version: u64,
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

/// Decodes a block's [`HEAD_WORDS`] from two copies taken one after the
/// other: they must agree on an even sequence number (else
/// [`BlockError::Torn`]). Versions 1 and 2 (whose further words
/// [`decode_thinning`] reads).
pub fn decode(
    first: &[u64; HEAD_WORDS],
    second: &[u64; HEAD_WORDS],
) -> Result<BackendFigures, BlockError> {
    let b = first;
    if b[word::MAGIC] != MAGIC {
        return Err(BlockError::Magic);
    }
    let version = b[word::VERSION];
    if version != 1 && version != VERSION {
        return Err(BlockError::Version(version));
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
        version,
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

/// The allocator's own thinning (its sample budget), from a version-2
/// block's words past [`HEAD_WORDS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocatorThinning {
    /// Sampled allocations dropped since the process started (or forked).
    pub thinned: u64,
    /// 1 sampled allocation kept in `factor` (a power of two; 1: all).
    pub factor: u64,
    /// The budget, sampled allocations per second (0: none); `None` before
    /// the process's first sampled allocation.
    pub max_event_rate: Option<u64>,
}

/// Reads the thinning words of a block of version 2 (`words`: the whole
/// block). `None` for garbage: a factor that is not a power of two up to
/// [`MAX_THIN_FACTOR`](crate::MAX_THIN_FACTOR), a count beyond 2^56.
pub fn decode_thinning(words: &[u64; WORDS]) -> Option<AllocatorThinning> {
    let factor = words[word::ALLOC_THIN_FACTOR];
    if !factor.is_power_of_two() || factor > crate::MAX_THIN_FACTOR {
        return None;
    }
    let thinned = words[word::ALLOC_THINNED];
    if thinned > 1 << 56 {
        return None;
    }
    let max_event_rate = match words[word::ALLOC_MAX_EVENT_RATE] {
        UNKNOWN => None,
        v if v <= 1 << 40 => Some(v),
        _ => return None,
    };
    Some(AllocatorThinning {
        thinned,
        factor,
        max_event_rate,
    })
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

    fn block() -> [u64; HEAD_WORDS] {
        let mut b = [0; HEAD_WORDS];
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
    fn the_thinning_words_decode_and_garbage_is_refused() {
        let mut w = [0; WORDS];
        w[..HEAD_WORDS].copy_from_slice(&block());
        w[word::ALLOC_THINNED] = 1234;
        w[word::ALLOC_THIN_FACTOR] = 16;
        w[word::ALLOC_MAX_EVENT_RATE] = 16_000;
        let t = decode_thinning(&w).unwrap();
        assert_eq!(
            (t.thinned, t.factor, t.max_event_rate),
            (1234, 16, Some(16_000))
        );
        w[word::ALLOC_MAX_EVENT_RATE] = UNKNOWN;
        assert_eq!(decode_thinning(&w).unwrap().max_event_rate, None);
        for (i, bad) in [
            (word::ALLOC_THIN_FACTOR, 0),
            (word::ALLOC_THIN_FACTOR, 12),
            (word::ALLOC_THIN_FACTOR, crate::MAX_THIN_FACTOR * 2),
            (word::ALLOC_THINNED, u64::MAX - 1),
            (word::ALLOC_MAX_EVENT_RATE, u64::MAX - 1),
        ] {
            let mut g = w;
            g[i] = bad;
            assert_eq!(decode_thinning(&g), None, "word {i} = {bad}");
        }
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
        version[word::VERSION] = 3;
        assert_eq!(decode(&version, &version), Err(BlockError::Version(3)));
        let mut v1 = b;
        v1[word::VERSION] = 1;
        assert_eq!(decode(&v1, &v1).map(|f| f.version), Ok(1));
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

//! The backend allocator's own figures in a process running
//! `liballocprof*.so`: the block its library keeps
//! (`profiler_common::backend_stats`), found through the library file's
//! note and copied with `process_vm_readv`. Nothing in the process is
//! called, stopped or signalled.
//!
//! The block is in memory the process writes: a copy is used only if it is
//! consistent and plausible (`backend_stats::decode`), and the address read
//! is always inside the process's own mapping of the library.

use std::time::Duration;

use profiler_common::backend_stats::{
    self as layout, AllocatorThinning, BackendFigures, BlockError, HEAD_WORDS, WORDS,
};
use thiserror::Error;

use crate::model::stats::human_bytes;
use crate::process::discover::{FileId, MapsEntry};
use crate::process::target_memory::{self, LiveThread, TargetMemory};

/// What the backend says of its heap, as of `age` ago.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendHeap {
    /// `mimalloc` or `glibc`.
    pub backend: &'static str,
    /// Address space it took from the system for the heap.
    pub reserved: Option<u64>,
    /// Of which committed.
    pub committed: Option<u64>,
    /// In allocated blocks, allocator headers included.
    pub in_use: Option<u64>,
    /// Free, kept for reuse.
    pub free: Option<u64>,
    /// In blocks mapped on their own.
    pub mmapped: Option<u64>,
    /// Since the library last refreshed the figures (it does so after a
    /// sampled allocation, a few times a second at most).
    pub age: Duration,
}

/// What a process's allocator keeps in its block: its backend's figures
/// and its own sample budget, each read where it is there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorBlock {
    /// None where the backend keeps none (`SamplingAllocator<System>`:
    /// the program's system allocator) or has not given them yet.
    pub heap: Option<BackendHeap>,
    /// The allocator's own sample budget (`ALLOCPROF_MAX_EVENT_RATE`) as of
    /// now: sampled allocations it dropped since the process started, the
    /// factor in force. None from a library older than the budget.
    pub thinning: Option<AllocatorThinning>,
}

impl BackendHeap {
    /// One line for the report and the live view: the figures the backend
    /// keeps, e.g. `mimalloc: reserved 80.1 MiB, committed 40.2 MiB (as of
    /// 0.3 s ago)`, or why it keeps none (glibc).
    pub fn describe(&self) -> String {
        if [
            self.reserved,
            self.committed,
            self.in_use,
            self.free,
            self.mmapped,
        ]
        .iter()
        .all(Option::is_none)
        {
            return format!(
                "{}: figures unknown (it gives them only by walking its heap under its locks, \
                 which would stall the program)",
                self.backend
            );
        }
        let figures: Vec<String> = [
            ("reserved", self.reserved),
            ("committed", self.committed),
            ("in use", self.in_use),
            ("free", self.free),
            ("mmapped", self.mmapped),
        ]
        .into_iter()
        .filter_map(|(name, v)| Some(format!("{name} {}", human_bytes(v? as f64))))
        .collect();
        format!(
            "{}: {} (as of {:.1} s ago)",
            self.backend,
            figures.join(", "),
            self.age.as_secs_f64()
        )
    }
}

#[derive(Debug, Error)]
pub enum ReadError {
    #[error("reading the process's memory: {0}")]
    Memory(#[from] target_memory::ReadError),
    #[error("the block is not usable: {0:?}")]
    Block(BlockError),
}

/// Where the block lies in a process: `offset` is its place in `file`,
/// mapped by a writable (data) mapping of that file. None if unmapped.
/// (Its first [`layout::HEAD_BYTES`]: a version-1 block is no longer.)
pub fn block_address(maps: &[MapsEntry], file: FileId, offset: u64) -> Option<u64> {
    data_address(maps, file, offset, layout::HEAD_BYTES as u64)
}

/// Where `len` bytes at `offset` of `file` lie in a process, all inside one
/// writable mapping of the file (the library's `.data`). None if unmapped.
pub fn data_address(maps: &[MapsEntry], file: FileId, offset: u64, len: u64) -> Option<u64> {
    maps.iter()
        .filter(|e| e.writable && e.id() == file && e.offset <= offset)
        .find_map(|e| {
            let at = e.start.checked_add(offset - e.offset)?;
            (at.checked_add(len)? <= e.end).then_some(at)
        })
}

/// Copies and decodes the block at `address` of `thread`'s process, trying
/// again (a few times) while the library is rewriting it.
pub fn read(
    mem: &TargetMemory,
    thread: LiveThread,
    address: u64,
    now_monotonic_ns: u64,
) -> Result<AllocatorBlock, ReadError> {
    let mut last = BlockError::Torn;
    for _ in 0..4 {
        let Copies {
            first,
            second,
            whole,
        } = copies(mem, thread, address)?;
        let figures = match layout::decode(&first, &second) {
            Ok(f) => Some(f),
            Err(BlockError::Torn) => {
                last = BlockError::Torn;
                std::thread::yield_now();
                continue;
            }
            // A backend that keeps no figures (its word never written), or
            // none yet: the block is ours all the same (its magic and
            // version were checked first), and its budget words are read.
            Err(BlockError::Backend(0) | BlockError::NotYetRefreshed) => None,
            Err(e) => return Err(ReadError::Block(e)),
        };
        // The budget's words are each written alone: one copy.
        let thinning = whole
            .filter(|_| first[layout::word::VERSION] >= 2)
            .and_then(|w| layout::decode_thinning(&w));
        return Ok(AllocatorBlock {
            heap: figures.map(|f| heap(f, now_monotonic_ns)),
            thinning,
        });
    }
    Err(ReadError::Block(last))
}

/// Two copies of the block's head, and one of the whole block where the
/// process maps it (a version-1 block is only its head, maybe at the end of
/// its mapping).
struct Copies {
    first: [u64; HEAD_WORDS],
    second: [u64; HEAD_WORDS],
    whole: Option<[u64; WORDS]>,
}

/// The copies in one `process_vm_readv` on the reader thread: the agent
/// reads 500 processes' blocks at an export, and a round trip each to that
/// thread cost more than the copies.
fn copies(mem: &TargetMemory, thread: LiveThread, address: u64) -> Result<Copies, ReadError> {
    let head = 2 * HEAD_WORDS;
    let ranges = vec![
        (address, HEAD_WORDS),
        (address, HEAD_WORDS),
        (address, WORDS),
    ];
    let (words, copied) = mem.readv(thread, ranges)?;
    if copied < head * 8 {
        return Err(target_memory::ReadError::short().into());
    }
    // The block is little-endian words, as this (x86-64) host.
    let head_copy = |from: usize| words[from..from + HEAD_WORDS].try_into().expect("a head");
    Ok(Copies {
        first: head_copy(0),
        second: head_copy(HEAD_WORDS),
        whole: (copied == words.len() * 8).then(|| words[head..].try_into().expect("a block")),
    })
}

fn heap(f: BackendFigures, now_ns: u64) -> BackendHeap {
    BackendHeap {
        backend: layout::backend_name(f.backend),
        reserved: f.reserved,
        committed: f.committed,
        in_use: f.in_use,
        free: f.free,
        mmapped: f.mmapped,
        // A clock ahead of ours (another time namespace) reads as fresh.
        age: Duration::from_nanos(now_ns.saturating_sub(f.refreshed_ns)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::discover::parse_maps;

    #[test]
    fn the_block_is_found_in_the_writable_mapping_of_its_file() {
        // The file page at 0x69000 is mapped twice (end of the relro part,
        // read-only, and start of .data, writable): only the latter counts.
        let maps = parse_maps(
            "7f0000069000-7f000006c000 r--p 00065000 fd:01 77 /lib/liballocprof.so
7f000006c000-7f0000071000 rw-p 00069000 fd:01 77 /lib/liballocprof.so
7f0000071000-7f0000077000 rw-p 00000000 00:00 0
7f0000100000-7f0000105000 rw-p 00069000 fd:01 78 /lib/other.so
",
        );
        let file = maps[1].id();
        assert_eq!(
            block_address(&maps, file, 0x6d080),
            Some(0x7f000006c000 + 0x4080)
        );
        // Past the mapping, or straddling its end: not read.
        assert_eq!(block_address(&maps, file, 0x6e000 - 8), None);
        assert_eq!(block_address(&maps, file, 0x90000), None);
        assert_eq!(block_address(&maps, file, 0x1000), None);
    }

    #[test]
    fn our_own_memory_reads_back_and_garbage_is_refused() {
        let mut block = [0u64; WORDS];
        let (mem, me) = (TargetMemory::default(), LiveThread::current());
        let addr = block.as_ptr() as u64;
        let err = read(&mem, me, addr, 0).unwrap_err();
        assert!(matches!(err, ReadError::Block(BlockError::Magic)), "{err}");
        use layout::word;
        block[word::MAGIC] = layout::MAGIC;
        block[word::VERSION] = layout::VERSION;
        block[word::BACKEND] = layout::BACKEND_MIMALLOC;
        block[word::SEQ] = 2;
        block[word::REFRESHED_NS] = 5_000_000_000;
        block[word::RESERVED] = 64 << 20;
        block[word::COMMITTED] = 8 << 20;
        for w in [word::IN_USE, word::FREE, word::MMAPPED] {
            block[w] = layout::UNKNOWN;
        }
        let addr = std::hint::black_box(block.as_ptr()) as u64;
        let b = read(&mem, me, addr, 7_000_000_000).unwrap();
        let h = b.heap.unwrap();
        assert_eq!(h.backend, "mimalloc");
        assert_eq!(h.committed, Some(8 << 20));
        assert_eq!(h.in_use, None);
        assert_eq!(h.age, Duration::from_secs(2));
        assert_eq!(
            h.describe(),
            "mimalloc: reserved 64.0 MiB, committed 8.0 MiB (as of 2.0 s ago)"
        );
        // Version 2: the budget's words, read alone (factor 0 is garbage).
        assert_eq!(b.thinning, None);
        block[word::ALLOC_THIN_FACTOR] = 32;
        block[word::ALLOC_THINNED] = 777;
        block[word::ALLOC_MAX_EVENT_RATE] = 16_000;
        let addr = std::hint::black_box(block.as_ptr()) as u64;
        let t = read(&mem, me, addr, 7_000_000_000)
            .unwrap()
            .thinning
            .unwrap();
        assert_eq!(
            (t.thinned, t.factor, t.max_event_rate),
            (777, 32, Some(16_000))
        );
        // A backend that never gives figures (`SamplingAllocator<System>`):
        // no heap, the budget all the same.
        block[word::BACKEND] = 0;
        block[word::REFRESHED_NS] = 0;
        let addr = std::hint::black_box(block.as_ptr()) as u64;
        let b = read(&mem, me, addr, 7_000_000_000).unwrap();
        assert_eq!(b.heap, None);
        assert_eq!(b.thinning.map(|t| t.thinned), Some(777));
        // Nor figures yet from mimalloc's.
        block[word::BACKEND] = layout::BACKEND_MIMALLOC;
        let addr = std::hint::black_box(block.as_ptr()) as u64;
        let b = read(&mem, me, addr, 7_000_000_000).unwrap();
        assert_eq!((b.heap, b.thinning.map(|t| t.factor)), (None, Some(32)));
        block[word::REFRESHED_NS] = 5_000_000_000;
        // An unknown backend is still refused.
        block[word::BACKEND] = 99;
        let addr = std::hint::black_box(block.as_ptr()) as u64;
        let err = read(&mem, me, addr, 7_000_000_000).unwrap_err();
        assert!(
            matches!(err, ReadError::Block(BlockError::Backend(99))),
            "{err}"
        );
        block[word::BACKEND] = layout::BACKEND_MIMALLOC;
        // A version-1 block (an older library): no thinning words read.
        block[word::VERSION] = 1;
        let addr = std::hint::black_box(block.as_ptr()) as u64;
        assert_eq!(read(&mem, me, addr, 7_000_000_000).unwrap().thinning, None);
        // glibc's block names the backend and no figure.
        let glibc = BackendHeap {
            backend: "glibc",
            reserved: None,
            committed: None,
            in_use: None,
            free: None,
            mmapped: None,
            age: Duration::ZERO,
        };
        assert!(
            glibc.describe().starts_with("glibc: figures unknown"),
            "{}",
            glibc.describe()
        );
        // An address the process does not map.
        assert!(matches!(read(&mem, me, 8, 0), Err(ReadError::Memory(_))));
    }
}

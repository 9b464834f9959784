//! The live-sample ledger of a process running `liballocprof*.so`
//! (`profiler_common::ledger`): every sampled block still live, with its
//! stack, including those allocated before allocprof attached. Found
//! through the library file's note, copied with `process_vm_readv`:
//! nothing in the process is called, stopped or signalled.
//!
//! The ledger is in memory the process writes: the header and every record
//! are checked (`ledger::decode_header`, `decode_record`), reads are bounded
//! ([`MAX_RECORDS`]), and what fails a check is counted and skipped.

use profiler_common::ledger::{
    self as layout, HEADER_BYTES, HEADER_WORDS, Header, HeaderError, LiveRecord, RECORD_BYTES,
    RECORD_WORDS, Record,
};
use thiserror::Error;

use crate::process::target_memory::{self, LiveThread, TargetMemory, Unreadable};

/// A frame address the session appends to a ledger stack the allocator cut
/// short (`FLAG_TRUNCATED`: its unwinding budget spent, or deeper than a
/// record holds), so the profile says callers are missing instead of
/// showing a short stack as whole. No user-space code lives this high (and
/// it differs from the kernel's `unwind::TRUNCATED_FRAME`).
pub const CUT_FRAME: u64 = 0xffff_ffff_ffff_ffe0;

/// Most records read from one process: 256 Ki records (78 MiB, copied
/// twice, a chunk at a time). Far above what a process holds at the default
/// rate (a 100 GiB heap is ~200k live samples); the rest are counted as not
/// read.
pub const MAX_RECORDS: u64 = 1 << 18;
/// Records copied per `process_vm_readv` (1.2 MiB).
const CHUNK_RECORDS: u64 = 4096;
/// Times a record written while it was copied is copied again.
const TORN_RETRIES: usize = 3;

/// A live record and where it is (its sequence is read there later, to
/// see whether the block was freed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedgerEntry {
    pub address: u64,
    pub record: LiveRecord,
}

/// What one read of a ledger found besides its live records (which go to
/// the reader's sink as they are copied: a ledger is never held whole).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LedgerRead {
    /// Records still being rewritten after a few tries (a block allocated
    /// or freed right then: the kernel's probes see it).
    pub torn: u64,
    /// Records no allocator writes (the process scribbled on its ledger).
    pub garbage: u64,
    /// Records past [`MAX_RECORDS`], not read.
    pub unread: u64,
}

/// What reading an image's ledger gave, for the views.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LedgerStatus {
    /// A ledger was read: the image's live figures include what it
    /// allocated before attach.
    pub read: bool,
    /// Live records from before attach, seeded.
    pub seeded: u64,
    /// Seeds freed since.
    pub retired: u64,
    /// Live records the kernel had seen (allocated after attach).
    pub seen: u64,
    /// Records not usable: written while copied, garbage, past the cap.
    pub torn: u64,
    pub garbage: u64,
    pub unread: u64,
    /// Live records from before attach not seeded: past the per-process or
    /// the session's cap on live samples (their bytes are counted as lost,
    /// the estimate is a lower bound).
    pub dropped: u64,
}

#[derive(Debug, Error)]
pub enum ReadError {
    #[error("reading the process's memory: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Unreadable(#[from] Unreadable),
    #[error("the ledger header is not usable: {0:?}")]
    Header(HeaderError),
}

impl From<target_memory::ReadError> for ReadError {
    fn from(e: target_memory::ReadError) -> ReadError {
        match e {
            target_memory::ReadError::Io(e) => ReadError::Io(e),
            target_memory::ReadError::Unreadable(e) => ReadError::Unreadable(e),
        }
    }
}

/// Copies and checks the ledger whose header is at `address` in `thread`'s
/// process, a chunk of records at a time; each live record goes to `live`.
/// On an error, records already given may be incomplete: the caller drops
/// what it made of them.
pub fn read(
    mem: &TargetMemory,
    thread: LiveThread,
    address: u64,
    live: &mut dyn FnMut(LedgerEntry),
) -> Result<LedgerRead, ReadError> {
    let header = read_header(mem, thread, address)?;
    let mut out = LedgerRead::default();
    let mut budget = MAX_RECORDS;
    for (first, used) in header.used_ranges() {
        let take = used.min(budget);
        out.unread += used - take;
        budget -= take;
        let mut index = first;
        while index < first + take {
            let n = CHUNK_RECORDS.min(first + take - index);
            read_chunk(mem, thread, &header, index, n, &mut out, live)?;
            index += n;
        }
    }
    Ok(out)
}

fn read_header(mem: &TargetMemory, thread: LiveThread, address: u64) -> Result<Header, ReadError> {
    let mut last = HeaderError::Torn;
    for _ in 0..4 {
        let first = mem.read_words(thread, address, HEADER_WORDS)?;
        let second = mem.read_words(thread, address, HEADER_WORDS)?;
        let words = |v: &[u64]| -> [u64; HEADER_WORDS] { v.try_into().expect("header words") };
        match layout::decode_header(&words(&first), &words(&second)) {
            Ok(h) => return Ok(h),
            Err(HeaderError::Torn) => std::thread::yield_now(),
            Err(e) => {
                last = e;
                break;
            }
        }
    }
    Err(ReadError::Header(last))
}

fn read_chunk(
    mem: &TargetMemory,
    thread: LiveThread,
    header: &Header,
    index: u64,
    n: u64,
    out: &mut LedgerRead,
    live: &mut dyn FnMut(LedgerEntry),
) -> Result<(), ReadError> {
    let words = n as usize * RECORD_WORDS;
    let address = header.record_address(index);
    let first = mem.read_words(thread, address, words)?;
    let second = mem.read_words(thread, address, words)?;
    for i in 0..n as usize {
        let span = i * RECORD_WORDS..(i + 1) * RECORD_WORDS;
        let a: &[u64; RECORD_WORDS] = first[span.clone()].try_into().expect("record span");
        let b: &[u64; RECORD_WORDS] = second[span].try_into().expect("record span");
        let at = address + (i * RECORD_BYTES) as u64;
        let mut record = layout::decode_record(a, b, header);
        for _ in 0..TORN_RETRIES {
            if record != Record::Torn {
                break;
            }
            let a = mem.read_words(thread, at, RECORD_WORDS)?;
            let b = mem.read_words(thread, at, RECORD_WORDS)?;
            let words = |v: &[u64]| -> [u64; RECORD_WORDS] { v.try_into().expect("record words") };
            record = layout::decode_record(&words(&a), &words(&b), header);
        }
        match record {
            // A sampled block lies whole in a slot of the sample region.
            Record::Live(r) if !block_in_region(&r, header) => out.garbage += 1,
            Record::Live(record) => live(LedgerEntry {
                address: at,
                record,
            }),
            Record::Free => {}
            Record::Torn => out.torn += 1,
            Record::Garbage => out.garbage += 1,
        }
    }
    Ok(())
}

/// Whether the record's whole block lies in the sample region (its pointer
/// was checked to; its size may still reach past it).
fn block_in_region(r: &LiveRecord, header: &Header) -> bool {
    let end = header.region_base.saturating_add(header.region_len);
    r.ptr.checked_add(r.size).is_some_and(|e| e <= end)
}

/// The sequence word of each record at `addresses` (none where it cannot
/// be read: the process is gone, its memory changed or is unreadable).
pub fn sequences(mem: &TargetMemory, thread: LiveThread, addresses: &[u64]) -> Vec<Option<u64>> {
    // IOV_MAX per call.
    const BATCH: usize = 1024;
    let mut out = Vec::with_capacity(addresses.len());
    for batch in addresses.chunks(BATCH) {
        let ranges = batch
            .iter()
            .map(|&a| (a + 8 * layout::record::SEQ as u64, 1))
            .collect();
        // A partial read stops at the first remote range that failed.
        let (seqs, done) = match mem.readv(thread, ranges) {
            Ok((seqs, n)) => (seqs, n / 8),
            Err(_) => (Vec::new(), 0),
        };
        out.extend((0..batch.len()).map(|i| (i < done).then(|| seqs[i])));
    }
    out
}

/// Where the header lies in a process: `offset` is its place in `file`,
/// in a writable (data) mapping of that file. None if unmapped.
pub fn header_address(
    maps: &[crate::process::discover::MapsEntry],
    file: crate::process::discover::FileId,
    offset: u64,
) -> Option<u64> {
    crate::process::backend_stats::data_address(maps, file, offset, HEADER_BYTES as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::ledger::{FLAG_LIVE, FRAMES, MAGIC, VERSION, header, record};

    /// A ledger in our own memory: a header and a table of `n` records.
    struct Fake {
        header: Box<[u64; HEADER_WORDS]>,
        table: Vec<u64>,
        region: Vec<u8>,
    }

    impl Fake {
        fn new(n: usize) -> Fake {
            let mut f = Fake {
                header: Box::new([0; HEADER_WORDS]),
                table: vec![0; n * RECORD_WORDS],
                region: vec![0; 1 << 16],
            };
            let h = &mut f.header;
            h[header::MAGIC] = MAGIC;
            h[header::VERSION] = VERSION;
            h[header::RECORD_BYTES] = RECORD_BYTES as u64;
            h[header::FRAMES] = FRAMES as u64;
            h[header::TABLE] = f.table.as_ptr() as u64;
            h[header::CAPACITY] = n as u64;
            h[header::REGION_BASE] = f.region.as_ptr() as u64;
            h[header::REGION_LEN] = f.region.len() as u64;
            h[header::RANGES] = 1;
            h[header::USED] = n as u64;
            f
        }

        fn live(&mut self, i: usize, size: u64, weight: u64) {
            let ptr = self.region.as_ptr() as u64 + 4096 * i as u64;
            let r = &mut self.table[i * RECORD_WORDS..(i + 1) * RECORD_WORDS];
            r[record::SEQ] = 2;
            r[record::PTR] = ptr;
            r[record::SIZE] = size;
            r[record::WEIGHT] = weight;
            r[record::TIME_NS] = 1;
            r[record::FLAGS] = FLAG_LIVE;
            r[record::NFRAMES] = 1;
            r[record::FRAMES] = 0x40_1000;
        }

        fn address(&self) -> u64 {
            self.header.as_ptr() as u64
        }
    }

    /// Reads a ledger in our own memory: its live records and the rest.
    fn read_own(address: u64) -> Result<(Vec<LedgerEntry>, LedgerRead), ReadError> {
        let mut live = Vec::new();
        let read = read(
            &TargetMemory::default(),
            LiveThread::current(),
            address,
            &mut |e| live.push(e),
        )?;
        Ok((live, read))
    }

    #[test]
    fn reads_the_live_records_of_a_ledger_in_memory() {
        let mut f = Fake::new(10);
        f.live(1, 100, 500_000);
        f.live(7, 5000, 600_000);
        let (live, read) = read_own(f.address()).unwrap();
        let sizes: Vec<u64> = live.iter().map(|e| e.record.size).collect();
        assert_eq!(sizes, [100, 5000]);
        assert_eq!((read.torn, read.garbage, read.unread), (0, 0, 0));
        let mem = TargetMemory::default();
        let seqs = sequences(
            &mem,
            LiveThread::current(),
            &[live[0].address, live[1].address, 8],
        );
        assert_eq!(seqs, [Some(2), Some(2), None]);
    }

    #[test]
    fn garbage_records_are_counted_and_skipped() {
        let mut f = Fake::new(5);
        for i in 0..5 {
            f.live(i, 100, 500_000);
        }
        // A pointer outside the region, a weight below the size, odd flags,
        // a block reaching past the region's end.
        f.table[RECORD_WORDS + record::PTR] = 0x1000;
        f.table[2 * RECORD_WORDS + record::WEIGHT] = 1;
        f.table[3 * RECORD_WORDS + record::FLAGS] = 0xff;
        f.table[4 * RECORD_WORDS + record::SIZE] = 1 << 20;
        f.table[4 * RECORD_WORDS + record::WEIGHT] = 1 << 21;
        let (live, read) = read_own(f.address()).unwrap();
        assert_eq!(live.len(), 1);
        assert_eq!(read.garbage, 4);
    }

    #[test]
    fn a_garbage_header_is_refused_and_an_unmapped_table_is_an_error() {
        let mut f = Fake::new(2);
        f.header[header::CAPACITY] = u64::MAX;
        assert!(matches!(
            read_own(f.address()),
            Err(ReadError::Header(HeaderError::Implausible))
        ));
        let mut f = Fake::new(2);
        f.header[header::TABLE] = 0x1000; // nothing mapped there
        assert!(matches!(read_own(f.address()), Err(ReadError::Io(_))));
        let mut f = Fake::new(2);
        f.header[header::MAGIC] = 0;
        assert!(matches!(
            read_own(f.address()),
            Err(ReadError::Header(HeaderError::Magic))
        ));
    }
}

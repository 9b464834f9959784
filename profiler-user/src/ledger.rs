//! The live-sample ledger of a process running `liballocprof*.so`
//! (`profiler_common::ledger`): every sampled block still live, with its
//! stack, including those allocated before allocprof attached. Found
//! through the library file's note, copied with `process_vm_readv`:
//! nothing in the process is called, stopped or signalled.
//!
//! The ledger is in memory the process writes: the header and every record
//! are checked (`ledger::decode_header`, `decode_record`), reads are bounded
//! ([`MAX_RECORDS`]), and what fails a check is counted and skipped.

use std::io;

use profiler_common::ledger::{
    self as layout, HEADER_BYTES, HEADER_WORDS, Header, HeaderError, LiveRecord, RECORD_BYTES,
    RECORD_WORDS, Record,
};
use thiserror::Error;

/// A frame address the session appends to a ledger stack the allocator cut
/// short (`FLAG_TRUNCATED`: its unwinding budget spent, or deeper than a
/// record holds), so the profile says callers are missing instead of
/// showing a short stack as whole. No user-space code lives this high (and
/// it differs from the kernel's `unwind::TRUNCATED_FRAME`).
pub const CUT_FRAME: u64 = 0xffff_ffff_ffff_ffe0;

/// Most records read from one process: 256 Ki records (78 MiB, copied
/// twice). Far above what a process holds at the default rate (a 100 GiB
/// heap is ~200k live samples); the rest are counted as not read.
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

/// What one read of a ledger found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LedgerRead {
    pub live: Vec<LedgerEntry>,
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
}

#[derive(Debug, Error)]
pub enum ReadError {
    #[error("reading the process's memory: {0}")]
    Io(#[from] io::Error),
    #[error("the ledger header is not usable: {0:?}")]
    Header(HeaderError),
}

/// Copies and checks the ledger whose header is at `address` in `pid`.
pub fn read(pid: u32, address: u64) -> Result<LedgerRead, ReadError> {
    let header = read_header(pid, address)?;
    let mut out = LedgerRead::default();
    let mut budget = MAX_RECORDS;
    for (first, used) in header.used_ranges() {
        let take = used.min(budget);
        out.unread += used - take;
        budget -= take;
        let mut index = first;
        while index < first + take {
            let n = CHUNK_RECORDS.min(first + take - index);
            read_chunk(pid, &header, index, n, &mut out)?;
            index += n;
        }
    }
    Ok(out)
}

fn read_header(pid: u32, address: u64) -> Result<Header, ReadError> {
    let mut last = HeaderError::Torn;
    for _ in 0..4 {
        let mut first = [0u64; HEADER_WORDS];
        let mut second = [0u64; HEADER_WORDS];
        copy(pid, address, &mut first)?;
        copy(pid, address, &mut second)?;
        match layout::decode_header(&first, &second) {
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
    pid: u32,
    header: &Header,
    index: u64,
    n: u64,
    out: &mut LedgerRead,
) -> Result<(), ReadError> {
    let words = n as usize * RECORD_WORDS;
    let mut first = vec![0u64; words];
    let mut second = vec![0u64; words];
    let address = header.record_address(index);
    copy(pid, address, &mut first)?;
    copy(pid, address, &mut second)?;
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
            let (mut a, mut b) = ([0u64; RECORD_WORDS], [0u64; RECORD_WORDS]);
            copy(pid, at, &mut a)?;
            copy(pid, at, &mut b)?;
            record = layout::decode_record(&a, &b, header);
        }
        match record {
            Record::Live(record) => out.live.push(LedgerEntry {
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

/// The sequence word of each record at `addresses` (none where it cannot
/// be read: the process is gone or its memory changed).
pub fn sequences(pid: u32, addresses: &[u64]) -> Vec<Option<u64>> {
    // IOV_MAX per call.
    const BATCH: usize = 1024;
    let mut out = Vec::with_capacity(addresses.len());
    for batch in addresses.chunks(BATCH) {
        let mut seqs = vec![0u64; batch.len()];
        let local: Vec<libc::iovec> = seqs
            .iter_mut()
            .map(|s| libc::iovec {
                iov_base: std::ptr::from_mut(s).cast(),
                iov_len: 8,
            })
            .collect();
        let remote: Vec<libc::iovec> = batch
            .iter()
            .map(|&a| libc::iovec {
                iov_base: (a + 8 * layout::record::SEQ as u64) as *mut libc::c_void,
                iov_len: 8,
            })
            .collect();
        // SAFETY: every local iovec points at one u64 of `seqs`, alive for
        // the call; the remote side is only read, in the other process.
        let n = unsafe {
            libc::process_vm_readv(
                pid as libc::pid_t,
                local.as_ptr(),
                local.len() as libc::c_ulong,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        // A partial read stops at the first remote iovec that failed.
        let done = if n < 0 { 0 } else { n as usize / 8 };
        out.extend(
            seqs.iter()
                .enumerate()
                .map(|(i, &s)| (i < done).then_some(s)),
        );
    }
    out
}

/// Where the header lies in a process: `offset` is its place in `file`,
/// in a writable (data) mapping of that file. None if unmapped.
pub fn header_address(
    maps: &[crate::discover::MapsEntry],
    file: crate::discover::FileId,
    offset: u64,
) -> Option<u64> {
    crate::backend_stats::data_address(maps, file, offset, HEADER_BYTES as u64)
}

fn copy(pid: u32, address: u64, words: &mut [u64]) -> io::Result<()> {
    let len = words.len() * 8;
    let local = libc::iovec {
        iov_base: words.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: address as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `local` is our own writable buffer of exactly iov_len bytes;
    // the remote side is only read, by the kernel, in the other process.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "short read of the ledger",
        ));
    }
    // Little-endian words, as this (x86-64) host.
    Ok(())
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

    fn me() -> u32 {
        std::process::id()
    }

    #[test]
    fn reads_the_live_records_of_a_ledger_in_memory() {
        let mut f = Fake::new(10);
        f.live(1, 100, 500_000);
        f.live(7, 5000, 600_000);
        let read = read(me(), f.address()).unwrap();
        let sizes: Vec<u64> = read.live.iter().map(|e| e.record.size).collect();
        assert_eq!(sizes, [100, 5000]);
        assert_eq!((read.torn, read.garbage, read.unread), (0, 0, 0));
        let seqs = sequences(me(), &[read.live[0].address, read.live[1].address, 8]);
        assert_eq!(seqs, [Some(2), Some(2), None]);
    }

    #[test]
    fn garbage_records_are_counted_and_skipped() {
        let mut f = Fake::new(4);
        f.live(0, 100, 500_000);
        f.live(1, 100, 500_000);
        f.live(2, 100, 500_000);
        // A pointer outside the region, a weight below the size, odd flags.
        f.table[RECORD_WORDS + record::PTR] = 0x1000;
        f.table[2 * RECORD_WORDS + record::WEIGHT] = 1;
        f.table[3 * RECORD_WORDS + record::FLAGS] = 0xff;
        let read = read(me(), f.address()).unwrap();
        assert_eq!(read.live.len(), 1);
        assert_eq!(read.garbage, 3);
    }

    #[test]
    fn a_garbage_header_is_refused_and_an_unmapped_table_is_an_error() {
        let mut f = Fake::new(2);
        f.header[header::CAPACITY] = u64::MAX;
        assert!(matches!(
            read(me(), f.address()),
            Err(ReadError::Header(HeaderError::Implausible))
        ));
        let mut f = Fake::new(2);
        f.header[header::TABLE] = 0x1000; // nothing mapped there
        assert!(matches!(read(me(), f.address()), Err(ReadError::Io(_))));
        let mut f = Fake::new(2);
        f.header[header::MAGIC] = 0;
        assert!(matches!(
            read(me(), f.address()),
            Err(ReadError::Header(HeaderError::Magic))
        ));
    }
}

//! The live-sample ledger: what `liballocprof*.so` knows of every sampled
//! block still live (its address, size, weight, allocation time and the
//! stack that allocated it), published in the process's memory so that
//! allocprof, attaching late or meeting a forked child, sees the heap that
//! was allocated before its probes were there. Read from outside with
//! `process_vm_readv`: the process is never called into, stopped or
//! signalled. A fork child's ledger is its parent's, copied with the rest
//! of its memory.
//!
//! Two parts, both little-endian `u64` words:
//! * the **header** ([`header`], [`HEADER_WORDS`] words) in the library's
//!   `.data`, named by an ELF note (section [`NOTE_SECTION`], owner
//!   [`NOTE_OWNER`], type [`NOTE_TYPE`], descriptor: the header's link-time
//!   address as one `u64`). It says where the record table is and which of
//!   its records have ever been used: the table is cut into ranges (one per
//!   slot class of the sample region), of which the first `USED` records
//!   have been handed out at least once;
//! * the **record table**: one record ([`record`], [`RECORD_WORDS`] words)
//!   per slot of the sample region, in an anonymous mapping made with the
//!   region. A record's pages are touched only when its slot is first used,
//!   so the ledger costs [`RECORD_BYTES`] per slot ever used (at most one
//!   per live sample plus the slots the region keeps warm), beside a sampled
//!   block's 4 KiB or more.
//!
//! Writers follow a sequence lock per record: [`record::SEQ`] is odd while
//! the record is rewritten and only grows. An allocation makes it odd,
//! writes the fields with [`FLAG_LIVE`], and makes it even; a free does the
//! same with the flags cleared. A reader copies a range twice and takes a
//! record only where both copies are equal with an even sequence (see
//! [`decode_record`]); later, a record whose sequence moved has been freed
//! (and perhaps reused).
//!
//! The ledger lives in memory the profiled program can write: every field
//! is checked, and what fails a check is counted and skipped.

/// Section that carries the note naming the header (shared with
/// [`crate::backend_stats`], told apart by the note type).
pub const NOTE_SECTION: &[u8] = b".note.allocprof";
/// The note's owner.
pub const NOTE_OWNER: &[u8] = b"allocprof";
/// The note's type: "live-sample ledger header".
pub const NOTE_TYPE: u32 = 2;

/// First word of the header: `b"APLEDGR1"` read as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"APLEDGR1");
/// Layout version this crate reads and writes.
pub const VERSION: u64 = 1;

/// Most ranges a header describes (the sample region has 21 slot classes).
pub const MAX_RANGES: usize = 24;

/// Word indices of the header.
pub mod header {
    use super::MAX_RANGES;

    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 1;
    /// Bytes per record: [`super::RECORD_BYTES`].
    pub const RECORD_BYTES: usize = 2;
    /// Frame words per record: [`super::FRAMES`].
    pub const FRAMES: usize = 3;
    /// Address of record 0; 0 until the sample region exists, and for good
    /// when the library keeps no ledger (`ALLOCPROF_LEDGER=0`, or the table
    /// could not be mapped): then `REGION_LEN` is set once the region
    /// exists, saying that samples may live that no record holds.
    pub const TABLE: usize = 4;
    /// Records in the table.
    pub const CAPACITY: usize = 5;
    /// The sample region (every live record's pointer lies in it).
    pub const REGION_BASE: usize = 6;
    pub const REGION_LEN: usize = 7;
    /// Ranges in use: `0..RANGES` of `FIRST`/`USED`.
    pub const RANGES: usize = 8;
    /// Index of each range's first record.
    pub const FIRST: usize = 9;
    /// Records of each range handed out at least once (a high-water mark:
    /// records past it were never written).
    pub const USED: usize = FIRST + MAX_RANGES;
}
/// Words in the header.
pub const HEADER_WORDS: usize = header::USED + MAX_RANGES;
pub const HEADER_BYTES: usize = HEADER_WORDS * 8;

/// Return addresses kept per record, innermost first.
pub const FRAMES: usize = 32;

/// Word indices of a record.
pub mod record {
    /// Sequence lock: odd while the record is rewritten; only grows.
    pub const SEQ: usize = 0;
    /// The block's address (in the sample region).
    pub const PTR: usize = 1;
    /// Bytes requested.
    pub const SIZE: usize = 2;
    /// Unbiased byte estimate (the alloc probe's `weight`).
    pub const WEIGHT: usize = 3;
    /// `CLOCK_MONOTONIC` nanoseconds of the allocation (the clock of
    /// `bpf_ktime_get_ns`).
    pub const TIME_NS: usize = 4;
    /// [`super::FLAG_LIVE`], [`super::FLAG_TRUNCATED`], [`super::FLAG_UNWOUND`].
    pub const FLAGS: usize = 5;
    /// Frames in `FRAMES..FRAMES + n`.
    pub const NFRAMES: usize = 6;
    /// The return addresses, innermost first (allocator frames included,
    /// as in the kernel's stacks).
    pub const FRAMES: usize = 7;
}
/// Words in a record.
pub const RECORD_WORDS: usize = record::FRAMES + FRAMES;
pub const RECORD_BYTES: usize = RECORD_WORDS * 8;

/// The block is live (allocated and not yet freed).
pub const FLAG_LIVE: u64 = 1;
/// The stack is not whole: it had more than [`FRAMES`] frames (the
/// outermost are cut), or the allocator's unwinder stopped early (JIT code,
/// CFI it does not model, its budget, no `_dl_find_object`).
pub const FLAG_TRUNCATED: u64 = 2;
/// The stack was taken by the CFI unwinder (code without frame pointers)
/// rather than by following frame pointers.
pub const FLAG_UNWOUND: u64 = 4;
const KNOWN_FLAGS: u64 = FLAG_LIVE | FLAG_TRUNCATED | FLAG_UNWOUND;

/// Largest table a reader accepts (records): far above what a process
/// uses, small enough that a garbage header cannot send a reader through
/// terabytes.
pub const MAX_CAPACITY: u64 = 1 << 24;
/// Addresses and figures above this (2^47, the x86-64 user address space)
/// are garbage.
pub const MAX_ADDRESS: u64 = 1 << 47;

/// A ledger's header, checked: where to read its records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub table: u64,
    pub capacity: u64,
    pub region_base: u64,
    pub region_len: u64,
    pub ranges: usize,
    pub first: [u64; MAX_RANGES],
    pub used: [u64; MAX_RANGES],
}

impl Header {
    /// The records to read, as (index of the first, count), one per range
    /// with any.
    pub fn used_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..self.ranges)
            .map(|k| (self.first[k], self.used[k]))
            .filter(|&(_, n)| n > 0)
    }

    /// Address of record `index`.
    pub fn record_address(&self, index: u64) -> u64 {
        self.table + index * RECORD_BYTES as u64
    }

    /// Records in all used ranges.
    pub fn used_records(&self) -> u64 {
        self.used_ranges().map(|(_, n)| n).sum()
    }
}

/// Why a header is not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// Not a ledger (wrong magic: another library, or overwritten).
    Magic,
    /// A layout this reader does not know (version, record size, frames).
    Version(u64),
    /// The sample region does not exist yet: nothing was sampled.
    NoTable,
    /// The library keeps no ledger, though it sampled: its live samples
    /// from before attach cannot be known.
    Off,
    /// Written while copied; copy again.
    Torn,
    /// A field out of bounds (table, capacity, ranges).
    Implausible,
}

/// Checks a header from two copies taken one after the other (the writer
/// changes it while the region is set up and as ranges grow). The `USED`
/// high-water marks move with every new record of a process allocating
/// hard, so copies that differ only by marks that grew are consistent: the
/// second copy's marks are taken.
pub fn decode_header(
    first: &[u64; HEADER_WORDS],
    second: &[u64; HEADER_WORDS],
) -> Result<Header, HeaderError> {
    let h = first;
    if h[header::MAGIC] != MAGIC {
        return Err(HeaderError::Magic);
    }
    if h[header::VERSION] != VERSION {
        return Err(HeaderError::Version(h[header::VERSION]));
    }
    if h[header::RECORD_BYTES] != RECORD_BYTES as u64 || h[header::FRAMES] != FRAMES as u64 {
        return Err(HeaderError::Version(h[header::VERSION]));
    }
    let settled = first[..header::USED] == second[..header::USED]
        && first[header::USED..]
            .iter()
            .zip(&second[header::USED..])
            .all(|(a, b)| a <= b);
    if !settled {
        return Err(HeaderError::Torn);
    }
    let table = h[header::TABLE];
    if table == 0 {
        return Err(if h[header::REGION_LEN] == 0 {
            HeaderError::NoTable
        } else {
            HeaderError::Off
        });
    }
    let capacity = h[header::CAPACITY];
    let ranges = h[header::RANGES];
    let (base, len) = (h[header::REGION_BASE], h[header::REGION_LEN]);
    let plausible = table.is_multiple_of(8)
        && capacity <= MAX_CAPACITY
        && table.saturating_add(capacity * RECORD_BYTES as u64) <= MAX_ADDRESS
        && ranges <= MAX_RANGES as u64
        && base.saturating_add(len) <= MAX_ADDRESS;
    if !plausible {
        return Err(HeaderError::Implausible);
    }
    let ranges = ranges as usize;
    let mut out = Header {
        table,
        capacity,
        region_base: base,
        region_len: len,
        ranges,
        first: [0; MAX_RANGES],
        used: [0; MAX_RANGES],
    };
    for k in 0..ranges {
        let (f, u) = (h[header::FIRST + k], second[header::USED + k]);
        if f > capacity || u > capacity - f {
            return Err(HeaderError::Implausible);
        }
        out.first[k] = f;
        out.used[k] = u;
    }
    Ok(out)
}

/// A live record, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveRecord {
    pub seq: u64,
    pub ptr: u64,
    pub size: u64,
    pub weight: u64,
    pub time_ns: u64,
    pub flags: u64,
    pub nframes: usize,
    pub frames: [u64; FRAMES],
}

impl LiveRecord {
    pub fn frames(&self) -> &[u64] {
        &self.frames[..self.nframes]
    }
}

/// What a record's two copies hold.
// Decoded one at a time and matched at once: the size does not matter, and
// `no_std` has no box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    Live(LiveRecord),
    /// Never used, or freed.
    Free,
    /// Written while copied.
    Torn,
    /// Fields no allocator writes: counted and skipped.
    Garbage,
}

/// Reads one record from two copies taken one after the other. `header`
/// bounds its pointer (the sample region).
pub fn decode_record(
    first: &[u64; RECORD_WORDS],
    second: &[u64; RECORD_WORDS],
    header: &Header,
) -> Record {
    let r = first;
    if r[record::SEQ] % 2 == 1 || first != second {
        return Record::Torn;
    }
    let flags = r[record::FLAGS];
    if flags & !KNOWN_FLAGS != 0 {
        return Record::Garbage;
    }
    if flags & FLAG_LIVE == 0 {
        return Record::Free;
    }
    let (ptr, size, weight, time_ns) = (
        r[record::PTR],
        r[record::SIZE],
        r[record::WEIGHT],
        r[record::TIME_NS],
    );
    let nframes = r[record::NFRAMES];
    let in_region = ptr >= header.region_base && ptr - header.region_base < header.region_len;
    let frames: [u64; FRAMES] = core::array::from_fn(|i| r[record::FRAMES + i]);
    let plausible = in_region
        && size < MAX_ADDRESS
        // A `size / p` weight is at least the size; any weight is at most
        // the kernel's bound on one sample.
        && weight >= size
        && weight > 0
        && weight <= crate::MAX_WEIGHT
        && time_ns > 0
        && nframes <= FRAMES as u64
        && frames[..nframes as usize]
            .iter()
            .all(|&f| f > 0 && f < MAX_ADDRESS);
    if !plausible {
        return Record::Garbage;
    }
    Record::Live(LiveRecord {
        seq: r[record::SEQ],
        ptr,
        size,
        weight,
        time_ns,
        flags,
        nframes: nframes as usize,
        frames,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_words() -> [u64; HEADER_WORDS] {
        let mut h = [0; HEADER_WORDS];
        h[header::MAGIC] = MAGIC;
        h[header::VERSION] = VERSION;
        h[header::RECORD_BYTES] = RECORD_BYTES as u64;
        h[header::FRAMES] = FRAMES as u64;
        h[header::TABLE] = 0x7f00_0000_0000;
        h[header::CAPACITY] = 1000;
        h[header::REGION_BASE] = 0x7e00_0000_0000;
        h[header::REGION_LEN] = 1 << 30;
        h[header::RANGES] = 2;
        h[header::FIRST] = 0;
        h[header::USED] = 3;
        h[header::FIRST + 1] = 500;
        h[header::USED + 1] = 0;
        h
    }

    fn record_words() -> [u64; RECORD_WORDS] {
        let mut r = [0; RECORD_WORDS];
        r[record::SEQ] = 2;
        r[record::PTR] = 0x7e00_0000_1000;
        r[record::SIZE] = 100;
        r[record::WEIGHT] = 524_388;
        r[record::TIME_NS] = 5;
        r[record::FLAGS] = FLAG_LIVE;
        r[record::NFRAMES] = 2;
        r[record::FRAMES] = 0x40_1000;
        r[record::FRAMES + 1] = 0x40_2000;
        r
    }

    #[test]
    fn a_header_gives_its_used_ranges() {
        let h = header_words();
        let d = decode_header(&h, &h).unwrap();
        let mut ranges = d.used_ranges();
        assert_eq!(ranges.next(), Some((0, 3)));
        assert_eq!(ranges.next(), None);
        assert_eq!(d.used_records(), 3);
        assert_eq!(
            d.record_address(2),
            0x7f00_0000_0000 + 2 * RECORD_BYTES as u64
        );
    }

    #[test]
    fn a_high_water_mark_grown_between_the_copies_is_taken_from_the_second() {
        let h = header_words();
        let mut grown = h;
        grown[header::USED] = 7;
        let d = decode_header(&h, &grown).unwrap();
        assert_eq!(d.used_ranges().next(), Some((0, 7)));
        grown[header::USED + 1] = 501;
        assert_eq!(
            decode_header(&h, &grown),
            Err(HeaderError::Implausible),
            "the second copy's marks are checked too"
        );
    }

    #[test]
    fn foreign_torn_and_out_of_bounds_headers_are_refused() {
        let h = header_words();
        let with = |i: usize, v: u64| {
            let mut c = h;
            c[i] = v;
            c
        };
        let magic = with(header::MAGIC, 1);
        assert_eq!(decode_header(&magic, &magic), Err(HeaderError::Magic));
        let v2 = with(header::VERSION, 2);
        assert_eq!(decode_header(&v2, &v2), Err(HeaderError::Version(2)));
        let frames = with(header::FRAMES, 64);
        assert!(matches!(
            decode_header(&frames, &frames),
            Err(HeaderError::Version(_))
        ));
        assert_eq!(
            decode_header(&with(header::USED, 4), &h),
            Err(HeaderError::Torn),
            "a high-water mark never shrinks"
        );
        assert_eq!(
            decode_header(&h, &with(header::RANGES, 1)),
            Err(HeaderError::Torn)
        );
        let none = with(header::REGION_LEN, 0);
        let none = {
            let mut n = none;
            n[header::TABLE] = 0;
            n
        };
        assert_eq!(decode_header(&none, &none), Err(HeaderError::NoTable));
        let off = with(header::TABLE, 0);
        assert_eq!(decode_header(&off, &off), Err(HeaderError::Off));
        for bad in [
            with(header::CAPACITY, MAX_CAPACITY + 1),
            with(header::RANGES, MAX_RANGES as u64 + 1),
            with(header::USED, 1001),
            with(header::FIRST + 1, 999),
            with(header::FIRST + 1, u64::MAX),
            with(header::TABLE, u64::MAX - 7),
            with(header::REGION_LEN, u64::MAX),
        ] {
            let bad = {
                let mut b = bad;
                if b[header::FIRST + 1] == 999 {
                    b[header::USED + 1] = 2;
                }
                b
            };
            assert_eq!(
                decode_header(&bad, &bad),
                Err(HeaderError::Implausible),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_live_record_decodes_with_its_frames() {
        let h = header_words();
        let h = decode_header(&h, &h).unwrap();
        let r = record_words();
        let Record::Live(live) = decode_record(&r, &r, &h) else {
            panic!("not live");
        };
        assert_eq!(live.frames(), [0x40_1000, 0x40_2000]);
        assert_eq!(live.weight, 524_388);
    }

    #[test]
    fn torn_free_and_garbage_records_are_told_apart() {
        let h = header_words();
        let h = decode_header(&h, &h).unwrap();
        let r = record_words();
        let with = |i: usize, v: u64| {
            let mut c = r;
            c[i] = v;
            c
        };
        let odd = with(record::SEQ, 3);
        assert_eq!(decode_record(&odd, &odd, &h), Record::Torn);
        assert_eq!(decode_record(&r, &with(record::SEQ, 4), &h), Record::Torn);
        let free = with(record::FLAGS, 0);
        assert_eq!(decode_record(&free, &free, &h), Record::Free);
        for bad in [
            with(record::FLAGS, 0x100 | FLAG_LIVE),
            with(record::PTR, 0x1000),
            with(record::PTR, u64::MAX),
            with(record::SIZE, u64::MAX),
            with(record::WEIGHT, 99),
            with(record::WEIGHT, crate::MAX_WEIGHT + 1),
            with(record::TIME_NS, 0),
            with(record::NFRAMES, FRAMES as u64 + 1),
            with(record::FRAMES + 1, 0),
            with(record::FRAMES, u64::MAX),
        ] {
            assert_eq!(decode_record(&bad, &bad, &h), Record::Garbage, "{bad:?}");
        }
    }
}

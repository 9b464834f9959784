//! Reserving the region and its side table: the address-space budget under
//! `RLIMIT_AS`, strict overcommit, the largest layout the kernel grants,
//! and the advice that keeps it out of core dumps and off huge pages. Raw
//! syscalls only, none of them a cancellation point (libc's `open`, `read`,
//! `write` and `close` are: a thread with a pending cancel would be
//! cancelled inside `malloc`): this runs inside `malloc`.

use core::ptr;
use core::sync::atomic::{AtomicUsize, Ordering};

use super::{
    layout::{LAYOUTS, MAX_ALIGN, PAGE},
    slots::SlotMeta,
};

/// `write(2)` of `msg` to stderr as a raw syscall (libc's `write` is a
/// cancellation point).
pub(super) fn warn(msg: &[u8]) {
    // SAFETY: writes our own buffer to stderr; the result does not matter.
    unsafe { libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len()) };
}

/// The mappings being made or made by [`map_region`] (region, side table,
/// ledger table), each (address, length) set right after its mmap and
/// cleared before it is unmapped, so they never name memory that is not
/// ours: a fork child that takes over an ancestor's interrupted
/// initialisation drops them ([`abandon_partial`]).
static MAPPINGS: [[AtomicUsize; 2]; 3] = [const { [const { AtomicUsize::new(0) }; 2] }; 3];
const REGION: usize = 0;
const META: usize = 1;
const TABLE: usize = 2;

/// Length 0 while the address changes: a fork in between sees no mapping
/// (and leaks it) rather than a range that mixes two.
fn note_mapping(which: usize, addr: usize, len: usize) {
    MAPPINGS[which][1].store(0, Ordering::Relaxed);
    MAPPINGS[which][0].store(addr, Ordering::Release);
    MAPPINGS[which][1].store(len, Ordering::Release);
}

/// Forget, then unmap, mapping `which` if any.
fn drop_mapping(which: usize) {
    let len = MAPPINGS[which][1].swap(0, Ordering::AcqRel);
    let addr = MAPPINGS[which][0].swap(0, Ordering::AcqRel);
    if len != 0 {
        // SAFETY: a mapping of ours that nothing uses (see `MAPPINGS`).
        unsafe { libc::munmap(addr as *mut libc::c_void, len) };
    }
}

/// In a fork child that takes over an interrupted initialisation: unmap
/// this process's copies of what the ancestor had mapped. A mapping made
/// in the instant between its mmap and its note stays (address space
/// only: `MAP_NORESERVE`, untouched).
pub(super) fn abandon_partial() {
    for which in [REGION, META, TABLE] {
        drop_mapping(which);
    }
}

/// A fresh page that fork clears (`MADV_WIPEONFORK`), its first word set
/// to 1: a thread that reads 0 there runs in a fork child of the process
/// that made it. `None` if the kernel refuses either call. Never unmapped
/// once published (a thread may read it any time later).
pub(super) fn fork_marker() -> Option<usize> {
    let page = map_anon(PAGE, libc::PROT_READ | libc::PROT_WRITE)?;
    // SAFETY: advice on our own fresh page.
    if unsafe { libc::madvise(page as *mut libc::c_void, PAGE, libc::MADV_WIPEONFORK) } != 0 {
        drop_marker(page);
        return None;
    }
    // SAFETY: the page is ours, mapped and writable; only ever accessed
    // atomically.
    unsafe { &*(page as *const AtomicUsize) }.store(1, Ordering::Release);
    Some(page)
}

/// Unmap a marker page that was never published.
pub(super) fn drop_marker(page: usize) {
    // SAFETY: our own page, which nothing else knows of.
    unsafe { libc::munmap(page as *mut libc::c_void, PAGE) };
}

/// The leading decimal number of a small proc file, read with raw
/// syscalls into a stack buffer (no allocation, no cancellation point);
/// `None` if it cannot be read.
fn read_proc_number(path: &core::ffi::CStr) -> Option<usize> {
    // SAFETY: opens a proc file read-only with a NUL-terminated path.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 64];
    // SAFETY: reads at most buf.len() bytes into buf; closes our own fd.
    let n = unsafe {
        let n = libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), buf.len());
        libc::syscall(libc::SYS_close, fd);
        n
    };
    let n = usize::try_from(n).ok()?;
    let digits = buf[..n].iter().take_while(|b| b.is_ascii_digit());
    (n > 0 && buf[0].is_ascii_digit()).then(|| {
        digits.fold(0usize, |acc, b| {
            acc.saturating_mul(10).saturating_add(usize::from(b - b'0'))
        })
    })
}

/// `vm.overcommit_memory = 2`: the kernel then charges every private
/// writable mapping whole, `MAP_NORESERVE` or not.
fn strict_overcommit() -> bool {
    read_proc_number(c"/proc/sys/vm/overcommit_memory") == Some(2)
}

const PR_SET_VMA: libc::c_int = 0x5356_4d41;
const PR_SET_VMA_ANON_NAME: libc::c_ulong = 0;

/// Fresh anonymous `MAP_NORESERVE` mapping of `len` bytes, or `None`.
fn map_anon(len: usize, prot: libc::c_int) -> Option<usize> {
    // SAFETY: fresh anonymous mapping at a kernel-chosen address; no
    // existing mapping is touched.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

/// Bytes of address space the region (plus side table) may take: no limit
/// without `RLIMIT_AS`, else a quarter of the limit and at most half of
/// what the process has not used yet (the rest of the program needs room).
fn address_space_budget() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: writes the limit into `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return usize::MAX;
    }
    let limit = lim.rlim_cur as usize;
    let free = limit.saturating_sub(vm_size());
    (limit / 4).min(free / 2)
}

/// This process's address space size in bytes (`/proc/self/statm`'s first
/// field), 0 if unknown.
fn vm_size() -> usize {
    read_proc_number(c"/proc/self/statm")
        .unwrap_or(0)
        .saturating_mul(PAGE)
}

pub(super) struct Mapped {
    pub(super) base: usize,
    /// The ledger's record table, 0 if none (see `crate::ledger`).
    pub(super) table: usize,
    pub(super) meta: *mut SlotMeta,
    pub(super) layout: usize,
    pub(super) lazy: bool,
}

/// Test builds only: `ALLOCPROF_TEST_FORCE_LAZY=1` makes the region lazy
/// as under strict overcommit. Not compiled into any library.
#[cfg(test)]
fn force_lazy() -> bool {
    std::env::var_os("ALLOCPROF_TEST_FORCE_LAZY").is_some()
}
#[cfg(not(test))]
fn force_lazy() -> bool {
    false
}

/// Reserve the largest layout that fits the address-space budget and that
/// the kernel grants, plus its side table and, unless `ALLOCPROF_LEDGER=0`,
/// the ledger's record table (counted in the budget; if the kernel refuses
/// it, the region works without a ledger). All three writable, or, under
/// strict overcommit (which charges a writable mapping whole) or if the
/// kernel refuses a writable region but not an inaccessible one, all three
/// `PROT_NONE` in lazy mode (committed as slots are first handed out, see
/// `open_prefix`).
pub(super) fn map_region() -> Option<Mapped> {
    let budget = address_space_budget();
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let ledger = crate::ledger::enabled();
    let strict = force_lazy() || strict_overcommit();
    for (i, l) in LAYOUTS.iter().enumerate() {
        let meta_len = (l.total_slots * size_of::<SlotMeta>()).next_multiple_of(PAGE);
        let table_len = if ledger {
            crate::ledger::table_bytes(l.total_slots).next_multiple_of(PAGE)
        } else {
            0
        };
        let reserve = l.len + MAX_ALIGN;
        if reserve + meta_len + table_len > budget {
            continue;
        }
        let writable = if strict { None } else { map_anon(reserve, rw) };
        let (raw, lazy) = match writable {
            Some(raw) => (raw, false),
            None => match map_anon(reserve, libc::PROT_NONE) {
                Some(raw) => (raw, true),
                None => continue, // not enough address space: smaller
            },
        };
        note_mapping(REGION, raw, reserve);
        let base = raw.next_multiple_of(MAX_ALIGN);
        // Noted before the trim: never a range that is not ours.
        note_mapping(REGION, base, l.len);
        // SAFETY: trims the unaligned head and tail of our own reservation.
        unsafe {
            if base > raw {
                libc::munmap(raw as *mut libc::c_void, base - raw);
            }
            let end = base + l.len;
            let raw_end = raw + reserve;
            if raw_end > end {
                libc::munmap(end as *mut libc::c_void, raw_end - end);
            }
        }
        // Zero pages are a valid all-empty side table (atomics of 0). In
        // lazy mode its records, like the ledger's, are committed with
        // their slots, so that what is charged is what was used.
        let prot = if lazy { libc::PROT_NONE } else { rw };
        let Some(meta) = map_anon(meta_len, prot) else {
            drop_mapping(REGION);
            continue;
        };
        note_mapping(META, meta, meta_len);
        // A record is written inside malloc and must never fault: writable
        // from the start, or in lazy mode committed before its slot is
        // placed. If the kernel refuses the table, no ledger.
        let table = if table_len > 0 {
            map_anon(table_len, prot).unwrap_or(0)
        } else {
            0
        };
        if table != 0 {
            note_mapping(TABLE, table, table_len);
            // SAFETY: advice on our own anonymous mapping; failure only
            // means the records would go into core dumps.
            unsafe { libc::madvise(table as *mut libc::c_void, table_len, libc::MADV_DONTDUMP) };
        }
        // SAFETY: advice and names on our own anonymous mappings. Failures
        // are harmless and ignored: DONTDUMP/NOHUGEPAGE only keep dumps
        // small and slots from pinning huge pages (each class's open
        // prefix is made DODUMP as it grows); naming needs
        // CONFIG_ANON_VMA_NAME.
        unsafe {
            libc::madvise(base as *mut libc::c_void, l.len, libc::MADV_DONTDUMP);
            libc::madvise(base as *mut libc::c_void, l.len, libc::MADV_NOHUGEPAGE);
            libc::madvise(meta as *mut libc::c_void, meta_len, libc::MADV_DONTDUMP);
            libc::prctl(
                PR_SET_VMA,
                PR_SET_VMA_ANON_NAME,
                base as libc::c_ulong,
                l.len as libc::c_ulong,
                c"allocprof-samples".as_ptr() as libc::c_ulong,
            );
            libc::prctl(
                PR_SET_VMA,
                PR_SET_VMA_ANON_NAME,
                meta as libc::c_ulong,
                meta_len as libc::c_ulong,
                c"allocprof-meta".as_ptr() as libc::c_ulong,
            );
        }
        return Some(Mapped {
            base,
            table,
            meta: meta as *mut SlotMeta,
            layout: i,
            lazy,
        });
    }
    None
}

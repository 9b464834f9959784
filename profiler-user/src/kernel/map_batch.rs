//! Reading a whole BPF hash map in batches (`BPF_MAP_LOOKUP_BATCH`, Linux
//! 5.6+): a few syscalls for the map, where aya's iterator makes two per
//! entry (next key, then lookup). With hundreds of processes and their live
//! samples, that walk was the largest part of a refresh. Callers fall back
//! to the iterator when the kernel refuses the command.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use aya::{Pod, maps::MapData};

/// `union bpf_attr`'s batch member (linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries asked for per call at first; doubled when a hash bucket holds
/// more (the kernel copies whole buckets).
const FIRST_BATCH: usize = 4096;
/// The most entries asked for in one call.
const MAX_BATCH: usize = 1 << 20;

/// Every (key, value) of a hash map whose key and value types are `K` and
/// `V` (a plain hash map: one value per key, not per CPU).
pub(crate) fn read_all<K: Pod, V: Pod>(map: &MapData) -> io::Result<Vec<(K, V)>> {
    let fd = map.fd().as_fd().as_raw_fd();
    let mut out = Vec::new();
    // The kernel's position between calls: a bucket index (4 bytes for a
    // hash map); 8 leaves room.
    let mut token_in = [0u8; 8];
    let mut token_out = [0u8; 8];
    let mut first = true;
    let mut batch = FIRST_BATCH;
    loop {
        // SAFETY: Pod types are valid for any bit pattern, zeros included.
        let zero_key: K = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let zero_value: V = unsafe { std::mem::zeroed() };
        let mut keys = vec![zero_key; batch];
        let mut values = vec![zero_value; batch];
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { token_in.as_ptr() as u64 },
            out_batch: token_out.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: batch as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` points at buffers of `batch` keys and values of the
        // map's own key and value sizes (the caller's types), and at 8-byte
        // tokens; the kernel writes at most `count` entries and one token.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &raw mut attr,
                size_of::<BatchAttr>(),
            )
        };
        let got = (attr.count as usize).min(batch);
        let error = (r < 0).then(io::Error::last_os_error);
        match error.as_ref().and_then(io::Error::raw_os_error) {
            // A bucket holds more entries than we asked for: ask for more.
            Some(libc::ENOSPC) if got == 0 && batch < MAX_BATCH => {
                batch *= 2;
                continue;
            }
            // The end of the map; the last entries came with it.
            Some(libc::ENOENT) | None => {}
            Some(_) => return Err(error.expect("an error")),
        }
        out.extend(keys.into_iter().zip(values).take(got));
        if error.is_some() {
            return Ok(out);
        }
        token_in = token_out;
        first = false;
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{FromRawFd, OwnedFd};

    use super::*;

    /// `union bpf_attr` for BPF_MAP_CREATE and BPF_MAP_UPDATE_ELEM (the
    /// leading fields each needs).
    #[repr(C)]
    #[derive(Default)]
    struct CreateAttr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
    }
    #[repr(C)]
    #[derive(Default)]
    struct ElemAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }

    fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> libc::c_long {
        // SAFETY: `attr` is a valid, initialised bpf_attr prefix of its size.
        unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size_of::<T>()) }
    }

    /// A real kernel hash map of 10,000 entries (needs root and BPF, as the
    /// suite does): read back whole, over several batches.
    #[test]
    fn a_whole_hash_map_reads_back_in_batches() {
        const N: u32 = 10_000;
        let mut create = CreateAttr {
            map_type: 1, // BPF_MAP_TYPE_HASH
            key_size: 4,
            value_size: 8,
            max_entries: N,
        };
        let fd = bpf(0, &mut create);
        assert!(
            fd >= 0,
            "BPF_MAP_CREATE: {} (root and BPF needed)",
            io::Error::last_os_error()
        );
        // SAFETY: a fresh descriptor the kernel just returned, owned here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        for k in 0..N {
            let v = u64::from(k) * 3;
            let mut elem = ElemAttr {
                map_fd: fd.as_raw_fd() as u32,
                key: (&raw const k) as u64,
                value: (&raw const v) as u64,
                ..ElemAttr::default()
            };
            assert_eq!(bpf(2, &mut elem), 0, "BPF_MAP_UPDATE_ELEM");
        }
        let map = MapData::from_fd(fd).unwrap();
        let mut all = read_all::<u32, u64>(&map).unwrap();
        all.sort_unstable();
        assert_eq!(all.len(), N as usize);
        assert!(
            all.iter()
                .enumerate()
                .all(|(i, &(k, v))| k == i as u32 && v == 3 * u64::from(k))
        );
    }
}

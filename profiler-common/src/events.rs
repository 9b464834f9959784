//! What the kernel tells user space through ring buffers: process
//! lifecycle events and frees of blocks it never saw allocated.

/// Process lifecycle event sent to user space through a ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcEvent {
    pub pid: u32,
    pub kind: u32,
    /// For `PROC_EVENT_FORK`: the process that forked `pid` (host pids).
    pub parent: u32,
    pub _pad: u32,
}

/// A free the kernel saw no allocation for, in a process whose ledger user
/// space seeded (`SEEDED_PIDS`): perhaps a block allocated before attach,
/// which user space then retires. Sent through its own ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnseenFree {
    pub pid: u32,
    pub _pad: u32,
    pub ptr: u64,
    /// When the free ran (`bpf_ktime_get_ns`, `CLOCK_MONOTONIC`): user
    /// space retires the seed in the snapshots read after it, not before.
    pub time_ns: u64,
}

pub const PROC_EVENT_EXIT: u32 = 1;
pub const PROC_EVENT_EXEC: u32 = 2;
/// The kernel's OOM killer picked the process (`oom:mark_victim`).
pub const PROC_EVENT_OOM: u32 = 3;
/// A followed process (`--pid`'s tree) forked `pid`, now followed too.
pub const PROC_EVENT_FORK: u32 = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layout_has_no_implicit_padding() {
        assert_eq!(size_of::<ProcEvent>(), 16);
        assert_eq!(size_of::<UnseenFree>(), 24);
    }
}

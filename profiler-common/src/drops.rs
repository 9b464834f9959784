//! Why a sampled event was not accounted (or was, under a stand-in stack):
//! the index of the kernel's per-process drop counters.

/// Why a sampled event was not accounted. Index into the drop counters.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// The global live-sample table is full.
    LiveMapFull = 0,
    /// The process reached its cap of live samples.
    ProcessCap = 1,
    /// The user stack could not be taken.
    StackFailed = 2,
    /// The stack table is full.
    StackMapFull = 3,
    /// The aggregate table is full.
    AggMapFull = 4,
    /// A probe argument could not be read.
    ArgReadFailed = 5,
    /// A free of a pointer that has no live sample (e.g. sampled before attach).
    UnmatchedFree = 6,
    /// An alloc at an address that still had a live sample (its free was missed).
    ReplacedLive = 7,
    /// The per-process state table is full.
    ProcMapFull = 8,
    /// The emitter could not track a sampled allocation (alloc with pointer
    /// 0; allocprof's allocator: the block could not be placed). Its bytes
    /// are in the allocated sums but missing from the live ones.
    Unplaced = 9,
    /// The per-CPU stack scratch was in use by a preempted program on this
    /// CPU: the sample is kept, under an unavailable stack.
    ScratchBusy = 10,
    /// The process created new stacks faster than its budget allows (e.g.
    /// garbage unwinds of code without frame pointers): the sample is kept,
    /// under the process's overflow stack ([`OVERFLOW_STACK`]).
    ///
    /// [`OVERFLOW_STACK`]: crate::OVERFLOW_STACK
    StackRateLimited = 11,
    /// The unwinder reached code it has no rule for (a file without
    /// call-frame information, or whose table did not fit the kernel's):
    /// the sample is kept, its stack ends in a truncation marker.
    StackTruncated = 12,
    /// The sample came before its process's unwind tables were in (a new
    /// or just exec'ed process): walked by frame pointers, its stack is cut
    /// after the first frame in a file not known to keep them, where the
    /// walk could have gone astray; the sample is kept, its stack ends in a
    /// marker. Counted by user space, which makes that cut.
    StackBeforeTables = 13,
    /// The stack was deeper than [`MAX_STACK_DEPTH`] frames: the sample is
    /// kept, its stack ends in a marker in place of its last frame. Counted
    /// by user space, from the kernel's marker.
    ///
    /// [`MAX_STACK_DEPTH`]: crate::MAX_STACK_DEPTH
    StackTooDeep = 14,
}

pub const DROP_REASONS: usize = 15;

impl DropReason {
    pub const ALL: [DropReason; DROP_REASONS] = [
        DropReason::LiveMapFull,
        DropReason::ProcessCap,
        DropReason::StackFailed,
        DropReason::StackMapFull,
        DropReason::AggMapFull,
        DropReason::ArgReadFailed,
        DropReason::UnmatchedFree,
        DropReason::ReplacedLive,
        DropReason::ProcMapFull,
        DropReason::Unplaced,
        DropReason::ScratchBusy,
        DropReason::StackRateLimited,
        DropReason::StackTruncated,
        DropReason::StackBeforeTables,
        DropReason::StackTooDeep,
    ];

    pub const fn describe(self) -> &'static str {
        match self {
            DropReason::LiveMapFull => "global live-sample cap reached",
            DropReason::ProcessCap => "per-process live-sample cap reached",
            DropReason::StackFailed => "user stack could not be taken",
            DropReason::StackMapFull => "stack table full",
            DropReason::AggMapFull => "aggregate table full",
            DropReason::ArgReadFailed => "probe argument unreadable",
            DropReason::UnmatchedFree => "free of a sample taken before attach",
            DropReason::ReplacedLive => "alloc over a live sample (missed free)",
            DropReason::ProcMapFull => "process table full",
            DropReason::Unplaced => "sample the allocator could not track",
            DropReason::ScratchBusy => "stack scratch busy (preempted walk)",
            DropReason::StackRateLimited => {
                "new stacks over the per-process limit (kept under the overflow stack)"
            }
            DropReason::StackTruncated => {
                "stack cut short: code without unwind info (kept, ends in a marker)"
            }
            DropReason::StackBeforeTables => {
                "stack cut short: taken before the process's unwind tables were in (kept, ends in a marker)"
            }
            DropReason::StackTooDeep => {
                "stack deeper than 127 frames (kept, cut there, ends in a marker)"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_reasons_index_their_own_slot() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }
}

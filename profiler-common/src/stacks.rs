//! User stacks and their ids: the frames the kernel files, the hash that
//! names them (seeded per process image, so an image's stacks can be
//! deleted alone), and the ids reserved for samples without a stack of
//! their own.

/// Deepest user stack taken per sample (the kernel's own limit is 127).
pub const MAX_STACK_DEPTH: usize = 127;

/// A user stack, filed under the hash of its process image and frames
/// (see [`stack_seed`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackTrace {
    pub len: u64,
    pub frames: [u64; MAX_STACK_DEPTH],
}

/// Stack id of samples whose user stack could not be taken: they are still
/// accounted, under a stack user space shows as unavailable.
pub const NO_STACK: u64 = 0;

/// Stack id of samples whose process was over its budget of new stacks
/// ([`DropReason::StackRateLimited`]): still accounted, under one stack per
/// process image that user space shows as a stack flood. [`stack_id`] never
/// produces it (nor [`NO_STACK`]).
///
/// [`DropReason::StackRateLimited`]: crate::DropReason::StackRateLimited
pub const OVERFLOW_STACK: u64 = u64::MAX;

/// FNV-1a over the frames, seeded by [`stack_seed`] (here, beside the types,
/// so host tests can compute what the kernel does). Two distinct stacks
/// collide with odds about n²/2^65 for n stacks: negligible at the table's
/// 65,536, but then they would merge.
#[inline(always)]
pub fn stack_hash_step(hash: u64, frame: u64) -> u64 {
    (hash ^ frame).wrapping_mul(0x0000_0100_0000_01b3)
}

pub const STACK_HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;

/// The hash state a stack of process image (`pid`, `generation`) starts
/// from: every stack id belongs to one image, so the ids of an image that is
/// gone can be deleted without touching another process's stacks. Each FNV
/// step is a bijection of the state for a given frame, so the same frames of
/// two images always hash apart (before [`stack_id`]'s remap).
#[inline(always)]
pub fn stack_seed(pid: u32, generation: u32) -> u64 {
    stack_hash_step(
        STACK_HASH_SEED,
        (u64::from(pid) << 32) | u64::from(generation),
    )
}

/// A finished hash as a stack id: never [`NO_STACK`] nor [`OVERFLOW_STACK`].
#[inline(always)]
pub fn stack_id(hash: u64) -> u64 {
    if hash == NO_STACK {
        1
    } else if hash == OVERFLOW_STACK {
        OVERFLOW_STACK - 1
    } else {
        hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layout_has_no_implicit_padding() {
        assert_eq!(size_of::<StackTrace>(), 8 * (1 + MAX_STACK_DEPTH));
    }

    fn id_of(pid: u32, generation: u32, frames: &[u64]) -> u64 {
        stack_id(
            frames
                .iter()
                .fold(stack_seed(pid, generation), |h, &f| stack_hash_step(h, f)),
        )
    }

    #[test]
    fn stack_ids_belong_to_one_process_image() {
        let frames = [0x4011_2233, 0x4011_5566, 0x7fff_0000_1234];
        let a = id_of(100, 0, &frames);
        assert_eq!(a, id_of(100, 0, &frames), "deterministic");
        assert_ne!(a, id_of(101, 0, &frames), "another process");
        assert_ne!(a, id_of(100, 1, &frames), "the next image of the process");
        // pid and generation are not interchangeable.
        assert_ne!(id_of(1, 2, &frames), id_of(2, 1, &frames));
        for pid in 0..2000 {
            for generation in 0..4 {
                for depth in 0..frames.len() {
                    let id = id_of(pid, generation, &frames[..depth]);
                    assert!(id != NO_STACK && id != OVERFLOW_STACK);
                }
            }
        }
        // The reserved ids are remapped, never produced.
        assert_eq!(stack_id(NO_STACK), 1);
        assert_eq!(stack_id(OVERFLOW_STACK), OVERFLOW_STACK - 1);
        assert_eq!(stack_id(42), 42);
    }
}

//! Bounded, positioned reads of an ELF image in memory or in a file.

use std::fs::File;
use std::mem::size_of;
use std::os::unix::fs::FileExt;

use object::pod::{self, Pod};

use super::{MAX_READ, NoteError};

/// What the parser reads from: an image in memory or an open file.
pub(super) enum Source<'a> {
    Bytes(&'a [u8]),
    File(&'a File),
}

/// Bounded, positioned reads of an ELF image: every read is checked against
/// the image's length and charged to a budget of [`MAX_READ`] bytes.
pub(super) struct Reader<'a> {
    source: Source<'a>,
    pub(super) len: u64,
    budget: u64,
}

impl<'a> Reader<'a> {
    pub(super) fn new(source: Source<'a>, len: u64) -> Self {
        Reader {
            source,
            len,
            budget: MAX_READ,
        }
    }

    /// Bytes `offset..offset + len`, or `Truncated` / `TooLarge`.
    pub(super) fn read(
        &mut self,
        offset: u64,
        len: u64,
        what: &'static str,
    ) -> Result<Vec<u8>, NoteError> {
        let truncated = |available: u64| NoteError::Truncated {
            what,
            offset,
            needed: len,
            available,
        };
        let available = self.len.saturating_sub(offset);
        let end = match offset.checked_add(len) {
            Some(end) if end <= self.len => end,
            _ => return Err(truncated(available)),
        };
        if len > self.budget {
            return Err(NoteError::TooLarge {
                what,
                offset,
                size: len,
                limit: MAX_READ,
            });
        }
        self.budget -= len;
        match self.source {
            // Both bounds are ≤ data.len(), so they fit in usize.
            Source::Bytes(data) => Ok(data[offset as usize..end as usize].to_vec()),
            Source::File(file) => {
                // ≤ MAX_READ, so it fits in usize.
                let mut buf = vec![0; len as usize];
                match file.read_exact_at(&mut buf, offset) {
                    Ok(()) => Ok(buf),
                    // The file shrank since we measured it.
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        Err(truncated(available))
                    }
                    Err(e) => Err(NoteError::Read(e)),
                }
            }
        }
    }

    pub(super) fn pod<T: Pod + Copy>(
        &mut self,
        offset: u64,
        what: &'static str,
    ) -> Result<T, NoteError> {
        let bytes = self.read(offset, size_of::<T>() as u64, what)?;
        // Cannot fail: the size was just checked and object's ELF structs have
        // alignment 1. Mapped anyway rather than unwrapped: this must not panic.
        pod::from_bytes::<T>(&bytes)
            .map(|(value, _)| *value)
            .map_err(|_| NoteError::Malformed { what, offset })
    }

    pub(super) fn table<T: Pod + Copy>(
        &mut self,
        offset: u64,
        count: u64,
        what: &'static str,
    ) -> Result<Vec<T>, NoteError> {
        let len = count.saturating_mul(size_of::<T>() as u64);
        let bytes = self.read(offset, len, what)?;
        pod::slice_from_all_bytes::<T>(&bytes)
            .map(<[T]>::to_vec)
            .map_err(|_| NoteError::Malformed { what, offset })
    }
}

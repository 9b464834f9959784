//! Ranges of the kernel's one array of unwind rows (`UNWIND_ROWS`), handed
//! out per file: first fit, and freed ranges merge with their neighbours so
//! the array does not fragment as libraries come and go.

use std::collections::BTreeMap;

/// Free ranges of a row array of `capacity` rows.
#[derive(Debug)]
pub struct RowPool {
    /// start → length, non-overlapping and never adjacent (merged).
    free: BTreeMap<u32, u32>,
}

impl RowPool {
    pub fn new(capacity: u32) -> RowPool {
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        RowPool { free }
    }

    /// A range of `len` rows, or `None` if no free range is that long.
    pub fn alloc(&mut self, len: u32) -> Option<u32> {
        if len == 0 {
            return None;
        }
        let (&start, &have) = self.free.iter().find(|(_, have)| **have >= len)?;
        self.free.remove(&start);
        if have > len {
            self.free.insert(start + len, have - len);
        }
        Some(start)
    }

    /// Returns a range [`RowPool::alloc`] gave.
    pub fn release(&mut self, start: u32, len: u32) {
        if len == 0 {
            return;
        }
        let (mut start, mut len) = (start, len);
        if let Some((&before, &before_len)) = self.free.range(..start).next_back()
            && before + before_len == start
        {
            self.free.remove(&before);
            start = before;
            len += before_len;
        }
        if let Some(&after_len) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += after_len;
        }
        self.free.insert(start, len);
    }

    /// Rows not handed out.
    pub(crate) fn free_rows(&self) -> u64 {
        self.free.values().map(|&l| u64::from(l)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_first_fit_and_never_overlap() {
        let mut pool = RowPool::new(100);
        assert_eq!(pool.alloc(30), Some(0));
        assert_eq!(pool.alloc(30), Some(30));
        assert_eq!(pool.alloc(50), None, "only 40 left");
        assert_eq!(pool.alloc(40), Some(60));
        assert_eq!(pool.free_rows(), 0);
        assert_eq!(pool.alloc(0), None);
    }

    #[test]
    fn released_ranges_merge_with_their_neighbours() {
        let mut pool = RowPool::new(90);
        let (a, b, c) = (
            pool.alloc(30).unwrap(),
            pool.alloc(30).unwrap(),
            pool.alloc(30).unwrap(),
        );
        pool.release(a, 30);
        pool.release(c, 30);
        assert_eq!(pool.alloc(60), None, "two holes of 30, not one of 60");
        pool.release(b, 30);
        assert_eq!(pool.alloc(90), Some(0), "all three merged");
    }
}

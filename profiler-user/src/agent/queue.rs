//! The exports waiting to be sent, bounded in bytes: when a new one does
//! not fit, the oldest are dropped (and counted) to make room. The export
//! being sent stays until its attempt ends; if room is needed, it is marked
//! abandoned (no further retry) rather than pulled from under the sender.
//! So memory is at most the bound plus one export.

use std::{collections::VecDeque, sync::Arc};

/// One encoded `ExportProfilesServiceRequest`.
#[derive(Clone, Debug)]
pub struct Item {
    pub id: u64,
    pub bytes: Arc<Vec<u8>>,
}

#[derive(Debug)]
pub struct Queue {
    items: VecDeque<Item>,
    bytes: usize,
    bound: usize,
    next_id: u64,
    in_flight: Option<u64>,
    abandoned: bool,
}

impl Queue {
    pub fn new(bound: usize) -> Queue {
        Queue {
            items: VecDeque::new(),
            bytes: 0,
            bound,
            next_id: 0,
            in_flight: None,
            abandoned: false,
        }
    }

    /// Adds an export; returns how many older ones were dropped for it.
    /// The newest is always kept, even alone over the bound.
    pub fn push(&mut self, bytes: Vec<u8>) -> usize {
        let len = bytes.len();
        let mut dropped = 0;
        while self.bytes + len > self.bound {
            let droppable = self.items.iter().position(|i| Some(i.id) != self.in_flight);
            match droppable {
                Some(at) => {
                    let item = self.items.remove(at).expect("a position found");
                    self.bytes -= item.bytes.len();
                    dropped += 1;
                }
                None => {
                    // Only the export in flight is left: it goes after this
                    // attempt (counted then, by the sender).
                    self.abandoned = self.in_flight.is_some();
                    break;
                }
            }
        }
        self.items.push_back(Item {
            id: self.next_id,
            bytes: Arc::new(bytes),
        });
        self.next_id += 1;
        self.bytes += len;
        dropped
    }

    /// The oldest export, now in flight.
    pub fn start(&mut self) -> Option<Item> {
        let item = self.items.front()?.clone();
        self.in_flight = Some(item.id);
        self.abandoned = false;
        Some(item)
    }

    /// Whether the export in flight should not be retried (the queue needed
    /// its room).
    pub fn abandoned(&self) -> bool {
        self.abandoned
    }

    /// The export in flight is done with (sent, or given up).
    pub fn finish(&mut self, id: u64) {
        if self.in_flight == Some(id) {
            self.in_flight = None;
            self.abandoned = false;
        }
        if let Some(at) = self.items.iter().position(|i| i.id == id) {
            let item = self.items.remove(at).expect("a position found");
            self.bytes -= item.bytes.len();
        }
    }

    /// Empties it; returns how many exports it held.
    pub fn clear(&mut self) -> usize {
        let n = self.items.len();
        self.items.clear();
        self.bytes = 0;
        n
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_are_dropped_to_stay_within_the_bound() {
        let mut q = Queue::new(100);
        assert_eq!(q.push(vec![1; 40]), 0);
        assert_eq!(q.push(vec![2; 40]), 0);
        assert_eq!(q.bytes(), 80);
        // 80 + 40 > 100: the oldest goes.
        assert_eq!(q.push(vec![3; 40]), 1);
        assert_eq!((q.len(), q.bytes()), (2, 80));
        assert_eq!(q.start().unwrap().bytes[0], 2);
        // One larger than the bound: all others go, it stays.
        let mut q = Queue::new(100);
        q.push(vec![1; 10]);
        q.push(vec![2; 10]);
        assert_eq!(q.push(vec![3; 150]), 2);
        assert_eq!((q.len(), q.bytes()), (1, 150));
    }

    #[test]
    fn the_export_in_flight_is_abandoned_not_removed() {
        let mut q = Queue::new(100);
        q.push(vec![1; 60]);
        q.push(vec![2; 30]);
        let sending = q.start().unwrap();
        // Room for 50: the waiting one goes first, then the one in flight
        // is marked abandoned.
        assert_eq!(q.push(vec![3; 50]), 1);
        assert!(q.abandoned());
        assert_eq!(q.bytes(), 110);
        q.finish(sending.id);
        assert_eq!((q.len(), q.bytes()), (1, 50));
        let next = q.start().unwrap();
        assert_eq!(next.bytes[0], 3);
        assert!(!q.abandoned());
        q.finish(next.id);
        assert!(q.is_empty());
        assert_eq!(q.bytes(), 0);
    }

    #[test]
    fn the_bound_holds_over_many_pushes() {
        let mut q = Queue::new(1000);
        let mut dropped = 0;
        for i in 0..500 {
            dropped += q.push(vec![0; 1 + i % 97]);
            assert!(q.bytes() <= 1000);
        }
        assert_eq!(dropped + q.len(), 500);
        let held = q.len();
        assert_eq!(q.clear(), held);
        assert_eq!(q.bytes(), 0);
    }
}

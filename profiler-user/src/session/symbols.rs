//! Stacks to the symbolizer and back. A stack is requested once per process
//! incarnation, normalized against the address space of the process that
//! took it; while a live process's maps are not known yet its stacks wait
//! (a stack normalized without them would stay unknown for good). A stack
//! with addresses outside every known mapping (a library dlopen'ed after the
//! last scan) is symbolized again once a scan maps one of them.

use std::sync::Arc;

use super::{Incarnation, KernelPort, ProcessPort, Session};
use crate::{
    kernel::KernelSnapshot,
    profile::synthetic_stack,
    symbolize::{Frame, Request, Response, heap_bytes},
};

/// A `symbols` entry's own share of the map (key, pointer, control byte,
/// load factor).
const SYMBOLS_ENTRY_BYTES: usize = 48;

impl<K: KernelPort, P: ProcessPort> Session<K, P> {
    /// The incarnation of the process that has `pid` now.
    pub(super) fn incarnation(&mut self, pid: u32) -> Incarnation {
        let next = &mut self.next_incarnation;
        *self.incarnations.entry(pid).or_insert_with(|| {
            *next += 1;
            *next
        })
    }

    /// Requests the stacks of live images whose maps are known.
    pub(super) fn request_symbols(&mut self, snapshot: &KernelSnapshot) {
        self.request_symbols_where(snapshot, |_, _| true, true);
    }

    /// Requests the stacks of the images `wanted(pid, generation)` selects.
    /// With `wait_for_maps`, those of a process whose address space is not
    /// known yet are left for a later call; without it (images being
    /// retired: their maps will never be known better), they go as they are.
    pub(super) fn request_symbols_where(
        &mut self,
        snapshot: &KernelSnapshot,
        wanted: impl Fn(u32, u32) -> bool,
        wait_for_maps: bool,
    ) {
        let mut batch = Vec::new();
        for (key, _) in &snapshot.aggregates {
            if synthetic_stack(key.stack_id).is_some() || !wanted(key.pid, key.generation) {
                continue;
            }
            let space = self.spaces.get(&key.pid);
            if space.is_none() && wait_for_maps {
                continue;
            }
            let id = (self.incarnation(key.pid), key.stack_id);
            let space = self.spaces.get(&key.pid);
            if self.pending.contains(&id)
                || (self.symbols.contains_key(&id) && !self.newly_mapped(id, space))
            {
                continue;
            }
            let addrs = match self.ledgers.stack(key.stack_id) {
                Some(frames) => Some(frames.to_vec()),
                None => self.kernel.stack(key.stack_id),
            };
            let Some(addrs) = addrs else {
                continue;
            };
            let frames: Vec<_> = addrs
                .into_iter()
                .map(|a| (a, space.and_then(|s| s.normalize(a))))
                .collect();
            // Walked before its process's tables were in: only the frames
            // that can be vouched for (a live image's waits for its files'
            // tables to compile).
            let Some(frames) = self.vouch_for(frames, wait_for_maps) else {
                continue;
            };
            let unresolved: Vec<u64> = frames
                .iter()
                .filter(|(a, at)| at.is_none() && mappable(*a))
                .map(|(a, _)| *a)
                .collect();
            // Only a live image's maps can still grow.
            if unresolved.is_empty() || space.is_none() {
                self.unresolved.remove(&id);
            } else {
                self.unresolved.insert(id, unresolved);
            }
            self.pending.insert(id);
            batch.push(Request { key: id, frames });
        }
        self.symbolizer.submit(batch);
    }

    /// Whether a symbolized stack had addresses outside its process's maps
    /// that `space` now maps: its names are worth asking for again.
    fn newly_mapped(
        &self,
        id: (Incarnation, u64),
        space: Option<&crate::normalize::AddressSpace>,
    ) -> bool {
        match (self.unresolved.get(&id), space) {
            (Some(addrs), Some(space)) => addrs.iter().any(|&a| space.normalize(a).is_some()),
            _ => false,
        }
    }

    /// Takes in what the symbolizer has finished.
    pub(super) fn collect_symbols(&mut self) {
        let responses = self.symbolizer.ready();
        self.take_symbols(responses);
    }

    fn take_symbols(&mut self, responses: Vec<Response<(Incarnation, u64)>>) {
        for response in responses {
            self.pending.remove(&response.key);
            if self.unwanted.remove(&response.key) {
                self.unresolved.remove(&response.key);
            } else {
                // A stack asked for again keeps its old names until now.
                self.symbols.insert(response.key, response.frames.into());
            }
        }
        self.reclaim_stacks();
        self.drop_oldest_frozen();
    }

    /// Deletes the kernel's stacks of frozen images once all are symbolized:
    /// stack ids belong to one image, so nothing will file a sample under
    /// them again, and a long system-wide run keeps `STACKS` bounded. The
    /// image's names now count in the memory of gone images.
    fn reclaim_stacks(&mut self) {
        let mut ids = Vec::new();
        for f in self.frozen.iter_mut().filter(|f| !f.stacks_reclaimed) {
            let symbolized = f.stacks.iter().all(|(id, _)| {
                synthetic_stack(*id).is_some() || self.symbols.contains_key(&(f.incarnation, *id))
            });
            if symbolized {
                let names: usize = f
                    .stacks
                    .iter()
                    .filter_map(|(id, _)| self.symbols.get(&(f.incarnation, *id)))
                    .map(|frames| SYMBOLS_ENTRY_BYTES + heap_bytes(frames))
                    .sum();
                f.bytes += names as u64;
                self.gone_bytes += names as u64;
                ids.extend(
                    f.stacks
                        .iter()
                        .map(|(id, _)| *id)
                        .filter(|id| synthetic_stack(*id).is_none()),
                );
                f.stacks_reclaimed = true;
            }
        }
        if !ids.is_empty() {
            self.kernel.forget_stacks(&ids);
        }
    }

    /// Waits for every requested stack to be symbolized.
    pub(crate) fn finish_symbols(&mut self) {
        let responses = self.symbolizer.wait(self.pending.len());
        self.take_symbols(responses);
    }

    /// The frames of a stack of an incarnation, or a placeholder saying why not.
    pub(super) fn frames(&self, incarnation: Incarnation, stack_id: u64) -> Arc<[Frame]> {
        if let Some(text) = synthetic_stack(stack_id) {
            return placeholder(text);
        }
        match self.symbols.get(&(incarnation, stack_id)) {
            Some(frames) => frames.clone(),
            None => placeholder(&format!("[stack {stack_id:016x}, not yet symbolized]")),
        }
    }
}

/// The lowest address no user mapping can hold: user space ends below 2^47
/// (2^56 with 5-level paging). Above it are the markers a stack may end in
/// (the kernel's `TRUNCATED_FRAME`, `DEPTH_CUT_FRAME` and `NO_TABLES_FRAME`, the ledger's `CUT_FRAME`): no rescan
/// can ever resolve them, so they must not keep a process rescanned.
const USER_SPACE_END: u64 = 1 << 56;

/// Whether a later scan of the process could map `addr`.
fn mappable(addr: u64) -> bool {
    addr < USER_SPACE_END
}

fn placeholder(text: &str) -> Arc<[Frame]> {
    Arc::from(vec![Frame::named(text)])
}

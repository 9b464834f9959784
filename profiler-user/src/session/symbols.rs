//! Stacks to the symbolizer and back. A stack is requested once per process
//! incarnation, normalized against the address space of the process that
//! took it; while a live process's maps are not known yet its stacks wait
//! (a stack normalized without them would stay unknown for good). A stack
//! with addresses outside every known mapping (a library dlopen'ed after the
//! last scan) is symbolized again once a scan maps one of them.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use super::{
    Incarnation, KernelPort, ProcessPort, Session, SymbolKey,
    record::{Symbols, Visit},
};
use profiler_common::python::split_python;

use crate::ids::Pid;
use crate::{
    kernel::KernelSnapshot,
    model::profile::synthetic_stack,
    python::{
        code::{CodeError, Layout, Memory, NoMemory},
        merge::PyItem,
    },
    symbolize::{Frame, Request, Response, heap_bytes},
};

/// How many answers [`Session::finish_symbols`] takes in at a time.
const FINISH_CHUNK: usize = 512;

/// A `symbols` entry's own share of the map (key, pointer, control byte,
/// load factor).
const SYMBOLS_ENTRY_BYTES: usize = 48;

impl<K: KernelPort, P: ProcessPort> Session<K, P> {
    /// The incarnation of the process that has `pid` now.
    pub(super) fn incarnation(&mut self, pid: Pid) -> Incarnation {
        self.track_pid(pid).incarnation
    }

    /// Where each tracked process's stacks stand in `snapshot` (read
    /// before the seeds join it): see [`Visit`].
    pub(super) fn visits(&self, snapshot: &KernelSnapshot) -> HashMap<Pid, Visit> {
        self.tracked
            .iter()
            .map(|(&pid, t)| {
                let kernel = snapshot
                    .processes
                    .get(&pid.0)
                    .map(|p| (p.generation, p.alloc_events));
                let ledger = t.image.ledger.as_ref().map(|l| l.stamp());
                (pid, Visit { kernel, ledger })
            })
            .collect()
    }

    /// The processes with nothing new to request since their last visit
    /// (and no stack waiting for a dlopen'ed library's maps).
    pub(super) fn quiet(&self, visits: &HashMap<Pid, Visit>) -> HashSet<Pid> {
        visits
            .iter()
            .filter(|(pid, visit)| {
                self.tracked.get(pid).is_some_and(|t| {
                    t.symbols.visited.as_ref() == Some(*visit) && t.symbols.unresolved.is_empty()
                })
            })
            .map(|(&pid, _)| pid)
            .collect()
    }

    /// Requests the stacks of live images whose maps are known, skipping
    /// the `quiet` processes; the others are noted as visited at `visits`
    /// when none of their stacks had to wait.
    pub(super) fn request_symbols(
        &mut self,
        snapshot: &KernelSnapshot,
        visits: HashMap<Pid, Visit>,
        quiet: &HashSet<Pid>,
    ) {
        let mut waiting = HashSet::new();
        self.request_symbols_where(snapshot, |pid, _| !quiet.contains(&pid), true, &mut waiting);
        for (pid, visit) in visits {
            let Some(t) = self.tracked.get_mut(&pid) else {
                continue;
            };
            let before = t.symbols.seen.replace(visit);
            if quiet.contains(&pid) || waiting.contains(&pid) {
                continue;
            }
            // Every stack of a sample counted at the read before is in this
            // read's aggregates; one counted by this read may not be yet.
            t.symbols.visited = before;
        }
    }

    /// Requests the stacks of the images `wanted(pid, generation)` selects.
    /// With `wait_for_maps`, those of a process whose address space is not
    /// known yet are left for a later call; without it (images being
    /// retired: their maps will never be known better), they go as they are.
    /// The processes with a stack left for a later call are added to
    /// `waiting`.
    pub(super) fn request_symbols_where(
        &mut self,
        snapshot: &KernelSnapshot,
        wanted: impl Fn(Pid, u32) -> bool,
        wait_for_maps: bool,
        waiting: &mut HashSet<Pid>,
    ) {
        let mut batch = Vec::new();
        for (key, _) in &snapshot.aggregates {
            if synthetic_stack(key.stack_id).is_some() || !wanted(Pid(key.pid), key.generation) {
                continue;
            }
            #[cfg(test)]
            {
                self.looked_at += 1;
            }
            if self.space(Pid(key.pid)).is_none() && wait_for_maps {
                waiting.insert(Pid(key.pid));
                continue;
            }
            let incarnation = self.incarnation(Pid(key.pid));
            let stack = key.stack_id;
            {
                let tracked = &self.tracked[&Pid(key.pid)];
                let space = tracked.image.space.as_ref();
                let symbols = &tracked.symbols;
                if symbols.pending.contains(&stack)
                    || (symbols.names.contains_key(&stack) && !newly_mapped(symbols, stack, space))
                {
                    continue;
                }
            }
            let addrs = match self.seeded_stack(Pid(key.pid), stack) {
                Some(frames) => Some(frames.to_vec()),
                None => self.kernel.stack(stack),
            };
            let Some(addrs) = addrs else {
                waiting.insert(Pid(key.pid));
                continue;
            };
            // The Python part is code objects, not addresses: resolved now,
            // while the process lives, before the native part is normalized.
            let (native, python) = split_python(&addrs);
            // Only the kernel's stacks have a Python part (the ledger's,
            // taken inside the process, have none), and with it prints.
            let prints = (!python.is_empty()).then(|| self.kernel.stack_prints(stack));
            let python = self.resolve_python(Pid(key.pid), python, prints.as_deref());
            let space = self.tracked[&Pid(key.pid)].image.space.as_ref();
            let frames: Vec<_> = native
                .iter()
                .map(|&a| (a, space.and_then(|s| s.normalize(a))))
                .collect();
            // Walked before its process's tables were in: only the frames
            // that can be vouched for (a live image's waits for its files'
            // tables to compile).
            let Some(frames) = self.vouch_for(frames, wait_for_maps) else {
                waiting.insert(Pid(key.pid));
                continue;
            };
            let unresolved: Vec<u64> = frames
                .iter()
                .filter(|(a, at)| at.is_none() && mappable(*a))
                .map(|(a, _)| *a)
                .collect();
            let known_space = space.is_some();
            let symbols = &mut self.track_pid(Pid(key.pid)).symbols;
            // Only a live image's maps can still grow.
            if unresolved.is_empty() || !known_space {
                symbols.unresolved.remove(&stack);
            } else {
                symbols.unresolved.insert(stack, unresolved);
            }
            symbols.pending.insert(stack);
            let key = SymbolKey {
                pid: Pid(key.pid),
                incarnation,
                stack,
            };
            batch.push(Request {
                key,
                frames,
                python,
            });
        }
        self.in_flight += batch.len();
        self.symbolizer.submit(batch);
    }

    /// The Python part of a stack of `pid`, resolved through its image's
    /// code cache (see `python::cache`).
    fn resolve_python(&mut self, pid: Pid, python: &[u64], prints: Option<&[u32]>) -> Vec<PyItem> {
        if python.is_empty() {
            return Vec::new();
        }
        let Some(tracked) = self.tracked.get_mut(&pid) else {
            return Vec::new();
        };
        let layout = tracked
            .python
            .map_or(Err(CodeError::NoVersion), Layout::for_version);
        let memory = self.processes.python_memory(pid);
        let memory: &dyn Memory = memory.as_deref().unwrap_or(&NoMemory);
        tracked
            .image
            .python_code
            .resolve(memory, layout, python, prints)
    }

    /// Takes in what the symbolizer has finished.
    pub(super) fn collect_symbols(&mut self) {
        let responses = self.symbolizer.ready();
        self.take_symbols(responses);
    }

    fn take_symbols(&mut self, responses: Vec<Response<SymbolKey>>) {
        for Response { key, frames } in responses {
            self.in_flight -= 1;
            // Its process's, if it still runs; else its frozen image's (the
            // newest are likeliest); else its image was dropped meanwhile
            // and its names are not kept.
            if let Some(t) = self
                .tracked
                .get_mut(&key.pid)
                .filter(|t| t.incarnation == key.incarnation)
                && t.symbols.pending.remove(&key.stack)
            {
                // A stack asked for again keeps its old names until now.
                t.symbols.names.insert(key.stack, self.stacks.share(frames));
            } else if let Some(f) = self
                .frozen
                .iter_mut()
                .rev()
                .find(|f| f.incarnation == key.incarnation && f.pending.contains(&key.stack))
            {
                f.pending.remove(&key.stack);
                f.names.insert(key.stack, self.stacks.share(frames));
            }
        }
        self.stacks.sweep();
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
            let symbolized = f
                .stacks
                .iter()
                .all(|(id, _)| synthetic_stack(*id).is_some() || f.names.contains_key(id));
            if symbolized {
                let names: usize = f
                    .stacks
                    .iter()
                    .filter_map(|(id, _)| f.names.get(id))
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

    /// Waits for every requested stack to be symbolized, taking the
    /// answers in as they come: an answer not from the symbolizer's memo
    /// has frames of its own until shared, and 20,000 of them held at once
    /// were the start-up's peak.
    pub(crate) fn finish_symbols(&mut self) {
        while self.in_flight > 0 {
            let responses = self.symbolizer.wait(self.in_flight.min(FINISH_CHUNK));
            // None: the thread is gone, and no answer will come.
            if responses.is_empty() {
                break;
            }
            self.take_symbols(responses);
        }
    }
}

/// The frames of a stack among an image's `names`, or a placeholder saying
/// why not.
pub(super) fn frames(names: &HashMap<u64, Arc<[Frame]>>, stack_id: u64) -> Arc<[Frame]> {
    if let Some(text) = synthetic_stack(stack_id) {
        return placeholder(text);
    }
    match names.get(&stack_id) {
        Some(frames) => frames.clone(),
        None => placeholder(&format!("[stack {stack_id:016x}, not yet symbolized]")),
    }
}

/// Whether a symbolized stack had addresses outside its process's maps
/// that `space` now maps: its names are worth asking for again.
fn newly_mapped(
    symbols: &Symbols,
    stack: u64,
    space: Option<&crate::process::normalize::AddressSpace>,
) -> bool {
    match (symbols.unresolved.get(&stack), space) {
        (Some(addrs), Some(space)) => addrs.iter().any(|&a| space.normalize(a).is_some()),
        _ => false,
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

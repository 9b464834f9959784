//! The [`Profile`] of a snapshot: the live images the kernel holds, and the
//! images retired earlier, frozen as they were.

use std::collections::BTreeMap;

use profiler_common::ProcCounters;

use super::{Incarnation, KernelPort, ProcessPort, Session};
use crate::{
    kernel::KernelSnapshot,
    profile::{ProcessKey, ProcessProfile, ProcessState, Profile, StackProfile, sort_processes},
    stats::Totals,
};

/// What identifies a process image in the profile, besides its key.
struct Image {
    name: String,
    rate: u64,
    state: ProcessState,
    incarnation: Incarnation,
}

impl<K: KernelPort, P: ProcessPort> Session<K, P> {
    /// A process's name and sampling rate, read once while it is alive.
    pub(super) fn identity(&mut self, pid: u32) -> (String, u64) {
        if let Some(known) = self.names.get(&pid) {
            return known.clone();
        }
        let name = self.processes.name(pid).unwrap_or_else(|| "?".into());
        let known = (name, self.processes.sampling_rate(pid));
        self.names.insert(pid, known.clone());
        known
    }

    pub(super) fn build(&mut self, snapshot: &KernelSnapshot) -> Profile {
        let mut live: BTreeMap<ProcessKey, Vec<(u64, Totals)>> = BTreeMap::new();
        for (key, agg) in &snapshot.aggregates {
            let pk = ProcessKey {
                pid: key.pid,
                generation: key.generation,
            };
            live.entry(pk)
                .or_default()
                .push((key.stack_id, Totals::from_agg(agg)));
        }
        let mut processes = Vec::new();
        for (key, stacks) in live {
            let proc = snapshot
                .processes
                .get(&key.pid)
                .copied()
                .unwrap_or_default();
            let (name, rate) = self.identity(key.pid);
            let image = Image {
                name,
                rate,
                state: ProcessState::Live,
                incarnation: self.incarnation(key.pid),
            };
            processes.push(self.process_profile(key, image, &proc, &stacks));
        }
        for f in &self.frozen {
            let image = Image {
                name: f.name.clone(),
                rate: f.rate,
                state: f.state,
                incarnation: f.incarnation,
            };
            processes.push(self.process_profile(f.key, image, &f.proc, &f.stacks));
        }
        sort_processes(&mut processes);
        Profile {
            processes,
            drops: snapshot.drops,
            elapsed: self.started.elapsed(),
            unwind: self.unwind.status(),
        }
    }

    fn process_profile(
        &self,
        key: ProcessKey,
        image: Image,
        proc: &ProcCounters,
        stacks: &[(u64, Totals)],
    ) -> ProcessProfile {
        // The variance model is the process's: decided from all its weights.
        let weight_form = proc.weight_form();
        let stacks = stacks
            .iter()
            .map(|(id, totals)| StackProfile {
                frames: self.frames(image.incarnation, *id),
                totals: totals.with_weight_form(weight_form),
            })
            .collect();
        ProcessProfile {
            alloc_events: proc.alloc_events,
            free_events: proc.free_events,
            drops: proc.drops,
            lost_live_bytes: proc.lost_live_bytes,
            contracts: proc.contracts,
            weight_form,
            // Wrapping in the kernel: an munmap seen without its mmap reads
            // as negative, not as 2^64.
            mapped_bytes: proc.mapped_bytes as i64,
            mmap_events: proc.mmap_events,
            ..ProcessProfile::from_stacks(key, image.name, image.state, image.rate, stacks)
        }
    }
}

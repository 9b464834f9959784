//! The kernel reports host pids; everything past the snapshot uses the pids
//! of allocprof's own namespace (see `pidns`).

use std::collections::BTreeMap;

use profiler_common::NO_STACK;

use super::{KernelPort, ProcessPort, Session};
use crate::{
    ids::{HostPid, Pid},
    kernel::{KernelError, KernelSnapshot},
    process::pidns::{Correlation, PidMap, correlate},
};

impl<K: KernelPort, P: ProcessPort> Session<K, P> {
    /// The kernel's maps, with host pids turned into ours; processes we
    /// cannot see (outside our pid namespace) or not recognised yet are left
    /// out. The seeds freed before it was taken are retired (see
    /// [`Session::retire_unseen_frees`]).
    pub(super) fn snapshot(&mut self, with_live: bool) -> Result<KernelSnapshot, KernelError> {
        let mut snapshot = self.kernel.snapshot(with_live)?;
        if !self.pids.is_identity() {
            self.recognise(&snapshot);
            let pids = &self.pids;
            localize(&mut snapshot.aggregates, pids, |k| &mut k.pid);
            localize(&mut snapshot.live, pids, |k| &mut k.pid);
            snapshot.processes = std::mem::take(&mut snapshot.processes)
                .into_iter()
                .filter_map(|(host, state)| Some((pids.local(HostPid(host))?.0, state)))
                .collect();
        }
        self.seeds_cut_ns = snapshot.taken_ns;
        self.retire_unseen_frees();
        Ok(snapshot)
    }

    /// Learns the host pids of the snapshot that are not mapped yet, by the
    /// probe sites their stacks start at (see `pidns`).
    pub(super) fn recognise(&mut self, snapshot: &KernelSnapshot) {
        let mut first_frames: BTreeMap<HostPid, Vec<u64>> = BTreeMap::new();
        for (key, _) in &snapshot.aggregates {
            if key.stack_id == NO_STACK || self.pids.local(HostPid(key.pid)).is_some() {
                continue;
            }
            let frames = first_frames.entry(HostPid(key.pid)).or_default();
            if frames.len() < 8
                && let Some(first) = self
                    .kernel
                    .stack(key.stack_id)
                    .and_then(|s| s.first().copied())
            {
                frames.push(first);
            }
        }
        let mut matches: BTreeMap<Pid, Vec<HostPid>> = BTreeMap::new();
        for (host, addresses) in first_frames {
            let candidates = self
                .tracked
                .iter()
                .filter(|(local, _)| !self.pids.is_mapped(**local))
                .filter_map(|(local, t)| Some((*local, t.image.space.as_ref()?)));
            match correlate(&addresses, candidates, |id| self.probe_ids.contains(&id)) {
                Correlation::Unique(local) => matches.entry(local).or_default().push(host),
                Correlation::Ambiguous(locals) => {
                    self.warn_ambiguous(host, &format!("processes {locals:?}"));
                }
                Correlation::None => {}
            }
        }
        // Both ways: two host pids that look like one of ours (a process
        // outside our namespace with the same layout) are not told apart.
        for (local, hosts) in matches {
            match hosts.as_slice() {
                [host] => {
                    self.pids.insert(*host, local);
                    self.ledger_recognised(local, *host);
                }
                _ => {
                    for host in hosts {
                        self.warn_ambiguous(host, &format!("process {local}"));
                    }
                }
            }
        }
    }

    pub(super) fn warn_ambiguous(&mut self, host: HostPid, which: &str) {
        if self.ambiguous.insert(host) {
            self.warnings.push(format!(
                "cannot tell whether the kernel's pid {host} is {which} (the same \
                 address-space layout); its samples are left out"
            ));
        }
    }
}

/// Keeps the entries whose host pid is of our namespace, with our pid.
fn localize<K, V>(entries: &mut Vec<(K, V)>, pids: &PidMap, pid: fn(&mut K) -> &mut u32) {
    entries.retain_mut(|(key, _)| match pids.local(HostPid(*pid(key))) {
        Some(local) => {
            *pid(key) = local.0;
            true
        }
        None => false,
    });
}

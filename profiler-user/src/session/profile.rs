//! The [`Profile`] of a snapshot: the live images the kernel holds, and the
//! images retired earlier, frozen as they were.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Instant,
};

use foldhash::fast::RandomState;
use profiler_common::{DROP_REASONS, DropReason, ProcCounters, WeightForm};

use super::{KernelPort, ProcessPort, Session, lifecycle::Frozen, record::MemoryFigures};
use crate::ids::Pid;
use crate::{
    kernel::KernelSnapshot,
    model::age,
    model::profile::BuildIds,
    model::profile::{
        ProcessKey, ProcessProfile, ProcessState, Profile, StackProfile, sort_processes,
    },
    model::stats::Totals,
    process::{normalize::AddressSpace, resource::ProcessResource},
    symbolize::{Frame, Name},
};

/// What identifies a process image in the profile, besides its key.
struct Image {
    name: String,
    rate: u64,
    state: ProcessState,
    since_attach: bool,
    ledger: Option<crate::process::ledger::LedgerStatus>,
    /// What its backend allocator says (a live image's).
    backend_heap: Option<crate::process::backend_stats::BackendHeap>,
    /// Its allocator's budget, as last read (a gone image's too).
    alloc_thinning: Option<profiler_common::backend_stats::AllocatorThinning>,
    /// Its resident memory (a live image's).
    resident: Option<crate::process::discover::Resident>,
    resource: Option<Arc<ProcessResource>>,
    build_ids: Option<Arc<BuildIds>>,
    /// Its parent (`--pid`'s trees).
    parent: Option<Pid>,
    python: Option<crate::python::runtime::PythonRuntime>,
}

impl<K: KernelPort, P: ProcessPort> Session<K, P> {
    /// A process's name and sampling rate, read once while it is alive.
    pub(super) fn identity(&mut self, pid: Pid) -> (String, u64) {
        if let Some(known) = self
            .tracked
            .get(&pid)
            .and_then(|t| t.image.identity.clone())
        {
            return known;
        }
        // Gone before we read /proc: the name the kernel saw, if it did.
        if let Some(start) = self.processes.start_ticks(pid) {
            self.track_pid(pid).start = Some(start);
        }
        let name = self.processes.name(pid).or_else(|| {
            // The kernel knows it by its host pid.
            let host = self.pids.host(pid)?;
            let counters = self.kernel.process(host)?;
            Some(String::from_utf8_lossy(counters.comm_bytes()?).into_owned())
        });
        // A fork child's is its parent's until it execs; read otherwise.
        let forked_rate = self.tracked.get(&pid).and_then(|t| t.image.forked_rate);
        let rate = forked_rate.unwrap_or_else(|| self.processes.sampling_rate(pid));
        let Some(name) = name else {
            // Not cached: it may be named yet.
            return ("?".into(), rate);
        };
        let known = (name, rate);
        self.track_pid(pid).image.identity = Some(known.clone());
        known
    }

    /// Sets `pid`'s address space, and reads the build ids of the files it
    /// maps (through the descriptors it holds: a path may name another
    /// file by now, or in our mount namespace).
    pub(super) fn set_space(&mut self, pid: Pid, space: AddressSpace) {
        let mut ids = BuildIds::new();
        for m in space.mappings() {
            let Some(open) = &m.file.open else { continue };
            let path: Name = m.file.path.display().to_string().into();
            if ids.contains_key(&path) {
                continue;
            }
            if let Some(id) = crate::output::export::build_id::build_id(&open.fd_path()) {
                ids.insert(path, id.into());
            }
        }
        // 500 copies of a program map the same files: one set for all.
        self.build_ids.sweep();
        let ids = self.build_ids.share(ids);
        let image = &mut self.track_pid(pid).image;
        image.space = Some(space);
        image.build_ids = Some(ids);
    }

    /// Who a process is (OTLP resource attributes), read once while it is
    /// alive; its host pid added once the pid map knows it.
    pub(super) fn resource(&mut self, pid: Pid) -> Option<Arc<ProcessResource>> {
        let host = self.pids.host(pid).map(|h| h.0);
        let cached = self
            .tracked
            .get(&pid)
            .and_then(|t| t.image.resource.clone());
        let resource = match cached {
            Some(r) if r.host_pid.is_some() || host.is_none() => return Some(r),
            Some(r) => ProcessResource {
                host_pid: host,
                ..(*r).clone()
            },
            None => ProcessResource {
                host_pid: host,
                ..self.processes.resource(pid)?
            },
        };
        let resource = Arc::new(resource);
        self.track_pid(pid).image.resource = Some(resource.clone());
        Some(resource)
    }

    /// The image ran before we attached: its live figures count only what
    /// it allocated since (its first image, started before the session).
    pub(super) fn predates_attach(&self, key: ProcessKey) -> bool {
        key.generation == 0 && self.started_before_attach(key.pid) && !self.whole_heap_seen(key)
    }

    /// Its ledger was read: what it allocated before attach is seen too.
    fn whole_heap_seen(&self, key: ProcessKey) -> bool {
        self.ledger_status(key.pid, key.generation)
            .is_some_and(|s| s.read)
    }

    /// Process `pid` started before the session attached (as far as known).
    fn started_before_attach(&self, pid: Pid) -> bool {
        self.tracked
            .get(&pid)
            .and_then(|t| t.start)
            .is_some_and(|start| start < self.attach_ticks)
    }

    /// The followed processes whose current image ran before we attached,
    /// sampled since or not, as `name (pid)`.
    fn ran_before_attach(&self) -> Vec<String> {
        let mut pids: Vec<Pid> = self
            .tracked
            .iter()
            .filter(|&(&pid, t)| {
                self.started_before_attach(pid)
                    && !t.execed_since_attach
                    && !self.whole_heap_seen(ProcessKey { pid, generation: 0 })
            })
            .map(|(&pid, _)| pid)
            .collect();
        pids.sort_unstable();
        pids.into_iter()
            .map(|pid| {
                let name = self.tracked[&pid]
                    .image
                    .identity
                    .as_ref()
                    .map_or("?", |(n, _)| n.as_str());
                format!("{name} ({pid})")
            })
            .collect()
    }

    pub(super) fn build(&mut self, snapshot: &KernelSnapshot) -> Profile {
        if snapshot.live_read {
            // The old ones go first: both at once were the agent's peak.
            self.ages = Default::default();
            self.ages = age::by_stack(&snapshot.live, self.processes.monotonic_ns(), self.min_age);
        }
        let ages = &self.ages;
        let mut live: BTreeMap<ProcessKey, Vec<(u64, Totals)>> = BTreeMap::new();
        for (key, agg) in &snapshot.aggregates {
            let pk = ProcessKey {
                pid: Pid(key.pid),
                generation: key.generation,
            };
            let stack_ages = ages.get(key).unwrap_or_default();
            let mut agg = *agg;
            if !self.min_age.is_zero() {
                // Only what has been live that long (`--min-age`).
                let old = stack_ages.old_enough;
                agg.live_bytes = old.live_bytes;
                agg.live_objects = old.live_objects;
                agg.live_var = old.live_var;
                agg.live_thin_var = old.live_thin_var;
                agg.live_samples = old.live_samples;
            }
            let totals = self.mark(
                Pid(key.pid),
                key.stack_id,
                Totals {
                    ages: stack_ages.ages,
                    ..Totals::from_agg(&agg)
                },
            );
            live.entry(pk).or_default().push((key.stack_id, totals));
        }
        // The processes the user named are shown, sampled or not yet (0 B
        // beside what they have resident), not "0 processes".
        {
            for &pid in self.target.roots() {
                let generation = snapshot.processes.get(&pid.0).map_or(0, |p| p.generation);
                let key = ProcessKey { pid, generation };
                if !live.contains_key(&key) && self.processes.alive(pid) {
                    live.insert(key, Vec::new());
                }
            }
        }
        let mut processes = Vec::new();
        for (key, stacks) in live {
            let proc = snapshot
                .processes
                .get(&key.pid.0)
                .copied()
                .unwrap_or_default();
            let proc = self.image_counters(key.pid, &proc);
            let (name, rate) = self.identity(key.pid);
            let resource = self.resource(key.pid);
            self.incarnation(key.pid);
            let tracked = self.tracked.get_mut(&key.pid).expect("tracked above");
            let memory = match tracked.image.memory_read {
                Some((at, figures)) if at.elapsed() < self.memory_figures_every => figures,
                _ => {
                    let block = &mut tracked.image.backend_block;
                    let figures = MemoryFigures {
                        allocator: self
                            .processes
                            .allocator_block(key.pid, block)
                            .unwrap_or_default(),
                        resident: self.processes.resident(key.pid),
                    };
                    tracked.image.memory_read = Some((Instant::now(), figures));
                    figures
                }
            };
            let backend_heap = memory.allocator.heap;
            if let Some(t) = memory.allocator.thinning {
                tracked.image.alloc_thinning = Some(t);
            }
            let alloc_thinning = tracked.image.alloc_thinning;
            let build_ids = tracked.image.build_ids.clone();
            let python = tracked.image.python_runtime;
            let image = Image {
                python,
                backend_heap,
                alloc_thinning,
                resident: memory.resident,
                resource,
                build_ids,
                parent: self.parent_of(key.pid),
                name,
                rate,
                state: ProcessState::Live,
                since_attach: self.predates_attach(key),
                ledger: self.ledger_status(key.pid, key.generation),
            };
            let names = &self.tracked[&key.pid].symbols.names;
            processes.push(self.process_profile(key, image, &proc, &stacks, names));
        }
        for f in &self.frozen {
            processes.push(self.frozen_profile(f));
        }
        sort_processes(&mut processes);
        // The stacks user space cut (see `with_cut_stacks`), of the images shown.
        let mut drops = snapshot.drops;
        for p in &processes {
            for reason in [DropReason::StackBeforeTables, DropReason::StackTooDeep] {
                drops[reason as usize] += p.drops[reason as usize];
            }
        }
        Profile {
            processes,
            drops,
            elapsed: self.started.elapsed(),
            unwind: self.unwind.status(),
            min_age: self.min_age,
            attached_at: Some(self.attached_at),
            ran_before_attach: self.ran_before_attach(),
        }
    }

    /// A gone image as the profile shows it.
    pub(super) fn frozen_profile(&self, f: &Frozen) -> ProcessProfile {
        let image = Image {
            python: f.python,
            parent: f.parent,
            name: f.name.clone(),
            rate: f.rate,
            state: f.state,
            since_attach: f.since_attach,
            ledger: f.ledger,
            backend_heap: None,
            alloc_thinning: f.alloc_thinning,
            resident: None,
            resource: f.resource.clone(),
            build_ids: f.build_ids.clone(),
        };
        self.process_profile(f.key, image, &f.proc, &f.stacks, &f.names)
    }

    fn process_profile(
        &self,
        key: ProcessKey,
        image: Image,
        proc: &ProcCounters,
        stacks: &[(u64, Totals)],
        names: &HashMap<u64, Arc<[Frame]>>,
    ) -> ProcessProfile {
        // The variance model is the process's: decided from all its weights.
        let weight_form = match proc.weight_form() {
            // The allocator's budget counts a kept sample k·w (k a power of
            // two): a process of one block size then has every weight a
            // multiple of the smallest, which reads as `nsamples × R` with
            // R the smallest k·w, and R·bytes would understate the samples
            // of a larger k. Its library writes `size / p` weights only.
            WeightForm::PointsTimesInterval { .. }
                if image.alloc_thinning.is_some_and(|t| t.thinned > 0) =>
            {
                WeightForm::InverseProbability
            }
            form => form,
        };
        // A kept sample stands for allocator factor × kernel factor.
        let thin_factor =
            proc.thin_factor.max(1) * image.alloc_thinning.map_or(1, |t| t.factor.max(1));
        // A stack seen both in the ledger (before attach) and by the kernel
        // is one stack: the same frames once the allocator's are removed.
        // foldhash: each key hashes every frame's names, and SipHash over
        // them was a fifth of the agent's CPU at 20,000 stacks.
        let mut merged: HashMap<Arc<[Frame]>, Totals, RandomState> = HashMap::default();
        for (id, totals) in stacks {
            *merged
                .entry(super::symbols::frames(names, *id))
                .or_default() += totals.with_weight_form(weight_form, image.rate, thin_factor);
        }
        let stacks: Vec<StackProfile> = merged
            .into_iter()
            .map(|(frames, totals)| StackProfile { frames, totals })
            .collect();
        ProcessProfile {
            alloc_events: proc.alloc_events,
            free_events: proc.free_events,
            drops: with_cut_stacks(proc.drops, &stacks),
            lost_live_bytes: proc.lost_live_bytes,
            contracts: proc.contracts,
            weight_form,
            // Wrapping in the kernel: an munmap seen without its mmap reads
            // as negative, not as 2^64.
            mapped_bytes: proc.mapped_bytes as i64,
            mmap_events: proc.mmap_events,
            thinned_events: proc.thinned_events,
            thin_factor: proc.thin_factor.max(1),
            alloc_thinning: image.alloc_thinning,
            resident: image.resident,
            since_attach: image.since_attach,
            ledger: image.ledger,
            backend_heap: image.backend_heap,
            resource: image.resource,
            build_ids: image.build_ids,
            parent: image.parent,
            python: image.python,
            ..ProcessProfile::from_stacks(key, image.name, image.state, image.rate, stacks)
        }
    }
}

/// The process's drops, with its samples whose stacks end in a marker user
/// space put there: taken before its unwind tables were in and cut where
/// they could not be vouched for, or deeper than the kernel keeps (the
/// kernel marks those, user space counts them with the marker's name).
fn with_cut_stacks(mut drops: [u64; DROP_REASONS], stacks: &[StackProfile]) -> [u64; DROP_REASONS] {
    for s in stacks {
        let reason = match s.frames.last().map(|f| &*f.function) {
            Some(crate::symbolize::BEFORE_TABLES_MARKER) => DropReason::StackBeforeTables,
            Some(crate::symbolize::DEPTH_CUT_MARKER) => DropReason::StackTooDeep,
            _ => continue,
        };
        drops[reason as usize] += s.totals.alloc_samples;
    }
    drops
}

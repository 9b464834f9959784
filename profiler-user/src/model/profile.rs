//! The profile as allocprof shows and exports it: per process (pid and exec
//! generation) and per symbolized stack, with unbiased totals. Pure data;
//! the session builds it from the kernel's maps.

use std::{collections::HashMap, sync::Arc, time::Duration};

use profiler_common::{DROP_REASONS, DropReason, NO_STACK, OVERFLOW_STACK, WeightForm};

use crate::{
    ids::Pid,
    model::stats::Totals,
    symbolize::{Frame, Name},
    unwind::tables::TablesStatus,
};

/// The one frame of a stack the kernel could not take.
pub(crate) const STACK_UNAVAILABLE: &str = "[stack unavailable]";
/// The one frame of a process's overflow stack: its samples past its budget
/// of new stacks (drop `stack_rate_limited`).
pub const STACK_FLOOD: &str = "[stack flood: new stacks over the per-process limit]";

/// The drop causes that are losses, shown as DROPPED EVENTS: all but a
/// free that matched no live sample, which loses nothing (its block was
/// sampled before allocprof could see it, or its alloc was itself dropped
/// and counted as such): it is counted apart, as an unmatched free.
pub fn is_loss(reason: DropReason) -> bool {
    reason != DropReason::UnmatchedFree
}

/// Of `drops`, those that lost something (see [`is_loss`]).
pub fn losses(drops: &[u64; DROP_REASONS]) -> u64 {
    DropReason::ALL
        .iter()
        .filter(|&&r| is_loss(r))
        .map(|&r| drops[r as usize])
        .sum()
}

/// The synthetic frame of a reserved stack id, which has no frames.
pub(crate) fn synthetic_stack(stack_id: u64) -> Option<&'static str> {
    match stack_id {
        NO_STACK => Some(STACK_UNAVAILABLE),
        OVERFLOW_STACK => Some(STACK_FLOOD),
        _ => None,
    }
}

/// GNU build ids (lowercase hex) by the file path frames name (their
/// `module`).
pub type BuildIds = std::collections::BTreeMap<Name, Name>;

/// One process image: a pid, and which exec of it (generation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessKey {
    pub pid: Pid,
    pub generation: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessState {
    Live,
    /// The process exited; its figures are as they were at exit.
    Exited,
    /// The process exec'ed another program; these figures are the old image's.
    Replaced,
    /// The kernel's OOM killer killed it; its figures are its heap then.
    OomKilled,
}

impl ProcessState {
    pub fn describe(self) -> &'static str {
        match self {
            ProcessState::Live => "live",
            ProcessState::Exited => "exited",
            ProcessState::Replaced => "exec'ed",
            ProcessState::OomKilled => "oom-killed",
        }
    }
}

#[derive(Clone, Debug)]
pub struct StackProfile {
    /// Innermost frame first, allocator frames removed.
    pub frames: Arc<[Frame]>,
    pub totals: Totals,
}

#[derive(Clone, Debug)]
pub struct ProcessProfile {
    pub key: ProcessKey,
    pub name: String,
    pub state: ProcessState,
    /// The process's mean sampling interval R in bytes (`ALLOCPROF_RATE`).
    pub rate: u64,
    pub totals: Totals,
    pub alloc_events: u64,
    pub free_events: u64,
    /// Sampled events not accounted, by `DropReason`.
    pub drops: [u64; DROP_REASONS],
    /// Unbiased bytes of samples missing from the live sums: when nonzero,
    /// the live estimate is a lower bound, short by at most this.
    pub lost_live_bytes: u64,
    /// The probe contracts the process spoke (`ProcCounters::contracts`
    /// bits; see [`crate::process::discover::PROVIDERS`]).
    pub contracts: u64,
    /// What its weights are, which decides its variances.
    pub weight_form: WeightForm,
    /// Bytes the emitter mapped on its own account (`mmap` minus `munmap`
    /// probes), beside the heap; `mmap_events` of them.
    pub mapped_bytes: i64,
    pub mmap_events: u64,
    /// Back-pressure (`--max-event-rate`): its alloc events the kernel did
    /// not keep (the kept ones stand for them), and the factor last in
    /// force (1 in `thin_factor` kept; 1: all).
    pub thinned_events: u64,
    pub thin_factor: u64,
    /// The allocator's own sample budget (`ALLOCPROF_MAX_EVENT_RATE`,
    /// thinned before the probe): what it dropped since the process started
    /// (or forked), the factor last in force, read from its statistics
    /// block (`liballocprof*.so` only; none for profiles read back from
    /// files older than it).
    pub alloc_thinning: Option<profiler_common::backend_stats::AllocatorThinning>,
    /// It ran before allocprof attached: its live figures are the bytes it
    /// allocated since, still live (what it held before is not seen).
    pub since_attach: bool,
    /// Its live-sample ledger, if it was looked for: whether it was read,
    /// and what it gave (none for profiles read back from files).
    pub ledger: Option<crate::process::ledger::LedgerStatus>,
    /// What a running process has resident (`/proc/PID/status`), to set
    /// the heap against; none for gone processes.
    pub resident: Option<crate::process::discover::Resident>,
    /// What its backend allocator says of its heap (`liballocprof*.so`
    /// only, running processes only).
    pub backend_heap: Option<crate::process::backend_stats::BackendHeap>,
    /// Who it is, for the OTLP export's resource attributes: read once when
    /// it was first followed (none for profiles read back from files).
    pub resource: Option<Arc<crate::process::resource::ProcessResource>>,
    /// The GNU build ids of the files its frames are in, read from the
    /// files it mapped (none for profiles read back from files: then the
    /// exports read the paths).
    pub build_ids: Option<Arc<BuildIds>>,
    /// Its parent process, where known (`--pid`'s trees: every process of
    /// a tree but its root has its parent in the profile too).
    pub parent: Option<Pid>,
    /// Its CPython, if it runs one: the version, and whether pymalloc
    /// serves its small objects (which samples then do not see).
    pub python: Option<crate::python::runtime::PythonRuntime>,
    /// Sorted by live bytes, largest first.
    pub stacks: Vec<StackProfile>,
}

impl ProcessProfile {
    /// Sampled allocations the allocator's budget dropped (0 without one).
    pub fn alloc_thinned(&self) -> u64 {
        self.alloc_thinning.map_or(0, |t| t.thinned)
    }

    /// Whether its samples were thinned, by the kernel's back-pressure or
    /// the allocator's budget: its intervals are wider for it, and every
    /// ± figure of it says so.
    pub fn thinned(&self) -> bool {
        self.thinned_events > 0 || self.alloc_thinned() > 0
    }

    /// The combined thinning factor in force (allocator × kernel; 1: none).
    pub fn combined_thin_factor(&self) -> u64 {
        self.thin_factor.max(1) * self.alloc_thinning.map_or(1, |t| t.factor.max(1))
    }

    /// A process image from its stacks: sorted, totals summed, no event or
    /// drop counters (the caller sets those where it has them).
    pub fn from_stacks(
        key: ProcessKey,
        name: String,
        state: ProcessState,
        rate: u64,
        mut stacks: Vec<StackProfile>,
    ) -> ProcessProfile {
        sort_stacks(&mut stacks);
        ProcessProfile {
            key,
            name,
            state,
            rate,
            totals: stacks.iter().map(|s| s.totals).sum(),
            alloc_events: 0,
            free_events: 0,
            drops: [0; DROP_REASONS],
            lost_live_bytes: 0,
            contracts: 0,
            weight_form: WeightForm::NoSamples,
            mapped_bytes: 0,
            mmap_events: 0,
            thinned_events: 0,
            thin_factor: 1,
            alloc_thinning: None,
            since_attach: false,
            ledger: None,
            resident: None,
            backend_heap: None,
            resource: None,
            build_ids: None,
            parent: None,
            python: None,
            stacks,
        }
    }

    /// The contracts it spoke, by provider name: `otel_memory`, `ddheap`,
    /// `otel_memory+ddheap`, or `-` before its first alloc probe.
    pub fn contract(&self) -> String {
        let names = crate::process::discover::contract_names(self.contracts);
        if names.is_empty() {
            "-".into()
        } else {
            names.join("+")
        }
    }

    pub fn label(&self) -> String {
        format!("{} ({})", self.name, self.key.pid)
    }

    /// Its sampled events lost (see [`is_loss`]).
    pub fn dropped(&self) -> u64 {
        losses(&self.drops)
    }

    /// Its frees that matched no live sample: nothing lost.
    pub fn unmatched_frees(&self) -> u64 {
        self.drops[DropReason::UnmatchedFree as usize]
    }
}

#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// Sorted by live bytes, largest first.
    pub processes: Vec<ProcessProfile>,
    /// Drops counted by the kernel over all processes (including events that
    /// could not be tied to a process).
    pub drops: [u64; DROP_REASONS],
    pub elapsed: Duration,
    /// Where the unwind tables of the profiled files stand (a file whose
    /// table could not be built or did not fit is `unavailable`: its code
    /// is walked by frame pointers).
    pub unwind: TablesStatus,
    /// `--min-age`: the live figures of running processes count only
    /// samples allocated at least this long ago (zero: all).
    pub min_age: Duration,
    /// When allocprof attached (none for profiles read back from files).
    pub attached_at: Option<std::time::SystemTime>,
    /// The followed processes (sampled since or not) that ran before
    /// allocprof attached, as `name (pid)`: their heap from before is not
    /// seen.
    pub ran_before_attach: Vec<String>,
}

impl Profile {
    /// When allocprof attached, as a local wall-clock time (`HH:MM:SS`).
    pub fn attached_clock(&self) -> Option<String> {
        let secs = self
            .attached_at?
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_secs();
        let t = libc::time_t::try_from(secs).ok()?;
        // SAFETY: an all-zero tm is a valid value for localtime_r to fill.
        let mut tm: libc::tm = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are valid for the call; localtime_r is the
        // thread-safe form.
        if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
            return None;
        }
        Some(format!(
            "{:02}:{:02}:{:02}",
            tm.tm_hour, tm.tm_min, tm.tm_sec
        ))
    }

    /// The live figures are the bytes allocated since attach, not a whole
    /// heap: some followed process ran before allocprof attached, or none
    /// has been sampled yet.
    pub fn live_since_attach(&self) -> bool {
        self.attached_at.is_some()
            && (!self.ran_before_attach.is_empty()
                || self.processes.iter().any(|p| p.since_attach)
                || self.processes.is_empty())
    }

    /// Every process image summed, live or gone (the exports' total).
    pub fn totals(&self) -> Totals {
        self.processes.iter().map(|p| p.totals).sum()
    }

    /// The live heap: processes still running. What an exited or exec'ed
    /// image held when it went is real, but not live heap
    /// ([`Profile::held_at_exit`]).
    pub fn live_totals(&self) -> Totals {
        self.processes
            .iter()
            .filter(|p| p.state == ProcessState::Live)
            .map(|p| p.totals)
            .sum()
    }

    /// What the images that are gone (exited, or replaced by an exec) held
    /// when they went.
    pub fn held_at_exit(&self) -> Totals {
        self.processes
            .iter()
            .filter(|p| p.state != ProcessState::Live)
            .map(|p| p.totals)
            .sum()
    }

    /// Sampled events lost, over all processes (see [`is_loss`]).
    pub fn dropped(&self) -> u64 {
        losses(&self.drops)
    }

    /// Frees that matched no live sample, over all processes: nothing lost.
    pub fn unmatched_frees(&self) -> u64 {
        self.drops[DropReason::UnmatchedFree as usize]
    }

    /// Over all processes: see [`ProcessProfile::lost_live_bytes`].
    pub fn lost_live_bytes(&self) -> u64 {
        self.processes.iter().map(|p| p.lost_live_bytes).sum()
    }

    /// Stacks of all processes merged by their symbolized frames: each
    /// sample was unbiased on its own, so merging is a plain sum.
    pub fn merged_stacks(&self) -> Vec<StackProfile> {
        let mut merged: HashMap<Arc<[Frame]>, Totals> = HashMap::new();
        for p in &self.processes {
            for s in &p.stacks {
                *merged.entry(s.frames.clone()).or_default() += s.totals;
            }
        }
        let mut stacks: Vec<StackProfile> = merged
            .into_iter()
            .map(|(frames, totals)| StackProfile { frames, totals })
            .collect();
        sort_stacks(&mut stacks);
        stacks
    }

    /// The profile with each process tree (`--pid`'s: parents in the
    /// profile) merged into its root's image (`--merge-tree`): the same
    /// stack in every worker adds up, and so do the counters. A process
    /// whose parent is not in the profile is a root. With several images
    /// of the root's pid (exec), the tree joins the first in the profile's
    /// order.
    pub fn merge_trees(&self) -> Profile {
        let parents: HashMap<Pid, Option<Pid>> = self
            .processes
            .iter()
            .map(|p| (p.key.pid, p.parent))
            .collect();
        // The root of a pid: its topmost ancestor in the profile (a pid
        // cycle, which reuse could make, is cut after as many steps as
        // there are processes).
        let root_of = |mut pid: Pid| {
            for _ in 0..parents.len() {
                match parents.get(&pid).copied().flatten() {
                    Some(up) if parents.contains_key(&up) && up != pid => pid = up,
                    _ => break,
                }
            }
            pid
        };
        let mut trees: Vec<ProcessProfile> = Vec::new();
        let mut index: HashMap<Pid, usize> = HashMap::new();
        // Roots first, so each tree takes its root's image.
        let (roots, members): (Vec<&ProcessProfile>, Vec<&ProcessProfile>) = self
            .processes
            .iter()
            .partition(|p| root_of(p.key.pid) == p.key.pid);
        for p in roots.into_iter().chain(members) {
            let root = root_of(p.key.pid);
            match index.get(&root) {
                Some(&i) => trees[i].absorb(p),
                None => {
                    index.insert(root, trees.len());
                    trees.push(p.clone());
                }
            }
        }
        for t in &mut trees {
            sort_stacks(&mut t.stacks);
            t.totals = t.stacks.iter().map(|s| s.totals).sum();
        }
        sort_processes(&mut trees);
        Profile {
            processes: trees,
            drops: self.drops,
            elapsed: self.elapsed,
            unwind: self.unwind,
            min_age: self.min_age,
            attached_at: self.attached_at,
            ran_before_attach: self.ran_before_attach.clone(),
        }
    }
}

impl ProcessProfile {
    /// Adds another process's stacks and counters to this one's (merged
    /// stacks by frames; totals are recomputed by the caller).
    fn absorb(&mut self, other: &ProcessProfile) {
        let mut at: HashMap<Arc<[Frame]>, usize> = self
            .stacks
            .iter()
            .enumerate()
            .map(|(i, s)| (s.frames.clone(), i))
            .collect();
        for s in &other.stacks {
            match at.get(&s.frames) {
                Some(&i) => self.stacks[i].totals += s.totals,
                None => {
                    at.insert(s.frames.clone(), self.stacks.len());
                    self.stacks.push(s.clone());
                }
            }
        }
        self.alloc_events += other.alloc_events;
        self.free_events += other.free_events;
        for (d, o) in self.drops.iter_mut().zip(other.drops) {
            *d += o;
        }
        self.lost_live_bytes += other.lost_live_bytes;
        self.contracts |= other.contracts;
        self.mapped_bytes = self.mapped_bytes.wrapping_add(other.mapped_bytes);
        self.mmap_events += other.mmap_events;
        self.thinned_events += other.thinned_events;
        self.alloc_thinning = match (self.alloc_thinning, other.alloc_thinning) {
            (Some(a), Some(b)) => Some(profiler_common::backend_stats::AllocatorThinning {
                thinned: a.thinned + b.thinned,
                factor: a.factor.max(b.factor),
                max_event_rate: a.max_event_rate.or(b.max_event_rate),
            }),
            (a, b) => a.or(b),
        };
        self.since_attach |= other.since_attach;
    }
}

/// Largest live heap first; ties by process key, so the order is stable.
pub(crate) fn sort_processes(processes: &mut [ProcessProfile]) {
    processes.sort_by(|a, b| {
        b.totals
            .live_bytes
            .total_cmp(&a.totals.live_bytes)
            .then(a.key.cmp(&b.key))
    });
}

/// Largest live bytes first; ties by allocated bytes, then frames, so the
/// order is stable between refreshes.
pub(crate) fn sort_stacks(stacks: &mut [StackProfile]) {
    stacks.sort_by(|a, b| {
        b.totals
            .live_bytes
            .total_cmp(&a.totals.live_bytes)
            .then(b.totals.alloc_bytes.total_cmp(&a.totals.alloc_bytes))
            .then_with(|| a.frames.cmp(&b.frames))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_stack_ids_have_one_synthetic_frame() {
        assert_eq!(synthetic_stack(NO_STACK), Some(STACK_UNAVAILABLE));
        assert_eq!(synthetic_stack(OVERFLOW_STACK), Some(STACK_FLOOD));
        assert_eq!(synthetic_stack(0x1234), None);
    }

    fn frames(names: &[&str]) -> Arc<[Frame]> {
        names.iter().map(|n| Frame::named(*n)).collect()
    }

    fn process(pid: u32, stacks: Vec<(Arc<[Frame]>, f64)>) -> ProcessProfile {
        let stacks: Vec<StackProfile> = stacks
            .into_iter()
            .map(|(frames, live)| StackProfile {
                frames,
                totals: Totals {
                    live_bytes: live,
                    live_samples: 1,
                    ..Default::default()
                },
            })
            .collect();
        ProcessProfile::from_stacks(
            ProcessKey {
                pid: Pid(pid),
                generation: 0,
            },
            "w".into(),
            ProcessState::Live,
            524_288,
            stacks,
        )
    }

    #[test]
    fn merging_trees_sums_each_tree_into_its_root() {
        let a = frames(&["handle", "main"]);
        let b = frames(&["other", "main"]);
        let child = |pid, parent, stacks| ProcessProfile {
            parent: Some(Pid(parent)),
            alloc_events: 1,
            ..process(pid, stacks)
        };
        let profile = Profile {
            processes: vec![
                // Tree 1: root 10 (its parent 1 is not profiled), workers 11
                // and 12, 12's child 13. Tree 2: 20 alone.
                child(10, 1, vec![(b.clone(), 1.0)]),
                child(11, 10, vec![(a.clone(), 100.0)]),
                child(13, 12, vec![(a.clone(), 7.0), (b.clone(), 2.0)]),
                child(12, 10, vec![(a.clone(), 50.0)]),
                process(20, vec![(a.clone(), 1000.0)]),
            ],
            ..Default::default()
        };
        let merged = profile.merge_trees();
        let pids: Vec<u32> = merged.processes.iter().map(|p| p.key.pid.0).collect();
        assert_eq!(pids, vec![20, 10], "one image per tree, largest first");
        let tree = &merged.processes[1];
        assert_eq!(tree.parent, Some(Pid(1)), "the root's own parent");
        assert_eq!(tree.alloc_events, 4);
        let live = |frames: &Arc<[Frame]>| {
            tree.stacks
                .iter()
                .find(|s| &s.frames == frames)
                .map(|s| s.totals.live_bytes)
        };
        assert_eq!((live(&a), live(&b)), (Some(157.0), Some(3.0)));
        assert_eq!(tree.stacks.len(), 2);
        assert_eq!(tree.totals.live_bytes, 160.0);
        assert_eq!(merged.processes[0].totals.live_bytes, 1000.0);
        // Without parents nothing merges.
        let flat = Profile {
            processes: vec![
                process(1, vec![(a.clone(), 1.0)]),
                process(2, vec![(a, 2.0)]),
            ],
            ..Default::default()
        };
        assert_eq!(flat.merge_trees().processes.len(), 2);
    }

    #[test]
    fn merging_sums_the_same_stack_across_processes() {
        let a = frames(&["leaf", "main"]);
        let b = frames(&["other", "main"]);
        let profile = Profile {
            processes: vec![
                process(1, vec![(a.clone(), 100.0), (b, 5.0)]),
                process(2, vec![(a.clone(), 50.0)]),
            ],
            ..Default::default()
        };
        let merged = profile.merged_stacks();
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].frames, a);
        assert_eq!(merged[0].totals.live_bytes, 150.0);
        assert_eq!(merged[0].totals.live_samples, 2);
        assert_eq!(merged[1].totals.live_bytes, 5.0);
        assert_eq!(profile.totals().live_bytes, 155.0);
    }
}

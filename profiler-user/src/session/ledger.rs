//! The heap from before attach: when the session first follows a process
//! image (attach, discovery, a fork child's first event, a new generation),
//! it reads the image's live-sample ledger (`crate::process::ledger`) and *seeds*
//! the blocks the kernel never saw allocated, with their stacks. A seed
//! lives until its block is freed:
//!
//! * the kernel reports the frees of a seeded process that find no live
//!   sample (`UNSEEN_FREES`), and the seed at that pointer goes with the
//!   first snapshot of the kernel's maps taken after the free (each
//!   profile is then one moment's heap: a seed and the block that replaced
//!   it are never both in it);
//! * a record whose sequence moved since it was read was freed (perhaps
//!   reused): checked right after seeding and with every read of the live
//!   samples, which also catches frees the full ring buffer lost.
//!
//! Nothing is counted twice: a record is seeded only if it was allocated
//! before the kernel could see it (before its file's probes were attached
//! or its process started, whichever is later) *and* the kernel holds no
//! live sample at its pointer. The kernel's maps are never written: the
//! seeds join each snapshot as aggregates of their own stacks, with their
//! ages.
//!
//! Seeds obey the caps the kernel puts on live samples (`kernel::Limits`),
//! for the ledger is the process's to forge: per process, live samples
//! (the kernel's and the seeds, as of the read) and new stacks (the
//! kernel's burst; past it, the process's overflow stack); for the session,
//! seeds and seeded stacks in all. A seed past a cap is dropped and counted
//! with the process's drops, its bytes with its lost live bytes (its
//! estimate is then a lower bound), and every seed's weight is checked as
//! the kernel checks a probe's (`weight_check`): the process's weight form,
//! and so its intervals, account for them. A ledger is read a chunk at a
//! time, each record seeded or counted as it comes: never held whole.

use std::{
    cell::OnceCell,
    collections::{HashMap, HashSet, hash_map::Entry},
    sync::Arc,
};

use profiler_common::{
    AggKey, DROP_REASONS, DropReason, LiveKey, LiveSample, NO_STACK, OVERFLOW_STACK, ProcCounters,
    SampleDelta, StackAgg, ledger::FLAG_TRUNCATED, stack_hash_step, stack_id, stack_seed,
    weight_check,
};

use super::{KernelPort, ProcessPort, Session};
use crate::ids::{HostPid, Pid};
use crate::{
    kernel::{KernelError, KernelSnapshot, Limits},
    model::stats::Totals,
    process::ledger::{CUT_FRAME, LedgerEntry, LedgerStatus, ReadError},
};

/// Mixed into a seeded stack's hash: its id never equals a kernel stack's
/// (their frames differ at the top anyway; the symbolized frames, without
/// the allocator's, are what merge them in the profile).
const LEDGER_STACK_TAG: u64 = 0x6c65_6467_6572_0001;

/// The caps seeds share with the kernel's live samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SeedLimits {
    /// Live samples of one process: its seeds and the kernel's.
    pub(super) per_process: u64,
    /// Seeds of every image together.
    pub(super) total: u64,
    /// Distinct seeded stacks of one image (the kernel's burst of new
    /// stacks: seeds all come at once); 0: no limit.
    pub(super) stacks_per_image: u64,
    /// Seeded stacks of every image together.
    pub(super) total_stacks: u64,
}

impl From<&Limits> for SeedLimits {
    fn from(l: &Limits) -> SeedLimits {
        SeedLimits {
            per_process: l.max_live_per_process,
            total: u64::from(l.max_live_samples),
            stacks_per_image: if l.max_new_stacks_per_second == 0 {
                0
            } else {
                l.new_stacks_burst
            },
            total_stacks: u64::from(l.max_stacks),
        }
    }
}

impl Default for SeedLimits {
    fn default() -> SeedLimits {
        SeedLimits::from(&Limits::default())
    }
}

/// A process image's ledger, as read when the session first followed it
/// (held by its process's record).
pub(super) struct LedgerImage {
    generation: u32,
    pub(super) status: LedgerStatus,
    /// Its blocks from before attach still live, by pointer.
    seeds: HashMap<u64, Seed>,
    /// Its seeded stacks: their raw frames, innermost first.
    stacks: HashMap<u64, Arc<[u64]>>,
    /// What its seeds add to its process's counters.
    counters: SeedCounters,
    /// Its seeds summed per stack, as every snapshot gets them: made
    /// again only after a seed went or came (a settled process's seeds
    /// do not change, and 500 processes' were a tenth of the agent's CPU).
    aggregates: OnceCell<Vec<(u64, StackAgg)>>,
}

impl LedgerImage {
    fn new(generation: u32) -> LedgerImage {
        LedgerImage {
            generation,
            status: LedgerStatus::default(),
            seeds: HashMap::new(),
            stacks: HashMap::new(),
            counters: SeedCounters::default(),
            aggregates: OnceCell::new(),
        }
    }

    /// Removes the seed at `ptr`; whether there was one.
    fn remove(&mut self, ptr: u64) -> bool {
        let gone = self.seeds.remove(&ptr).is_some();
        if gone {
            self.aggregates.take();
        }
        gone
    }

    /// What its seeded stacks depend on (see `record::Visit`): seeds are
    /// only taken at the read, so which stacks it has changes only then.
    pub(super) fn stamp(&self) -> (u32, bool) {
        (self.generation, self.status.read)
    }

    /// Its seeds per stack (see `aggregates`).
    fn aggregates(&self) -> &[(u64, StackAgg)] {
        self.aggregates.get_or_init(|| {
            let mut aggs: HashMap<u64, StackAgg> = HashMap::new();
            for seed in self.seeds.values() {
                let s = &seed.sample;
                let d = s.delta();
                let agg = aggs.entry(s.stack_id).or_default();
                // A forged ledger's records can overflow the sums (the
                // kernel's counters wrap; here they saturate, never panic).
                agg.live_bytes = agg.live_bytes.saturating_add(d.bytes);
                agg.live_objects = agg.live_objects.saturating_add(d.objects);
                agg.live_var = agg.live_var.saturating_add(d.var);
                agg.live_samples = agg.live_samples.saturating_add(1);
            }
            aggs.into_iter().collect()
        })
    }
}

struct Seed {
    /// The record's address and the sequence it was read with.
    address: u64,
    seq: u64,
    sample: LiveSample,
}

/// What an image's seeds add to its process's kernel counters at each
/// snapshot: drops and lost live bytes as the kernel counts its own, and
/// the weight-form counts of `weight_check`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct SeedCounters {
    drops: [u64; DROP_REASONS],
    lost_live_bytes: u64,
    min_weight: u64,
    weights_not_multiple: u64,
    weights_below_size: u64,
    weights_invalid: u64,
}

impl SeedCounters {
    /// Folds a seed's weight into the form counts, as the kernel folds a
    /// probe's.
    fn weigh(&mut self, size: u64, weight: u64) {
        let c = weight_check(self.min_weight, size, weight);
        self.min_weight = c.min_weight;
        self.weights_not_multiple += u64::from(c.not_multiple);
        self.weights_below_size += u64::from(c.below_size);
        self.weights_invalid += u64::from(c.invalid);
    }

    /// A seed not kept: its bytes are missing from the live sums.
    fn lose(&mut self, size: u64, weight: u64, reason: DropReason) {
        self.lost_live_bytes += SampleDelta::of(size, weight).bytes;
        self.drops[reason as usize] += 1;
    }

    /// Adds these to a process's counters (a snapshot's copy).
    fn add_to(&self, p: &mut ProcCounters) {
        if self.min_weight != 0 {
            // Both sets of weights are multiples of their own minimum; all
            // of them are multiples of the smaller minimum only if it
            // divides the larger.
            let (lo, hi) = if p.min_weight == 0 {
                (self.min_weight, self.min_weight)
            } else {
                (
                    p.min_weight.min(self.min_weight),
                    p.min_weight.max(self.min_weight),
                )
            };
            p.weights_not_multiple += u64::from(!hi.is_multiple_of(lo));
            p.min_weight = lo;
        }
        p.weights_not_multiple += self.weights_not_multiple;
        p.weights_below_size += self.weights_below_size;
        p.weights_invalid += self.weights_invalid;
        p.lost_live_bytes += self.lost_live_bytes;
        for (d, s) in p.drops.iter_mut().zip(self.drops) {
            *d += s;
        }
    }
}

/// Where a ledger's records are seeded while it is read.
struct Seeding<'a> {
    image: &'a mut LedgerImage,
    /// Seeded stacks of every other image.
    other_stacks: u64,
    limits: SeedLimits,
    /// Seeds this image may hold (the per-process cap less the kernel's
    /// live samples of the process).
    room: u64,
    /// Seeds of every image, this one's included.
    total: u64,
    /// Records allocated from then on were seen by the kernel.
    seen_from: u64,
    stack_seed: u64,
}

impl Seeding<'_> {
    /// Seeds `entry` if the kernel cannot have seen it and the caps allow.
    fn offer(&mut self, entry: LedgerEntry, kernel_has: impl Fn(u64) -> bool) {
        let r = entry.record;
        let status = &mut self.image.status;
        if r.time_ns >= self.seen_from || kernel_has(r.ptr) {
            status.seen += 1;
            return;
        }
        if self.image.seeds.contains_key(&r.ptr) {
            // Two live records of one block: no allocator writes that.
            status.garbage += 1;
            return;
        }
        let counters = &mut self.image.counters;
        counters.weigh(r.size, r.weight);
        let full = if self.image.seeds.len() as u64 >= self.room {
            Some(DropReason::ProcessCap)
        } else if self.total >= self.limits.total {
            Some(DropReason::LiveMapFull)
        } else {
            None
        };
        if let Some(reason) = full {
            counters.lose(r.size, r.weight, reason);
            status.dropped += 1;
            return;
        }
        let cut = (r.flags & FLAG_TRUNCATED != 0).then_some(CUT_FRAME);
        let frames = r.frames().iter().copied().chain(cut);
        let id = stack_id(frames.clone().fold(self.stack_seed, stack_hash_step));
        let stacks = &mut self.image.stacks;
        let stack = if stacks.contains_key(&id) {
            id
        } else if self.limits.stacks_per_image != 0
            && stacks.len() as u64 >= self.limits.stacks_per_image
        {
            // As the kernel does past a process's budget of new stacks.
            counters.drops[DropReason::StackRateLimited as usize] += 1;
            OVERFLOW_STACK
        } else if self.other_stacks + stacks.len() as u64 >= self.limits.total_stacks {
            counters.drops[DropReason::StackMapFull as usize] += 1;
            NO_STACK
        } else {
            stacks.insert(id, frames.collect());
            id
        };
        let sample = LiveSample {
            stack_id: stack,
            size: r.size,
            weight: r.weight,
            generation: self.image.generation,
            thin_factor: 1,
            allocated_ns: r.time_ns,
        };
        let seed = Seed {
            address: entry.address,
            seq: r.seq,
            sample,
        };
        if let Entry::Vacant(v) = self.image.seeds.entry(r.ptr) {
            v.insert(seed);
            self.image.aggregates.take();
            status.seeded += 1;
            self.total += 1;
        }
    }
}

impl<K: KernelPort, P: ProcessPort> Session<K, P> {
    fn ledger(&self, pid: Pid) -> Option<&LedgerImage> {
        self.tracked.get(&pid)?.image.ledger.as_ref()
    }

    fn ledger_mut(&mut self, pid: Pid) -> Option<&mut LedgerImage> {
        self.tracked.get_mut(&pid)?.image.ledger.as_mut()
    }

    /// The image's ledger status, if the session read (or looked for) it.
    pub(super) fn ledger_status(&self, pid: Pid, generation: u32) -> Option<LedgerStatus> {
        self.ledger(pid)
            .filter(|i| i.generation == generation)
            .map(|i| i.status)
    }

    pub(super) fn has_seeds(&self, pid: Pid) -> bool {
        self.ledger(pid).is_some_and(|i| !i.seeds.is_empty())
    }

    /// The generation of `pid`'s image that holds seeds, if one does.
    pub(super) fn seeded_generation(&self, pid: Pid) -> Option<u32> {
        self.ledger(pid)
            .filter(|i| !i.seeds.is_empty())
            .map(|i| i.generation)
    }

    /// A seeded stack's frames.
    pub(super) fn seeded_stack(&self, pid: Pid, id: u64) -> Option<&Arc<[u64]>> {
        self.ledger(pid)?.stacks.get(&id)
    }

    /// A stack's totals, its live bytes marked as from before attach if it
    /// is a seeded stack.
    pub(super) fn mark(&self, pid: Pid, stack_id: u64, mut totals: Totals) -> Totals {
        if self.seeded_stack(pid, stack_id).is_some() {
            totals.before_attach_bytes = totals.live_bytes;
        }
        totals
    }

    fn retire_seed(&mut self, pid: Pid, ptr: u64) {
        if let Some(image) = self.ledger_mut(pid)
            && image.remove(ptr)
        {
            image.status.retired += 1;
        }
    }

    /// The images' ledgers.
    fn ledgers(&self) -> impl Iterator<Item = (Pid, &LedgerImage)> {
        self.tracked
            .iter()
            .filter_map(|(&pid, t)| Some((pid, t.image.ledger.as_ref()?)))
    }
    /// Reads the ledger of every followed process image not read yet;
    /// whether there was one.
    pub(super) fn read_ledgers(&mut self, snapshot: &KernelSnapshot) -> bool {
        let mut due: Vec<(Pid, u32, u64)> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.image.space.is_some())
            .map(|(&pid, _)| {
                let p = snapshot.processes.get(&pid.0);
                (
                    pid,
                    p.map_or(0, |p| p.generation),
                    p.map_or(0, |p| p.live_samples),
                )
            })
            .filter(|&(pid, generation, _)| self.ledger_status(pid, generation).is_none())
            .collect();
        due.sort_unstable();
        let read = !due.is_empty();
        for (pid, generation, kernel_live) in due {
            self.read_ledger(pid, generation, kernel_live);
        }
        read
    }

    /// The kernel's maps read again (see `Session::read`), for the
    /// processes of `older` and those followed now: one `track` retired
    /// (gone, taken out of `older`) stays out.
    pub(super) fn snapshot_after(
        &mut self,
        older: &KernelSnapshot,
        with_live: bool,
    ) -> Result<KernelSnapshot, KernelError> {
        let mut fresh = self.snapshot(with_live)?;
        let pids: HashSet<u32> = older
            .processes
            .keys()
            .copied()
            .chain(older.aggregates.iter().map(|(k, _)| k.pid))
            .chain(self.tracked.keys().map(|pid| pid.0))
            .collect();
        fresh.processes.retain(|pid, _| pids.contains(pid));
        fresh.aggregates.retain(|(k, _)| pids.contains(&k.pid));
        fresh.live.retain(|(k, _)| pids.contains(&k.pid));
        Ok(fresh)
    }

    fn read_ledger(&mut self, pid: Pid, generation: u32, kernel_live: u64) {
        // In another pid namespace, its host pid is learnt from its first
        // stacks, which an idle process never has: its ledger is read all
        // the same. Its records from before attach cannot be the kernel's
        // samples (checked once it is recognised, `ledger_recognised`), and
        // their frees show in their sequences until the kernel can report
        // them.
        let host = self.pids.host(pid);
        let mut image = LedgerImage::new(generation);
        if let Some((file, address)) = self.processes.ledger_address(pid) {
            // Before the read: a free from now on is reported.
            match host.map_or(Ok(()), |host| self.kernel.watch_unseen_frees(host)) {
                Ok(()) => self.seed(host, pid, file, address, kernel_live, &mut image),
                Err(e) => self.warnings.push(format!("process {pid}: {e}")),
            }
            if !image.status.read
                && let Some(host) = host
            {
                self.kernel.unwatch_unseen_frees(host);
            }
        }
        self.track_pid(pid).image.ledger = Some(image);
        // Records rewritten since they were read (the frees reported
        // meanwhile are retired with the snapshot taken after it).
        self.check_seeds(pid);
    }

    /// Reads `pid`'s ledger at `address` into `image`, seeding the live
    /// records the kernel cannot have seen, within the caps.
    fn seed(
        &mut self,
        host: Option<HostPid>,
        pid: Pid,
        file: crate::process::discover::FileId,
        address: u64,
        kernel_live: u64,
        image: &mut LedgerImage,
    ) {
        let seen_from = self.seen_from_ns(pid, file);
        let limits = self.seed_limits;
        let total = self.ledgers().map(|(_, i)| i.seeds.len() as u64).sum();
        let other_stacks = self.ledgers().map(|(_, i)| i.stacks.len() as u64).sum();
        let mut seeding = Seeding {
            stack_seed: stack_seed(pid.0, image.generation) ^ LEDGER_STACK_TAG,
            image,
            other_stacks,
            limits,
            room: limits.per_process.saturating_sub(kernel_live),
            total,
            seen_from,
        };
        let kernel = &self.kernel;
        let read = self.processes.read_ledger(pid, address, &mut |entry| {
            seeding.offer(entry, |ptr| {
                host.is_some_and(|host| kernel.has_live_sample(host, ptr))
            });
        });
        match read {
            Ok(read) => {
                let status = &mut image.status;
                status.read = true;
                status.torn = read.torn;
                status.garbage += read.garbage;
                status.unread = read.unread;
                return;
            }
            // Nothing sampled yet: no table, nothing from before.
            Err(ReadError::Header(profiler_common::ledger::HeaderError::NoTable)) => {
                image.status.read = true;
                return;
            }
            // Turned off (`ALLOCPROF_LEDGER=0`): the user's choice.
            Err(ReadError::Header(profiler_common::ledger::HeaderError::Off)) => {}
            // Said once, by the reader.
            Err(ReadError::Unreadable(_)) => {}
            Err(e) => self
                .warnings
                .push(format!("process {pid}: its live-sample ledger: {e}")),
        }
        // Not read whole: nothing of it is used.
        *image = LedgerImage::new(image.generation);
    }

    /// When the kernel started seeing `pid`'s allocations through `file`
    /// (CLOCK_MONOTONIC ns): the later of the file's attach and the
    /// process's start (a fork child's inherited blocks came before).
    fn seen_from_ns(&self, pid: Pid, file: crate::process::discover::FileId) -> u64 {
        // Per process with `--pid`; for all system-wide.
        let tracked = self.tracked.get(&pid);
        let attached = tracked
            .and_then(|t| t.attached_ns.get(&file))
            .or_else(|| self.attached_files.get(&file))
            .copied()
            .unwrap_or(0);
        let started = tracked
            .and_then(|t| t.start)
            .or_else(|| self.processes.start_ticks(pid))
            .map_or(0, |ticks| monotonic_ns_of_boot_ticks(ticks + 1));
        attached.max(started)
    }

    /// `pid`'s host pid is now known (see `read_ledger`): the kernel
    /// reports its unseen frees from now on, and a seed the kernel holds a
    /// live sample of (allocated as the probes were attached) is the
    /// kernel's.
    pub(super) fn ledger_recognised(&mut self, pid: Pid, host: HostPid) {
        let Some(image) = self.ledger(pid) else {
            return;
        };
        if !image.status.read {
            return;
        }
        let held: Vec<u64> = image
            .seeds
            .keys()
            .copied()
            .filter(|&ptr| self.kernel.has_live_sample(host, ptr))
            .collect();
        if let Err(e) = self.kernel.watch_unseen_frees(host) {
            self.warnings.push(format!("process {pid}: {e}"));
        }
        let image = self.ledger_mut(pid).expect("checked above");
        for ptr in held {
            image.remove(ptr);
            image.status.seen += 1;
        }
    }

    /// Retires the seeds the kernel's unseen frees name, those freed up to
    /// the seeds' cut (the last snapshot): a seed freed after it stays in
    /// that snapshot's profile until the next snapshot, for the block that
    /// replaced it is not in the aggregates either. Frees of no seed are
    /// forgotten: a seed never comes after its free's report (see
    /// `read_ledger`: the kernel sees every block allocated after the
    /// watch, which only an older ledger could have seeded).
    ///
    /// Retiring a seed at its report instead counted, in every profile,
    /// both the seeds freed between the reports' drain and the
    /// snapshot and their replacements, in the snapshot: a churning
    /// process's heap up to half again too large at its first profiles
    /// when the session waited a few milliseconds on a loaded host.
    pub(super) fn retire_unseen_frees(&mut self) {
        let mut frees = std::mem::take(&mut self.unseen_pending);
        frees.extend(self.kernel.unseen_frees());
        for f in frees {
            let Some(pid) = self.pids.local(HostPid(f.pid)) else {
                continue;
            };
            if !self
                .ledger(pid)
                .is_some_and(|i| i.seeds.contains_key(&f.ptr))
            {
                continue;
            }
            if f.time_ns <= self.seeds_cut_ns {
                self.retire_seed(pid, f.ptr);
            } else {
                self.unseen_pending.push(f);
            }
        }
    }

    /// Retires the seeds of `pid` whose record was rewritten since it was
    /// read (their block was freed; its free may have been lost).
    pub(super) fn check_seeds(&mut self, pid: Pid) {
        let Some(image) = self.ledger(pid) else {
            return;
        };
        if image.seeds.is_empty() {
            return;
        }
        let (ptrs, addresses): (Vec<u64>, Vec<u64>) =
            image.seeds.iter().map(|(&p, s)| (p, s.address)).unzip();
        let seqs = self.processes.ledger_sequences(pid, &addresses);
        let image = self.ledger_mut(pid).expect("checked above");
        for (ptr, seq) in ptrs.into_iter().zip(seqs) {
            // Unreadable (the process is going): its exit retires all.
            if seq.is_some_and(|s| image.seeds.get(&ptr).is_some_and(|seed| seed.seq != s)) {
                image.remove(ptr);
                image.status.retired += 1;
            }
        }
    }

    /// [`Session::check_seeds`] for every image with seeds.
    pub(super) fn check_all_seeds(&mut self) {
        let mut pids: Vec<Pid> = self
            .ledgers()
            .filter(|(_, i)| !i.seeds.is_empty())
            .map(|(pid, _)| pid)
            .collect();
        pids.sort_unstable();
        for pid in pids {
            self.check_seeds(pid);
        }
    }

    /// Adds the seeds to a snapshot: one aggregate per seeded stack, and
    /// with the live samples, the seeds as live samples (for their ages).
    /// Their drops, lost bytes and weights join their process's counters.
    pub(super) fn add_seeds(&self, snapshot: &mut KernelSnapshot) {
        self.add_seeds_of(snapshot, |_| true);
    }

    /// [`Session::add_seeds`] of the processes `wanted` selects.
    pub(super) fn add_seeds_of(&self, snapshot: &mut KernelSnapshot, wanted: impl Fn(Pid) -> bool) {
        for (pid, image) in self.ledgers().filter(|&(pid, _)| wanted(pid)) {
            if image.counters != SeedCounters::default() {
                let counters = snapshot.processes.entry(pid.0).or_default();
                image.counters.add_to(counters);
                for (d, s) in snapshot.drops.iter_mut().zip(image.counters.drops) {
                    *d += s;
                }
            }
            if snapshot.live_read {
                snapshot.live.extend(image.seeds.iter().map(|(&ptr, seed)| {
                    let key = LiveKey {
                        pid: pid.0,
                        _pad: 0,
                        ptr,
                    };
                    (key, seed.sample)
                }));
            }
            snapshot
                .aggregates
                .extend(image.aggregates().iter().map(|&(stack_id, agg)| {
                    let key = AggKey {
                        pid: pid.0,
                        generation: image.generation,
                        stack_id,
                    };
                    (key, agg)
                }));
        }
    }

    /// Forgets `pid`'s ledger (its image is gone; a new image is read
    /// anew), and stops the kernel reporting its unseen frees.
    pub(super) fn forget_ledger(&mut self, pid: Pid) {
        // Seeded stack ids hash the image in: no other image shares them.
        let Some(image) = self
            .tracked
            .get_mut(&pid)
            .and_then(|t| t.image.ledger.take())
        else {
            return;
        };
        if image.status.read
            && let Some(host) = self.pids.host(pid)
        {
            self.kernel.unwatch_unseen_frees(host);
        }
    }
}

/// A `/proc/PID/stat` start time (clock ticks since boot, `CLOCK_BOOTTIME`)
/// on the `CLOCK_MONOTONIC` clock of the ledger's times.
fn monotonic_ns_of_boot_ticks(ticks: u64) -> u64 {
    let now = |clock| {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a valid, writable timespec.
        unsafe { libc::clock_gettime(clock, &mut t) };
        t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
    };
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|&hz| hz > 0)
        .unwrap_or(100);
    let suspended = now(libc::CLOCK_BOOTTIME).saturating_sub(now(libc::CLOCK_MONOTONIC));
    (ticks.saturating_mul(1_000_000_000) / hz).saturating_sub(suspended)
}

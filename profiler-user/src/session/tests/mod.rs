//! The session's bookkeeping against a fake kernel and fake processes: this
//! file holds the fakes and helpers every test shares; the tests are in its
//! submodules, by behaviour (`lifecycle`: exec, exit, pid reuse, a lost exit
//! event, nothing outliving its process; `attach`; `symbols`: a stack seen
//! before its process's maps, dlopen; `frozen`: the caps on gone images, OOM
//! victims; `tables`; `ages`; `ledger`). Stacks are addresses of functions
//! of this test binary, and every fake process has this process's real
//! address space, so symbolization is real.

use std::{
    cell::RefCell,
    collections::{BTreeMap, HashMap},
    fs::File,
    rc::Rc,
    sync::Arc,
    time::Duration,
};

use profiler_common::{
    AggKey, DROP_REASONS, DropReason, LiveKey, LiveSample, PROC_EVENT_EXEC, PROC_EVENT_EXIT,
    PROC_EVENT_OOM, ProcCounters, ProcEvent, SampleDelta, StackAgg, UnseenFree, UsdtSpec,
    unwind::{ProcUnwind, UnwindRow},
};

use super::{KernelPort, ProcessPort, Session, Target};
use crate::{
    ids::{HostPid, Pid, Tid},
    kernel::{KernelError, KernelSnapshot, Scope},
    model::profile::{ProcessProfile, ProcessState, Profile},
    process::discover::{FileId, OpenFile, ProbeFile, ProbeKind, ProbeSite, Scan, Scanner},
    process::pidns::PidMap,
    process::resource::ProcessResource,
};

const RATE: u64 = 512 * 1024;

#[inline(never)]
fn alpha_site() -> u64 {
    std::hint::black_box(1)
}

#[inline(never)]
fn beta_site() -> u64 {
    std::hint::black_box(2)
}

/// An address inside a function of this binary (past its first byte, as a
/// return address would be).
fn address_in(f: fn() -> u64) -> u64 {
    f as usize as u64 + 1
}

/// The kernel side as the session sees it: aggregates, counters, stacks and
/// events the test sets, and what the session did to it.
#[derive(Default)]
struct KernelState {
    aggregates: HashMap<AggKey, StackAgg>,
    live: Vec<(LiveKey, LiveSample)>,
    procs: BTreeMap<u32, ProcCounters>,
    stacks: HashMap<u64, Vec<u64>>,
    /// The prints of stacks with Python frames (see `python_prints`).
    prints: HashMap<u64, Vec<u32>>,
    drops: [u64; DROP_REASONS],
    events: Vec<ProcEvent>,
    attached: Vec<(FileId, Scope)>,
    detached: Vec<u32>,
    unwind_rows: HashMap<u32, UnwindRow>,
    unwind_procs: HashMap<u32, ProcUnwind>,
    /// Every `ProcUnwind::version` given, in order.
    unwind_versions: Vec<u64>,
    unwind_cleared: Vec<u32>,
    /// Processes whose unseen frees are reported, and those reported.
    watched: std::collections::HashSet<u32>,
    unseen: Vec<UnseenFree>,
    /// How many times the session read a stack's frames.
    stack_reads: std::cell::Cell<usize>,
}

#[derive(Clone)]
struct FakeProcess {
    name: String,
    /// Whether `/proc/PID/maps` can be read yet.
    maps_readable: bool,
    /// An address whose mapping the scan does not see yet (a library the
    /// process has not dlopen'ed yet).
    not_mapped: Option<u64>,
    /// What `code_size` says (none: unknown, rescanned at every refresh).
    code_size: Option<u64>,
    probe_files: Vec<FileId>,
    /// Its live-sample ledger (none: its library has none).
    ledger: Option<FakeLedger>,
    /// In its exit: still in /proc, but its maps and executable are gone.
    exiting: bool,
    /// Its `ALLOCPROF_RATE` (its environ: unreadable once exiting or gone).
    rate: u64,
}

/// A ledger's live records and each record's sequence now.
#[derive(Clone, Default)]
struct FakeLedger {
    live: Vec<crate::process::ledger::LedgerEntry>,
    seqs: HashMap<u64, u64>,
    /// Blocks the process frees while its ledger is read, each replaced at
    /// once by a block the kernel samples.
    replaced_while_read: Vec<Replacement>,
    /// The same, right after the session read its records' sequences.
    replaced_after_check: Vec<Replacement>,
    /// The same, right after the kernel's maps were read (1 ns later).
    replaced_after_snapshot: Vec<Replacement>,
}

/// A block freed (by pointer) and the one the kernel samples in its place
/// (stack id, frames, size).
type Replacement = (u64, u64, Vec<u64>, u64);

struct WorldState {
    kernel: KernelState,
    processes: BTreeMap<u32, FakeProcess>,
    scans: Vec<u32>,
    /// `CLOCK_MONOTONIC` as the session reads it (ns): the test moves it.
    clock_ns: u64,
}

/// Where the fake clock starts: a machine booted a minute and a half ago,
/// as CI machines often are. A test that needs older samples moves the
/// clock on first ([`World::pass`]).
const BOOTED_FOR: Duration = Duration::from_secs(90);

impl Default for WorldState {
    fn default() -> Self {
        WorldState {
            kernel: KernelState::default(),
            processes: BTreeMap::new(),
            scans: Vec::new(),
            clock_ns: BOOTED_FOR.as_nanos() as u64,
        }
    }
}

impl WorldState {
    fn unseen_free(&mut self, pid: u32, ptr: u64) {
        let time_ns = self.clock_ns;
        self.kernel.unseen.push(UnseenFree {
            pid,
            _pad: 0,
            ptr,
            time_ns,
        });
    }
}

/// One world both fakes share, so a test drives it after the session took
/// the ports.
#[derive(Clone, Default)]
struct World(Rc<RefCell<WorldState>>);

struct FakeKernel(World);

struct FakeProcesses {
    world: World,
    /// Our own process: the address space every fake process has.
    scanner: Scanner,
    open: HashMap<FileId, Arc<ProbeFile>>,
    /// Reads our own memory (where `python` tests lay out code objects).
    memory: crate::process::target_memory::TargetMemory,
}

impl World {
    fn spawn(&self, pid: u32, name: &str) {
        self.0.borrow_mut().processes.insert(
            pid,
            FakeProcess {
                name: name.into(),
                maps_readable: true,
                not_mapped: None,
                code_size: None,
                probe_files: vec![probe_file_id(1)],
                ledger: None,
                exiting: false,
                rate: RATE,
            },
        );
    }

    fn process(&self, pid: u32) -> std::cell::RefMut<'_, FakeProcess> {
        std::cell::RefMut::map(self.0.borrow_mut(), |w| {
            w.processes.get_mut(&pid).expect("a spawned process")
        })
    }

    /// One sampled allocation of `size` bytes in `pid`'s current image, on
    /// the stack `stack_id` (whose frames the kernel holds).
    fn sample(&self, pid: u32, stack_id: u64, frames: &[u64], size: u64) {
        self.sample_aged(pid, stack_id, frames, size, Duration::ZERO);
    }

    /// The kernel's prints of the code objects of stack `stack_id`'s
    /// Python frames, as it files them when the stack is new.
    fn python_prints(&self, stack_id: u64, prints: &[u32]) {
        self.0
            .borrow_mut()
            .kernel
            .prints
            .insert(stack_id, prints.to_vec());
    }

    /// `pid`'s ledger, if it is there and has one.
    fn ledger(&self, pid: u32) -> Option<std::cell::RefMut<'_, FakeLedger>> {
        std::cell::RefMut::filter_map(self.0.borrow_mut(), |w| {
            w.processes.get_mut(&pid)?.ledger.as_mut()
        })
        .ok()
    }

    /// The process frees the blocks `which` of its ledger names (once):
    /// the kernel reports each free (it saw no allocation), the record
    /// leaves the live ones and its sequence moves, and the block that
    /// replaces it is the kernel's sample.
    fn replace(&self, pid: u32, which: fn(&mut FakeLedger) -> &mut Vec<Replacement>) {
        let blocks = match self.ledger(pid) {
            Some(mut l) => std::mem::take(which(&mut l)),
            None => return,
        };
        for (ptr, stack_id, frames, size) in blocks {
            {
                let mut w = self.0.borrow_mut();
                w.unseen_free(pid, ptr);
                let l = w.processes.get_mut(&pid).unwrap().ledger.as_mut().unwrap();
                if let Some(at) = l.live.iter().position(|e| e.record.ptr == ptr) {
                    let address = l.live.remove(at).address;
                    *l.seqs.entry(address).or_default() += 2;
                }
            }
            self.sample(pid, stack_id, &frames, size);
        }
    }

    /// [`World::replace`] a nanosecond from now.
    fn replace_later(&self, pid: u32, which: fn(&mut FakeLedger) -> &mut Vec<Replacement>) {
        let due = self
            .ledger(pid)
            .is_some_and(|mut l| !which(&mut l).is_empty());
        if due {
            self.pass(Duration::from_nanos(1));
            self.replace(pid, which);
        }
    }

    /// The kernel reports a free of `pid` that found no live sample, now.
    fn unseen_free(&self, pid: u32, ptr: u64) {
        self.0.borrow_mut().unseen_free(pid, ptr);
    }

    /// Time passes: the session's clock moves `d` on.
    fn pass(&self, d: Duration) {
        self.0.borrow_mut().clock_ns += d.as_nanos() as u64;
    }

    /// A live sample allocated `age` ago (no earlier than the boot: move
    /// the clock on first with [`World::pass`]).
    fn sample_aged(&self, pid: u32, stack_id: u64, frames: &[u64], size: u64, age: Duration) {
        let mut w = self.0.borrow_mut();
        let allocated_ns = w
            .clock_ns
            .checked_sub(age.as_nanos() as u64)
            .expect("a sample dated before the boot: World::pass first");
        let k = &mut w.kernel;
        k.stacks.insert(stack_id, frames.to_vec());
        let proc = k.procs.entry(pid).or_default();
        proc.alloc_events += 1;
        proc.live_samples += 1;
        let key = AggKey {
            pid,
            generation: proc.generation,
            stack_id,
        };
        let weight = size.max(RATE);
        let delta = SampleDelta::of(size, weight);
        let agg = k.aggregates.entry(key).or_default();
        agg.live_bytes += delta.bytes;
        agg.alloc_bytes += delta.bytes;
        agg.live_samples += 1;
        agg.alloc_samples += 1;
        let ptr = k.live.len() as u64;
        k.live.push((
            LiveKey { pid, _pad: 0, ptr },
            LiveSample {
                stack_id,
                size,
                weight,
                generation: key.generation,
                thin_factor: 0,
                allocated_ns,
            },
        ));
    }

    fn exec(&self, pid: u32, new_name: &str) {
        let mut w = self.0.borrow_mut();
        if let Some(p) = w.kernel.procs.get_mut(&pid) {
            p.generation += 1;
        }
        w.kernel.events.push(ProcEvent {
            pid,
            kind: PROC_EVENT_EXEC,
            ..ProcEvent::default()
        });
        w.processes.get_mut(&pid).unwrap().name = new_name.into();
    }

    fn exit(&self, pid: u32) {
        let mut w = self.0.borrow_mut();
        w.processes.remove(&pid);
        w.kernel.events.push(ProcEvent {
            pid,
            kind: PROC_EVENT_EXIT,
            ..ProcEvent::default()
        });
    }

    /// The OOM killer picks `pid` (its exit follows).
    fn oom(&self, pid: u32) {
        self.0.borrow_mut().kernel.events.push(ProcEvent {
            pid,
            kind: PROC_EVENT_OOM,
            ..ProcEvent::default()
        });
    }

    fn kernel(&self) -> std::cell::Ref<'_, KernelState> {
        std::cell::Ref::map(self.0.borrow(), |w| &w.kernel)
    }

    fn scans_of(&self, pid: u32) -> usize {
        self.0.borrow().scans.iter().filter(|&&p| p == pid).count()
    }
}

/// What the tests look at inside the session.
impl<K: KernelPort, P: ProcessPort> Session<K, P> {
    /// Stacks with names, of live processes and frozen images.
    fn symbols_held(&self) -> usize {
        let live: usize = self.tracked.values().map(|t| t.symbols.names.len()).sum();
        live + self.frozen.iter().map(|f| f.names.len()).sum::<usize>()
    }

    /// Requests the symbolizer has not answered (of dropped images too).
    fn looked_at(&self) -> usize {
        self.looked_at
    }

    fn pending_requests(&self) -> usize {
        self.in_flight
    }

    /// Stacks with addresses outside their process's known maps.
    fn unresolved_stacks(&self) -> usize {
        self.tracked
            .values()
            .map(|t| t.symbols.unresolved.len())
            .sum()
    }

    /// As if no process had been scanned at a refresh yet.
    fn forget_scans(&mut self) {
        for t in self.tracked.values_mut() {
            t.image.scanned = None;
        }
    }
}

fn probe_file_id(n: u64) -> FileId {
    FileId {
        dev: 0xfa4e,
        ino: n,
    }
}

impl KernelPort for FakeKernel {
    fn attach_file(
        &mut self,
        file: &OpenFile,
        _site: &ProbeSite,
        scope: Scope,
    ) -> Result<(), KernelError> {
        let mut w = self.0.0.borrow_mut();
        if !w.kernel.attached.contains(&(file.id, scope)) {
            w.kernel.attached.push((file.id, scope));
        }
        Ok(())
    }

    fn detach_process(&mut self, Tid(tid): Tid) {
        let mut w = self.0.0.borrow_mut();
        w.kernel
            .attached
            .retain(|(_, s)| *s != Scope::Process(Tid(tid)));
        w.kernel.detached.push(tid);
    }

    fn attachments(&self) -> usize {
        self.0.kernel().attached.len()
    }

    fn forget_stacks(&mut self, ids: &[u64]) -> usize {
        let mut w = self.0.0.borrow_mut();
        ids.iter()
            .filter(|id| w.kernel.stacks.remove(id).is_some())
            .count()
    }

    fn proc_events(&mut self) -> Vec<ProcEvent> {
        std::mem::take(&mut self.0.0.borrow_mut().kernel.events)
    }

    fn process(&self, HostPid(pid): HostPid) -> Option<ProcCounters> {
        self.0.kernel().procs.get(&pid).copied()
    }

    fn snapshot(&self, with_live: bool) -> Result<KernelSnapshot, KernelError> {
        let k = self.0.kernel();
        let snapshot = KernelSnapshot {
            aggregates: k.aggregates.iter().map(|(k, v)| (*k, *v)).collect(),
            live: if with_live {
                k.live.clone()
            } else {
                Vec::new()
            },
            live_read: with_live,
            processes: k.procs.clone(),
            drops: k.drops,
            taken_ns: self.0.0.borrow().clock_ns,
        };
        drop(k);
        let pids: Vec<u32> = self.0.0.borrow().processes.keys().copied().collect();
        for pid in pids {
            self.0
                .replace_later(pid, |l| &mut l.replaced_after_snapshot);
        }
        Ok(snapshot)
    }

    fn stack(&self, id: u64) -> Option<Vec<u64>> {
        let k = self.0.kernel();
        k.stack_reads.set(k.stack_reads.get() + 1);
        k.stacks.get(&id).cloned()
    }

    fn stack_prints(&self, id: u64) -> Vec<u32> {
        self.0.kernel().prints.get(&id).cloned().unwrap_or_default()
    }

    fn forget_images(
        &mut self,
        gone: &[(HostPid, Option<u32>)],
        aggregates: &[AggKey],
        _live_samples: bool,
    ) -> usize {
        let mut w = self.0.0.borrow_mut();
        for key in aggregates {
            w.kernel.aggregates.remove(key);
        }
        for (pid, below) in gone {
            if below.is_none() {
                w.kernel.procs.remove(&pid.0);
            }
        }
        0
    }

    fn unwind_capacity(&self) -> u32 {
        1 << 20
    }

    fn write_unwind_rows(&mut self, start: u32, rows: &[UnwindRow]) -> Result<(), KernelError> {
        let mut w = self.0.0.borrow_mut();
        for (i, row) in rows.iter().enumerate() {
            w.kernel.unwind_rows.insert(start + i as u32, *row);
        }
        Ok(())
    }

    fn set_process_unwind(
        &mut self,
        HostPid(pid): HostPid,
        table: &ProcUnwind,
    ) -> Result<(), KernelError> {
        let mut w = self.0.0.borrow_mut();
        w.kernel.unwind_versions.push(table.version);
        w.kernel.unwind_procs.insert(pid, *table);
        Ok(())
    }

    fn clear_process_unwind(&mut self, HostPid(pid): HostPid) {
        let mut w = self.0.0.borrow_mut();
        w.kernel.unwind_procs.remove(&pid);
        w.kernel.unwind_cleared.push(pid);
    }

    fn watch_unseen_frees(&mut self, HostPid(pid): HostPid) -> Result<(), KernelError> {
        self.0.0.borrow_mut().kernel.watched.insert(pid);
        Ok(())
    }

    fn unwatch_unseen_frees(&mut self, HostPid(pid): HostPid) {
        self.0.0.borrow_mut().kernel.watched.remove(&pid);
    }

    fn unseen_frees(&mut self) -> Vec<UnseenFree> {
        std::mem::take(&mut self.0.0.borrow_mut().kernel.unseen)
    }

    fn has_live_sample(&self, HostPid(pid): HostPid, ptr: u64) -> bool {
        let w = self.0.0.borrow();
        w.kernel
            .live
            .iter()
            .any(|(k, _)| k.pid == pid && k.ptr == ptr)
    }
}

impl ProcessPort for FakeProcesses {
    fn python_memory(&self, Pid(pid): Pid) -> Option<Box<dyn crate::python::code::Memory + '_>> {
        self.world.0.borrow().processes.get(&pid)?;
        Some(Box::new(crate::python::code::TargetReader {
            memory: &self.memory,
            thread: crate::process::target_memory::LiveThread::current(),
        }))
    }

    fn alive(&self, Pid(pid): Pid) -> bool {
        self.world.0.borrow().processes.contains_key(&pid)
    }

    fn code_size(&self, Pid(pid): Pid) -> Option<u64> {
        self.world.0.borrow().processes.get(&pid)?.code_size
    }

    fn scan(&mut self, Pid(pid): Pid) -> std::io::Result<Scan> {
        self.world.0.borrow_mut().scans.push(pid);
        let process = self.world.0.borrow().processes.get(&pid).cloned();
        let process = process.ok_or(std::io::ErrorKind::NotFound)?;
        if process.exiting {
            return Err(std::io::ErrorKind::NotFound.into());
        }
        if !process.maps_readable {
            return Err(std::io::ErrorKind::PermissionDenied.into());
        }
        let mut own = self.scanner.scan(Pid(std::process::id()))?;
        if let Some(addr) = process.not_mapped {
            own.space = own.space.without(addr);
        }
        let probes = process
            .probe_files
            .iter()
            .map(|id| {
                self.open
                    .entry(*id)
                    .or_insert_with(|| fake_probe_file(*id))
                    .clone()
            })
            .collect();
        Ok(Scan {
            tid: Tid(pid),
            probes,
            space: own.space,
        })
    }

    fn name(&self, Pid(pid): Pid) -> Option<String> {
        Some(self.world.0.borrow().processes.get(&pid)?.name.clone())
    }

    /// Its executable named after it, its container after its pid; an
    /// exiting process has no executable left to read.
    fn resource(&self, Pid(pid): Pid) -> Option<ProcessResource> {
        let w = self.world.0.borrow();
        let p = w.processes.get(&pid)?;
        Some(ProcessResource {
            executable_path: (!p.exiting).then(|| format!("/fake/{}", p.name)),
            container_id: Some(format!("container-{pid}")),
            ..ProcessResource::default()
        })
    }

    fn sampling_rate(&self, Pid(pid): Pid) -> u64 {
        let w = self.world.0.borrow();
        w.processes
            .get(&pid)
            .filter(|p| !p.exiting)
            .map_or(profiler_common::rate::DEFAULT_RATE, |p| p.rate)
    }

    fn monotonic_ns(&self) -> u64 {
        self.world.0.borrow().clock_ns
    }

    fn all_pids(&self) -> Vec<Pid> {
        self.world
            .0
            .borrow()
            .processes
            .keys()
            .map(|&p| Pid(p))
            .collect()
    }

    fn ledger_address(&self, Pid(pid): Pid) -> Option<(FileId, u64)> {
        let w = self.world.0.borrow();
        let p = w.processes.get(&pid)?;
        p.ledger.as_ref()?;
        Some((*p.probe_files.first()?, 0x1000))
    }

    fn read_ledger(
        &self,
        Pid(pid): Pid,
        _address: u64,
        live: &mut dyn FnMut(crate::process::ledger::LedgerEntry),
    ) -> Result<crate::process::ledger::LedgerRead, crate::process::ledger::ReadError> {
        let ledger = {
            let w = self.world.0.borrow();
            w.processes.get(&pid).and_then(|p| p.ledger.clone())
        };
        let ledger = ledger.ok_or(std::io::Error::from(std::io::ErrorKind::NotFound))?;
        ledger.live.into_iter().for_each(live);
        // The read copied them live; the process goes on meanwhile.
        self.world.replace(pid, |l| &mut l.replaced_while_read);
        Ok(crate::process::ledger::LedgerRead::default())
    }

    fn ledger_sequences(&self, Pid(pid): Pid, addresses: &[u64]) -> Vec<Option<u64>> {
        let seqs = {
            let w = self.world.0.borrow();
            let ledger = w.processes.get(&pid).and_then(|p| p.ledger.as_ref());
            addresses
                .iter()
                .map(|a| ledger.and_then(|l| l.seqs.get(a).copied()))
                .collect()
        };
        self.world.replace(pid, |l| &mut l.replaced_after_check);
        seqs
    }
}

fn fake_probe_file(id: FileId) -> Arc<ProbeFile> {
    let site = |kind| ProbeSite {
        kind,
        file_offset: 0x1000,
        spec: UsdtSpec::default(),
    };
    Arc::new(ProbeFile {
        file: Arc::new(OpenFile {
            id,
            file: File::open("/proc/self/exe").unwrap(),
            display: format!("/fake/liballocprof-{}.so", id.ino).into(),
        }),
        sites: vec![site(ProbeKind::Alloc), site(ProbeKind::Free)],
        problems: Vec::new(),
        backend_stats: None,
        ledger: None,
    })
}

fn session(world: &World, target: Target) -> Session<FakeKernel, FakeProcesses> {
    let processes = FakeProcesses {
        world: world.clone(),
        scanner: Scanner::default(),
        open: HashMap::new(),
        memory: Default::default(),
    };
    let mut s = Session::with_ports(
        FakeKernel(world.clone()),
        processes,
        PidMap::identity(),
        target,
    )
    .unwrap();
    // Every refresh a sweep, as the tests of what a sweep notices expect;
    // `sweeps` tests the cadence itself.
    s.sweep_every = Duration::ZERO;
    s
}

fn images(profile: &Profile, pid: u32) -> Vec<&ProcessProfile> {
    profile
        .processes
        .iter()
        .filter(|p| p.key.pid.0 == pid)
        .collect()
}

fn only_image(profile: &Profile, pid: u32, state: ProcessState) -> &ProcessProfile {
    let matching: Vec<_> = images(profile, pid)
        .into_iter()
        .filter(|p| p.state == state)
        .collect();
    assert_eq!(
        matching.len(),
        1,
        "one {state:?} image of {pid} in {profile:#?}"
    );
    matching[0]
}

fn functions(p: &ProcessProfile) -> Vec<String> {
    p.stacks
        .iter()
        .flat_map(|s| s.frames.iter().map(|f| f.function.to_string()))
        .collect()
}

fn has_function(p: &ProcessProfile, name: &str) -> bool {
    functions(p).iter().any(|f| f.contains(name))
}

mod ages;
mod attach;
mod frozen;
mod ledger;
mod lifecycle;
mod python;
mod sweeps;
mod symbols;
mod tables;

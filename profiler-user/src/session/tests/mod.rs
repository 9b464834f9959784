//! The session's bookkeeping against a fake kernel and fake processes: exec,
//! exit, pid reuse, dlopen, a stack seen before its process's maps, drops.
//! Stacks are addresses of functions of this test binary, and every fake
//! process has this process's real address space, so symbolization is real.

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
    PROC_EVENT_OOM, ProcCounters, ProcEvent, SampleDelta, StackAgg, UsdtSpec,
    unwind::{ProcUnwind, UnwindRow},
};

use super::{KernelPort, ProcessPort, Session, Target};
use crate::{
    discover::{FileId, OpenFile, ProbeFile, ProbeKind, ProbeSite, Scan, Scanner},
    kernel::{KernelError, KernelSnapshot, Scope},
    pidns::PidMap,
    profile::{ProcessProfile, ProcessState, Profile},
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
    drops: [u64; DROP_REASONS],
    events: Vec<ProcEvent>,
    attached: Vec<(FileId, Scope)>,
    detached: Vec<u32>,
    unwind_rows: HashMap<u32, UnwindRow>,
    unwind_procs: HashMap<u32, ProcUnwind>,
    unwind_cleared: Vec<u32>,
    /// Processes whose unseen frees are reported, and those reported.
    watched: std::collections::HashSet<u32>,
    unseen: Vec<(u32, u64)>,
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
}

/// A ledger's live records and each record's sequence now.
#[derive(Clone, Default)]
struct FakeLedger {
    live: Vec<crate::ledger::LedgerEntry>,
    seqs: HashMap<u64, u64>,
}

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
        });
        w.processes.get_mut(&pid).unwrap().name = new_name.into();
    }

    fn exit(&self, pid: u32) {
        let mut w = self.0.borrow_mut();
        w.processes.remove(&pid);
        w.kernel.events.push(ProcEvent {
            pid,
            kind: PROC_EVENT_EXIT,
        });
    }

    /// The OOM killer picks `pid` (its exit follows).
    fn oom(&self, pid: u32) {
        self.0.borrow_mut().kernel.events.push(ProcEvent {
            pid,
            kind: PROC_EVENT_OOM,
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

    fn detach_process(&mut self, tid: u32) {
        let mut w = self.0.0.borrow_mut();
        w.kernel.attached.retain(|(_, s)| *s != Scope::Process(tid));
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

    fn process(&self, pid: u32) -> Option<ProcCounters> {
        self.0.kernel().procs.get(&pid).copied()
    }

    fn snapshot(&self, with_live: bool) -> Result<KernelSnapshot, KernelError> {
        let k = self.0.kernel();
        Ok(KernelSnapshot {
            aggregates: k.aggregates.iter().map(|(k, v)| (*k, *v)).collect(),
            live: if with_live {
                k.live.clone()
            } else {
                Vec::new()
            },
            live_read: with_live,
            processes: k.procs.clone(),
            drops: k.drops,
        })
    }

    fn stack(&self, id: u64) -> Option<Vec<u64>> {
        self.0.kernel().stacks.get(&id).cloned()
    }

    fn forget_images(
        &mut self,
        gone: &[(u32, Option<u32>)],
        aggregates: &[AggKey],
        _live_samples: bool,
    ) -> usize {
        let mut w = self.0.0.borrow_mut();
        for key in aggregates {
            w.kernel.aggregates.remove(key);
        }
        for (pid, below) in gone {
            if below.is_none() {
                w.kernel.procs.remove(pid);
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

    fn set_process_unwind(&mut self, pid: u32, table: &ProcUnwind) -> Result<(), KernelError> {
        self.0
            .0
            .borrow_mut()
            .kernel
            .unwind_procs
            .insert(pid, *table);
        Ok(())
    }

    fn clear_process_unwind(&mut self, pid: u32) {
        let mut w = self.0.0.borrow_mut();
        w.kernel.unwind_procs.remove(&pid);
        w.kernel.unwind_cleared.push(pid);
    }

    fn watch_unseen_frees(&mut self, pid: u32) -> Result<(), KernelError> {
        self.0.0.borrow_mut().kernel.watched.insert(pid);
        Ok(())
    }

    fn unwatch_unseen_frees(&mut self, pid: u32) {
        self.0.0.borrow_mut().kernel.watched.remove(&pid);
    }

    fn unseen_frees(&mut self) -> Vec<(u32, u64)> {
        std::mem::take(&mut self.0.0.borrow_mut().kernel.unseen)
    }

    fn has_live_sample(&self, pid: u32, ptr: u64) -> bool {
        let w = self.0.0.borrow();
        w.kernel
            .live
            .iter()
            .any(|(k, _)| k.pid == pid && k.ptr == ptr)
    }
}

impl ProcessPort for FakeProcesses {
    fn alive(&self, pid: u32) -> bool {
        self.world.0.borrow().processes.contains_key(&pid)
    }

    fn code_size(&self, pid: u32) -> Option<u64> {
        self.world.0.borrow().processes.get(&pid)?.code_size
    }

    fn scan(&mut self, pid: u32) -> std::io::Result<Scan> {
        self.world.0.borrow_mut().scans.push(pid);
        let process = self.world.0.borrow().processes.get(&pid).cloned();
        let process = process.ok_or(std::io::ErrorKind::NotFound)?;
        if !process.maps_readable {
            return Err(std::io::ErrorKind::PermissionDenied.into());
        }
        let mut own = self.scanner.scan(std::process::id())?;
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
            tid: pid,
            probes,
            space: own.space,
        })
    }

    fn name(&self, pid: u32) -> Option<String> {
        Some(self.world.0.borrow().processes.get(&pid)?.name.clone())
    }

    fn sampling_rate(&self, _pid: u32) -> u64 {
        RATE
    }

    fn monotonic_ns(&self) -> u64 {
        self.world.0.borrow().clock_ns
    }

    fn all_pids(&self) -> Vec<u32> {
        self.world.0.borrow().processes.keys().copied().collect()
    }

    fn ledger_address(&self, pid: u32) -> Option<(FileId, u64)> {
        let w = self.world.0.borrow();
        let p = w.processes.get(&pid)?;
        p.ledger.as_ref()?;
        Some((*p.probe_files.first()?, 0x1000))
    }

    fn read_ledger(
        &self,
        pid: u32,
        _address: u64,
        live: &mut dyn FnMut(crate::ledger::LedgerEntry),
    ) -> Result<crate::ledger::LedgerRead, crate::ledger::ReadError> {
        let ledger = {
            let w = self.world.0.borrow();
            w.processes.get(&pid).and_then(|p| p.ledger.clone())
        };
        let ledger = ledger.ok_or(std::io::Error::from(std::io::ErrorKind::NotFound))?;
        ledger.live.into_iter().for_each(live);
        Ok(crate::ledger::LedgerRead::default())
    }

    fn ledger_sequences(&self, pid: u32, addresses: &[u64]) -> Vec<Option<u64>> {
        let w = self.world.0.borrow();
        let ledger = w.processes.get(&pid).and_then(|p| p.ledger.as_ref());
        addresses
            .iter()
            .map(|a| ledger.and_then(|l| l.seqs.get(a).copied()))
            .collect()
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
    };
    Session::with_ports(
        FakeKernel(world.clone()),
        processes,
        PidMap::identity(),
        target,
    )
    .unwrap()
}

fn images(profile: &Profile, pid: u32) -> Vec<&ProcessProfile> {
    profile
        .processes
        .iter()
        .filter(|p| p.key.pid == pid)
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

#[test]
fn an_exit_freezes_the_image_and_frees_its_kernel_state() {
    let world = World::default();
    world.spawn(100, "worker");
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 4 << 20);
    let before = s.complete_profile().unwrap();
    let live = only_image(&before, 100, ProcessState::Live);
    assert!(has_function(live, "alpha_site"), "{:?}", functions(live));
    assert_eq!(s.held_address_spaces(), 1);

    world.exit(100);
    let after = s.complete_profile().unwrap();
    let exited = only_image(&after, 100, ProcessState::Exited);
    assert_eq!(exited.totals.live_bytes, live.totals.live_bytes);
    assert_eq!(exited.alloc_events, 1, "counters frozen at exit");
    assert_eq!(exited.name, "worker");
    assert!(has_function(exited, "alpha_site"));
    assert_eq!(images(&after, 100).len(), 1);
    let kernel = world.kernel();
    assert!(kernel.aggregates.is_empty(), "aggregates forgotten");
    assert!(kernel.procs.is_empty(), "counters forgotten");
    assert!(kernel.stacks.is_empty(), "stacks reclaimed once symbolized");
    drop(kernel);
    assert_eq!(s.held_address_spaces(), 0, "its address space pruned");
}

#[test]
fn an_exec_keeps_the_old_image_apart_and_rescans_the_new_one() {
    let world = World::default();
    world.spawn(100, "sh");
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.complete_profile().unwrap();
    let scans = world.scans_of(100);

    world.exec(100, "server");
    world.sample(100, 8, &[address_in(beta_site)], 3 << 20);
    let p = s.complete_profile().unwrap();
    assert!(world.scans_of(100) > scans, "rescanned after exec");
    let old = only_image(&p, 100, ProcessState::Replaced);
    let new = only_image(&p, 100, ProcessState::Live);
    assert_eq!((old.key.generation, new.key.generation), (0, 1));
    assert_eq!((old.name.as_str(), new.name.as_str()), ("sh", "server"));
    assert!(has_function(old, "alpha_site") && !has_function(old, "beta_site"));
    assert!(has_function(new, "beta_site") && !has_function(new, "alpha_site"));
    assert!(new.totals.live_bytes > old.totals.live_bytes);
    let kernel = world.kernel();
    assert!(
        kernel.aggregates.keys().all(|k| k.generation == 1),
        "only the old image's aggregates are forgotten"
    );
    assert!(
        kernel.procs.contains_key(&100),
        "the process keeps its counters"
    );
}

#[test]
fn an_image_replaced_by_exec_keeps_its_weight_form_lost_bytes_and_drops() {
    let world = World::default();
    world.spawn(100, "emitter");
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    {
        // Weights of no known form, a sample it could not track, a drop.
        let mut w = world.0.borrow_mut();
        let proc = w.kernel.procs.get_mut(&100).unwrap();
        proc.min_weight = 3;
        proc.weights_not_multiple = 2;
        proc.weights_below_size = 1;
        proc.lost_live_bytes = 5 << 20;
        proc.drops[DropReason::Unplaced as usize] = 1;
    }
    let before = s.complete_profile().unwrap();
    let live = only_image(&before, 100, ProcessState::Live);
    assert_eq!(live.weight_form, profiler_common::WeightForm::Unrecognized);
    assert_eq!(live.totals.live_ci95_known(), None);

    world.exec(100, "emitter");
    // Frozen at the poll that sees the exec; the new image samples after.
    s.complete_profile().unwrap();
    world.sample(100, 8, &[address_in(beta_site)], 2 << 20);
    let after = s.complete_profile().unwrap();
    let old = only_image(&after, 100, ProcessState::Replaced);
    assert_eq!(old.weight_form, profiler_common::WeightForm::Unrecognized);
    assert_eq!(
        old.totals.live_ci95_known(),
        None,
        "no interval after the exec either"
    );
    assert_eq!(old.lost_live_bytes, 5 << 20, "still a lower bound");
    assert_eq!(old.drops[DropReason::Unplaced as usize], 1);
    assert_eq!(old.alloc_events, 1);
    // The new image's counters are its own: nothing counted twice.
    let new = only_image(&after, 100, ProcessState::Live);
    assert_eq!(new.lost_live_bytes, 0);
    assert_eq!(new.dropped(), 0);
    assert_eq!(new.alloc_events, 1);
    assert_eq!(after.lost_live_bytes(), 5 << 20);
    // And when it exits, its own again.
    world.exit(100);
    let gone = s.complete_profile().unwrap();
    let exited = only_image(&gone, 100, ProcessState::Exited);
    assert_eq!((exited.lost_live_bytes, exited.alloc_events), (0, 1));
    assert_eq!(gone.lost_live_bytes(), 5 << 20);
}

#[test]
fn a_reused_pid_is_another_process_with_its_own_figures_and_names() {
    let world = World::default();
    world.spawn(100, "first");
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.complete_profile().unwrap();
    world.exit(100);
    s.complete_profile().unwrap();

    // Another process gets pid 100, and a stack id the first one used:
    // ids are per (pid, generation), which the new process starts over.
    world.spawn(100, "second");
    world.sample(100, 7, &[address_in(beta_site)], 8 << 20);
    world.sample(100, 7, &[address_in(beta_site)], 8 << 20);
    let p = s.complete_profile().unwrap();
    let first = only_image(&p, 100, ProcessState::Exited);
    let second = only_image(&p, 100, ProcessState::Live);
    assert_eq!(
        (first.name.as_str(), second.name.as_str()),
        ("first", "second")
    );
    assert!(has_function(first, "alpha_site") && !has_function(first, "beta_site"));
    assert!(
        has_function(second, "beta_site") && !has_function(second, "alpha_site"),
        "the new process's stack is symbolized for it: {:?}",
        functions(second)
    );
    assert_eq!(first.totals.live_samples, 1);
    assert_eq!(second.totals.live_samples, 2);
}

/// Runs processes through start, exec, exit and pid reuse (system-wide
/// and per process), and checks what the session holds per process: each
/// live process one record, and nothing once every process has exited and
/// the images kept of them are dropped.
fn nothing_outlives_its_process(target: Target) {
    let world = World::default();
    world.spawn(100, "app");
    world.spawn(200, "quiet");
    let mut s = session(&world, target.clone());
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    world.oom(200);
    s.complete_profile().unwrap();
    assert!(s.tracked.contains_key(&100) && s.per_process_entries() > 0);

    // An exec: the record stays, the old image is frozen with its names.
    world.exec(100, "app2");
    world.sample(100, 8, &[address_in(beta_site)], 1 << 20);
    s.complete_profile().unwrap();
    assert_eq!(images(&s.complete_profile().unwrap(), 100).len(), 2);

    // Both exit (the quiet one never sampled, after its OOM event).
    world.exit(100);
    world.exit(200);
    s.complete_profile().unwrap();
    assert!(
        s.tracked.is_empty(),
        "records of exited processes: {:?}",
        s.tracked.keys().collect::<Vec<_>>()
    );
    assert_eq!(s.per_process_entries(), 0);

    // Another process reuses pid 100, execs and exits.
    world.spawn(100, "again");
    if let Target::Pids(_) = target {
        s.scan(100).unwrap();
    }
    world.sample(100, 7, &[address_in(beta_site)], 1 << 20);
    s.complete_profile().unwrap();
    let again = s.tracked[&100].incarnation;
    assert!(
        s.frozen.iter().all(|f| f.incarnation != again),
        "a new incarnation"
    );
    world.exec(100, "again2");
    s.complete_profile().unwrap();
    world.exit(100);
    s.complete_profile().unwrap();
    assert!(s.tracked.is_empty());
    assert_eq!(s.per_process_entries(), 0);
    assert!(s.symbols_held() > 0, "the frozen images keep their names");

    // The images kept of them go: nothing of any process is left.
    s.set_max_gone_memory(0);
    s.complete_profile().unwrap();
    assert!(s.frozen.is_empty());
    assert_eq!(s.symbols_held(), 0);
    assert_eq!(s.pending_requests(), 0);
    assert!(s.tracked.is_empty());
    assert_eq!(world.kernel().watched.len(), 0);
}

#[test]
fn nothing_outlives_its_process_system_wide() {
    nothing_outlives_its_process(Target::All);
}

#[test]
fn nothing_outlives_its_process_with_pid() {
    nothing_outlives_its_process(Target::Pids(vec![100, 200]));
}

#[test]
fn a_dlopened_probe_file_is_attached_at_the_next_refresh() {
    for target in [Target::All, Target::Pids(vec![100])] {
        let world = World::default();
        world.spawn(100, "app");
        let mut s = session(&world, target.clone());
        world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
        s.refresh().unwrap();
        let plugin = probe_file_id(2);
        assert!(!s.is_attached(100, plugin));

        world.process(100).probe_files.push(plugin);
        s.refresh().unwrap();
        assert!(s.is_attached(100, plugin), "{target:?}");
        let scope = match target {
            Target::All => Scope::AllProcesses,
            Target::Pids(_) => Scope::Process(100),
        };
        assert!(world.kernel().attached.contains(&(plugin, scope)));
    }
}

#[test]
fn with_pid_an_exit_detaches_the_process_s_own_attachments() {
    let world = World::default();
    world.spawn(100, "app");
    world.spawn(200, "other");
    let mut s = session(&world, Target::Pids(vec![100, 200]));
    assert_eq!(s.attachments(), 2);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.refresh().unwrap();

    world.exit(100);
    s.refresh().unwrap();
    assert_eq!(world.kernel().detached, vec![100]);
    assert_eq!(s.attachments(), 1, "the other target stays attached");
    assert!(s.targets_alive());
    world.exit(200);
    s.refresh().unwrap();
    assert!(!s.targets_alive());
}

#[test]
fn with_pid_a_target_that_sampled_nothing_yet_is_in_the_profile_at_0_b() {
    let world = World::default();
    world.spawn(100, "idle");
    world.spawn(200, "busy");
    let mut s = session(&world, Target::Pids(vec![100, 200]));
    world.sample(200, 7, &[address_in(alpha_site)], 1 << 20);
    let p = s.complete_profile().unwrap();
    let idle = only_image(&p, 100, ProcessState::Live);
    assert_eq!(idle.name, "idle");
    assert_eq!(idle.totals.live_bytes, 0.0);
    assert!(idle.stacks.is_empty());
    assert_eq!(p.processes.len(), 2, "{p:#?}");
    // Gone without a sample: nothing of it to show.
    world.exit(100);
    let p = s.complete_profile().unwrap();
    assert!(images(&p, 100).is_empty(), "{p:#?}");
}

#[test]
fn a_stack_seen_before_its_process_s_maps_is_symbolized_once_they_are_known() {
    let world = World::default();
    world.spawn(100, "app");
    // Armed probes fired before a scan could read the process's maps
    // (right after exec, or /proc not readable yet).
    world.process(100).maps_readable = false;
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.refresh().unwrap();
    s.finish_symbols();
    let early = s.refresh().unwrap();
    let live = only_image(&early, 100, ProcessState::Live);
    assert!(
        functions(live)
            .iter()
            .all(|f| f.contains("not yet symbolized")),
        "not symbolized without its maps: {:?}",
        functions(live)
    );

    world.process(100).maps_readable = true;
    let p = s.complete_profile().unwrap();
    let live = only_image(&p, 100, ProcessState::Live);
    assert!(has_function(live, "alpha_site"), "{:?}", functions(live));
}

#[test]
fn a_stack_into_a_library_mapped_after_its_scan_is_symbolized_again() {
    let world = World::default();
    world.spawn(100, "app");
    // beta_site's code is in a library the process dlopen'ed after the
    // last scan: the scan does not map it yet (nor, here, the rest of this
    // binary's code, which shares its mapping).
    world.process(100).not_mapped = Some(address_in(beta_site));
    let mut s = session(&world, Target::All);
    world.sample(
        100,
        7,
        &[address_in(beta_site), address_in(alpha_site)],
        1 << 20,
    );
    let early = s.complete_profile().unwrap();
    let live = only_image(&early, 100, ProcessState::Live);
    assert!(!has_function(live, "beta_site"), "{:?}", functions(live));
    assert!(has_function(live, "[unknown"), "{:?}", functions(live));

    // The next scan sees the library: its frames get their names.
    world.process(100).not_mapped = None;
    let p = s.complete_profile().unwrap();
    let live = only_image(&p, 100, ProcessState::Live);
    assert!(has_function(live, "beta_site"), "{:?}", functions(live));
    assert_eq!(s.unresolved_stacks(), 0, "nothing left to resolve");
    // Asked for once: names that are complete are not asked for again.
    let again = s.complete_profile().unwrap();
    assert_eq!(s.pending_requests(), 0);
    assert!(has_function(
        only_image(&again, 100, ProcessState::Live),
        "beta_site"
    ));
}

#[test]
fn a_process_is_rescanned_when_its_code_changes_or_its_stacks_leave_its_maps() {
    let world = World::default();
    world.spawn(100, "app");
    world.process(100).code_size = Some(1000);
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.complete_profile().unwrap();
    let scans = world.scans_of(100);
    s.refresh().unwrap();
    s.refresh().unwrap();
    assert_eq!(world.scans_of(100), scans, "nothing changed: no rescan");

    // A dlopen: its code grows.
    world.process(100).code_size = Some(1200);
    s.refresh().unwrap();
    assert_eq!(world.scans_of(100), scans + 1);
    s.refresh().unwrap();
    assert_eq!(world.scans_of(100), scans + 1);

    // A stack outside the maps known (the library's size unchanged: one
    // dlclose'd, another dlopen'ed): rescanned until its names are in.
    world.process(100).not_mapped = Some(address_in(beta_site));
    s.forget_scans();
    s.refresh().unwrap();
    world.sample(100, 8, &[address_in(beta_site)], 1 << 20);
    s.complete_profile().unwrap();
    world.process(100).not_mapped = None;
    let p = s.complete_profile().unwrap();
    assert!(has_function(
        only_image(&p, 100, ProcessState::Live),
        "beta_site"
    ));
    let scans = world.scans_of(100);
    s.refresh().unwrap();
    assert_eq!(world.scans_of(100), scans, "resolved: no rescan");
}

#[test]
fn drops_are_reported_per_process_and_in_total() {
    let world = World::default();
    world.spawn(100, "app");
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    {
        let mut w = world.0.borrow_mut();
        w.kernel.drops[DropReason::StackMapFull as usize] = 5;
        w.kernel.drops[DropReason::UnmatchedFree as usize] = 2;
        let proc = w.kernel.procs.get_mut(&100).unwrap();
        proc.drops[DropReason::StackMapFull as usize] = 3;
        proc.lost_live_bytes = 12345;
    }
    let p = s.refresh().unwrap();
    assert_eq!(p.drops[DropReason::StackMapFull as usize], 5);
    assert_eq!(p.drops[DropReason::UnmatchedFree as usize], 2);
    let live = only_image(&p, 100, ProcessState::Live);
    assert_eq!(live.drops[DropReason::StackMapFull as usize], 3);
    assert_eq!(live.lost_live_bytes, 12345);

    // Frozen with the process when it exits.
    world.exit(100);
    let p = s.refresh().unwrap();
    let exited = only_image(&p, 100, ProcessState::Exited);
    assert_eq!(exited.drops[DropReason::StackMapFull as usize], 3);
    assert_eq!(exited.lost_live_bytes, 12345);
}

#[test]
fn a_lost_exit_event_is_noticed_at_the_next_refresh() {
    let world = World::default();
    world.spawn(100, "app");
    let mut s = session(&world, Target::All);
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.refresh().unwrap();
    // The ring buffer was full: the exit is never reported.
    world.exit(100);
    world.0.borrow_mut().kernel.events.clear();
    let p = s.refresh().unwrap();
    only_image(&p, 100, ProcessState::Exited);
    // The refresh that notices it shows it once: not also live, from the
    // snapshot taken before it was retired.
    assert_eq!(images(&p, 100).len(), 1, "{p:#?}");
    assert!(world.kernel().procs.is_empty());
}

#[test]
fn the_oldest_frozen_images_go_past_the_cap() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    s.max_frozen = 3;
    for pid in 100..105 {
        world.spawn(pid, &format!("job{pid}"));
        world.sample(pid, 7, &[address_in(alpha_site)], 1 << 20);
        s.complete_profile().unwrap();
        world.exit(pid);
        s.refresh().unwrap();
    }
    let p = s.complete_profile().unwrap();
    let mut pids: Vec<u32> = p.processes.iter().map(|p| p.key.pid).collect();
    pids.sort_unstable();
    assert_eq!(pids, vec![102, 103, 104], "the newest three are kept");
    assert_eq!(s.symbols_held(), 3, "the names of dropped images go too");
    assert_eq!(s.dropped_images, 2);
    assert_eq!(
        s.warnings
            .iter()
            .filter(|w| w.contains("no longer shown"))
            .count(),
        1,
        "said once: {:?}",
        s.warnings
    );
}

#[test]
fn the_oldest_frozen_images_go_past_the_memory_cap() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    let mut one_image = 0;
    for pid in 100..106 {
        world.spawn(pid, &format!("job{pid}"));
        world.sample(
            pid,
            7,
            &[address_in(alpha_site), address_in(beta_site)],
            1 << 20,
        );
        s.complete_profile().unwrap();
        world.exit(pid);
        s.complete_profile().unwrap();
        if pid == 100 {
            // Its figures and, once symbolized, its stack's names.
            one_image = s.gone_bytes;
            assert!(one_image > 200, "{one_image}");
            s.set_max_gone_memory(one_image * 5 / 2);
        }
    }
    let p = s.complete_profile().unwrap();
    let mut pids: Vec<u32> = p.processes.iter().map(|p| p.key.pid).collect();
    pids.sort_unstable();
    assert_eq!(pids, vec![104, 105], "the newest two fit");
    assert!(s.gone_bytes <= one_image * 5 / 2);
    assert_eq!(s.symbols_held(), 2, "the names of dropped images go too");
    assert_eq!(s.dropped_images, 4);
    assert!(
        s.warnings.iter().any(|w| w.contains("--max-gone-memory")),
        "{:?}",
        s.warnings
    );
}

#[test]
fn names_of_images_dropped_before_they_are_symbolized_are_not_kept() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    // Nothing gone may be kept: each image goes as it is frozen, while its
    // stacks are still with the symbolizer.
    s.set_max_gone_memory(1);
    for pid in 100..103 {
        world.spawn(pid, &format!("job{pid}"));
        world.sample(pid, 7, &[address_in(alpha_site)], 1 << 20);
        world.exit(pid);
        s.refresh().unwrap();
    }
    let p = s.complete_profile().unwrap();
    assert!(p.processes.is_empty(), "{p:#?}");
    assert_eq!(s.dropped_images, 3);
    assert_eq!(s.symbols_held(), 0, "names kept");
    assert_eq!(s.pending_requests(), 0);
    assert_eq!(s.gone_bytes, 0);
}

/// Waits (bounded) until `pid` has the table of this test binary's code.
fn wait_for_tables(s: &mut Session<FakeKernel, FakeProcesses>, world: &World, pid: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let here = address_in(alpha_site);
    let has_ours = |world: &World| {
        world.kernel().unwind_procs.get(&pid).is_some_and(|t| {
            t.mappings[..t.len as usize]
                .iter()
                .any(|m| m.start <= here && here < m.end)
        })
    };
    while !has_ours(world) {
        assert!(
            std::time::Instant::now() < deadline,
            "no unwind tables for {pid}: {:?}",
            s.warnings
        );
        s.poll_events();
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_process_gets_the_tables_of_its_code_and_loses_them_at_exec_and_exit() {
    let world = World::default();
    world.spawn(100, "app");
    let mut s = session(&world, Target::All);
    wait_for_tables(&mut s, &world, 100);
    let here = address_in(alpha_site);
    {
        let k = world.kernel();
        let table = k.unwind_procs[&100];
        let m = table.mappings[..table.len as usize]
            .iter()
            .find(|m| m.start <= here && here < m.end)
            .expect("our code's mapping has a table");
        let rows: Vec<UnwindRow> = (m.rows_start..m.rows_start + m.rows_len)
            .map(|i| k.unwind_rows[&i])
            .collect();
        let row = profiler_common::unwind::find_row(&rows, here - 1 - m.bias).unwrap();
        assert_ne!(
            rows[row].cfa_rule,
            profiler_common::unwind::cfa::UNKNOWN,
            "our function has a rule"
        );
    }
    world.exec(100, "other");
    s.poll_events();
    assert!(
        world.kernel().unwind_cleared.contains(&100),
        "the old image's tables go at exec"
    );
    // The new image (the same files here) gets them again from its scan.
    wait_for_tables(&mut s, &world, 100);
    world.exit(100);
    s.refresh().unwrap();
    assert!(world.kernel().unwind_procs.is_empty(), "and at exit");
}

#[test]
fn a_process_gets_no_tables_while_any_of_its_files_is_loading() {
    // Its address space is this test binary's: the binary, libc, the
    // loader..., whose tables come in one by one (libc long before us).
    let world = World::default();
    world.spawn(100, "app");
    let mut s = session(&world, Target::All);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut polls = 0;
    while !world.kernel().unwind_procs.contains_key(&100) {
        assert!(std::time::Instant::now() < deadline, "{:?}", s.warnings);
        assert!(s.unwind_status().loading > 0, "every table in, none given");
        s.poll_events();
        polls += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    // Given in the poll that loaded the last one: walks never start in code
    // whose table is still on its way (they would end in a marker at once).
    let status = s.unwind_status();
    assert_eq!(status.loading, 0, "after {polls} polls: {status:?}");
    assert!(world.kernel().unwind_procs[&100].len > 1, "several files");
}

#[test]
fn live_bytes_are_split_by_age_and_min_age_keeps_only_the_old() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    world.spawn(100, "leaky");
    world.pass(Duration::from_secs(700));
    let (leak, cache) = (address_in(alpha_site), address_in(beta_site));
    for _ in 0..3 {
        world.sample_aged(100, 1, &[leak], 1 << 20, Duration::from_secs(700));
    }
    world.sample_aged(100, 2, &[cache], 8 << 20, Duration::from_secs(1));
    let p = s.complete_profile().unwrap();
    let stack = |p: &Profile, id: &str| {
        images(p, 100)[0]
            .stacks
            .iter()
            .find(|st| st.frames.iter().any(|f| f.function.contains(id)))
            .map(|st| st.totals)
            .unwrap()
    };
    let old = stack(&p, "alpha_site");
    assert_eq!(old.ages.over_old, old.live_bytes);
    assert_eq!(old.ages.over_very_old, old.live_bytes);
    assert!(old.ages.oldest >= Duration::from_secs(700));
    let young = stack(&p, "beta_site");
    assert_eq!(young.ages.over_old, 0.0);
    assert!(young.live_bytes > old.live_bytes, "the cache is larger now");
    assert_eq!(images(&p, 100)[0].totals.ages.over_old, old.live_bytes);

    // `--min-age 5s`: the leak alone is live that long.
    s.set_min_age(Duration::from_secs(5));
    let p = s.complete_profile().unwrap();
    assert_eq!(stack(&p, "alpha_site").live_bytes, old.live_bytes);
    assert_eq!(stack(&p, "beta_site").live_bytes, 0.0);
    assert_eq!(images(&p, 100)[0].totals.live_bytes, old.live_bytes);
}

#[test]
fn a_process_gone_before_it_is_read_keeps_the_name_the_kernel_saw() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    // Sampled and gone before the session ever read its /proc entry.
    world.sample(300, 9, &[address_in(alpha_site)], 4 << 20);
    {
        let mut w = world.0.borrow_mut();
        let proc = w.kernel.procs.get_mut(&300).unwrap();
        proc.comm[..9].copy_from_slice(b"shortjob\0");
    }
    world.exit(300);
    let profile = s.complete_profile().unwrap();
    let gone = only_image(&profile, 300, ProcessState::Exited);
    assert_eq!(gone.name, "shortjob");
}

#[test]
fn live_samples_are_read_for_their_ages_every_few_seconds_and_whenever_it_matters() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    world.spawn(100, "leaky");
    world.pass(Duration::from_secs(1000));
    let leak = address_in(alpha_site);
    world.sample_aged(100, 1, &[leak], 1 << 20, Duration::from_secs(100));
    let oldest = |p: &Profile| images(p, 100)[0].totals.ages.oldest;
    let first = s.complete_profile().unwrap();
    assert!(oldest(&first) >= Duration::from_secs(100));
    // An older sample shows at the next read of the live samples, not at a
    // refresh a moment later (the ages are kept from the last read).
    world.sample_aged(100, 1, &[leak], 1 << 20, Duration::from_secs(900));
    let soon = s.refresh().unwrap();
    assert!(
        oldest(&soon) < Duration::from_secs(900),
        "{:?}",
        oldest(&soon)
    );
    // A complete profile (the final one of a run, an export) reads them.
    let last = s.complete_profile().unwrap();
    assert!(oldest(&last) >= Duration::from_secs(900));
    // With a minimum age the live figures come from them: read every time.
    world.sample_aged(100, 1, &[leak], 1 << 20, Duration::from_secs(1000));
    s.set_min_age(Duration::from_secs(5));
    let now = s.refresh().unwrap();
    assert!(oldest(&now) >= Duration::from_secs(1000));
}

#[test]
fn an_oom_victim_that_reuses_an_earlier_victim_s_pid_is_recorded_too() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    let dir = tempfile::tempdir().unwrap();
    s.record_oom_kills(crate::oom::OomRecorder::new(dir.path(), 10).unwrap());
    let profiles = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".pb.gz")
            })
            .count()
    };
    // Two processes in turn with pid 100, both at generation 0, both
    // killed by the OOM killer.
    for victims in 1..=2 {
        world.spawn(100, "grow");
        world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
        s.refresh().unwrap();
        world.oom(100);
        world.exit(100);
        let p = s.complete_profile().unwrap();
        let killed: Vec<_> = images(&p, 100)
            .into_iter()
            .filter(|p| p.state == ProcessState::OomKilled)
            .collect();
        assert_eq!(killed.len(), victims, "{p:#?}");
        assert!(killed.iter().all(|k| k.key.generation == 0));
        assert_eq!(profiles(), victims, "{:?}", s.warnings);
    }
    // Each once.
    s.complete_profile().unwrap();
    assert_eq!(profiles(), 2);
}

#[test]
fn an_oom_victim_whose_main_thread_had_exited_is_recorded_as_oom_killed() {
    let world = World::default();
    let mut s = session(&world, Target::All);
    world.spawn(100, "workers");
    world.sample(100, 7, &[address_in(alpha_site)], 1 << 20);
    s.refresh().unwrap();
    // The main thread calls pthread_exit: the kernel reports its exit, the
    // other threads run on.
    world.0.borrow_mut().kernel.events.push(ProcEvent {
        pid: 100,
        kind: PROC_EVENT_EXIT,
    });
    s.refresh().unwrap();
    // The OOM killer picks the process; its threads die with no exit
    // event of the main thread left to report.
    world.oom(100);
    s.refresh().unwrap();
    world.0.borrow_mut().processes.remove(&100);
    let p = s.complete_profile().unwrap();
    only_image(&p, 100, ProcessState::OomKilled);
}

mod ledger;

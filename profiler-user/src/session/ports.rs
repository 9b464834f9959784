//! What a session reads and changes outside itself, as two small traits:
//! the kernel side ([`KernelPort`], implemented by [`Kernel`]) and the
//! processes it follows ([`ProcessPort`], implemented by [`Procfs`]). The
//! session's bookkeeping is written against these, so it is unit-tested
//! with fakes, without root (see `session/tests/`).

use profiler_common::{
    AggKey, ProcCounters, ProcEvent, UnseenFree,
    python::PyProcConfig,
    unwind::{ProcUnwind, UnwindRow},
};

use std::collections::HashMap;

use crate::{
    ids::{HostPid, Pid, Tid},
    kernel::{Kernel, KernelError, KernelSnapshot, Scope},
    process::backend_stats::{self, AllocatorBlock},
    process::discover::{self, FileId, OpenFile, ProbeSite, Scan, Scanner},
    process::ledger::{self, LedgerEntry, LedgerRead},
    process::resource::ProcessResource,
    process::target_memory::{LiveThread, TargetMemory, Unreadable},
};

/// The kernel programs and maps, as the session uses them. Pids here are
/// the kernel's (host) pids.
pub trait KernelPort {
    /// Attaches to a probe site of an open file (attaching twice is a no-op).
    fn attach_file(
        &mut self,
        file: &OpenFile,
        site: &ProbeSite,
        scope: Scope,
    ) -> Result<(), KernelError>;
    /// Detaches every probe attached for thread `tid` alone.
    fn detach_process(&mut self, tid: Tid);
    /// Number of attached probe sites.
    fn attachments(&self) -> usize;
    /// Process exit/exec events reported since the last call.
    fn proc_events(&mut self) -> Vec<ProcEvent>;
    /// The kernel programs' diagnostics since the last call (`--verbose`).
    fn diagnostics(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// Why OOM kills cannot be told from exits, if they cannot.
    fn oom_unavailable(&self) -> Option<String> {
        None
    }
    /// One process's counters (a lookup, no snapshot).
    fn process(&self, pid: HostPid) -> Option<ProcCounters>;
    /// A copy of the aggregates, per-process counters and drops, and with
    /// `with_live` the live samples.
    fn snapshot(&self, with_live: bool) -> Result<KernelSnapshot, KernelError>;
    /// A stack's frames, innermost first.
    fn stack(&self, id: u64) -> Option<Vec<u64>>;
    /// The kernel's prints of the code objects of a stack's Python frames
    /// (see [`Kernel::stack_prints`]).
    fn stack_prints(&self, id: u64) -> Vec<u32>;
    /// Deletes the kernel state of retired images (see [`Kernel::forget_images`]).
    fn forget_images(
        &mut self,
        gone: &[(HostPid, Option<u32>)],
        aggregates: &[AggKey],
        live_samples: bool,
    ) -> usize;
    /// Deletes the stacks of gone, symbolized images (see [`Kernel::forget_stacks`]).
    fn forget_stacks(&mut self, ids: &[u64]) -> usize;
    /// Rows the kernel's unwind-table array holds.
    fn unwind_capacity(&self) -> u32;
    /// Writes unwind rows at `start`.
    fn write_unwind_rows(&mut self, start: u32, rows: &[UnwindRow]) -> Result<(), KernelError>;
    /// The executable mappings with unwind tables of process `pid`.
    fn set_process_unwind(&mut self, pid: HostPid, table: &ProcUnwind) -> Result<(), KernelError>;
    /// Process `pid` is walked by frame pointers again.
    fn clear_process_unwind(&mut self, pid: HostPid);
    /// Whether CPython processes get Python frames (`--python`).
    fn python_frames(&self) -> bool {
        false
    }
    /// Where the Python frames of process `pid` are.
    fn set_process_python(
        &mut self,
        _pid: HostPid,
        _config: &PyProcConfig,
    ) -> Result<(), KernelError> {
        Ok(())
    }
    /// No Python frames for `pid`.
    fn clear_process_python(&mut self, _pid: HostPid) {}
    /// Report the frees of `pid` that find no live sample (its ledger was
    /// read): see [`KernelPort::unseen_frees`].
    fn watch_unseen_frees(&mut self, _pid: HostPid) -> Result<(), KernelError> {
        Ok(())
    }
    fn unwatch_unseen_frees(&mut self, _pid: HostPid) {}
    /// Frees of watched processes that found no live sample since the last
    /// call (host pids).
    fn unseen_frees(&mut self) -> Vec<UnseenFree> {
        Vec::new()
    }
    /// Follows process `pid` in the kernel, of the tree rooted at `root`
    /// (`Target::Trees`; see [`Kernel::follow`]).
    fn follow(&mut self, _pid: HostPid, _root: HostPid) -> Result<(), KernelError> {
        Ok(())
    }
    /// Whether the kernel follows process `pid`.
    fn is_followed(&self, _pid: HostPid) -> bool {
        false
    }
    /// Whether the kernel holds a live sample of `pid` at `ptr`.
    fn has_live_sample(&self, pid: HostPid, ptr: u64) -> bool;
}

/// The processes a session follows, as `/proc` shows them. Pids here are
/// those of allocprof's own pid namespace.
pub trait ProcessPort {
    fn alive(&self, pid: Pid) -> bool;
    /// What `pid` maps: its probe files, its address space, a live thread.
    /// `Err` when it is gone.
    fn scan(&mut self, pid: Pid) -> std::io::Result<Scan>;
    fn name(&self, pid: Pid) -> Option<String>;
    /// The size of its executable mappings, which a dlopen changes (none
    /// where unknown: then it is rescanned at every refresh).
    fn code_size(&self, _pid: Pid) -> Option<u64> {
        None
    }
    /// What it has resident now (none where unknown).
    fn resident(&self, _pid: Pid) -> Option<discover::Resident> {
        None
    }
    /// What its allocator library says in its block: its backend's
    /// figures and its own sample budget (none without a block). `block`
    /// is where the port keeps the block's address for the process's image
    /// (the session's record holds it, so it goes with the image).
    fn allocator_block(&self, _pid: Pid, _block: &mut BackendBlock) -> Option<AllocatorBlock> {
        None
    }
    /// Who it is, for the OTLP resource attributes (none where unknown:
    /// then it goes without them). Its `host_pid` is the session's to set.
    fn resource(&self, _pid: Pid) -> Option<ProcessResource> {
        None
    }
    /// When it started, in clock ticks since boot (none where unknown).
    fn start_ticks(&self, _pid: Pid) -> Option<u64> {
        None
    }
    /// The sampling rate it runs with.
    fn sampling_rate(&self, pid: Pid) -> u64;
    /// `CLOCK_MONOTONIC` now, in nanoseconds: the clock of the kernel's
    /// and the ledgers' times (a port, so tests set it: on a freshly booted
    /// machine it reads only minutes).
    fn monotonic_ns(&self) -> u64 {
        crate::model::age::monotonic_now_ns()
    }
    fn all_pids(&self) -> Vec<Pid>;
    /// The parent of a process, if known.
    fn parent(&self, _pid: Pid) -> Option<Pid> {
        None
    }
    /// Every process with its parent (to find a tree's descendants).
    fn all_parents(&self) -> Vec<(Pid, Pid)> {
        Vec::new()
    }
    /// Where its live-sample ledger's header is: the library file that
    /// names it, and its address (none without one).
    fn ledger_address(&self, _pid: Pid) -> Option<(FileId, u64)> {
        None
    }
    /// Reads its ledger, each live record to `live` (see
    /// [`crate::process::ledger::read`]).
    fn read_ledger(
        &self,
        pid: Pid,
        address: u64,
        live: &mut dyn FnMut(LedgerEntry),
    ) -> Result<LedgerRead, ledger::ReadError>;
    /// The sequence words of its ledger records at `addresses` (see
    /// [`crate::process::ledger::sequences`]).
    fn ledger_sequences(&self, pid: Pid, addresses: &[u64]) -> Vec<Option<u64>>;
    /// What went wrong reading processes' memory since the last call (a
    /// process marked unreadable, said once).
    fn take_warnings(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// Its memory, to read the Python code objects its stacks name (none
    /// where it cannot be read: then they show as unreadable).
    fn python_memory(&self, _pid: Pid) -> Option<Box<dyn crate::python::code::Memory + '_>> {
        None
    }
    /// Its pid namespace when it is not the initial one (see
    /// [`crate::process::pidns::process_namespace`]): its interpreter's
    /// thread ids are that namespace's. None where unknown.
    fn pid_namespace(&self, _pid: Pid) -> Option<(u64, u64)> {
        None
    }
}

impl KernelPort for Kernel {
    fn attach_file(
        &mut self,
        file: &OpenFile,
        site: &ProbeSite,
        scope: Scope,
    ) -> Result<(), KernelError> {
        Kernel::attach_file(self, file, site, scope)
    }

    fn detach_process(&mut self, tid: Tid) {
        Kernel::detach_process(self, tid);
    }

    fn attachments(&self) -> usize {
        Kernel::attachments(self)
    }

    fn proc_events(&mut self) -> Vec<ProcEvent> {
        Kernel::proc_events(self)
    }

    fn diagnostics(&mut self) -> Vec<String> {
        Kernel::diagnostics(self)
    }

    fn oom_unavailable(&self) -> Option<String> {
        Kernel::oom_unavailable(self).map(str::to_string)
    }

    fn process(&self, pid: HostPid) -> Option<ProcCounters> {
        Kernel::process(self, pid)
    }

    fn snapshot(&self, with_live: bool) -> Result<KernelSnapshot, KernelError> {
        Kernel::snapshot(self, with_live)
    }

    fn stack(&self, id: u64) -> Option<Vec<u64>> {
        Kernel::stack(self, id)
    }

    fn stack_prints(&self, id: u64) -> Vec<u32> {
        Kernel::stack_prints(self, id)
    }

    fn forget_images(
        &mut self,
        gone: &[(HostPid, Option<u32>)],
        aggregates: &[AggKey],
        live_samples: bool,
    ) -> usize {
        Kernel::forget_images(self, gone, aggregates, live_samples)
    }

    fn forget_stacks(&mut self, ids: &[u64]) -> usize {
        Kernel::forget_stacks(self, ids)
    }

    fn unwind_capacity(&self) -> u32 {
        Kernel::unwind_capacity(self)
    }

    fn write_unwind_rows(&mut self, start: u32, rows: &[UnwindRow]) -> Result<(), KernelError> {
        Kernel::write_unwind_rows(self, start, rows)
    }

    fn set_process_unwind(&mut self, pid: HostPid, table: &ProcUnwind) -> Result<(), KernelError> {
        Kernel::set_process_unwind(self, pid, table)
    }

    fn clear_process_unwind(&mut self, pid: HostPid) {
        Kernel::clear_process_unwind(self, pid);
    }

    fn python_frames(&self) -> bool {
        Kernel::python_frames(self)
    }

    fn set_process_python(
        &mut self,
        pid: HostPid,
        config: &PyProcConfig,
    ) -> Result<(), KernelError> {
        Kernel::set_process_python(self, pid, config)
    }

    fn clear_process_python(&mut self, pid: HostPid) {
        Kernel::clear_process_python(self, pid);
    }

    fn watch_unseen_frees(&mut self, pid: HostPid) -> Result<(), KernelError> {
        Kernel::watch_unseen_frees(self, pid)
    }

    fn unwatch_unseen_frees(&mut self, pid: HostPid) {
        Kernel::unwatch_unseen_frees(self, pid);
    }

    fn unseen_frees(&mut self) -> Vec<UnseenFree> {
        Kernel::unseen_frees(self)
    }

    fn follow(&mut self, pid: HostPid, root: HostPid) -> Result<(), KernelError> {
        Kernel::follow(self, pid, root)
    }

    fn is_followed(&self, pid: HostPid) -> bool {
        Kernel::is_followed(self, pid)
    }

    fn has_live_sample(&self, pid: HostPid, ptr: u64) -> bool {
        Kernel::has_live_sample(self, pid, ptr)
    }
}

/// The real processes, through `/proc` (discovery's [`Scanner`] caches
/// which files carry probes).
#[derive(Default)]
pub struct Procfs {
    scanner: Scanner,
    /// Files seen by a scan that carry a backend-statistics block, with the
    /// block's file offset.
    stats_blocks: HashMap<FileId, u64>,
    /// Files seen by a scan that carry a live-sample ledger, with its
    /// header's file offset.
    ledger_headers: HashMap<FileId, u64>,
    /// Every read of a process's memory (`/proc/PID/environ` too) goes
    /// through it: none may block the session.
    memory: TargetMemory,
    /// Read each process's command line into its resource (opt-in:
    /// command lines hold secrets).
    pub(crate) command_lines: bool,
}

/// Where a process image's backend-statistics block is, as
/// [`ProcessPort::allocator_block`] found it: none yet (looked for at the next
/// read), none there, or its address and the live thread it is read
/// through. Found once from the maps; forgotten when the process is scanned
/// again or the block no longer reads as one (its thread gone).
#[derive(Clone, Copy, Debug, Default)]
pub struct BackendBlock(Option<Option<(u64, LiveThread)>>);

impl ProcessPort for Procfs {
    fn alive(&self, pid: Pid) -> bool {
        discover::process_alive(pid)
    }

    fn scan(&mut self, pid: Pid) -> std::io::Result<Scan> {
        let scan = self.scanner.scan(pid)?;
        for probe in &scan.probes {
            if let Some(offset) = probe.backend_stats {
                self.stats_blocks.insert(probe.id(), offset);
            }
            if let Some(offset) = probe.ledger {
                self.ledger_headers.insert(probe.id(), offset);
            }
        }
        Ok(scan)
    }

    fn name(&self, pid: Pid) -> Option<String> {
        discover::process_name(pid)
    }

    fn resident(&self, pid: Pid) -> Option<discover::Resident> {
        discover::Process::find(pid)?.resident()
    }

    fn code_size(&self, pid: Pid) -> Option<u64> {
        discover::Process::find(pid)?.code_size()
    }

    fn allocator_block(&self, pid: Pid, block: &mut BackendBlock) -> Option<AllocatorBlock> {
        if self.stats_blocks.is_empty() {
            return None;
        }
        // The library stamps its refreshes with CLOCK_MONOTONIC too.
        let now = crate::model::age::monotonic_now_ns();
        match block.0 {
            Some(None) => return None,
            Some(Some((address, thread))) => {
                match backend_stats::read(&self.memory, thread, address, now) {
                    Ok(heap) => return Some(heap),
                    Err(backend_stats::ReadError::Memory(
                        crate::process::target_memory::ReadError::Unreadable(_),
                    )) => return None,
                    // Its thread ended, or an exec: found again.
                    Err(_) => {}
                }
            }
            None => {}
        }
        let process = discover::Process::find(pid)?;
        let address = process.maps().ok().and_then(|maps| {
            self.stats_blocks
                .iter()
                .find_map(|(&file, &offset)| backend_stats::block_address(&maps, file, offset))
        });
        let thread = process.thread();
        block.0 = Some(address.map(|a| (a, thread)));
        backend_stats::read(&self.memory, thread, address?, now).ok()
    }

    fn start_ticks(&self, pid: Pid) -> Option<u64> {
        discover::Process::find(pid)?.start_ticks()
    }

    fn resource(&self, pid: Pid) -> Option<ProcessResource> {
        let process = discover::Process::find(pid)?;
        let mut resource = process.resource_outside_memory();
        // Its environment and command line are its memory.
        let command_lines = self.command_lines;
        let thread = process.thread();
        if let Ok((service, line)) = self
            .memory
            .run(thread, move || process.resource_in_memory(command_lines))
        {
            resource.service_name = service;
            resource.command_line = line;
        }
        Some(resource)
    }

    fn sampling_rate(&self, pid: Pid) -> u64 {
        // Its environment is its memory (`/proc/PID/environ` reads it).
        let default = profiler_common::rate::DEFAULT_RATE;
        let Some(process) = discover::Process::find(pid) else {
            return default;
        };
        self.memory
            .run(process.thread(), move || process.sampling_rate())
            .unwrap_or(default)
    }

    fn all_pids(&self) -> Vec<Pid> {
        discover::all_pids()
    }

    fn parent(&self, pid: Pid) -> Option<Pid> {
        discover::process_parent(pid)
    }

    fn all_parents(&self) -> Vec<(Pid, Pid)> {
        discover::all_parents()
    }

    fn ledger_address(&self, pid: Pid) -> Option<(FileId, u64)> {
        if self.ledger_headers.is_empty() {
            return None;
        }
        let maps = discover::Process::find(pid)?.maps().ok()?;
        self.ledger_headers
            .iter()
            .find_map(|(&file, &offset)| Some((file, ledger::header_address(&maps, file, offset)?)))
    }

    fn read_ledger(
        &self,
        pid: Pid,
        address: u64,
        live: &mut dyn FnMut(LedgerEntry),
    ) -> Result<LedgerRead, ledger::ReadError> {
        let process = discover::Process::find(pid)
            .ok_or(Unreadable::NoThread(std::io::ErrorKind::NotFound))?;
        ledger::read(&self.memory, process.thread(), address, live)
    }

    fn ledger_sequences(&self, pid: Pid, addresses: &[u64]) -> Vec<Option<u64>> {
        match discover::Process::find(pid) {
            Some(process) => ledger::sequences(&self.memory, process.thread(), addresses),
            None => vec![None; addresses.len()],
        }
    }

    fn take_warnings(&mut self) -> Vec<String> {
        self.memory.take_warnings()
    }

    fn pid_namespace(&self, pid: Pid) -> Option<(u64, u64)> {
        crate::process::pidns::process_namespace(pid)
    }

    fn python_memory(&self, pid: Pid) -> Option<Box<dyn crate::python::code::Memory + '_>> {
        let process = discover::Process::find(pid)?;
        Some(Box::new(crate::python::code::TargetReader {
            memory: &self.memory,
            thread: process.thread(),
        }))
    }
}

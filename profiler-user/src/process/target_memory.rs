//! Reading the memory of the processes allocprof follows (their live-sample
//! ledger, their allocator's statistics block, their environment) without
//! ever letting one of them stop the session.
//!
//! What a process maps is its own choice, and so is what a read of it
//! costs: a page registered with userfaultfd and never served, or backed by
//! a FUSE file whose server never answers, keeps `process_vm_readv` asleep
//! (state `D`) for as long as the process likes, and no signal but SIGKILL
//! wakes the reader. So every read runs on a reader thread, and the session
//! waits for it at most [`DEADLINE`]. A read that does not finish in time is
//! abandoned: its thread is left parked (it exits when the read returns, or
//! dies with allocprof: those sleeps are killable, and `exit_group` kills
//! every thread), the process is marked unreadable and never read again,
//! and a warning says so. At most [`MAX_PARKED`] threads are parked at once;
//! while that many are, no process memory is read at all, so a host full of
//! such processes costs allocprof a bounded number of threads.
//!
//! Reads go through a [`LiveThread`]: `process_vm_readv` fails with `ESRCH`
//! for a process whose main thread called `pthread_exit` (a zombie leader
//! has no memory), while any of its live threads reaches the process's
//! memory.

use std::{
    cell::RefCell,
    collections::HashSet,
    io,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
        mpsc,
    },
    time::Duration,
};

use thiserror::Error;

use crate::ids::{Pid, Tid};

/// How long one read may take before its process is marked unreadable.
/// A copy of a ledger chunk (1.2 MiB) takes about a millisecond; this
/// leaves room for a loaded host and memory swapped out.
pub const DEADLINE: Duration = Duration::from_secs(2);
/// Reader threads parked in reads that never finished, at most.
pub const MAX_PARKED: usize = 16;
/// The reader thread's stack: it only makes system calls.
const READER_STACK: usize = 256 << 10;

/// A live thread of a process, through which its memory is read. Found by
/// discovery (`discover::Process::thread`), which reaches a process through
/// one of its live threads: a thread-group id alone is not one (its leader
/// may have called `pthread_exit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveThread {
    pid: Pid,
    tid: Tid,
    /// When the process started (clock ticks since boot; 0 where unknown):
    /// with the pid, which process it is (pids are reused).
    started: u64,
}

impl LiveThread {
    /// Only discovery finds live threads (see the type's documentation).
    pub(crate) fn found(pid: Pid, tid: Tid, started: u64) -> LiveThread {
        LiveThread { pid, tid, started }
    }

    /// The calling thread, in this process (which reads its own memory in
    /// tests).
    pub fn current() -> LiveThread {
        // SAFETY: gettid has no preconditions.
        let tid = Tid(unsafe { libc::gettid() } as u32);
        LiveThread {
            pid: Pid(std::process::id()),
            tid,
            started: 0,
        }
    }

    /// The process (thread-group) id.
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// The thread id to read through.
    pub fn tid(&self) -> Tid {
        self.tid
    }

    fn process(&self) -> (Pid, u64) {
        (self.pid, self.started)
    }
}

/// Why a process's memory was not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum Unreadable {
    #[error(
        "a read of its memory did not finish within {:?}: it is marked unreadable",
        DEADLINE
    )]
    Hung,
    #[error("it was marked unreadable (a read of its memory never finished)")]
    Marked,
    #[error("{MAX_PARKED} reads of process memory are stuck: none is read until one finishes")]
    Saturated,
    #[error("no thread to read it with: {0}")]
    NoThread(io::ErrorKind),
}

#[derive(Debug, Error)]
pub enum ReadError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Unreadable(#[from] Unreadable),
}

impl ReadError {
    /// Fewer bytes copied than asked for (a range past its mapping).
    pub fn short() -> ReadError {
        io::Error::new(io::ErrorKind::UnexpectedEof, "short read").into()
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The reader: one thread at a time serves the reads; a new one replaces a
/// thread left parked. Used from the session's thread only.
#[derive(Default)]
pub struct TargetMemory {
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    reader: Option<Reader>,
    /// Processes (pid, start) whose read never finished.
    unreadable: HashSet<(Pid, u64)>,
    /// Threads parked in a read that has not returned (shared with them:
    /// each takes itself off when its read returns).
    parked: Arc<AtomicUsize>,
    saturated_said: bool,
    warnings: Vec<String>,
}

struct Reader {
    jobs: mpsc::Sender<Job>,
    /// Set when the session stops waiting for this thread's read.
    abandoned: Arc<AtomicBool>,
}

impl TargetMemory {
    /// Runs `read`, a read of `thread`'s process memory, on the reader
    /// thread, and waits for it at most [`DEADLINE`].
    pub fn run<R: Send + 'static>(
        &self,
        thread: LiveThread,
        read: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, Unreadable> {
        let mut state = self.state.borrow_mut();
        if state.unreadable.contains(&thread.process()) {
            return Err(Unreadable::Marked);
        }
        if state.parked.load(Ordering::Acquire) >= MAX_PARKED {
            if !state.saturated_said {
                state.saturated_said = true;
                state.warnings.push(format!(
                    "{MAX_PARKED} reads of process memory never finished: no process's memory \
                     (ledgers, allocator figures) is read until one does"
                ));
            }
            return Err(Unreadable::Saturated);
        }
        state.saturated_said = false;
        let (tx, rx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move || {
            // The session may have stopped waiting: then nobody receives.
            let _ = tx.send(read());
        });
        if state.reader.is_none() {
            state.reader = Some(spawn_reader(&state.parked)?);
        }
        let reader = state.reader.as_ref().expect("spawned above");
        if let Err(mpsc::SendError(job)) = reader.jobs.send(job) {
            // The thread is gone (it cannot panic: a job that panics is
            // caught below); start another.
            let reader = spawn_reader(&state.parked)?;
            let _ = reader.jobs.send(job);
            state.reader = Some(reader);
        }
        match rx.recv_timeout(DEADLINE) {
            Ok(r) => Ok(r),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Counted before it is flagged: the thread takes itself off
                // only once it sees the flag.
                state.parked.fetch_add(1, Ordering::AcqRel);
                if let Some(reader) = state.reader.take() {
                    reader.abandoned.store(true, Ordering::Release);
                }
                state.unreadable.insert(thread.process());
                let name = crate::process::discover::process_name(thread.pid)
                    .map_or_else(String::new, |n| format!(" ({n})"));
                state.warnings.push(format!(
                    "process {}{name}: marked unreadable: a read of its memory did not finish \
                     within {} s (it maps memory nobody serves: userfaultfd, or a file whose \
                     server does not answer); its memory is not read again, so its heap from \
                     before attach and its allocator's figures are not shown",
                    thread.pid,
                    DEADLINE.as_secs()
                ));
                Err(Unreadable::Hung)
            }
            // The job panicked (unwinding dropped its sender).
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                state.reader = None;
                Err(Unreadable::NoThread(io::ErrorKind::Other))
            }
        }
    }

    /// Copies `words` words at `address` of `thread`'s process.
    pub fn read_words(
        &self,
        thread: LiveThread,
        address: u64,
        words: usize,
    ) -> Result<Vec<u64>, ReadError> {
        let (buf, copied) = self.readv(thread, vec![(address, words)])?;
        if copied != words * 8 {
            return Err(ReadError::short());
        }
        Ok(buf)
    }

    /// Copies each range (address, words) of `thread`'s process, one after
    /// the other into one buffer; returns it and the bytes copied (a
    /// partial read stops at the first range that failed). At most
    /// `IOV_MAX` (1024) ranges.
    pub fn readv(
        &self,
        thread: LiveThread,
        ranges: Vec<(u64, usize)>,
    ) -> Result<(Vec<u64>, usize), ReadError> {
        let total: usize = ranges.iter().map(|&(_, n)| n).sum();
        let tid = thread.tid;
        let result = self.run(thread, move || {
            let mut buf = vec![0u64; total];
            let n = copy(tid, &mut buf, &ranges);
            n.map(|n| (buf, n))
        })?;
        Ok(result?)
    }

    /// The warnings since the last call (each unreadable process once).
    pub fn take_warnings(&self) -> Vec<String> {
        std::mem::take(&mut self.state.borrow_mut().warnings)
    }
}

fn spawn_reader(parked: &Arc<AtomicUsize>) -> Result<Reader, Unreadable> {
    let (jobs, rx) = mpsc::channel::<Job>();
    let abandoned = Arc::new(AtomicBool::new(false));
    let (flag, parked) = (abandoned.clone(), parked.clone());
    std::thread::Builder::new()
        .name("allocprof-read".into())
        .stack_size(READER_STACK)
        .spawn(move || {
            while let Ok(job) = rx.recv() {
                // A panic drops the job's sender: the session sees it.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                if flag.load(Ordering::Acquire) {
                    break;
                }
            }
            if flag.load(Ordering::Acquire) {
                parked.fetch_sub(1, Ordering::AcqRel);
            }
        })
        .map_err(|e| Unreadable::NoThread(e.kind()))?;
    Ok(Reader { jobs, abandoned })
}

/// One `process_vm_readv` of `ranges` into `buf` (exactly their size).
fn copy(tid: Tid, buf: &mut [u64], ranges: &[(u64, usize)]) -> io::Result<usize> {
    let mut local = Vec::with_capacity(ranges.len());
    let mut rest = &mut buf[..];
    let mut remote = Vec::with_capacity(ranges.len());
    for &(address, words) in ranges {
        let (head, tail) = rest.split_at_mut(words);
        local.push(libc::iovec {
            iov_base: head.as_mut_ptr().cast(),
            iov_len: words * 8,
        });
        remote.push(libc::iovec {
            iov_base: address as *mut libc::c_void,
            iov_len: words * 8,
        });
        rest = tail;
    }
    // SAFETY: every local iovec points into `buf`, ours and alive for the
    // call, with exactly its length; the remote side is only read, by the
    // kernel, in the other process.
    let n = unsafe {
        libc::process_vm_readv(
            tid.0 as libc::pid_t,
            local.as_ptr(),
            local.len() as libc::c_ulong,
            remote.as_ptr(),
            remote.len() as libc::c_ulong,
            0,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_memory_reads_back_range_by_range() {
        let words: Vec<u64> = (0..100).collect();
        let mem = TargetMemory::default();
        let me = LiveThread::current();
        let at = words.as_ptr() as u64;
        assert_eq!(mem.read_words(me, at + 8, 3).unwrap(), [1, 2, 3]);
        let (buf, n) = mem.readv(me, vec![(at + 80, 1), (at, 2), (8, 1)]).unwrap();
        // The third range is unmapped: the read stops there.
        assert_eq!((&buf[..3], n), (&[10, 0, 1][..], 24));
        assert!(matches!(
            mem.read_words(me, 8, 1),
            Err(ReadError::Io(e)) if e.raw_os_error() == Some(libc::EFAULT)
        ));
    }

    #[test]
    fn a_read_that_never_returns_marks_its_process_and_parks_its_thread() {
        let mem = TargetMemory::default();
        let hostile = LiveThread::found(Pid(1), Tid(1), 42);
        let other = LiveThread::found(Pid(2), Tid(2), 7);
        let (release, wait) = mpsc::channel::<()>();
        // A read stuck until released (as a read of unserved memory is,
        // until its process exits).
        let stuck = mem.run(hostile, move || wait.recv().is_ok());
        assert_eq!(stuck, Err(Unreadable::Hung));
        let warnings = mem.take_warnings();
        assert!(
            warnings.len() == 1
                && warnings[0].contains("process 1")
                && warnings[0].contains("unreadable"),
            "{warnings:?}"
        );
        // Never read again; other processes are, by a new thread.
        assert_eq!(mem.run(hostile, || 1), Err(Unreadable::Marked));
        assert_eq!(mem.run(other, || 2), Ok(2));
        let parked = mem.state.borrow().parked.clone();
        assert_eq!(parked.load(Ordering::Acquire), 1);
        // Released, the parked thread takes itself off.
        release.send(()).unwrap();
        for _ in 0..1000 {
            if parked.load(Ordering::Acquire) == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(parked.load(Ordering::Acquire), 0);
        assert_eq!(mem.run(hostile, || 1), Err(Unreadable::Marked));
    }

    #[test]
    fn past_the_parked_threads_bound_nothing_is_read() {
        let mem = TargetMemory::default();
        mem.state
            .borrow()
            .parked
            .store(MAX_PARKED, Ordering::Release);
        let p = LiveThread::found(Pid(3), Tid(3), 1);
        assert_eq!(mem.run(p, || 1), Err(Unreadable::Saturated));
        assert_eq!(mem.run(p, || 1), Err(Unreadable::Saturated));
        assert_eq!(mem.take_warnings().len(), 1, "said once");
        mem.state.borrow().parked.store(0, Ordering::Release);
        assert_eq!(mem.run(p, || 1), Ok(1));
    }
}

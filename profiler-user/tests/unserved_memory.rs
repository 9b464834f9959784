//! A process can make any read of its memory sleep for as long as it likes:
//! a page registered with userfaultfd and never served keeps
//! `process_vm_readv` in state D, deaf to SIGINT and SIGTERM. allocprof reads
//! the ledger wherever the process's header points: such a process must not
//! take allocprof with it. Real allocprof, real eBPF, a real process whose
//! ledger header points into unserved memory.

mod common;

use std::{
    io::{BufRead, BufReader, Read},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::{Proc, header_address, read_words, write_words};
use profiler_common::ledger::{HEADER_WORDS, RECORD_BYTES, header};

fn allocprof() -> Command {
    Command::new(env!("CARGO_BIN_EXE_allocprof"))
}

/// How long allocprof may take before the test calls it hung: far beyond
/// its run and the read deadline (the test fails instead of hanging; no
/// speed is asserted).
const HUNG: Duration = Duration::from_secs(90);

/// unserved_memory.c, its ledger header's table pointed into its region
/// that nobody serves, so that the first record read sleeps.
fn hostile() -> Proc {
    common::require_bpf();
    let mut w = Proc::spawn(Command::new(common::compile_c("unserved_memory.c", &[])));
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    let line = w.line();
    let region = line
        .strip_prefix("region ")
        .and_then(|r| r.split(' ').next())
        .and_then(|r| u64::from_str_radix(r, 16).ok())
        .unwrap_or_else(|| panic!("unexpected {line:?}"));
    let at = header_address(w.pid());
    let mut h = read_words(w.pid(), at, HEADER_WORDS);
    let table = h[header::TABLE];
    assert_ne!(table, 0, "the workload sampled: its table exists");
    // The first record read (of the first range in use) lands at the
    // region's start.
    let first = (0..h[header::RANGES] as usize)
        .find(|&k| h[header::USED + k] > 0)
        .map(|k| h[header::FIRST + k])
        .expect("a range in use");
    h[header::TABLE] = region - first * RECORD_BYTES as u64;
    write_words(w.pid(), at, &h);
    w
}

/// Waits for `child` at most [`HUNG`]; kills it (SIGKILL, the one signal a
/// sleeping read obeys) and fails if it is still running then.
fn finish(
    mut child: Child,
    mut err: impl Read + Send + 'static,
    what: &str,
) -> (std::process::ExitStatus, String, String) {
    let mut out = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + HUNG;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "allocprof ({what}) was still running after {HUNG:?}: {}",
                stderr.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, stdout.join().unwrap(), stderr.join().unwrap())
}

fn assert_named_unreadable(stderr: &str, pid: u32) {
    assert!(
        stderr.contains(&format!(
            "process {pid} (unserved_memory): marked unreadable"
        )),
        "{stderr}"
    );
}

#[test]
fn a_ledger_in_memory_nobody_serves_does_not_hang_a_timed_run() {
    let w = hostile();
    let mut child = allocprof()
        .args(["--pid", &w.pid().to_string(), "-d", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let (status, stdout, stderr) = finish(child, err, "--pid P -d 3");
    assert!(status.success(), "{status}: {stderr}");
    assert!(stdout.starts_with("allocprof: "), "the report: {stdout}");
    // Its heap from before attach unknown, and said so.
    assert!(
        stdout.contains(&format!("unserved_memory ({}) ran before", w.pid())),
        "{stdout}"
    );
    assert_named_unreadable(&stderr, w.pid());
}

/// The threads of `pid` in state D (uninterruptible sleep).
fn sleeping_threads(pid: u32) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
        .filter(|stat| {
            stat.rsplit_once(") ")
                .is_some_and(|(_, s)| s.starts_with('D'))
        })
        .count()
}

#[test]
fn sigint_stops_allocprof_while_a_read_sleeps() {
    let w = hostile();
    let mut child = allocprof()
        .args(["--pid", &w.pid().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let apid = child.id();
    // Once it has attached, its first reading reads the ledger: wait until
    // a thread of it sleeps in that read, then ask it to stop.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    stderr.read_line(&mut first).unwrap();
    assert!(first.contains("attached"), "{first}");
    let deadline = Instant::now() + HUNG;
    while sleeping_threads(apid) == 0 {
        assert!(
            Instant::now() < deadline,
            "no thread of allocprof ever slept in the read"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill has no memory preconditions; apid is our child.
    assert_eq!(unsafe { libc::kill(apid as i32, libc::SIGINT) }, 0);
    let (status, stdout, rest) = finish(child, stderr, "stopped by SIGINT");
    assert!(status.success(), "{status}: {rest}");
    assert!(stdout.starts_with("allocprof: "), "the report: {stdout}");
    assert_named_unreadable(&rest, w.pid());
}

//! Helpers shared by the integration tests: building workloads, requiring root.

#![allow(dead_code)]

pub mod otelcol;
pub mod tmux;

use std::{
    ffi::OsStr,
    io::{BufRead, BufReader, Lines, Write},
    path::{Path, PathBuf},
    process::Command,
    process::{Child, ChildStdin, ChildStdout, Stdio},
};

/// Fails the test (never skips it) when BPF cannot be used here.
pub fn require_bpf() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test loads eBPF programs and must run as root (CAP_BPF + CAP_PERFMON); \
         run `cargo xtask test` as root"
    );
    assert!(
        Path::new("/sys/bus/event_source/devices/uprobe/type").exists(),
        "this kernel has no uprobe PMU (CONFIG_UPROBE_EVENTS); allocprof cannot work here"
    );
}

pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Compiles a C workload from tests/workloads with frame pointers and debug
/// info, once per test binary: tests run in parallel, and rewriting a binary
/// another test is running (or symbolizing) would break that test.
pub fn compile_c(source: &str, extra: &[&str]) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let key = format!("{source} {}", extra.join(" "));
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path)) = built.iter().find(|(k, _)| *k == key) {
        return path.clone();
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads")
        .join(source);
    // Per test binary (pid), so concurrent test binaries don't share it either.
    let dir = scratch_dir(&format!("workloads-{}-{}", std::process::id(), built.len()));
    let out = dir.join(source.trim_end_matches(".c"));
    let status = Command::new("gcc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-fno-builtin", "-o"])
        .arg(&out)
        .arg(&src)
        .args(extra)
        .status()
        .expect("gcc is needed to build the test workloads (apt-get install gcc)");
    assert!(
        status.success(),
        "compiling {source} failed (sys/sdt.h comes from apt-get install systemtap-sdt-dev)"
    );
    built.push((key, out.clone()));
    out
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Builds workspace artifacts once into their own target dir (the outer
/// `cargo test` holds the lock on the main one) and returns that dir.
fn build_artifacts() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let target = workspace_root().join("target/test-artifacts");
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(workspace_root())
            .args([
                "build",
                "--release",
                "-p",
                "liballocprof",
                "-p",
                "liballocprof-glibc",
                "-p",
                "demo",
                "--examples",
                "--lib",
            ])
            .arg("--target-dir")
            .arg(&target)
            .env_remove("CARGO_TARGET_DIR")
            .status()
            .expect("running cargo to build the test artifacts");
        assert!(
            status.success(),
            "building liballocprof.so and the demo examples failed"
        );
        target.join("release")
    })
}

/// An example of the demo crate built without frame pointers
/// (`-C force-frame-pointers=no` replaces the workspace's rustflags), once
/// per test binary, into its own target dir.
pub fn example_without_frame_pointers(name: &str) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let target = workspace_root().join("target/test-artifacts-nofp");
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(workspace_root())
            .args(["build", "--release", "-p", "demo", "--examples"])
            .arg("--target-dir")
            .arg(&target)
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env("RUSTFLAGS", "-C force-frame-pointers=no")
            .status()
            .expect("running cargo to build the demo examples without frame pointers");
        assert!(
            status.success(),
            "building the demo examples without frame pointers failed"
        );
        target.join("release")
    });
    dir.join("examples").join(name)
}

/// liballocprof.so.
pub fn preload_library() -> PathBuf {
    build_artifacts().join("liballocprof.so")
}

/// liballocprof_glibc.so.
pub fn preload_glibc_library() -> PathBuf {
    build_artifacts().join("liballocprof_glibc.so")
}

/// An example of the demo crate (a Rust workload with the global allocator).
pub fn example(name: &str) -> PathBuf {
    build_artifacts().join("examples").join(name)
}

/// Compiles a C shared library from tests/workloads.
pub fn compile_c_library(source: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/workloads")
        .join(source);
    let out = scratch_dir("workloads").join(format!("lib{}.so", source.trim_end_matches(".c")));
    let status = Command::new("gcc")
        .args([
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-shared",
            "-fPIC",
            "-o",
        ])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("gcc is needed to build the test workloads (apt-get install gcc)");
    assert!(status.success(), "compiling {source} failed");
    out
}

/// Expected value and standard deviation of the unbiased estimate of `n`
/// live allocations of `size` bytes sampled per byte at mean interval `rate`.
pub fn truth_and_sigma(n: u64, size: u64, rate: u64) -> (f64, f64) {
    let (s, r) = (size as f64, rate as f64);
    let p = -(-s / r).exp_m1();
    (n as f64 * s, (n as f64 * s * s * (1.0 - p) / p).sqrt())
}

/// Waits until a freshly spawned process has mapped `file_name` (the dynamic
/// loader maps LD_PRELOAD libraries shortly after exec).
pub fn wait_for_mapping(pid: u32, file_name: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        if maps.contains(file_name) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} never mapped {file_name}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The sampling rate the workloads run with: small enough that every site
/// gets samples, large enough to stay cheap.
pub const RATE: u64 = 64 * 1024;

/// `cmd` as a profiled C workload: under liballocprof.so at [`RATE`], with
/// stdin and stdout piped for its line protocol.
pub fn preloaded(cmd: &mut Command) -> &mut Command {
    cmd.env("LD_PRELOAD", preload_library())
        .env("ALLOCPROF_RATE", RATE.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
}

/// Spawns allocprof as `cmd` says and returns once it reports it has
/// attached; the rest of its stderr is drained so it never blocks on it.
pub fn spawn_attached(cmd: &mut Command) -> Child {
    let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert!(
        line.contains("attached"),
        "allocprof did not attach: {line}"
    );
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    child
}

/// A workload process following the wait/allocate/"ready"/wait protocol.
pub struct Workload {
    child: Child,
    stdin: ChildStdin,
}

impl Workload {
    fn spawn(mut cmd: Command) -> Workload {
        let mut child = cmd
            .env("ALLOCPROF_RATE", RATE.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        Workload { child, stdin }
    }

    /// tests/workloads/alloc_sites.c under LD_PRELOAD, once it has mapped the
    /// library (so that attaching finds the probes).
    pub fn c(extra_args: &[&OsStr]) -> Workload {
        let exe = compile_c("alloc_sites.c", &["-ldl"]);
        let mut cmd = Command::new(exe);
        cmd.args(extra_args).env("LD_PRELOAD", preload_library());
        let w = Workload::spawn(cmd);
        wait_for_mapping(w.pid(), "liballocprof.so");
        w
    }

    /// demo/examples/rust_sites.rs, with the allocprof global allocator.
    pub fn rust() -> Workload {
        Workload::spawn(Command::new(example("rust_sites")))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How allocprof names the C workload's process.
    pub fn label(&self) -> String {
        format!("alloc_sites ({})", self.pid())
    }

    /// Lets it allocate and waits until it has.
    pub fn allocate(&mut self) {
        writeln!(self.stdin, "go").unwrap();
        let mut line = String::new();
        BufReader::new(self.child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "the workload failed");
    }

    /// Sends one line (the protocol's "go", "exec" or "exit").
    pub fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
    }

    pub fn exit(mut self) {
        writeln!(self.stdin, "exit").unwrap();
        assert!(self.child.wait().unwrap().success());
    }
}

/// A test that fails half-way leaves no workload behind.
impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Totals of the stacks that pass through `function`.
pub fn site(
    p: &allocprof::model::profile::ProcessProfile,
    function: &str,
) -> allocprof::model::stats::Totals {
    p.stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| &*f.function == function))
        .map(|s| s.totals)
        .sum()
}

/// The image of `pid` in `profile` (failing the test if it is missing).
pub fn process(
    profile: &allocprof::model::profile::Profile,
    pid: u32,
) -> &allocprof::model::profile::ProcessProfile {
    profile
        .processes
        .iter()
        .find(|p| p.key.pid.0 == pid)
        .unwrap_or_else(|| panic!("process {pid} is not in the profile: {profile:#?}"))
}

/// Resident memory of a process, from `/proc/PID/status` (`field`: `VmRSS`, `VmHWM`), in KiB.
pub fn memory_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// User plus system CPU time, in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    // Fields 14 and 15 of stat(5), counted from the state (field 3).
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The entries of the kernel map `name` of the allocprof process `pid`, as
/// key bytes (its maps are known by the ids its descriptors hold: other
/// allocprof instances running meanwhile have maps of the same names).
pub fn table_keys(pid: u32, name: &str) -> Vec<Vec<u8>> {
    let bpftool = |args: &[&str]| -> serde_json::Value {
        let out = Command::new("bpftool")
            .args(args)
            .output()
            .expect("bpftool reads the kernel's map occupancy (apt-get install bpftool)");
        assert!(out.status.success(), "bpftool {args:?} failed");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let ids: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("map_id:"))
                .and_then(|id| id.trim().parse().ok())
        })
        .collect();
    let maps = bpftool(&["map", "show", "-j"]);
    let id = maps
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["name"] == name)
        .filter_map(|m| m["id"].as_u64())
        .find(|id| ids.contains(id))
        .unwrap_or_else(|| panic!("allocprof {pid} holds no kernel map {name}"));
    let entries = bpftool(&["map", "dump", "id", &id.to_string(), "-j"]);
    let byte = |b: &serde_json::Value| {
        u8::from_str_radix(b.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
    };
    entries
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .map(|e| e["key"].as_array().unwrap().iter().map(byte).collect())
                .collect()
        })
        .unwrap_or_default()
}

/// How many entries the kernel map `name` of allocprof `pid` holds.
pub fn table_entries(pid: u32, name: &str) -> usize {
    table_keys(pid, name).len()
}

/// The pids the entries of `PROCS` or `AGGS` (keys starting with a pid)
/// of allocprof `pid` belong to.
pub fn table_pids(pid: u32, name: &str) -> Vec<u32> {
    table_keys(pid, name)
        .iter()
        .map(|k| u32::from_le_bytes(k[..4].try_into().unwrap()))
        .collect()
}

/// A child speaking a line protocol on stdin/stdout, preloaded as
/// [`preloaded`] says unless the command sets its own `LD_PRELOAD`; killed
/// (SIGKILL) and reaped on drop.
pub struct Proc {
    pub child: Child,
    pub stdin: ChildStdin,
    pub stdout: Lines<BufReader<ChildStdout>>,
}

impl Proc {
    pub fn spawn(mut cmd: Command) -> Proc {
        let own = cmd
            .get_envs()
            .any(|(k, v)| k == "LD_PRELOAD" && v.is_some());
        let mut child = if own {
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()
        } else {
            preloaded(&mut cmd).spawn()
        }
        .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Proc {
            child,
            stdin,
            stdout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
    }

    /// The next line it prints.
    pub fn line(&mut self) -> String {
        self.stdout.next().expect("the workload died").unwrap()
    }

    pub fn expect(&mut self, want: &str) {
        let line = self.line();
        assert_eq!(line, want, "the workload failed");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The function names of all of a process's frames.
pub fn functions(p: &allocprof::model::profile::ProcessProfile) -> Vec<&str> {
    p.stacks
        .iter()
        .flat_map(|s| s.frames.iter().map(|f| &*f.function))
        .collect()
}

/// tests/workloads/alloc_sites.c's sites: (function, count, size, freed).
pub const SITES: [(&str, u64, u64, bool); 4] = [
    ("site_small", 200_000, 64, false),
    ("site_medium", 2_000, 8192, false),
    ("site_large", 8, 1 << 20, false),
    ("site_freed", 100_000, 256, true),
];

/// alloc_sites.c's sites within 5 sigma of the truth at [`RATE`]; freed
/// sites leave no live bytes.
pub fn assert_sites_within_bounds(p: &allocprof::model::profile::ProcessProfile) {
    assert_renamed_sites_within_bounds(p, "site_");
}

/// The same for alloc_sites.c built with its `site_` functions renamed to
/// `prefix` (`-Dsite_small=PREFIXsmall`, ...).
pub fn assert_renamed_sites_within_bounds(
    p: &allocprof::model::profile::ProcessProfile,
    prefix: &str,
) {
    for (function, n, size, freed) in SITES {
        let function = function.replacen("site_", prefix, 1);
        let function = function.as_str();
        let t = site(p, function);
        let (truth, sigma) = truth_and_sigma(n, size, RATE);
        assert!(t.alloc_samples > 0, "{function}: no samples in {p:#?}");
        assert!(
            (t.alloc_bytes - truth).abs() <= 5.0 * sigma,
            "{function}: allocated {} vs truth {truth} (sigma {sigma})",
            t.alloc_bytes
        );
        if freed {
            assert_eq!(
                t.live_bytes, 0.0,
                "{function}: freed memory must not stay live"
            );
            assert_eq!(t.live_samples, 0);
        } else {
            assert!(
                (t.live_bytes - truth).abs() <= 5.0 * sigma,
                "{function}: live {} vs truth {truth} (sigma {sigma})",
                t.live_bytes
            );
            // The kernel's variance estimate agrees with the a-priori one to
            // within sampling noise (loosely: a factor of 3). Sites sampled
            // almost surely have next to no variance, below byte rounding.
            let sd = t.live_ci95() / allocprof::model::stats::Z95;
            if sigma > 0.01 * truth {
                assert!(
                    sd > sigma / 3.0 && sd < sigma * 3.0,
                    "{function}: sd {sd} vs {sigma}"
                );
            }
        }
    }
}

/// The ledger header's address in `pid`, found as allocprof finds it.
pub fn header_address(pid: u32) -> u64 {
    let lib = preload_library();
    let notes = allocprof::process::usdt::notes_in_elf(&std::fs::read(&lib).unwrap()).unwrap();
    let offset = notes.ledger.expect("liballocprof.so names its ledger");
    let maps = allocprof::process::discover::Process::find(allocprof::ids::Pid(pid))
        .unwrap()
        .maps()
        .unwrap();
    let meta = std::fs::metadata(&lib).unwrap();
    let id = allocprof::process::discover::FileId::of(&meta);
    allocprof::process::ledger::header_address(&maps, id, offset).expect("the header is mapped")
}

pub fn read_words(pid: u32, address: u64, n: usize) -> Vec<u64> {
    let mut words = vec![0u64; n];
    let local = libc::iovec {
        iov_base: words.as_mut_ptr().cast(),
        iov_len: n * 8,
    };
    let remote = libc::iovec {
        iov_base: address as *mut libc::c_void,
        iov_len: n * 8,
    };
    // SAFETY: reads into our own buffer of exactly iov_len bytes.
    let got = unsafe { libc::process_vm_readv(pid as i32, &local, 1, &remote, 1, 0) };
    assert_eq!(got, (n * 8) as isize);
    words
}

pub fn write_words(pid: u32, address: u64, words: &[u64]) {
    let local = libc::iovec {
        iov_base: words.as_ptr().cast_mut().cast(),
        iov_len: words.len() * 8,
    };
    let remote = libc::iovec {
        iov_base: address as *mut libc::c_void,
        iov_len: words.len() * 8,
    };
    // SAFETY: writes our buffer into the other process (we are root).
    let put = unsafe { libc::process_vm_writev(pid as i32, &local, 1, &remote, 1, 0) };
    assert_eq!(put, (words.len() * 8) as isize);
}

/// Debian's CPython (3.11.2; its interpreter is in the executable).
pub const DEBIAN_PYTHON: &str = "/usr/bin/python3";

/// The `python3` on PATH, resolved to its executable (pyenv's shim execs it).
pub fn path_python() -> PathBuf {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 on PATH");
    let exe = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let debian = std::fs::canonicalize(DEBIAN_PYTHON).unwrap();
    assert_ne!(
        std::fs::canonicalize(&exe).unwrap(),
        debian,
        "the python3 on PATH should be the machine's other CPython (pyenv's), not Debian's"
    );
    exe
}

/// The first child of `pid` (a process that forks or `unshare --fork`s),
/// waiting up to a minute for it.
pub fn first_child(pid: u32) -> u32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(child) = children.split_whitespace().next() {
            return child.parse().unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} never forked"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A process's pid in each pid namespace it is in, outermost first
/// (`NSpid:`).
pub fn ns_pids(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .expect("NSpid in status")
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

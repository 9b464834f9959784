//! Shared helpers for the LD_PRELOAD tests: build the libraries once into a
//! separate target dir (the outer `cargo test` holds the lock on its own),
//! compile the C test programs, run things with and without the library.
#![allow(dead_code)] // each test binary uses a subset

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

/// The two flavours of the preload library.
#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Mimalloc,
    Glibc,
}

pub const BACKENDS: [Backend; 2] = [Backend::Mimalloc, Backend::Glibc];

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("preload/ has a parent")
        .to_path_buf()
}

/// `<target dir>/test-artifacts`, honouring `CARGO_TARGET_DIR`.
pub fn artifacts_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("test-artifacts")
}

struct Libs {
    mimalloc: PathBuf,
    glibc: PathBuf,
}

fn libs() -> &'static Libs {
    static LIBS: OnceLock<Libs> = OnceLock::new();
    LIBS.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let target = artifacts_dir();
        let status = Command::new(cargo)
            .current_dir(workspace_root())
            .args([
                "build",
                "--release",
                "-p",
                "liballocprof",
                "-p",
                "liballocprof-glibc",
            ])
            .arg("--target-dir")
            .arg(&target)
            .env_remove("CARGO_TARGET_DIR")
            .status()
            .expect("run cargo build for the preload libraries");
        assert!(status.success(), "building the preload libraries failed");
        let release = target.join("release");
        let libs = Libs {
            mimalloc: release.join("liballocprof.so"),
            glibc: release.join("liballocprof_glibc.so"),
        };
        assert!(libs.mimalloc.exists() && libs.glibc.exists());
        libs
    })
}

pub fn library(backend: Backend) -> &'static Path {
    match backend {
        Backend::Mimalloc => &libs().mimalloc,
        Backend::Glibc => &libs().glibc,
    }
}

/// Fail (never skip) when a tool is missing, naming the Debian package.
pub fn require_tool(tool: &str, package: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("`{tool}` not found in PATH: install it with `apt-get install {package}`")
    })
}

/// Compile `tests/c/<name>.c` once per test binary; returns the executable.
/// `exe_name` lets a test pick a recognisable `comm`.
pub fn c_program(name: &str, exe_name: &str) -> PathBuf {
    c_program_with(name, exe_name, &[])
}

/// [`c_program`] with extra gcc flags (e.g. `-fomit-frame-pointer`).
pub fn c_program_with(name: &str, exe_name: &str, flags: &[&str]) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(p) = built.get(exe_name) {
        return p.clone();
    }
    require_tool("gcc", "gcc");
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(format!("{name}.c"));
    let out_dir = artifacts_dir().join("c");
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join(exe_name);
    let out = Command::new("gcc")
        .args(["-O2", "-g", "-Wall", "-Werror", "-pthread", "-fno-builtin"])
        .args(["-Wno-alloc-size-larger-than"])
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "gcc {name}.c failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    built.insert(exe_name.to_string(), exe.clone());
    exe
}

/// How a command is run: bare, or with a library preloaded at a rate.
#[derive(Clone, Copy, Debug)]
pub struct Mode {
    pub backend: Option<Backend>,
    /// `None` = ALLOCPROF_RATE unset (default rate).
    pub rate: Option<&'static str>,
}

pub const BARE: Mode = Mode {
    backend: None,
    rate: None,
};

pub fn preloaded(backend: Backend, rate: Option<&'static str>) -> Mode {
    Mode {
        backend: Some(backend),
        rate,
    }
}

pub fn apply(cmd: &mut Command, mode: Mode) -> &mut Command {
    cmd.env_remove("LD_PRELOAD").env_remove("ALLOCPROF_RATE");
    if let Some(b) = mode.backend {
        cmd.env("LD_PRELOAD", library(b));
    }
    if let Some(r) = mode.rate {
        cmd.env("ALLOCPROF_RATE", r);
    }
    cmd
}

/// Run and require exit status 0; returns the output.
pub fn run_ok(cmd: &mut Command, what: &str) -> Output {
    let out = output_within(cmd, RUN_LIMIT, what);
    assert!(
        out.status.success(),
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Far longer than any test program runs, even on a loaded machine: a
/// program that hangs (a deadlock in the allocator) fails its test instead
/// of holding the suite until CI's limit.
const RUN_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// `cmd`'s output (as `Command::output`: no stdin), its whole process group
/// killed if it runs past `limit`.
pub fn output_within(cmd: &mut Command, limit: std::time::Duration, what: &str) -> Output {
    use std::{io::Read, os::unix::process::CommandExt, process::Stdio};
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: spawn failed: {e}"));
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            // SAFETY: kill has no memory-safety preconditions; the group is
            // the child's own (process_group(0)).
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            panic!("{what}: still running after {limit:?} (a hang); killed");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // SAFETY: as above; forked children left behind would hold the pipes.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// A fresh scratch directory under the artifacts dir.
pub fn scratch_dir(name: &str) -> PathBuf {
    let d = artifacts_dir()
        .join("scratch")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// bpftrace running a script, for tests that check what the probes fire.
/// Never blocks a test forever: its output arrives through a channel, and
/// stopping it repeats SIGINT (under load bpftrace has missed one).
pub struct Bpftrace {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Bpftrace {
    /// Starts `script` and returns once bpftrace has attached its probes.
    pub fn attach(script: &str) -> Bpftrace {
        use std::io::{BufRead, BufReader, Read};
        use std::process::Stdio;
        use std::time::{Duration, Instant};

        require_tool("bpftrace", "bpftrace");
        // bpftrace's uprobes need no tracefs on this kernel, but older
        // bpftrace paths look there; mount it if absent (we are root).
        if !Path::new("/sys/kernel/tracing/events").exists() {
            let _ = Command::new("mount")
                .args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"])
                .status();
        }
        let mut child = Command::new("bpftrace")
            .args(["-e", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn bpftrace");
        let (tx, lines) = std::sync::mpsc::channel();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains("Attaching") => break,
                Ok(_) => {}
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let mut err = String::new();
                    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
                    panic!("bpftrace did not attach within 60 s: {err}");
                }
            }
        }
        // Attached is not yet enabled everywhere: give it a moment.
        std::thread::sleep(Duration::from_millis(500));
        Bpftrace { child, lines }
    }

    /// Stops bpftrace and returns what it printed after attaching.
    pub fn stop(mut self) -> String {
        use std::time::{Duration, Instant};

        // Let the last events reach the output buffer first.
        std::thread::sleep(Duration::from_millis(1000));
        for _ in 0..12 {
            // SAFETY: signals our own child process by pid.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
            let asked = Instant::now();
            while asked.elapsed() < Duration::from_secs(5) {
                if self.child.try_wait().unwrap().is_some() {
                    return self.lines.iter().map(|l| l + "\n").collect();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        panic!("bpftrace did not stop on SIGINT within a minute");
    }
}

/// A program's standard output as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `name=<u64>` in a program's output.
pub fn field(text: &str, name: &str) -> u64 {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {text:?}"))
}

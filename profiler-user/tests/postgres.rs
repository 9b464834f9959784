//! `--pid`'s trees on a real prefork server (issue 29): Debian's PostgreSQL,
//! started under liballocprof.so and loaded with pgbench. Following the
//! postmaster shows its backends, named, with their stacks.

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use allocprof::{
    ids::Pid,
    kernel::Limits,
    session::{Session, Target},
};

use common::{RATE, preload_library};

/// Debian 12's server (package `postgresql`, which `cargo xtask test`
/// installs): the binaries, pgbench included.
const BIN: &str = "/usr/lib/postgresql/15/bin";
/// Clients of the pgbench run: each is served by a backend of its own.
const CLIENTS: usize = 4;

fn bin(name: &str) -> PathBuf {
    let path = Path::new(BIN).join(name);
    assert!(
        path.exists(),
        "{} is missing: install Debian's `postgresql` (`cargo xtask test` does)",
        path.display()
    );
    path
}

/// The `postgres` account's uid and gid, from /etc/passwd.
fn postgres_ids() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&"postgres")).then(|| (f[2].parse().unwrap(), f[3].parse().unwrap()))
        })
        .expect("no `postgres` user: install Debian's `postgresql` (`cargo xtask test` does)")
}

/// `program` run as the postgres user.
fn as_postgres(program: &Path, (uid, gid): (u32, u32), dir: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.uid(uid)
        .gid(gid)
        .current_dir(dir)
        .env_remove("LD_PRELOAD")
        .env("HOME", dir);
    cmd
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The server, stopped (fast shutdown) and its directory removed on drop.
struct Cluster {
    postmaster: Child,
    dir: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: signals our own child, not yet reaped.
        unsafe { libc::kill(self.postmaster.id() as i32, libc::SIGINT) };
        let _ = self.postmaster.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh cluster in a directory of its own, listening only on a unix
/// socket there (no TCP port to collide with), its postmaster run under
/// liballocprof.so.
fn start_cluster() -> Cluster {
    let ids = postgres_ids();
    // Under /tmp: the postgres user must reach it, which the build tree's
    // parents may not allow.
    let dir = std::env::temp_dir().join(format!("allocprof-pg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(ids.0), Some(ids.1)).unwrap();
    // The library too: the build tree's parents may be closed to others
    // (a clone under /root), and the loader then ignores LD_PRELOAD.
    let library = dir.join("liballocprof.so");
    std::fs::copy(preload_library(), &library).unwrap();
    let data = dir.join("data");
    run(
        as_postgres(&bin("initdb"), ids, &dir)
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&data),
        "initdb",
    );
    let postmaster = as_postgres(&bin("postgres"), ids, &dir)
        .arg("-D")
        .arg(&data)
        .arg("-k")
        .arg(&dir)
        .args(["-c", "listen_addresses=", "-p", "5432"])
        .env("LD_PRELOAD", &library)
        .env("ALLOCPROF_RATE", RATE.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut cluster = Cluster { postmaster, dir };
    // Ready when it accepts connections; a server that fails to start ends
    // the wait with its own exit. (A bound far beyond any start, so a hung
    // one fails the test rather than holding the suite.)
    for attempt in 0.. {
        assert!(attempt < 3000, "postgres never accepted connections");
        if let Some(status) = cluster.postmaster.try_wait().unwrap() {
            panic!("postgres exited at start: {status}");
        }
        let ready = Command::new(bin("pg_isready"))
            .arg("-h")
            .arg(&cluster.dir)
            .args(["-p", "5432", "-U", "postgres", "-q"])
            .status()
            .unwrap();
        if ready.success() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    cluster
}

fn pgbench(cluster: &Cluster, args: &[&str]) {
    run(
        Command::new(bin("pgbench"))
            .arg("-h")
            .arg(&cluster.dir)
            .args(["-p", "5432", "-U", "postgres"])
            .args(args)
            .arg("postgres"),
        &format!("pgbench {args:?}"),
    );
}

#[test]
fn following_the_postmaster_shows_its_backends_with_their_stacks() {
    common::require_bpf();
    let cluster = start_cluster();
    let postmaster = cluster.postmaster.id();
    let mut session =
        Session::start(Target::Trees(vec![Pid(postmaster)]), Limits::default()).unwrap();
    pgbench(&cluster, &["-i", "-q"]);
    pgbench(&cluster, &["-c", &CLIENTS.to_string(), "-T", "3"]);
    let profile = session.complete_profile().unwrap();
    let children: Vec<_> = profile
        .processes
        .iter()
        .filter(|p| p.parent == Some(Pid(postmaster)))
        .collect();
    let summary: Vec<_> = children
        .iter()
        .map(|p| (p.key.pid.0, p.name.clone(), p.state, p.totals.alloc_bytes))
        .collect();
    // Backends are named `postgres` and have sampled stacks with named
    // frames: one per pgbench client at least (the server's own processes,
    // checkpointer, walwriter..., may allocate too little to be sampled).
    let with_stacks: Vec<_> = children
        .iter()
        .filter(|p| {
            &*p.name == "postgres"
                && p.totals.alloc_samples > 0
                && p.stacks.iter().any(|s| {
                    s.frames
                        .iter()
                        .any(|f| !f.function.is_empty() && !f.function.starts_with('['))
                })
        })
        .collect();
    eprintln!(
        "{} children of the postmaster, {} named `postgres` with named stacks",
        children.len(),
        with_stacks.len()
    );
    assert!(
        with_stacks.len() >= CLIENTS,
        "{} of the postmaster's children are named `postgres` with named stacks, \
         want at least {CLIENTS}: {summary:#?}",
        with_stacks.len()
    );
    let postmaster_profile = profile
        .processes
        .iter()
        .find(|p| p.key.pid.0 == postmaster)
        .unwrap_or_else(|| panic!("the postmaster is not in the profile: {summary:#?}"));
    assert_eq!(&*postmaster_profile.name, "postgres");
}

//! Debian packages the test suite and benchmarks use as real subjects and
//! peers. Installed with apt-get when missing (never via sudo when root).

use anyhow::{Result, bail};

use crate::shell;

/// (package, a file it installs that tells whether it is present)
const TEST_PACKAGES: &[(&str, &str)] = &[
    ("bpftrace", "/usr/bin/bpftrace"),
    ("sqlite3", "/usr/bin/sqlite3"),
    ("python3", "/usr/bin/python3"),
    ("git", "/usr/bin/git"),
    ("gcc", "/usr/bin/gcc"),
    ("binutils", "/usr/bin/readelf"),
    (
        "systemtap-sdt-dev",
        "/usr/include/x86_64-linux-gnu/sys/sdt.h",
    ),
    ("tmux", "/usr/bin/tmux"),
    // The soak test reads the kernel's table occupancy with it.
    ("bpftool", "/usr/sbin/bpftool"),
    // `go tool pprof` opens allocprof's pprof exports in the tests.
    ("golang-go", "/usr/bin/go"),
    // rsvg-convert renders the flamegraph exports in the tests.
    ("librsvg2-bin", "/usr/bin/rsvg-convert"),
    // lli, a JIT that registers its code's unwind info with libgcc
    // (preload/tests/slow_path.rs).
    ("llvm-14", "/usr/bin/lli-14"),
    // A real prefork server for `--pid`'s trees (profiler-user/tests/postgres.rs);
    // its pgbench comes with the server package.
    ("postgresql", "/usr/lib/postgresql/15/bin/postgres"),
];

const BENCH_PACKAGES: &[(&str, &str)] = &[
    (
        "libmimalloc2.0",
        "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
    ),
    ("libjemalloc2", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
    ("hyperfine", "/usr/bin/hyperfine"),
    // `cargo xtask bench peers`: tcmalloc with sampling, and heaptrack.
    (
        "libgoogle-perftools4",
        "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
    ),
    ("heaptrack", "/usr/bin/heaptrack"),
    // Instructions per malloc/free pair (`bench alloc`, `bench peers`).
    ("valgrind", "/usr/bin/valgrind"),
];

pub fn ensure_test_packages() -> Result<()> {
    ensure(TEST_PACKAGES)
}

pub fn ensure_bench_packages() -> Result<()> {
    ensure(TEST_PACKAGES)?;
    ensure(BENCH_PACKAGES)
}

fn ensure(wanted: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|(_, file)| !std::path::Path::new(file).exists())
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !shell::succeeds("apt-get", &["--version"]) {
        bail!("missing packages {missing:?} and no apt-get to install them: install them by hand");
    }
    eprintln!("setup: installing Debian packages {missing:?}");
    shell::run_cmd(&mut shell::as_root("apt-get", &["update", "-qq"]))?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(&missing);
    let mut cmd = shell::as_root("apt-get", &args);
    cmd.env("DEBIAN_FRONTEND", "noninteractive");
    shell::run_cmd(&mut cmd)
}

//! `cargo xtask bench alloc`: cost of the sampling layer.
//!
//! Builds the preload libraries, the Rust benchmark binaries and a small C
//! benchmark, and the *plain reference* for each backend: glibc itself;
//! the vendored mimalloc of the locked libmimalloc-sys (found through
//! `cargo metadata`) built here as a plain override library with the flags
//! and defines liballocprof.so's mimalloc gets; `System` for
//! `SamplingAllocator<System>`. Then reports
//! (1) per workload (small-block churn, mixed sizes, 2 threads with
//! cross-thread frees, churn over 20,000 live blocks per thread on 1 and 2
//! threads), each setup at R = off / default / 64k as a ratio to its plain
//! backend: median over interleaved rounds (the reference and every setup
//! once per round, the order alternating), with the min-max of the
//! per-round ratios, so a burst of load from elsewhere skews a round, not
//! a row;
//! (2) the cost of one sample, measured with every allocation sampled, in
//! the warm-cache and cache-overflow regimes;
//! (3) whole-program wall time of the 2-thread churn under glibc, plain
//! and Debian mimalloc, jemalloc with heap profiling, and both allocprof
//! libraries;
//! (4) memory cost of sampled blocks (a page per live sample) and what
//! stays resident after everything is freed;
//! (5) big-block churn (malloc, memset, free of 1-64 MiB blocks, nearly all
//! sampled at the default rate) against the same library with
//! `ALLOCPROF_RATE=0`, for issue 26's target (within 5%).
//! Arguments: `--quick` for fewer rounds and iterations; `--big` for
//! section (5) alone.
//!
//! `bench peers` builds the same [`Programs`] and runs (1) at the default
//! rate alone ([`per_operation`]) for issue 12's fast-path target.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

const BENCH_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long iters;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static inline uint64_t xs(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }

/* Churn over a window of `w` (a power of two <= 256) live blocks: one
 * malloc + one free per step. */
static double churn(size_t lo, size_t hi, uint64_t seed, unsigned w) {
    void *win[256] = {0};
    uint64_t s = seed;
    for (unsigned i = 0; i < w; i++) win[i] = malloc(lo);
    double t0 = now();
    for (long i = 0; i < iters; i++) {
        uint64_t r = xs(&s);
        unsigned k = r & (w - 1);
        free(win[k]);
        size_t n = lo + (r >> 8) % (hi - lo + 1);
        win[k] = malloc(n);
        *(volatile char *)win[k] = 1;
    }
    double t = now() - t0;
    for (unsigned i = 0; i < w; i++) free(win[i]);
    return t * 1e9 / iters;
}

/* Bursts: allocate 64 blocks, then free all 64 (more than a sample-region
 * class keeps warm, so with everything sampled most frees release pages). */
static double burst(void) {
    void *b[64];
    uint64_t s = 5;
    double t0 = now();
    for (long i = 0; i < iters; i += 64) {
        for (int j = 0; j < 64; j++) {
            b[j] = malloc(8 + xs(&s) % 249);
            *(volatile char *)b[j] = 1;
        }
        for (int j = 0; j < 64; j++) free(b[j]);
    }
    return (now() - t0) * 1e9 / iters;
}

/* Mixed: mostly small, some medium, rare large (up to 256 KiB). */
static double mixed(void) {
    void *win[256] = {0};
    uint64_t s = 99;
    double t0 = now();
    for (long i = 0; i < iters; i++) {
        uint64_t r = xs(&s);
        unsigned k = r & 255;
        free(win[k]);
        unsigned c = (r >> 8) & 1023;
        size_t n = c < 900 ? 8 + (r >> 20) % 248 : c < 1020 ? 256 + (r >> 20) % 8000 : 8192 + (r >> 20) % 250000;
        win[k] = malloc(n);
        *(volatile char *)win[k] = 1;
    }
    double t = now() - t0;
    for (int i = 0; i < 256; i++) free(win[i]);
    return t * 1e9 / iters;
}

/* `threads` threads, each churning 20,000 live blocks: 95% 8-256 B, 5%
 * 257 B-16 KiB (the blocks are touched at both ends). */
static void *churn20k_thread(void *arg) {
    uint64_t s = 88172645463325252ull + (uintptr_t)arg;
    enum { SLOTS = 20000 };
    void **win = calloc(SLOTS, sizeof(void *));
    for (long i = 0; i < iters; i++) {
        uint64_t r = xs(&s);
        unsigned k = (r >> 32) % SLOTS;
        free(win[k]);
        size_t n = (r & 0xff) < 243 ? 8 + (r >> 8) % 249 : 257 + (r >> 8) % 16128;
        char *p = malloc(n);
        ((volatile char *)p)[0] = 1;
        ((volatile char *)p)[n - 1] = 2;
        win[k] = p;
    }
    for (int k = 0; k < SLOTS; k++) free(win[k]);
    free(win);
    return NULL;
}
static double churn20k(long threads) {
    pthread_t th[2];
    double t0 = now();
    for (long i = 0; i < threads; i++) pthread_create(&th[i], NULL, churn20k_thread, (void *)i);
    for (long i = 0; i < threads; i++) pthread_join(th[i], NULL);
    return (now() - t0) * 1e9 / iters; /* per pair, per thread */
}

/* Two threads: each allocates into a shared ring, the other frees. */
enum { RING = 4096 };
static void *_Atomic ring[2][RING];
static void *xfer(void *arg) {
    long me = (long)arg;
    uint64_t s = 7 + me;
    for (long i = 0; i < iters; i++) {
        unsigned k = i & (RING - 1);
        void *p = malloc(8 + xs(&s) % 249);
        *(volatile char *)p = 1;
        void *old = __atomic_exchange_n(&ring[me][k], p, __ATOMIC_ACQ_REL);
        free(old);
        /* free what the other thread allocated */
        void *q = __atomic_exchange_n(&ring[1 - me][(k * 7) & (RING - 1)], NULL, __ATOMIC_ACQ_REL);
        free(q);
    }
    return NULL;
}
static double threads2(void) {
    pthread_t th[2];
    double t0 = now();
    for (long i = 0; i < 2; i++) pthread_create(&th[i], NULL, xfer, (void *)i);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    double t = now() - t0;
    for (int m = 0; m < 2; m++) for (int k = 0; k < RING; k++) free(ring[m][k]);
    return t * 1e9 / iters; /* per pair, per thread */
}

struct stats { uint64_t sampled, unplaced, freed, live_pages; };
static long rss_kib(void) { long pages = 0, rss = 0; FILE *f = fopen("/proc/self/statm", "r"); if (f) { if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0; fclose(f); } return rss * (sysconf(_SC_PAGESIZE) / 1024); }

/* Live set: 200k x 64 B + 2000 x 8 KiB + 20 x 1 MiB, then report RSS and
 * the pages held by live samples; then free it all and report what stays
 * resident (allocator caches, incl. allocprof's warm sample slots). */
static void live(void) {
    static void *small[200000], *mid[2000], *big[20];
    long r0 = rss_kib();
    size_t total = 0;
    for (int i = 0; i < 200000; i++) { small[i] = malloc(64); memset(small[i], 1, 64); total += 64; }
    for (int i = 0; i < 2000; i++) { mid[i] = malloc(8192); memset(mid[i], 1, 8192); total += 8192; }
    for (int i = 0; i < 20; i++) { big[i] = malloc(1 << 20); memset(big[i], 1, 1 << 20); total += 1 << 20; }
    long r1 = rss_kib();
    struct stats st = {0};
    void (*fn)(struct stats *) = (void (*)(struct stats *))dlsym(RTLD_DEFAULT, "allocprof_stats");
    if (fn) fn(&st);
    for (int i = 0; i < 200000; i++) free(small[i]);
    for (int i = 0; i < 2000; i++) free(mid[i]);
    for (int i = 0; i < 20; i++) free(big[i]);
    long r2 = rss_kib();
    printf("live_bytes=%zu rss_delta_kib=%ld sampled=%lu unplaced=%lu live_sample_pages=%lu rss_after_free_kib=%ld\n",
           total, r1 - r0, (unsigned long)st.sampled, (unsigned long)st.unplaced, (unsigned long)st.live_pages, r2 - r0);
}

/* Big blocks: `iters` x (malloc, memset, free) of `mib` MiB. Returns CPU
 * ns per iteration (the process's user + system time: page faults are
 * system time, and on a shared machine wall time mostly measures the
 * neighbours). */
static double cpu_now(void) { struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static double big(long mib) {
    size_t n = (size_t)mib << 20;
    double t0 = cpu_now();
    for (long i = 0; i < iters; i++) {
        char *p = malloc(n);
        memset(p, (int)i, n);
        /* Keeps gcc from eliding the malloc/memset/free triple. */
        __asm__ volatile("" : : "r"(p) : "memory");
        free(p);
    }
    return (cpu_now() - t0) * 1e9 / iters;
}

/* Allocations sampled so far (0 without allocprof). */
static unsigned long samples(void) {
    struct stats st = {0};
    void (*fn)(struct stats *) = (void (*)(struct stats *))dlsym(RTLD_DEFAULT, "allocprof_stats");
    if (fn) fn(&st);
    return (unsigned long)st.sampled;
}

/* Prints "<ns per pair> <allocations sampled>". */
int main(int argc, char **argv) {
    iters = argc > 2 ? atol(argv[2]) : 20000000;
    const char *m = argc > 1 ? argv[1] : "small";
    double ns = -1;
    if (!strcmp(m, "small")) ns = churn(8, 256, 1, 256);
    else if (!strcmp(m, "small-w4")) ns = churn(8, 256, 1, 4);
    else if (!strcmp(m, "burst")) ns = burst();
    else if (!strcmp(m, "mixed")) ns = mixed();
    else if (!strcmp(m, "threads2")) ns = threads2();
    else if (!strcmp(m, "churn-1t")) ns = churn20k(1);
    else if (!strcmp(m, "churn-2t")) ns = churn20k(2);
    else if (!strcmp(m, "live")) { live(); return 0; }
    else if (!strncmp(m, "big-", 4)) ns = big(atol(m + 4));
    printf("%.3f %lu\n", ns, samples());
    return 0;
}
"#;

/// One way of running a benchmark program.
struct Setup {
    name: String,
    exe: PathBuf,
    preload: Option<PathBuf>,
    env: Vec<(&'static str, &'static str)>,
}

fn setup(
    name: &str,
    exe: &Path,
    preload: Option<&Path>,
    env: &[(&'static str, &'static str)],
) -> Setup {
    Setup {
        name: name.to_string(),
        exe: exe.to_path_buf(),
        preload: preload.map(Path::to_path_buf),
        env: env.to_vec(),
    }
}

fn command(s: &Setup, args: &[&str]) -> Command {
    let mut c = Command::new(&s.exe);
    c.args(args)
        .env_remove("LD_PRELOAD")
        .env_remove("ALLOCPROF_RATE")
        .env_remove("MALLOC_CONF")
        .env_remove("ALLOCPROF_LEDGER");
    if let Some(p) = &s.preload {
        c.env("LD_PRELOAD", p);
    }
    for (k, v) in &s.env {
        c.env(k, v);
    }
    c
}

/// One run of a benchmark program: (ns per pair, allocations sampled).
fn run_once(s: &Setup, mode: &str, iters: &str) -> Result<(f64, u64)> {
    let out = command(s, &[mode, iters]).output()?;
    if !out.status.success() {
        bail!(
            "{} {mode} failed: {}",
            s.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut fields = text.split_whitespace();
    let v: f64 = fields.next().unwrap_or("").parse().context("parse ns")?;
    let n: u64 = fields
        .next()
        .unwrap_or("")
        .parse()
        .context("parse samples")?;
    Ok((v, n))
}

/// The median of `v` (the mean of the middle two for an even count).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A setup's figures against the reference of its rounds.
pub(crate) struct Row {
    pub(crate) ns: f64,
    /// The median of its per-round ratios to the reference, their min and max.
    pub(crate) ratio: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    /// Allocations sampled per run (median).
    pub(crate) samples: u64,
}

/// `rounds` interleaved rounds: in each, `reference` then every setup
/// once, in reverse order every other round. Returns the reference's
/// median ns/pair and, per setup, the median of its per-round ratios to
/// that round's reference run (with their min and max).
fn interleaved(
    reference: &Setup,
    setups: &[Setup],
    mode: &str,
    iters: &str,
    rounds: usize,
) -> Result<(f64, Vec<Row>)> {
    let mut ref_ns = Vec::new();
    let mut ns = vec![Vec::new(); setups.len()];
    let mut ratios = vec![Vec::new(); setups.len()];
    let mut samples = vec![Vec::new(); setups.len()];
    let all: Vec<&Setup> = std::iter::once(reference).chain(setups).collect();
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..all.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut got = vec![(0.0, 0); all.len()];
        for i in order {
            got[i] = run_once(all[i], mode, iters)?;
        }
        ref_ns.push(got[0].0);
        for (j, &(v, n)) in got[1..].iter().enumerate() {
            ns[j].push(v);
            ratios[j].push(v / got[0].0);
            samples[j].push(n as f64);
        }
    }
    let rows = (0..setups.len())
        .map(|j| Row {
            ns: median(&ns[j]),
            ratio: median(&ratios[j]),
            min: ratios[j].iter().copied().fold(f64::INFINITY, f64::min),
            max: ratios[j].iter().copied().fold(0.0, f64::max),
            samples: median(&samples[j]) as u64,
        })
        .collect();
    Ok((median(&ref_ns), rows))
}

/// The source directory of the mimalloc vendored in the locked
/// libmimalloc-sys (the v2 tree, as `preload/Cargo.toml` selects).
fn vendored_mimalloc(root: &Path) -> Result<PathBuf> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--filter-platform",
            "x86_64-unknown-linux-gnu",
        ])
        .output()
        .context("cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    }
    let json = String::from_utf8(out.stdout)?;
    // No JSON crate in xtask: every package has a "manifest_path" string,
    // and the crate's is the one in a `libmimalloc-sys-VERSION` directory.
    let dirs: Vec<PathBuf> = json
        .split("\"manifest_path\":\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(|manifest| {
            Path::new(manifest)
                .parent()
                .unwrap_or(Path::new(""))
                .to_path_buf()
        })
        .filter(|dir| {
            dir.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libmimalloc-sys-"))
        })
        .collect();
    let [dir] = dirs.as_slice() else {
        bail!(
            "cargo metadata lists {} libmimalloc-sys packages, expected one: {dirs:?}",
            dirs.len()
        );
    };
    let src = dir.join("c_src/mimalloc/v2");
    if !src.join("src/static.c").exists() {
        bail!("no mimalloc source in {}", src.display());
    }
    Ok(src)
}

/// The vendored mimalloc as a plain override library: `static.c` with
/// `MI_MALLOC_OVERRIDE`, and otherwise what liballocprof.so's copy gets
/// (preload/build.rs: libmimalloc-sys's defines; the `cc` crate's flags
/// for the release profile, which keeps debug info, so neither `NDEBUG`
/// nor `MI_BUILD_RELEASE`; frame pointers from .cargo/config.toml).
fn build_plain_mimalloc(src: &Path, out: &Path) -> Result<String> {
    let args: Vec<String> = [
        "-O3",
        "-ffunction-sections",
        "-fdata-sections",
        "-fPIC",
        "-gdwarf-4",
        "-fno-omit-frame-pointer",
        "-m64",
        "-Wno-error=date-time",
        "-ftls-model=initial-exec",
        "-DMI_DEBUG=0",
        "-DMI_DEFAULT_ARENA_EAGER_COMMIT=0",
        "-DMI_MALLOC_OVERRIDE",
        "-shared",
    ]
    .iter()
    .map(|a| a.to_string())
    .chain([
        format!("-I{}", src.join("include").display()),
        format!("-I{}", src.join("src").display()),
        "-o".into(),
        out.display().to_string(),
        src.join("src/static.c").display().to_string(),
        "-lpthread".into(),
    ])
    .collect();
    let o = Command::new("gcc").args(&args).output().context("gcc")?;
    if !o.status.success() {
        bail!(
            "building plain mimalloc: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(format!("gcc {}", args.join(" ")))
}

/// What the benches run, built by [`Programs::build`].
pub(crate) struct Programs {
    /// The C benchmark program (`BENCH_C`).
    exe: PathBuf,
    pub(crate) lib_mi: PathBuf,
    pub(crate) lib_gl: PathBuf,
    rust_system: PathBuf,
    rust_sampling: PathBuf,
    /// The vendored mimalloc as a plain override library, and the command
    /// that built it.
    pub(crate) plain_mi: PathBuf,
    pub(crate) plain_cmd: String,
}

impl Programs {
    /// Builds the preload libraries, the Rust benchmark binaries, the C
    /// benchmark and the plain vendored mimalloc.
    pub(crate) fn build(root: &Path) -> Result<Programs> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        for build in [
            &[
                "build",
                "--release",
                "-p",
                "liballocprof",
                "-p",
                "liballocprof-glibc",
            ][..],
            &[
                "build",
                "--release",
                "-p",
                "allocator",
                "--example",
                "alloc_bench_system",
                "--example",
                "alloc_bench_sampling",
            ][..],
        ] {
            let status = Command::new(&cargo)
                .current_dir(root)
                .args(build)
                .status()?;
            if !status.success() {
                bail!("cargo {} failed", build.join(" "));
            }
        }
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        let dir = target.join("bench-alloc");
        std::fs::create_dir_all(&dir)?;
        let src = dir.join("alloc_bench.c");
        std::fs::write(&src, BENCH_C)?;
        let exe = dir.join("alloc_bench");
        let out = Command::new("gcc")
            .args(["-O2", "-fno-omit-frame-pointer", "-pthread", "-o"])
            .arg(&exe)
            .arg(&src)
            .arg("-ldl")
            .output()
            .context("gcc (apt-get install gcc)")?;
        if !out.status.success() {
            bail!("gcc: {}", String::from_utf8_lossy(&out.stderr));
        }
        let mi_src = vendored_mimalloc(root)?;
        let plain_mi = dir.join("libmimalloc-plain.so");
        let plain_cmd = build_plain_mimalloc(&mi_src, &plain_mi)?;
        Ok(Programs {
            exe,
            lib_mi: target.join("release/liballocprof.so"),
            lib_gl: target.join("release/liballocprof_glibc.so"),
            rust_system: target.join("release/examples/alloc_bench_system"),
            rust_sampling: target.join("release/examples/alloc_bench_sampling"),
            plain_mi,
            plain_cmd,
        })
    }
}

/// The workloads of the per-operation section.
const MODES: [&str; 5] = ["small", "mixed", "threads2", "churn-1t", "churn-2t"];
/// The default rate, as (label, `ALLOCPROF_RATE`): the fast-path target's.
pub(crate) const DEFAULT_RATE: (&str, &str) = ("512k (default)", "524288");
/// The fast-path target: at the default rate, at most this times the
/// plain backend's time.
pub(crate) const FAST_PATH_TARGET: f64 = 1.03;

/// The per-operation section's table head.
pub(crate) const PER_OPERATION_HEAD: &str = "| workload | setup | R | ns/pair | vs plain backend | samples per 1M pairs |\n|---|---|---|---|---|---|";

/// One workload on one backend: the plain backend's ns/pair and, per rate,
/// the sampling layer against it.
pub(crate) struct Group {
    pub(crate) mode: &'static str,
    /// The plain backend, e.g. `mimalloc (plain, vendored)`.
    pub(crate) reference: String,
    /// The sampling layer over it, e.g. `allocprof/mimalloc`.
    pub(crate) setup: String,
    base_ns: f64,
    /// One per rate, in the order of the rates asked for.
    pub(crate) rows: Vec<Row>,
}

impl Group {
    /// Its rows of the per-operation table; `rates` as measured, `pairs`
    /// per run.
    pub(crate) fn print(&self, rates: &[(&str, &str)], pairs: f64) {
        let mode = self.mode;
        println!(
            "| {mode} | {} | - | {:.2} | 1 | |",
            self.reference, self.base_ns
        );
        // Per thread in the threaded workloads: the programs report
        // ns per pair per thread and count samples of all threads.
        let threads = if matches!(mode, "threads2" | "churn-2t") {
            2.0
        } else {
            1.0
        };
        for ((label, _), r) in rates.iter().zip(&self.rows) {
            println!(
                "| {mode} | {} | {label} | {:.2} | {:.3} ({:.3}-{:.3}) | {:.0} |",
                self.setup,
                r.ns,
                r.ratio,
                r.min,
                r.max,
                r.samples as f64 * 1e6 / pairs / threads,
            );
        }
    }
}

/// The per-operation section: every workload (small-block churn, mixed
/// sizes, 2 threads with cross-thread frees, churn over 20,000 live blocks
/// on 1 and 2 threads) on every backend (glibc, the plain vendored
/// mimalloc, Rust's `System`), the sampling layer at each of `rates`
/// (label, `ALLOCPROF_RATE`) against the plain backend, in `rounds`
/// interleaved rounds of `iters` pairs. `each` sees every group once
/// measured.
pub(crate) fn per_operation(
    p: &Programs,
    rates: &[(&'static str, &'static str)],
    iters: &str,
    rounds: usize,
    mut each: impl FnMut(&Group),
) -> Result<Vec<Group>> {
    let mut groups = Vec::new();
    for mode in MODES {
        let backends = [
            (
                setup("glibc (plain)", &p.exe, None, &[]),
                &p.exe,
                Some(&p.lib_gl),
                "allocprof/glibc",
            ),
            (
                setup("mimalloc (plain, vendored)", &p.exe, Some(&p.plain_mi), &[]),
                &p.exe,
                Some(&p.lib_mi),
                "allocprof/mimalloc",
            ),
            (
                setup("System (plain)", &p.rust_system, None, &[]),
                &p.rust_sampling,
                None,
                "SamplingAllocator<System>",
            ),
        ];
        for (reference, sampled_exe, lib, setup_name) in backends {
            let setups: Vec<Setup> = rates
                .iter()
                .map(|&(_, rate)| {
                    setup(
                        "allocprof",
                        sampled_exe,
                        lib.map(PathBuf::as_path),
                        &[("ALLOCPROF_RATE", rate)],
                    )
                })
                .collect();
            let (base_ns, rows) = interleaved(&reference, &setups, mode, iters, rounds)?;
            let group = Group {
                mode,
                reference: reference.name,
                setup: setup_name.to_string(),
                base_ns,
                rows,
            };
            each(&group);
            groups.push(group);
        }
    }
    Ok(groups)
}

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let (iters, rounds) = if quick {
        ("1000000", 7)
    } else {
        ("5000000", 21)
    };
    let programs = Programs::build(root)?;
    if args.iter().any(|a| a == "--big") {
        println!("Load average at start: {}", load_average());
        big_blocks(&programs, quick)?;
        println!("\nLoad average at the end: {}", load_average());
        return Ok(());
    }
    let Programs {
        exe,
        lib_mi,
        lib_gl,
        plain_mi,
        ..
    } = &programs;
    let deb_mi = Path::new("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2");
    let deb_je = Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");

    println!("Plain mimalloc reference: {}\n", programs.plain_cmd);
    println!("Load average at start: {}\n", load_average());
    println!(
        "## Per-operation cost: ratio to the plain backend (median of {rounds} interleaved rounds, min-max of the per-round ratios; {iters} pairs per run)\n"
    );
    println!("{PER_OPERATION_HEAD}");
    let rates = [("off", "0"), DEFAULT_RATE, ("64k", "65536")];
    let pairs: f64 = iters.parse()?;
    let groups = per_operation(&programs, &rates, iters, rounds, |g| g.print(&rates, pairs))?;
    let mut missed = Vec::new();
    for g in &groups {
        for (rate, r) in rates.iter().zip(&g.rows) {
            if *rate == DEFAULT_RATE && r.ratio > FAST_PATH_TARGET {
                missed.push(format!("{} {} {:.3}", g.mode, g.setup, r.ratio));
            }
        }
    }
    if missed.is_empty() {
        println!("\nTarget (default rate <= 1.03x the plain backend): met in every row.");
    } else {
        println!(
            "\nTarget (default rate <= 1.03x the plain backend) missed: {}",
            missed.join(", ")
        );
    }

    // Every allocation sampled is ~50x slower (and ~100x in bursts): a
    // twentieth of the pairs keeps this section short.
    let sample_iters = (iters.parse::<u64>()? / 20).to_string();
    let sample_pairs = sample_iters.parse::<f64>()?;
    let reps = rounds.min(7);
    println!(
        "\n## Cost of one sample: every allocation sampled (R = 1) vs off, 8-256 B blocks (median of {reps} interleaved rounds, {sample_iters} pairs)\n"
    );
    println!(
        "| setup | pattern | ns/pair off | ns/pair R=1 | samples per pair | cost per sample | of which the ledger (vs ALLOCPROF_LEDGER=0) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (backend, lib) in [("glibc", &lib_gl), ("mimalloc", &lib_mi)] {
        for (mode, window) in [
            ("small-w4", "churn, 4 live blocks (slots reused warm)"),
            ("small", "churn, 256 live blocks (slots reused warm)"),
            (
                "burst",
                "64 mallocs then 64 frees (the last 16 frees overflow the warm cache: madvise + fault)",
            ),
        ] {
            let off = setup("allocprof", exe, Some(lib), &[("ALLOCPROF_RATE", "0")]);
            let all = setup("allocprof", exe, Some(lib), &[("ALLOCPROF_RATE", "1")]);
            // The same with the live-sample ledger off, in the same rounds:
            // the difference is the ledger's capture and record per sample.
            let no_ledger = setup(
                "allocprof, no ledger",
                exe,
                Some(lib),
                &[("ALLOCPROF_RATE", "1"), ("ALLOCPROF_LEDGER", "0")],
            );
            let (v0, r) = interleaved(&off, &[all, no_ledger], mode, &sample_iters, reps)?;
            let (v1, n) = (r[0].ns, r[0].samples);
            let per_pair = n as f64 / sample_pairs;
            println!(
                "| allocprof/{backend} | {window} | {v0:.2} | {v1:.2} | {per_pair:.3} | {:.0} ns | {:.0} ns |",
                (v1 - v0) / per_pair,
                (v1 - r[1].ns) / per_pair
            );
        }
    }

    println!("\n## Whole program: 2-thread churn (`threads2`), wall time (median of {reps})\n");
    println!("| allocator | wall ms |");
    println!("|---|---|");
    let wholes = [
        setup("glibc", exe, None, &[]),
        setup("mimalloc (plain, vendored 2.3.x)", exe, Some(plain_mi), &[]),
        setup("mimalloc (Debian libmimalloc2.0)", exe, Some(deb_mi), &[]),
        setup(
            "jemalloc prof:true,lg_prof_sample:19",
            exe,
            Some(deb_je),
            &[("MALLOC_CONF", "prof:true,lg_prof_sample:19")],
        ),
        setup("allocprof (mimalloc), default R", exe, Some(lib_mi), &[]),
        setup("allocprof (glibc), default R", exe, Some(lib_gl), &[]),
    ];
    let mut times = vec![Vec::new(); wholes.len()];
    for _ in 0..reps {
        for (s, t) in wholes.iter().zip(&mut times) {
            let t0 = Instant::now();
            let st = command(s, &["threads2", iters])
                .stdout(std::process::Stdio::null())
                .status()?;
            if !st.success() {
                bail!("{} failed", s.name);
            }
            t.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    for (s, t) in wholes.iter().zip(&mut times) {
        println!("| {} | {:.1} |", s.name, median(t));
    }

    println!("\n## Memory: live set of 200k x 64 B + 2000 x 8 KiB + 20 x 1 MiB\n");
    for (label, rate) in [
        ("off", "0"),
        ("512k", "524288"),
        ("64k", "65536"),
        ("4k", "4096"),
    ] {
        let s = setup("allocprof", exe, Some(lib_mi), &[("ALLOCPROF_RATE", rate)]);
        let out = command(&s, &["live"]).output()?;
        println!(
            "- R={label}: {}",
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    big_blocks(&programs, quick)?;
    println!("\nLoad average at the end: {}", load_average());
    Ok(())
}

/// Block sizes of the big-block section, MiB.
const BIG_MIB: [u64; 6] = [1, 2, 4, 8, 16, 64];
/// The big-block target: at the default rate, at most this times the same
/// library with sampling off.
const BIG_TARGET: f64 = 1.05;

/// Section (5): malloc + memset + free of big blocks, each library at the
/// default rate against itself with `ALLOCPROF_RATE=0`, in interleaved
/// rounds; about 2 GiB written per run (a quarter with `--quick`). CPU time
/// (user + system, so page faults count) rather than wall time, which on a
/// shared machine mostly measures the neighbours.
fn big_blocks(p: &Programs, quick: bool) -> Result<()> {
    let rounds = if quick { 5 } else { 11 };
    let bytes: u64 = if quick { 512 << 20 } else { 2 << 30 };
    println!(
        "\n## Big blocks: malloc + memset + free, default rate vs ALLOCPROF_RATE=0 of the same library (median of {rounds} interleaved rounds, min-max of the per-round ratios)\n"
    );
    println!(
        "| block | setup | CPU ns/iteration off | CPU ns/iteration default R | ratio | samples per run |"
    );
    println!("|---|---|---|---|---|---|");
    let mut missed = Vec::new();
    for mib in BIG_MIB {
        let mode = format!("big-{mib}");
        let iters = (bytes / (mib << 20)).to_string();
        for (name, lib) in [
            ("allocprof/glibc", &p.lib_gl),
            ("allocprof/mimalloc", &p.lib_mi),
        ] {
            let off = setup(name, &p.exe, Some(lib), &[("ALLOCPROF_RATE", "0")]);
            let on = setup(name, &p.exe, Some(lib), &[]);
            let (base, rows) = interleaved(&off, &[on], &mode, &iters, rounds)?;
            let r = &rows[0];
            println!(
                "| {mib} MiB | {name} | {base:.0} | {:.0} | {:.3} ({:.3}-{:.3}) | {} |",
                r.ns, r.ratio, r.min, r.max, r.samples
            );
            if r.ratio > BIG_TARGET {
                missed.push(format!("{mib} MiB {name} {:.3}", r.ratio));
            }
        }
    }
    if missed.is_empty() {
        println!(
            "\nTarget (big blocks <= 1.05x the same library with sampling off): met in every row."
        );
    } else {
        println!(
            "\nTarget (big blocks <= 1.05x the same library with sampling off) missed: {}",
            missed.join(", ")
        );
    }
    Ok(())
}

/// `/proc/loadavg`'s 1, 5 and 15 minute figures: how busy the machine was.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

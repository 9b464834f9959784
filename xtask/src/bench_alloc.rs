//! `cargo xtask bench alloc`: cost of the sampling layer.
//!
//! Builds the preload libraries and a small C benchmark, then reports
//! (1) ns per malloc/free pair for small churn, mixed sizes and 2 threads
//! with cross-thread frees, under each library at R = off / default / 64k,
//! with the ratio to the bare backend measured in the same run;
//! (2) whole-program wall time of the 2-thread churn under glibc, Debian's
//! mimalloc, jemalloc with heap profiling, and both allocprof libraries;
//! (3) memory cost of sampled blocks (a page per live sample) and what
//! stays resident after everything is freed.
//! (4) the cost of one sample, measured with every allocation sampled, in
//! the warm-cache and cache-overflow regimes.
//! The per-pair table also gives the samples taken per million pairs (at
//! the default rate they are too rare for the difference to the `off` row
//! to measure their cost: that is what (4) is for).
//! Arguments: `--quick` for fewer iterations.

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
    else if (!strcmp(m, "live")) { live(); return 0; }
    printf("%.3f %lu\n", ns, samples());
    return 0;
}
"#;

struct Setup {
    name: &'static str,
    preload: Option<PathBuf>,
    env: Vec<(&'static str, &'static str)>,
}

fn setup(
    name: &'static str,
    preload: Option<&Path>,
    env: &[(&'static str, &'static str)],
) -> Setup {
    Setup {
        name,
        preload: preload.map(Path::to_path_buf),
        env: env.to_vec(),
    }
}

fn command(exe: &Path, s: &Setup, args: &[&str]) -> Command {
    let mut c = Command::new(exe);
    c.args(args)
        .env_remove("LD_PRELOAD")
        .env_remove("ALLOCPROF_RATE")
        .env_remove("MALLOC_CONF");
    if let Some(p) = &s.preload {
        c.env("LD_PRELOAD", p);
    }
    for (k, v) in &s.env {
        c.env(k, v);
    }
    c
}

/// One run of the benchmark: (ns per pair, allocations sampled).
fn run_once(exe: &Path, s: &Setup, mode: &str, iters: &str) -> Result<(f64, u64)> {
    let out = command(exe, s, &[mode, iters]).output()?;
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

/// Best (minimum) of `reps` runs of each setup, with the number of
/// allocations sampled in that run. The setups are run in rounds (one run
/// of each per round) so that a burst of load from elsewhere on the
/// machine skews all of them alike instead of one row.
fn ns_per_pair(
    exe: &Path,
    setups: &[Setup],
    mode: &str,
    iters: &str,
    reps: usize,
) -> Result<Vec<(f64, u64)>> {
    let mut best = vec![(f64::INFINITY, 0); setups.len()];
    for _ in 0..reps {
        for (s, b) in setups.iter().zip(&mut best) {
            let r = run_once(exe, s, mode, iters)?;
            if r.0 < b.0 {
                *b = r;
            }
        }
    }
    Ok(best)
}

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let (iters, reps) = if quick {
        ("2000000", 3)
    } else {
        ("20000000", 5)
    };
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args([
            "build",
            "--release",
            "-p",
            "liballocprof",
            "-p",
            "liballocprof-glibc",
        ])
        .status()?;
    if !status.success() {
        bail!("building the preload libraries failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let lib_mi = target.join("release/liballocprof.so");
    let lib_gl = target.join("release/liballocprof_glibc.so");
    let dir = target.join("bench-alloc");
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("alloc_bench.c");
    std::fs::write(&src, BENCH_C)?;
    let exe = dir.join("alloc_bench");
    let out = Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-ldl")
        .output()
        .context("gcc (apt-get install gcc)")?;
    if !out.status.success() {
        bail!("gcc: {}", String::from_utf8_lossy(&out.stderr));
    }
    let deb_mi = Path::new("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2");
    let deb_je = Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");

    println!("## Per-operation cost (ns per malloc/free pair, best of {reps}, {iters} pairs)\n");
    let pairs: f64 = iters.parse()?;
    println!(
        "| workload | setup | R | ns/pair | vs bare backend | vs off | samples per 1M pairs |"
    );
    println!("|---|---|---|---|---|---|---|");
    for mode in ["small", "mixed", "threads2"] {
        for (backend, bare, lib) in [
            ("glibc", setup("glibc", None, &[]), &lib_gl),
            (
                "mimalloc",
                setup("mimalloc (Debian 2.0)", Some(deb_mi), &[]),
                &lib_mi,
            ),
        ] {
            let rates = [("off", "0"), ("512k (default)", "524288"), ("64k", "65536")];
            let mut setups = vec![bare];
            for (_, rate) in rates {
                setups.push(setup("allocprof", Some(lib), &[("ALLOCPROF_RATE", rate)]));
            }
            let results = ns_per_pair(&exe, &setups, mode, iters, reps)?;
            let base = results[0].0;
            let off = results[1].0;
            println!(
                "| {mode} | {} (bare) | - | {base:.2} | 1.00 | | |",
                setups[0].name
            );
            for ((label, rate), &(v, n)) in rates.iter().zip(&results[1..]) {
                if *rate == "0" {
                    println!(
                        "| {mode} | allocprof/{backend} | {label} | {v:.2} | {:.3} ({:+.2} ns) | | 0 |",
                        v / base,
                        v - base
                    );
                    continue;
                }
                println!(
                    "| {mode} | allocprof/{backend} | {label} | {v:.2} | {:.3} ({:+.2} ns) | {:+.2} ns | {:.0} |",
                    v / base,
                    v - base,
                    v - off,
                    n as f64 * 1e6 / pairs / if mode == "threads2" { 2.0 } else { 1.0 },
                );
            }
        }
    }

    // Every allocation sampled is ~50x slower (and ~300x in bursts): a
    // twentieth of the pairs keeps this section short.
    let sample_iters = (iters.parse::<u64>()? / 20).to_string();
    let sample_pairs = sample_iters.parse::<f64>()?;
    println!(
        "\n## Cost of one sample: every allocation sampled (R = 1) vs off, 8-256 B blocks (best of {reps}, {sample_iters} pairs)\n"
    );
    println!(
        "| setup | pattern | ns/pair off | ns/pair R=1 | samples per pair | cost per sample |"
    );
    println!("|---|---|---|---|---|---|");
    for (backend, lib) in [("glibc", &lib_gl), ("mimalloc", &lib_mi)] {
        for (mode, window) in [
            ("small-w4", "churn, 4 live blocks (slots reused warm)"),
            ("small", "churn, 256 live blocks (slots reused warm)"),
            (
                "burst",
                "64 mallocs then 64 frees (7/8 of frees overflow the warm cache: madvise + fault)",
            ),
        ] {
            let off = setup("allocprof", Some(lib), &[("ALLOCPROF_RATE", "0")]);
            let all = setup("allocprof", Some(lib), &[("ALLOCPROF_RATE", "1")]);
            let r = ns_per_pair(&exe, &[off, all], mode, &sample_iters, reps)?;
            let ((v0, _), (v1, n)) = (r[0], r[1]);
            let per_pair = n as f64 / sample_pairs;
            println!(
                "| allocprof/{backend} | {window} | {v0:.2} | {v1:.2} | {per_pair:.3} | {:.0} ns |",
                (v1 - v0) / per_pair
            );
        }
    }

    println!("\n## Whole program: 2-thread churn, wall time (best of {reps})\n");
    println!("| allocator | wall ms |");
    println!("|---|---|");
    let wholes = [
        setup("glibc", None, &[]),
        setup("mimalloc (Debian libmimalloc2.0)", Some(deb_mi), &[]),
        setup(
            "jemalloc prof:true,lg_prof_sample:19",
            Some(deb_je),
            &[("MALLOC_CONF", "prof:true,lg_prof_sample:19")],
        ),
        setup("allocprof (mimalloc), default R", Some(&lib_mi), &[]),
        setup("allocprof (glibc), default R", Some(&lib_gl), &[]),
    ];
    for s in &wholes {
        let mut best = f64::INFINITY;
        for _ in 0..reps {
            let t0 = Instant::now();
            let st = command(&exe, s, &["threads2", iters])
                .stdout(std::process::Stdio::null())
                .status()?;
            if !st.success() {
                bail!("{} failed", s.name);
            }
            best = best.min(t0.elapsed().as_secs_f64() * 1e3);
        }
        println!("| {} | {best:.1} |", s.name);
    }

    println!("\n## Memory: live set of 200k x 64 B + 2000 x 8 KiB + 20 x 1 MiB\n");
    for (label, rate) in [
        ("off", "0"),
        ("512k", "524288"),
        ("64k", "65536"),
        ("4k", "4096"),
    ] {
        let s = setup("allocprof", Some(&lib_mi), &[("ALLOCPROF_RATE", rate)]);
        let out = command(&exe, &s, &["live"]).output()?;
        println!(
            "- R={label}: {}",
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(())
}

//! What `bench alloc` and `bench peers` run, built: the preload libraries,
//! the Rust benchmark binaries, the C benchmark (`BENCH_C`) and the plain
//! vendored mimalloc.

use std::path::{Path, PathBuf};
use std::process::Command;

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
    pub(super) exe: PathBuf,
    pub(crate) lib_mi: PathBuf,
    pub(crate) lib_gl: PathBuf,
    pub(super) rust_system: PathBuf,
    pub(super) rust_sampling: PathBuf,
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

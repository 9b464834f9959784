//! C programs under LD_PRELOAD: every exported function's semantics,
//! threads with cross-thread frees, fork from a threaded program, signal
//! handlers that allocate, everything-sampled stress. Both backends.

mod common;

use std::process::Command;

use common::{BACKENDS, Backend, apply, c_program, field, preloaded, run_ok};

const RATES: [Option<&str>; 4] = [None, Some("1"), Some("4k"), Some("0")];

fn run_c(name: &str, args: &[&str], backend: Backend, rate: Option<&'static str>) -> String {
    let exe = c_program(name, name);
    let mut cmd = Command::new(&exe);
    cmd.args(args);
    apply(&mut cmd, preloaded(backend, rate));
    if rate == Some("1") {
        cmd.env("API_EXPECT_ALL_SAMPLED", "1");
    }
    let out = run_ok(
        &mut cmd,
        &format!("{name} {args:?} {backend:?} rate={rate:?}"),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn api_semantics_all_backends_and_rates() {
    for backend in BACKENDS {
        for rate in RATES {
            let out = run_c("api", &[], backend, rate);
            assert!(out.contains("api ok"), "{out}");
            if rate == Some("0") {
                assert!(out.contains("sampled=0 "), "rate 0 must not sample: {out}");
            }
        }
    }
}

/// free preserves errno even when the allocator's free makes a syscall that
/// touches errno (errno.c interposes madvise/munmap/mprotect to clobber it):
/// unsampled blocks (mimalloc purges/unmaps in free) and sampled ones (the
/// region's madvise when a class's warm cache is full), both backends.
#[test]
fn free_preserves_errno() {
    for backend in BACKENDS {
        for rate in [Some("0"), Some("1"), None] {
            let out = run_c("errno", &[], backend, rate);
            assert!(out.contains("errno ok"), "{out}");
            let syscalls: u64 = out
                .trim()
                .rsplit("syscalls_in_free=")
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no syscall count: {out}"));
            // The check must not be vacuous: with everything sampled the
            // region releases pages from free; mimalloc's own free reaches
            // munmap/madvise for the large blocks. (glibc's free calls its
            // internal munmap, which cannot be interposed, and preserves
            // errno itself.)
            let expect_syscalls = matches!(
                (backend, rate),
                (_, Some("1")) | (Backend::Mimalloc, Some("0"))
            );
            if expect_syscalls {
                assert!(syscalls > 0, "{backend:?} rate={rate:?}: {out}");
            }
        }
    }
}

#[test]
fn threads_with_cross_thread_frees() {
    for backend in BACKENDS {
        for rate in RATES {
            run_c("stress", &["threads"], backend, rate);
        }
    }
}

#[test]
fn fork_from_threaded_program() {
    for backend in BACKENDS {
        for rate in [None, Some("1"), Some("4k")] {
            run_c("stress", &["fork"], backend, rate);
        }
    }
}

/// A fork child reseeds its sampler (fork is detected through a
/// MADV_WIPEONFORK page, not a getpid per sample): parent and child running
/// the same allocations must sample different ones.
#[test]
fn fork_child_does_not_sample_in_lockstep() {
    for backend in BACKENDS {
        run_c("stress", &["fork-reseed"], backend, Some("4k"));
    }
}

#[test]
fn signal_handlers_that_allocate() {
    for backend in BACKENDS {
        for rate in [None, Some("1"), Some("4k")] {
            run_c("stress", &["signals"], backend, rate);
        }
        // Asynchronous signals are only fair when nothing reaches the
        // (non-async-signal-safe) backend: everything sampled.
        run_c("stress", &["signals-async"], backend, Some("1"));
    }
}

#[test]
fn malformed_rate_warns_once_and_uses_default() {
    for backend in BACKENDS {
        let exe = c_program("api", "api");
        let mut cmd = Command::new(&exe);
        apply(&mut cmd, preloaded(backend, Some("12zz")));
        let out = run_ok(&mut cmd, "api with malformed rate");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.matches("malformed ALLOCPROF_RATE").count(),
            1,
            "stderr: {stderr}"
        );
    }
}

/// glibc's own entry points (`__libc_malloc` & co.) and the standard names,
/// in every pairing (malloc/__libc_free, __libc_malloc/free, the calloc,
/// realloc, memalign, valloc and pvalloc pairs), sampled and unsampled
/// blocks: both families are the library's, so every block goes back to
/// whoever made it. (Before the library exported them: SIGSEGV in
/// liballocprof.so, `free(): invalid pointer` in liballocprof_glibc.so.)
#[test]
fn libc_entry_points_mix_with_the_standard_names() {
    for backend in BACKENDS {
        for rate in RATES {
            let out = run_c("libc_entries", &[], backend, rate);
            assert!(out.contains("libc entries ok"), "{out}");
            let sampled = field(&out, "sampled");
            match rate {
                Some("0") => assert_eq!(sampled, 0, "{backend:?}: {out}"),
                // Nearly every block sampled: 10 rounds x 8 sizes x 21 blocks
                // (1-byte blocks with probability 1 - 1/e).
                Some("1") => assert!(sampled >= 1_200, "{backend:?}: {out}"),
                // 3 MiB blocks are sampled at the default rate too.
                _ => assert!(sampled > 0, "{backend:?} rate={rate:?}: {out}"),
            }
        }
    }
}

/// A malloc from a `.preinit_array` function runs before libc has set up
/// `environ`: the rate must still be `ALLOCPROF_RATE`'s for the whole run
/// (read from /proc/self/environ then), not the default latched early.
#[test]
fn a_malloc_before_the_environment_is_set_up_keeps_allocprof_rate() {
    for backend in BACKENDS {
        let out = run_c("preinit", &[], backend, Some("0"));
        assert_eq!(field(&out, "sampled"), 0, "{backend:?} rate 0: {out}");
        let out = run_c("preinit", &[], backend, Some("1"));
        assert_eq!(
            field(&out, "main_sampled"),
            1000,
            "{backend:?} rate 1: {out}"
        );
        // The 64 MiB block of the .preinit_array function, the 16 small
        // ones and main's 1,000.
        assert!(field(&out, "sampled") >= 1017, "{backend:?} rate 1: {out}");
        // A malformed rate is still noticed, once.
        let exe = c_program("preinit", "preinit");
        let mut cmd = Command::new(&exe);
        apply(&mut cmd, preloaded(backend, Some("12zz")));
        let out = run_ok(&mut cmd, "preinit with a malformed rate");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.matches("malformed ALLOCPROF_RATE").count(),
            1,
            "{stderr}"
        );
    }
}

/// liballocprof_glibc.so never asks glibc for heap statistics: `mallinfo2`,
/// `mallinfo`, `malloc_info` and `malloc_stats` walk every free chunk under
/// each arena's lock (tens of milliseconds with a million free chunks, with
/// the arena's other threads waiting). The library does not import them,
/// and a guard preloaded ahead of it that aborts in each of them is never
/// reached, on a heap with a million free chunks and thousands of samples.
#[test]
fn a_sampled_malloc_never_walks_glibcs_heap() {
    let lib = common::library(Backend::Glibc);
    let nm = Command::new(common::require_tool("nm", "binutils"))
        .args(["-D", "--undefined-only"])
        .arg(lib)
        .output()
        .unwrap();
    let imports = String::from_utf8_lossy(&nm.stdout);
    for walker in ["mallinfo", "malloc_info", "malloc_stats"] {
        assert!(
            !imports.contains(walker),
            "liballocprof_glibc.so imports {walker}:\n{imports}"
        );
    }
    let guard = shared_library("mallinfo_guard");
    let exe = c_program("free_chunks", "free_chunks");
    let mut cmd = Command::new(&exe);
    apply(&mut cmd, preloaded(Backend::Glibc, Some("4k")));
    cmd.env(
        "LD_PRELOAD",
        format!("{}:{}", guard.display(), lib.display()),
    );
    let out = run_ok(&mut cmd, "free_chunks under the mallinfo guard");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(field(&stdout, "sampled") > 1000, "{stdout}");
}

/// `tests/c/<name>.c` built as a shared library.
fn shared_library(name: &str) -> std::path::PathBuf {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(format!("{name}.c"));
    let out_dir = common::artifacts_dir().join("c");
    std::fs::create_dir_all(&out_dir).unwrap();
    let so = out_dir.join(format!("lib{name}.so"));
    let out = Command::new(common::require_tool("gcc", "gcc"))
        .args(["-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gcc {name}.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    so
}

/// A fork child draws its own countdown at fork instead of running out
/// its parent's, both backends. fork_seed.c forks 8 children per round
/// from one state, then samples from that state itself: a child running
/// out the inherited countdown never samples before the parent does; one
/// with a fresh gap does about half the time. (Before, every child of
/// every round sampled at or after its parent: the workers of a prefork
/// server shared one unsampled stretch after each fork.)
#[test]
fn fork_children_draw_their_own_first_sample() {
    const ROUNDS: usize = 10;
    const CHILDREN: usize = 8;
    for backend in BACKENDS {
        let out = run_c("fork_seed", &["10", "8"], backend, Some("64k"));
        let rounds: Vec<Vec<u64>> = out
            .lines()
            .filter_map(|l| l.strip_prefix("round "))
            .map(|r| {
                r.split(' ')
                    .map(|k| k.parse().expect("a sample index"))
                    .collect()
            })
            .collect();
        assert_eq!(rounds.len(), ROUNDS, "{backend:?}: {out}");
        let mut before_parent = 0;
        for r in &rounds {
            assert_eq!(r.len(), 1 + CHILDREN, "{backend:?}: {out}");
            before_parent += r[1..].iter().filter(|&&k| k < r[0]).count();
        }
        // Independent Exp gaps: each child is first with probability 1/2,
        // so ~40 of 80; fewer than 10 is beyond chance.
        assert!(
            before_parent >= 10,
            "{backend:?}: {before_parent} of {} children sampled before their parent: \
             they ran out its countdown (parent's index first):\n{out}",
            ROUNDS * CHILDREN
        );
    }
}

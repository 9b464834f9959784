//! Edge cases of the sample region under LD_PRELOAD, both libraries
//! (tests/c/edges.c): double free, errno on allocation, C23 sized frees,
//! region flags, RLIMIT_AS, huge and numerous samples, unplaced samples.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use common::{
    BACKENDS, Backend, Bpftrace, apply, c_program, field, library, preloaded, require_tool, run_ok,
    stdout,
};

fn edges(mode: &str, backend: Backend, rate: Option<&'static str>) -> Command {
    let mut cmd = Command::new(c_program("edges", "edges"));
    cmd.arg(mode);
    apply(&mut cmd, preloaded(backend, rate));
    cmd
}

/// Like glibc: a second free of a sampled block aborts with a one-line
/// message instead of corrupting the slot stacks (which used to hand the
/// same pointer to the next two mallocs).
#[test]
fn double_free_of_sampled_block_aborts() {
    for backend in BACKENDS {
        let out = edges("double-free", backend, Some("1")).output().unwrap();
        let (so, se) = (stdout(&out), String::from_utf8_lossy(&out.stderr));
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGABRT),
            "{backend:?}: {}\nstdout: {so}\nstderr: {se}",
            out.status
        );
        let block = so
            .trim()
            .strip_prefix("block ")
            .unwrap_or_else(|| panic!("{so}"));
        let expected = format!("allocprof: free(): double free of sampled block {block}\n");
        assert!(se.contains(&expected), "{backend:?}: stderr {se:?}");
        assert!(!so.contains("survived"), "{so}");
    }
}

/// Successful allocations leave errno alone, including the first sampled
/// one (the region's set-up calls prctl, which fails with EINVAL where the
/// kernel cannot name VMAs) and the slow paths' other syscalls.
#[test]
fn allocation_preserves_errno() {
    for backend in BACKENDS {
        for rate in [Some("1"), None] {
            let out = run_ok(
                &mut edges("errno", backend, rate),
                &format!("edges errno {backend:?} rate={rate:?}"),
            );
            assert!(stdout(&out).contains("errno ok"), "{}", stdout(&out));
        }
    }
}

/// C23 free_sized / free_aligned_sized are interposed (a program built
/// against a newer glibc would otherwise hand our sampled blocks to glibc)
/// and release sampled blocks.
#[test]
fn free_sized_and_free_aligned_sized() {
    let nm = require_tool("nm", "binutils");
    for backend in BACKENDS {
        let out = run_ok(
            Command::new(&nm)
                .args(["-D", "--defined-only"])
                .arg(library(backend)),
            "nm -D",
        );
        let syms = stdout(&out);
        for name in ["free_sized", "free_aligned_sized"] {
            assert!(
                syms.lines().any(|l| l.ends_with(&format!(" T {name}"))),
                "{backend:?} does not export {name}:\n{syms}"
            );
        }
        let out = run_ok(&mut edges("free-sized", backend, Some("1")), "free-sized");
        assert!(stdout(&out).contains("free_sized ok"), "{}", stdout(&out));
        assert!(field(&stdout(&out), "sampled") >= 200);
    }
}

/// What each library exports is exactly the C allocator and
/// `allocprof_stats`: nothing of mimalloc, of the Rust runtime or of the
/// fused C entries' helpers leaks into the interposed namespace.
#[test]
fn exports_are_exactly_the_c_allocator() {
    let nm = require_tool("nm", "binutils");
    let mut expected = vec![
        "__libc_calloc",
        "__libc_free",
        "__libc_malloc",
        "__libc_memalign",
        "__libc_pvalloc",
        "__libc_realloc",
        "__libc_valloc",
        "aligned_alloc",
        "allocprof_stats",
        "calloc",
        "cfree",
        "free",
        "free_aligned_sized",
        "free_sized",
        "malloc",
        "malloc_usable_size",
        "memalign",
        "posix_memalign",
        "pvalloc",
        "realloc",
        "reallocarray",
        "valloc",
    ];
    expected.sort_unstable();
    for backend in BACKENDS {
        let out = run_ok(
            Command::new(&nm)
                .args(["-D", "--defined-only", "--format=posix"])
                .arg(library(backend)),
            "nm -D",
        );
        let mut names: Vec<String> = stdout(&out)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .collect();
        names.sort_unstable();
        assert_eq!(names, expected, "{backend:?}: exported symbols");
    }
}

/// liballocprof.so's exported `malloc` and `free` are the C functions with
/// mimalloc's fast paths inlined (preload/c/entries.c, aliased by the
/// link's `--defsym`), not the Rust entries that tail-jump into mimalloc.
#[test]
fn mimalloc_entries_have_its_fast_path_inlined() {
    let nm = require_tool("nm", "binutils");
    let out = run_ok(
        Command::new(&nm)
            .args(["--defined-only", "--format=posix"])
            .arg(library(Backend::Mimalloc)),
        "nm",
    );
    let text = stdout(&out);
    let address = |name: &str| -> Vec<&str> {
        text.lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some(name)).then(|| f.nth(1)).flatten()
            })
            .collect()
    };
    for (export, fused) in [
        ("malloc", "allocprof_mimalloc_malloc"),
        ("free", "allocprof_mimalloc_free"),
    ] {
        let (e, f) = (address(export), address(fused));
        assert!(
            !f.is_empty() && e == f,
            "`{export}` is at {e:?}, the fused C entry `{fused}` at {f:?}"
        );
    }
}

/// The region is never backed by transparent huge pages (`nh`), and a
/// live sampled block is in core dumps (no `dd`: only the region past the
/// slots ever placed is left out, see tests/region.rs).
#[test]
fn region_is_nohugepage_and_its_blocks_are_dumped() {
    for backend in BACKENDS {
        let out = run_ok(&mut edges("region", backend, Some("1")), "region");
        let text = stdout(&out);
        let flags = text
            .lines()
            .find(|l| l.contains("VmFlags:"))
            .unwrap_or_else(|| panic!("{backend:?}: no mapping holds the block:\n{text}"));
        let flags: Vec<&str> = flags.split_whitespace().collect();
        assert!(
            !flags.contains(&"dd") && flags.contains(&"nh"),
            "{backend:?}: region VmFlags {flags:?}"
        );
    }
}

/// Under `ulimit -v 8000000` (8,000,000 KiB) a 64 GiB reservation cannot
/// exist; the region shrinks to fit instead of vanishing, so samples are
/// still placed (and their probes fired).
#[test]
fn region_fits_under_rlimit_as() {
    require_tool("bash", "bash");
    for backend in BACKENDS {
        let exe = c_program("edges", "edges");
        let mut cmd = Command::new("bash");
        cmd.args(["-c", "ulimit -v 8000000 && exec \"$0\" region"])
            .arg(&exe);
        apply(&mut cmd, preloaded(backend, Some("1")));
        let out = run_ok(&mut cmd, "region under ulimit -v");
        let text = stdout(&out);
        assert_eq!(field(&text, "unplaced"), 0, "{backend:?}: {text}");
        assert!(field(&text, "sampled") >= 2, "{text}");
        // The 100 MiB block and the small one are live and placed.
        assert!(field(&text, "live_pages") > (100 << 20) / 4096, "{text}");
        let mib = field(&text, "mapping_mib");
        assert!(
            (128..2048).contains(&mib),
            "{backend:?}: region of {mib} MiB under an 7.6 GiB limit:\n{text}"
        );
    }
}

/// With too little address space for even the smallest region, the library
/// says so once on stderr and every sample is still counted (unplaced, and
/// announced with a null pointer) while the program runs on normally.
#[test]
fn no_room_for_any_region_is_reported() {
    require_tool("bash", "bash");
    for backend in BACKENDS {
        let exe = c_program("edges", "edges");
        let mut cmd = Command::new("bash");
        cmd.args(["-c", "ulimit -v 400000 && exec \"$0\" region"])
            .arg(&exe);
        apply(&mut cmd, preloaded(backend, Some("1")));
        let out = run_ok(&mut cmd, "region under ulimit -v 400000");
        let text = stdout(&out);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr
                .matches("allocprof: cannot reserve address space for the sample region")
                .count(),
            1,
            "{backend:?}: stderr {stderr:?}"
        );
        assert!(field(&text, "unplaced") >= 2, "{backend:?}: {text}");
        assert_eq!(field(&text, "live_pages"), 0, "{text}");
    }
}

/// Samples of any size, however many are live: 4 x 256 MiB, 1 GiB and
/// 1,500 x 3 MiB (more than the 4 MiB class's 1,024 slots) are all placed.
#[test]
fn huge_and_numerous_samples_are_placed() {
    for backend in BACKENDS {
        let out = run_ok(&mut edges("huge", backend, Some("1")), "huge");
        let text = stdout(&out);
        assert_eq!(field(&text, "unplaced"), 0, "{backend:?}: {text}");
        assert!(field(&text, "sampled") >= 1505, "{text}");
    }
}

/// A sample the region cannot place (aligned to 256 MiB, beyond the
/// region's 128 MiB) is served by the backend and announced with pointer
/// 0, so the profiler counts its weight as dropped instead of never
/// hearing of it.
#[test]
fn unplaced_sample_fires_alloc_probe_with_null_pointer() {
    // Sequential: both attach to probes filtered by the same comm.
    for backend in BACKENDS {
        let lib = library(backend);
        let exe_name = "edges";
        let script = format!(
            "usdt:{lib}:otel_memory:alloc /comm == \"{exe_name}\" && arg1 == 4096/ {{ printf(\"A %lu %lu %lu\\n\", arg0, arg1, arg2); }}\n",
            lib = lib.display()
        );
        let bt = Bpftrace::attach(&script);
        let run = run_ok(&mut edges("unplaced", backend, Some("1")), "unplaced");
        let rest = bt.stop();
        assert!(field(&stdout(&run), "unplaced") >= 1, "{}", stdout(&run));
        assert!(
            rest.lines().any(|l| l.trim() == "A 0 4096 4096"),
            "{backend:?}: no alloc(0, 4096, 4096) event:\n{rest}"
        );
    }
}

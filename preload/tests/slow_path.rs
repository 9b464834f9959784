//! The sampling slow path under what real programs do around it: a JIT's
//! `__register_frame` (libgcc holds a mutex while it mallocs), tens of
//! thousands of mappings, and a signal handler that `siglongjmp`s out of
//! it. Each must neither hang, nor cost in proportion to the process, nor
//! stop sampling.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{BACKENDS, Backend, apply, c_program, output_within, preloaded, require_tool};

/// Generous: a run takes well under a second; only a hang reaches it.
const HANG: Duration = Duration::from_secs(60);

fn field(out: &str, name: &str) -> u64 {
    out.split_whitespace()
        .skip_while(|w| *w != name)
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no `{name}` in {out:?}"))
}

/// Runs `cmd` under `backend`'s library at `rate`, failing the test if it
/// does not finish within `limit` (a hang) or does not exit 0; its stdout.
fn run_preloaded(
    mut cmd: Command,
    backend: Backend,
    rate: &'static str,
    limit: Duration,
    what: &str,
) -> String {
    apply(&mut cmd, preloaded(backend, Some(rate)));
    let out = output_within(&mut cmd, limit, what);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// libgcc 12's `_Unwind_Find_FDE` mallocs (sorting a registered object's
/// FDEs) while it holds its `object_mutex`; a sampled malloc there used to
/// call `_Unwind_Backtrace`, which took the mutex again: a hang in 6 of 6
/// runs at ALLOCPROF_RATE=64.
#[test]
fn a_program_that_registers_frames_never_hangs_in_malloc() {
    let exe = c_program("register_frame", "register_frame");
    for backend in BACKENDS {
        for run in 0..20 {
            let what = format!("register_frame under {backend:?}, run {run}");
            let text = run_preloaded(Command::new(&exe), backend, "64", HANG, &what);
            // The unwinds inside malloc had something to sample.
            assert!(field(&text, "sampled") > 0, "{what}: {text}");
        }
    }
}

/// A real JIT: LLVM's `lli` registers the `.eh_frame` of the code it
/// compiles with `__register_frame`; the JIT'd program asks glibc for a
/// backtrace, so libgcc sorts the registered object under its mutex with
/// sampled mallocs, whose stacks cross libgcc (the JIT'd `leaf` keeps a
/// value in %rbp, so the frame-pointer chain breaks and the CFI walk runs)
/// and end in JIT code, which no object holds (cut short). On the old code
/// this run did not hang: the allocator's own `_Unwind_Backtrace`, called
/// on an earlier sample, had already sorted the object (its mallocs not
/// sampled); `register_frame.c` above is the case that hung.
#[test]
fn llvms_jit_that_registers_frames_never_hangs_in_malloc() {
    let lli = require_tool("lli-14", "llvm-14");
    let dir = common::scratch_dir("lli");
    let ir = dir.join("backtrace.ll");
    std::fs::write(&ir, LLI_PROGRAM).unwrap();
    for backend in BACKENDS {
        for run in 0..5 {
            let mut cmd = Command::new(&lli);
            cmd.arg(&ir);
            let what = format!("lli under {backend:?}, run {run}");
            run_preloaded(cmd, backend, "64", HANG, &what);
        }
    }
}

const LLI_PROGRAM: &str = r#"declare i32 @backtrace(i8**, i32)
declare i8* @malloc(i64)
declare void @free(i8*)
@g0 = global i64 4096
@g1 = global i64 8193
@g2 = global i64 12290
@g3 = global i64 16387
@g4 = global i64 20484
@g5 = global i64 24581
@g6 = global i64 28678
@sink = global i64 0

; Holds 7 values across the backtrace call without a frame pointer:
; one of them lives in %rbp, so a frame-pointer walk from inside the
; unwinder breaks there.
define i32 @leaf() "frame-pointer"="none" {
  %buf = alloca [64 x i8*]
  %p = getelementptr [64 x i8*], [64 x i8*]* %buf, i32 0, i32 0
  %v0 = load volatile i64, i64* @g0
  %v1 = load volatile i64, i64* @g1
  %v2 = load volatile i64, i64* @g2
  %v3 = load volatile i64, i64* @g3
  %v4 = load volatile i64, i64* @g4
  %v5 = load volatile i64, i64* @g5
  %v6 = load volatile i64, i64* @g6
  %d = call i32 @backtrace(i8** %p, i32 64)
  %d64 = sext i32 %d to i64
  %s0 = add i64 %d64, %v0
  %s1 = add i64 %s0, %v1
  %s2 = add i64 %s1, %v2
  %s3 = add i64 %s2, %v3
  %s4 = add i64 %s3, %v4
  %s5 = add i64 %s4, %v5
  %s6 = add i64 %s5, %v6
  store volatile i64 %s6, i64* @sink
  ret i32 %d
}

define i32 @depth(i32 %n) {
entry:
  %c = icmp eq i32 %n, 0
  br i1 %c, label %leaf, label %rec
leaf:
  %d = call i32 @leaf()
  ret i32 %d
rec:
  %m = call i8* @malloc(i64 200)
  %n1 = sub i32 %n, 1
  %r = call i32 @depth(i32 %n1)
  call void @free(i8* %m)
  ret i32 %r
}

define i32 @main() {
  %d = call i32 @depth(i32 8)
  %ok = icmp sgt i32 %d, 8
  %code = select i1 %ok, i32 0, i32 1
  ret i32 %code
}
"#;

/// Each thread's first sampled allocation used to read all of
/// /proc/self/maps (30,000 mappings: ~2 MB, 200 threads: 2.2-2.6 s). It
/// now asks the kernel for one mapping (PROCMAP_QUERY): the bytes the
/// process reads no longer grow with its mappings.
#[test]
fn the_first_sample_of_a_thread_costs_nothing_per_mapping() {
    let exe = c_program("many_maps", "many_maps");
    for backend in BACKENDS {
        let what = format!("many_maps under {backend:?}");
        let text = run_preloaded(
            Command::new(&exe),
            backend,
            "1",
            Duration::from_secs(300),
            &what,
        );
        println!("{backend:?}: {text}");
        let (maps, rchar) = (field(&text, "maps"), field(&text, "rchar"));
        assert!(maps >= 30_000, "{what}: {text}");
        // 200 threads that each read the maps would read >= 200 x 30,000
        // lines; reading /proc/self/io itself is a few hundred bytes.
        assert!(rchar < 16 * 1024, "{what}: read {rchar} bytes: {text}");
    }
}

/// A handler that `siglongjmp`s out of the slow path used to leave the
/// thread marked busy: never sampled again, every later malloc on the slow
/// path.
#[test]
fn a_siglongjmp_out_of_the_slow_path_does_not_stop_sampling() {
    let exe = c_program("siglongjmp", "siglongjmp");
    for backend in BACKENDS {
        let what = format!("siglongjmp under {backend:?}");
        let text = run_preloaded(
            Command::new(&exe),
            backend,
            "1",
            Duration::from_secs(300),
            &what,
        );
        assert_eq!(field(&text, "jumps"), 3000, "{what}: {text}");
    }
}

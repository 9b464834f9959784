//! The sample region under real programs, both libraries
//! (tests/c/region.c): big-block churn, core dumps, fork during the
//! region's creation, cancellation, strict overcommit, calloc's usable
//! bytes.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{
    BACKENDS, Backend, apply, c_program, field, preloaded, require_tool, run_ok, scratch_dir,
    stdout,
};

fn region(args: &[&str], backend: Backend, rate: Option<&'static str>) -> Command {
    let mut cmd = Command::new(c_program("region", "region"));
    cmd.args(args);
    apply(&mut cmd, preloaded(backend, rate));
    cmd
}

/// A loop of malloc, memset and free of one big block: at the default rate
/// nearly every such block is sampled, and each free used to release the
/// slot's pages (`MADV_DONTNEED`) and the next malloc to fault them all
/// back in (6-11x the backend's time). Freed big slots now stay warm
/// within a budget: the loop takes (almost) no page fault per iteration,
/// and no more than the same library with sampling off. Counted in faults,
/// not time. And the few unsampled blocks (14% of 1 MiB ones, 2% of
/// 2 MiB) used to come from the backend, so the loop wrote the region's
/// slot and the backend's block in turn (1 MiB: ~60 switches in 256
/// iterations, 10-19% slower); they now take the same warm slot: the
/// block never moves.
#[test]
fn big_block_churn_reuses_resident_slots() {
    for backend in BACKENDS {
        for mib in [1usize, 2, 4, 16, 64] {
            // Enough iterations that a block's one-time first touch (in
            // the backend or a fresh slot) is a small part of the mean.
            let iters = (1024 / mib).clamp(16, 256).to_string();
            let args = ["churn", &mib.to_string(), &iters];
            let on = stdout(&run_ok(&mut region(&args, backend, None), "churn"));
            let off = stdout(&run_ok(&mut region(&args, backend, Some("0")), "churn off"));
            let pages = field(&on, "pages");
            let (f_on, f_off) = (
                field(&on, "faults_per_iter"),
                field(&off, "faults_per_iter"),
            );
            println!("{backend:?} {mib} MiB: {f_on} faults/iteration sampled, {f_off} off");
            assert!(
                field(&on, "sampled") > 0,
                "{backend:?} {mib} MiB: nothing sampled: {on}"
            );
            assert!(
                f_on <= f_off + pages / 20 && f_on < pages / 10,
                "{backend:?} {mib} MiB blocks: {f_on} faults per iteration sampled vs {f_off} \
                 off ({pages} pages a block)\n{on}{off}"
            );
            assert_eq!(
                field(&on, "switches"),
                0,
                "{backend:?} {mib} MiB blocks: the loop alternates buffers\n{on}"
            );
        }
    }
}

/// What freed big samples keep resident is bounded: 16 x 16 MiB freed at
/// once leave at most the 64 MiB budget (and a little of the backend's).
#[test]
fn warm_big_slots_stay_within_their_budget() {
    for backend in BACKENDS {
        let out = stdout(&run_ok(&mut region(&["bound"], backend, None), "bound"));
        let (held, after) = (field(&out, "held_kib"), field(&out, "after_free_kib"));
        assert!(held >= 250 << 10, "{backend:?}: {out}");
        assert!(
            after <= 72 << 10,
            "{backend:?}: {after} KiB stay resident after freeing 256 MiB: {out}"
        );
    }
}

/// The kernel's core file name for the dumping process, when
/// `core_pattern` writes a file into the process's working directory
/// (`core`, `core.%p`...); `None` when it pipes to a helper or names
/// another directory.
fn core_in_cwd() -> bool {
    let pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap();
    let p = pattern.trim();
    !p.starts_with('|') && !p.contains('/') && !p.is_empty()
}

/// Whether `hay` holds `needle`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A crashed service's sampled buffer is in its core dump (it used to be
/// `MADV_DONTDUMP` with the whole region), and the empty region, the
/// side table and the ledger table are not: the core stays small.
#[test]
fn core_dumps_hold_live_sampled_blocks() {
    require_tool("bash", "bash");
    let pattern = b"allocprof-core-dump-pattern-0123allocprof-core-dump-pattern-0123";
    for backend in BACKENDS {
        let dir = scratch_dir(&format!("core-{backend:?}"));
        let exe = c_program("region", "region");
        let (core, text) = if core_in_cwd() {
            // The kernel writes `core*` into the working directory.
            let mut cmd = Command::new("bash");
            cmd.args(["-c", "ulimit -c unlimited && exec \"$0\" core"])
                .arg(&exe)
                .current_dir(&dir);
            apply(&mut cmd, preloaded(backend, None));
            let out = cmd.output().unwrap();
            assert_eq!(
                out.status.signal(),
                Some(libc::SIGABRT),
                "{backend:?}: {}",
                out.status
            );
            let core = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("core"))
                })
                .unwrap_or_else(|| panic!("{backend:?}: no core file in {}", dir.display()));
            (core, stdout(&out))
        } else {
            // core_pattern pipes elsewhere (systemd-coredump...): gcore, which
            // honours MADV_DONTDUMP as the kernel does, on the live process.
            let gcore = require_tool("gcore", "gdb");
            let mut cmd = Command::new(&exe);
            cmd.args(["core", "wait"]);
            apply(&mut cmd, preloaded(backend, None));
            let mut child = cmd
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            let prefix = dir.join("core");
            let st = Command::new(gcore)
                .arg("-o")
                .arg(&prefix)
                .arg(child.id().to_string())
                .output()
                .unwrap();
            drop(child.stdin.take());
            let _ = child.wait();
            assert!(st.status.success(), "gcore: {st:?}");
            (
                Path::new(&format!("{}.{}", prefix.display(), child.id())).to_path_buf(),
                line,
            )
        };
        assert_eq!(field(&text, "unplaced"), 0, "{backend:?}: {text}");
        assert!(field(&text, "live_pages") >= 8192, "{backend:?}: {text}");
        let meta = std::fs::metadata(&core).unwrap();
        let bytes = std::fs::read(&core).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        use std::os::unix::fs::MetadataExt;
        println!(
            "{backend:?}: core of {} MiB ({} MiB on disk)",
            meta.len() >> 20,
            (meta.blocks() * 512) >> 20
        );
        assert!(
            contains(&bytes, pattern),
            "{backend:?}: the live 32 MiB sampled block is not in the core"
        );
        // The region is 100 GiB and the ledger table ~650 MiB: neither is
        // in the core, only the classes' open prefixes.
        assert!(
            meta.len() < 512 << 20,
            "{backend:?}: core of {} bytes",
            meta.len()
        );
    }
}

/// A process forked while another of its threads is creating the region
/// (its first sampled allocation) used to keep the "initialising" state
/// forever, it and its children: every sample became an unplaced drop.
/// Now a child takes the work over: each child and grandchild samples.
/// Many runs, two threads forking in a loop around the main thread's first
/// sampled malloc (the window is a few microseconds wide).
#[test]
fn fork_during_the_regions_creation_leaves_children_sampling() {
    for backend in BACKENDS {
        let (mut runs, mut children, mut in_window, mut early) = (0, 0, 0, 0);
        while runs < 20 {
            let out = region(&["fork-init"], backend, Some("64m"))
                .output()
                .unwrap();
            let text = stdout(&out);
            if out.status.code() == Some(3) && early < 10 {
                early += 1; // something sampled before main: no window to test
                continue;
            }
            assert!(
                out.status.success(),
                "{backend:?}: {}\n{text}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            runs += 1;
            assert_eq!(field(&text, "bad"), 0, "{backend:?} run {runs}: {text}");
            assert_eq!(field(&text, "parent_unplaced"), 0, "{backend:?}: {text}");
            children += field(&text, "children");
            in_window += field(&text, "in_window");
        }
        println!(
            "{backend:?}: {runs} runs, {children} children all sampling, {in_window} forked while the region was being made"
        );
    }
}

/// Under `ulimit -v` the region's first use reads `/proc/self/statm`: with
/// libc's `open`/`read` (cancellation points) a thread with a pending
/// deferred cancel was cancelled inside malloc, which never returned, and
/// the process never sampled again. Raw syscalls: malloc returns, and
/// every later sample is placed.
#[test]
fn a_pending_cancel_does_not_fire_inside_malloc() {
    require_tool("bash", "bash");
    for backend in BACKENDS {
        let exe = c_program("region", "region");
        let mut tries = 0;
        let text = loop {
            let mut cmd = Command::new("bash");
            cmd.args(["-c", "ulimit -v 8000000 && exec \"$0\" cancel"])
                .arg(&exe);
            apply(&mut cmd, preloaded(backend, Some("8m")));
            let out = cmd.output().unwrap();
            tries += 1;
            if out.status.code() == Some(3) && tries < 5 {
                continue; // sampled before the thread: not the case tested
            }
            assert!(
                out.status.success(),
                "{backend:?}: {}\n{}{}",
                out.status,
                stdout(&out),
                String::from_utf8_lossy(&out.stderr)
            );
            break stdout(&out);
        };
        assert_eq!(
            field(&text, "returned"),
            1,
            "{backend:?}: malloc never returned: {text}"
        );
        assert_eq!(field(&text, "cancelled"), 1, "{backend:?}: {text}");
        assert_eq!(field(&text, "first_unplaced"), 0, "{backend:?}: {text}");
        assert_eq!(field(&text, "unplaced"), 0, "{backend:?}: {text}");
        assert!(field(&text, "sampled") >= 95, "{backend:?}: {text}");
    }
}

/// Sets `vm.overcommit_memory` to 2 (and the ratio high, so that nobody
/// else on the machine meets the strict limit meanwhile: the accounting is
/// what is tested, not the limit), and restores both when dropped, panic
/// or not.
struct StrictOvercommit {
    mode: String,
    ratio: String,
}

const MODE: &str = "/proc/sys/vm/overcommit_memory";
const RATIO: &str = "/proc/sys/vm/overcommit_ratio";

impl StrictOvercommit {
    fn set() -> StrictOvercommit {
        let guard = StrictOvercommit {
            mode: std::fs::read_to_string(MODE).unwrap(),
            ratio: std::fs::read_to_string(RATIO).unwrap(),
        };
        std::fs::write(RATIO, "400").expect("set vm.overcommit_ratio (root needed)");
        std::fs::write(MODE, "2").expect("set vm.overcommit_memory (root needed)");
        guard
    }
}

impl Drop for StrictOvercommit {
    fn drop(&mut self) {
        let _ = std::fs::write(MODE, self.mode.trim());
        let _ = std::fs::write(RATIO, self.ratio.trim());
    }
}

/// The commit charge of process `pid`: the bytes of its mappings the
/// kernel accounts (`ac` in smaps' VmFlags).
fn commit_charge(pid: u32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut size = 0;
    let mut total = 0;
    for line in smaps.lines() {
        if let Some(kb) = line.strip_prefix("Size:") {
            size = kb
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap()
                << 10;
        } else if let Some(flags) = line.strip_prefix("VmFlags:")
            && flags.split_whitespace().any(|f| f == "ac")
        {
            total += size;
        }
    }
    total
}

/// Under `vm.overcommit_memory = 2` the kernel charges private writable
/// mappings whole, `MAP_NORESERVE` or not: the side and ledger tables cost
/// ~700 MiB of commit per process (776 MiB for 64 MiB held). Now they and
/// the region are committed as slots are first used: a process holding
/// 64 MiB is charged about what it is without the library. The strict
/// window lasts while the programs start and allocate (well under a
/// second); the charge is fixed when the mappings are made, so it is read
/// after the setting is restored.
#[test]
fn strict_overcommit_charges_what_is_used() {
    let exe = c_program("region", "region");
    let spawn = |backend: Option<Backend>| {
        let mut cmd = Command::new(&exe);
        cmd.arg("commit");
        match backend {
            Some(b) => apply(&mut cmd, preloaded(b, None)),
            None => apply(&mut cmd, common::BARE),
        };
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let setups = [None, Some(Backend::Mimalloc), Some(Backend::Glibc)];
    // Built before the strict window opens: only the programs run in it.
    for b in BACKENDS {
        common::library(b);
    }
    let mut children = Vec::new();
    let mut lines = Vec::new();
    {
        let _strict = StrictOvercommit::set();
        for b in setups {
            children.push(spawn(b));
        }
        for c in &mut children {
            let mut line = String::new();
            BufReader::new(c.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            lines.push(line);
        }
    }
    let charges: Vec<u64> = children.iter().map(|c| commit_charge(c.id())).collect();
    for c in &mut children {
        let _ = c.stdin.take().unwrap().write_all(b"");
        let _ = c.wait();
    }
    let bare = charges[0];
    println!("bare: {} MiB charged", bare >> 20);
    for ((b, charge), line) in setups.iter().zip(&charges).zip(&lines).skip(1) {
        println!("{b:?}: {} MiB charged ({})", charge >> 20, line.trim());
    }
    for ((b, charge), line) in setups.iter().zip(&charges).zip(&lines).skip(1) {
        assert!(line.starts_with("ready"), "{b:?}: {line}");
        assert_eq!(field(line, "unplaced"), 0, "{b:?}: {line}");
        assert!(field(line, "sampled") > 0, "{b:?}: {line}");
        assert!(
            *charge <= bare + (32 << 20),
            "{b:?}: {} MiB of commit charge for 64 MiB held ({} MiB without the library)",
            charge >> 20,
            bare >> 20
        );
    }
}

/// glibc's calloc clears the whole chunk, all that malloc_usable_size
/// reports; a calloc served from a warm sample slot cleared only `size`
/// bytes, leaving stale bytes up to the end of the page.
#[test]
fn calloc_clears_every_usable_byte() {
    for backend in BACKENDS {
        let out = run_ok(
            &mut region(&["calloc-usable"], backend, Some("1")),
            "calloc-usable",
        );
        let text = stdout(&out);
        assert!(text.contains("calloc-usable ok"), "{backend:?}: {text}");
        assert!(field(&text, "reused") >= 3, "{backend:?}: {text}");
    }
}

/// Big unsampled blocks take the warm slot a sampled one left, whatever
/// entry point asks (`malloc`, `calloc`, `posix_memalign`,
/// `aligned_alloc`, the `__libc_*` names), and behave as heap blocks: their
/// usable size, calloc's zeroes over every usable byte of a dirty slot,
/// realloc out of the region (growing, shrinking, by either family), free
/// by either family. The program checks each one (tests/c/region.c).
#[test]
fn unsampled_big_blocks_share_the_warm_slot_through_every_entry_point() {
    for backend in BACKENDS {
        let out = run_ok(
            &mut region(&["unsampled"], backend, Some("4m")),
            "unsampled",
        );
        let text = stdout(&out);
        println!("{backend:?}: {}", text.trim());
        assert!(text.contains("unsampled ok"), "{backend:?}: {text}");
        assert!(field(&text, "unsampled") >= 9, "{backend:?}: {text}");
        assert_eq!(field(&text, "unplaced"), 0, "{backend:?}: {text}");
    }
}

/// A second free of an unsampled block in the region is caught as one of a
/// sampled block is: the slot is not pushed twice.
#[test]
fn an_unsampled_block_freed_twice_aborts() {
    for backend in BACKENDS {
        let out = region(&["unsampled-double-free"], backend, Some("4m"))
            .output()
            .unwrap();
        let (so, se) = (stdout(&out), String::from_utf8_lossy(&out.stderr));
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGABRT),
            "{backend:?}: {}\nstdout: {so}\nstderr: {se}",
            out.status
        );
        let block = so
            .lines()
            .find_map(|l| l.strip_prefix("freeing ")?.strip_suffix(" again"))
            .unwrap_or_else(|| panic!("{backend:?}: {so}"));
        let expected = format!("allocprof: free(): double free of sampled block {block}\n");
        assert!(se.contains(&expected), "{backend:?}: stderr {se:?}");
    }
}

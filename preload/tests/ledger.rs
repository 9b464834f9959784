//! The live-sample ledger read from outside the process, as allocprof reads
//! it: the `.note.allocprof` note of type 2 in the library file names the
//! header, `process_vm_readv` copies it and the records twice, and
//! `profiler_common::ledger` decodes them. Programs built with and without
//! frame pointers.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};

use common::{BACKENDS, Backend, apply, c_program_with, library, preloaded, require_tool, run_ok};
use profiler_common::ledger::{
    FLAG_TRUNCATED, FLAG_UNWOUND, HEADER_WORDS, Header, LiveRecord, NOTE_TYPE, RECORD_WORDS,
    Record, decode_header, decode_record,
};

/// Link-time address of the ledger header: the type-2 note's descriptor.
fn header_address(lib: &Path) -> u64 {
    require_tool("objcopy", "binutils");
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!("ledger-note-{}-{n}", std::process::id()));
    // objcopy writes the copy of the library to /dev/null: only the dump is kept.
    run_ok(
        Command::new("objcopy")
            .arg(format!("--dump-section=.note.allocprof={}", out.display()))
            .arg(lib)
            .arg("/dev/null"),
        "objcopy --dump-section",
    );
    let bytes = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).ok();
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let mut at = 0;
    while at + 12 <= bytes.len() {
        let (namesz, descsz, kind) = (word(at), word(at + 4), word(at + 8));
        let name = &bytes[at + 12..at + 12 + namesz];
        let desc = at + 12 + namesz.next_multiple_of(4);
        if name == b"allocprof\0" && kind == NOTE_TYPE as usize && descsz == 8 {
            return u64::from_le_bytes(bytes[desc..desc + 8].try_into().unwrap());
        }
        at = desc + descsz.next_multiple_of(4);
    }
    panic!("{}: no ledger note", lib.display());
}

/// (start, end, path) of each mapping of `pid`.
fn maps(pid: u32) -> Vec<(u64, u64, u64, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (lo, hi) = f[0].split_once('-').unwrap();
            (
                u64::from_str_radix(lo, 16).unwrap(),
                u64::from_str_radix(hi, 16).unwrap(),
                u64::from_str_radix(f[2], 16).unwrap(),
                f.get(5).unwrap_or(&"").to_string(),
            )
        })
        .collect()
}

fn read_words<const N: usize>(pid: u32, addr: u64) -> [u64; N] {
    let mut out = [0u64; N];
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: N * 8,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: N * 8,
    };
    // SAFETY: copies N words of the other process into `out`.
    let n = unsafe { libc::process_vm_readv(pid as i32, &local, 1, &remote, 1, 0) };
    assert_eq!(n, (N * 8) as isize, "process_vm_readv at {addr:#x}");
    out
}

/// The ledger header of `pid` (preloaded with `lib`), read twice as a
/// reader from outside does, and decoded.
fn read_header(pid: u32, lib: &Path) -> Result<Header, profiler_common::ledger::HeaderError> {
    let canonical = lib.canonicalize().unwrap();
    let base = maps(pid)
        .into_iter()
        .find(|(_, _, off, path)| *off == 0 && Path::new(path) == canonical)
        .expect("the library is mapped")
        .0;
    let at = base + header_address(lib);
    decode_header(
        &read_words::<HEADER_WORDS>(pid, at),
        &read_words::<HEADER_WORDS>(pid, at),
    )
}

/// The ledger of `pid` (preloaded with `lib`): its header and every record
/// of its used ranges, decoded.
fn ledger(pid: u32, lib: &Path) -> (Header, Vec<(u64, Record)>) {
    let h = read_header(pid, lib).expect("a header");
    let mut records = Vec::new();
    for (first, n) in h.used_ranges() {
        for id in first..first + n {
            let a = h.record_address(id);
            let r = decode_record(
                &read_words::<RECORD_WORDS>(pid, a),
                &read_words::<RECORD_WORDS>(pid, a),
                &h,
            );
            records.push((id, r));
        }
    }
    (h, records)
}

/// Address and size of `symbol` in `exe` (`nm -S`: link-time, PIE).
fn symbol(exe: &Path, symbol: &str) -> (u64, u64) {
    let out = run_ok(Command::new("nm").arg("-S").arg(exe), "nm -S");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[3] == symbol).then(|| {
                (
                    u64::from_str_radix(f[0], 16).unwrap(),
                    u64::from_str_radix(f[1], 16).unwrap(),
                )
            })
        })
        .unwrap_or_else(|| panic!("no {symbol} in {}", exe.display()))
}

struct Program {
    child: Child,
    out: BufReader<ChildStdout>,
    site: u64,
    blocks: Vec<u64>,
}

impl Program {
    /// `exe` under `backend`, every allocation sampled, with the program's
    /// own settings (`LEDGER_PAUSE_US`, `LEDGER_BLOCKS`).
    fn start(exe: &Path, backend: Backend, settings: &[(&str, &str)]) -> Program {
        let mut cmd = Command::new(exe);
        apply(&mut cmd, preloaded(backend, Some("1")));
        cmd.envs(settings.iter().copied());
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let (mut site, mut blocks) = (0, Vec::new());
        loop {
            let mut line = String::new();
            assert!(out.read_line(&mut line).unwrap() > 0, "program ended early");
            let hex = |s: &str| u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).unwrap();
            if let Some(s) = line.strip_prefix("site ") {
                site = hex(s);
            } else if let Some(b) = line.strip_prefix("block ") {
                blocks.push(hex(b));
            } else if line.starts_with("ready") {
                break;
            }
        }
        Program {
            child,
            out,
            site,
            blocks,
        }
    }

    fn command(&mut self, what: &str, reply: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{what}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), reply);
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// The live records by the block they describe, with their ids.
fn live_by_ptr(records: &[(u64, Record)]) -> HashMap<u64, (u64, LiveRecord)> {
    records
        .iter()
        .filter_map(|&(id, r)| match r {
            Record::Live(l) => Some((l.ptr, (id, l))),
            _ => None,
        })
        .collect()
}

/// Checks every block's record, frees half, checks again. Returns the flags
/// of the records.
fn read_from_outside(exe: &Path, backend: Backend, settings: &[(&str, &str)]) -> Vec<u64> {
    let lib = library(backend);
    let mut p = Program::start(exe, backend, settings);
    let pid = p.child.id();
    let (site_link, site_len) = symbol(exe, "site_b");
    let (main_link, main_len) = symbol(exe, "main");
    let exe_base = p.site - site_link;
    let main = exe_base + main_link;
    let libc_text: Vec<(u64, u64)> = maps(pid)
        .into_iter()
        .filter(|(_, _, _, path)| path.contains("/libc.so"))
        .map(|(lo, hi, _, _)| (lo, hi))
        .collect();
    let (h, records) = ledger(pid, lib);
    assert!(h.used_records() >= p.blocks.len() as u64);
    let garbage = records
        .iter()
        .filter(|(_, r)| *r == Record::Garbage)
        .count();
    assert_eq!(garbage, 0, "{records:?}");
    let live = live_by_ptr(&records);
    let mut flags = Vec::new();
    let mut ids = Vec::new();
    for &b in &p.blocks {
        let (id, r) = *live
            .get(&b)
            .unwrap_or_else(|| panic!("no live record of {b:#x}"));
        assert!((100..164).contains(&r.size), "{r:?}");
        assert!(r.weight >= r.size);
        let frames = r.frames();
        let in_site = frames
            .iter()
            .position(|&f| f > p.site && f <= p.site + site_len)
            .unwrap_or_else(|| panic!("no frame in site_b: {frames:x?} flags {}", r.flags));
        flags.push(r.flags);
        ids.push((id, r.seq));
        if r.flags & (FLAG_TRUNCATED | FLAG_UNWOUND) == FLAG_TRUNCATED {
            // Over the unwinder's budget: cut after malloc's caller.
            assert_eq!(in_site + 1, frames.len(), "{frames:x?}");
            continue;
        }
        // site_b's caller, main, and main's caller in libc.
        let in_main = frames[in_site + 1..]
            .iter()
            .position(|&f| f > main && f <= main + main_len)
            .unwrap_or_else(|| {
                panic!(
                    "no frame in main after site_b: {frames:x?} flags {}",
                    r.flags
                )
            })
            + in_site
            + 1;
        assert!(
            frames[in_main + 1..]
                .iter()
                .any(|&f| libc_text.iter().any(|&(lo, hi)| lo <= f && f < hi)),
            "no frame in libc after main: {frames:x?} flags {}",
            r.flags
        );
    }
    p.command("free", "freed");
    let (_, after) = ledger(pid, lib);
    let after: HashMap<u64, Record> = after.into_iter().collect();
    for (i, &b) in p.blocks.iter().enumerate() {
        let (id, seq) = ids[i];
        let now = &after[&id];
        if i < p.blocks.len() / 2 {
            // Freed: the record says so (unless the slot was reused since,
            // which would show a new allocation under a later sequence).
            match now {
                Record::Free => {}
                Record::Live(l) => assert!(l.seq > seq + 2 && l.ptr == b, "{l:?}"),
                other => panic!("freed block {b:#x}: {other:?}"),
            }
        } else {
            assert!(
                matches!(now, Record::Live(l) if l.ptr == b && l.seq == seq),
                "{now:?}"
            );
        }
    }
    flags
}

#[test]
fn a_program_with_frame_pointers_has_its_blocks_in_the_ledger() {
    let exe = c_program_with("ledger", "ledger_fp", &["-fno-omit-frame-pointer"]);
    for backend in BACKENDS {
        let flags = read_from_outside(&exe, backend, &[]);
        println!("{backend:?}: flags {flags:?}");
        assert!(
            flags
                .iter()
                .all(|f| f & (FLAG_UNWOUND | FLAG_TRUNCATED) == 0),
            "{backend:?}: frame-pointer stacks were unwound or cut: {flags:?}"
        );
    }
}

#[test]
fn a_program_without_frame_pointers_is_unwound_within_a_budget() {
    let exe = c_program_with("ledger", "ledger_nofp", &["-fomit-frame-pointer"]);
    for backend in BACKENDS {
        let unwound = |f: &u64| f & (FLAG_TRUNCATED | FLAG_UNWOUND) == FLAG_UNWOUND;
        let cut = |f: &u64| f & (FLAG_TRUNCATED | FLAG_UNWOUND) == FLAG_TRUNCATED;
        // Paced: the unwinder's budget (100x its own time) lets stacks
        // through; whole stacks reach main and libc (checked above).
        let flags = read_from_outside(&exe, backend, &[("LEDGER_PAUSE_US", "5000")]);
        println!("{backend:?} paced: flags {flags:?}");
        assert!(
            flags.iter().filter(|f| unwound(f)).count() >= flags.len() / 2,
            "{backend:?}: {flags:?}"
        );
        // A short burst at start-up (a heap built at once) is within the
        // budget's burst: every stack whole.
        let flags = read_from_outside(&exe, backend, &[]);
        println!("{backend:?} short burst: flags {flags:?}");
        assert!(flags.iter().all(unwound), "{backend:?}: {flags:?}");
        // A long burst spends it (~10 ms of walks): whole stacks first,
        // then stacks cut after malloc's caller, site_b. (A walk of this
        // shallow stack takes ≈ 0.35 µs with the row cache warm: ≈ 28k fit
        // in the burst, on this machine.)
        let flags = read_from_outside(&exe, backend, &[("LEDGER_BLOCKS", "100000")]);
        let (n_unwound, n_cut) = (
            flags.iter().filter(|f| unwound(f)).count(),
            flags.iter().filter(|f| cut(f)).count(),
        );
        println!("{backend:?} long burst: {n_unwound} unwound, {n_cut} cut");
        assert!(
            unwound(&flags[0]) && n_unwound >= 16,
            "{backend:?}: {n_unwound} unwound"
        );
        assert!(
            n_cut > flags.len() / 3,
            "{backend:?}: {n_cut} cut of {}",
            flags.len()
        );
    }
}

/// `ALLOCPROF_LEDGER=0`: the header is there, its table is not.
#[test]
fn ledger_off_leaves_no_table() {
    let exe = c_program_with("ledger", "ledger_fp", &["-fno-omit-frame-pointer"]);
    let lib = library(Backend::Mimalloc);
    let mut cmd = Command::new(&exe);
    apply(&mut cmd, preloaded(Backend::Mimalloc, Some("1")));
    cmd.env("ALLOCPROF_LEDGER", "off");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("ready") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0);
    }
    assert_eq!(
        read_header(child.id(), lib),
        Err(profiler_common::ledger::HeaderError::Off)
    );
    drop(child.stdin.take());
    child.wait().unwrap();
}

/// `ALLOCPROF_LEDGER=off` holds when the sample region (and with it the
/// ledger) is set up by a malloc in a `.preinit_array` function, before
/// libc has set up `environ`: the switch is read from the process's
/// initial environment then.
#[test]
fn ledger_off_holds_when_the_first_sample_is_taken_before_the_environment_is_set_up() {
    for backend in [Backend::Mimalloc, Backend::Glibc] {
        let exe = common::c_program("preinit", "preinit");
        let lib = library(backend);
        let mut cmd = Command::new(&exe);
        apply(&mut cmd, preloaded(backend, Some("1")));
        cmd.arg("wait").env("ALLOCPROF_LEDGER", "off");
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let mut printed = String::new();
        while !line.starts_with("ready") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "{printed}");
            printed.push_str(&line);
        }
        assert_eq!(
            read_header(child.id(), lib),
            Err(profiler_common::ledger::HeaderError::Off),
            "{backend:?}: {printed}"
        );
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
    }
}

/// A big unsampled block in the region's warm slot (tests/c/region.c
/// `unsampled wait`, at ALLOCPROF_RATE=4m) has no live record: the slot's
/// record stays the retired one of the sample that left it, and the
/// ledger's live blocks are samples only.
#[test]
fn an_unsampled_block_in_the_region_has_no_live_record() {
    for backend in BACKENDS {
        let lib = library(backend);
        let mut cmd = Command::new(common::c_program("region", "region"));
        apply(&mut cmd, preloaded(backend, Some("4m")));
        let mut child = cmd
            .args(["unsampled", "wait"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let (mut line, mut printed) = (String::new(), String::new());
        while !line.starts_with("ready") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "{printed}");
            printed.push_str(&line);
        }
        let held = printed
            .lines()
            .find_map(|l| l.strip_prefix("held 0x"))
            .map(|h| u64::from_str_radix(h, 16).unwrap())
            .unwrap_or_else(|| panic!("{printed}"));
        let (_, records) = ledger(child.id(), lib);
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success(), "{backend:?}");
        let live = live_by_ptr(&records);
        assert!(
            !live.contains_key(&held),
            "{backend:?}: a live record for the unsampled block {held:#x}: {:?}",
            live[&held]
        );
        // The slot was a sample's: its class's records are in use.
        assert!(!records.is_empty(), "{backend:?}: no record in use");
    }
}

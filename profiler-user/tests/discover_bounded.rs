//! Discovery reads what it needs of a mapped file, not the file: a process
//! mapping huge sparse files (one of them with an ELF header claiming an
//! absurd note section) costs allocprof next to nothing. Measured on this
//! test process (the library) and on the allocprof binary run system-wide.

mod common;

use std::{
    io::{BufRead, BufReader},
    os::unix::fs::FileExt,
    path::Path,
    process::{Command, Stdio},
};

use allocprof::process::discover::Scanner;

/// A peak RSS no discovery should come near (the files are 4 GiB each).
const BOUND: u64 = 256 << 20;

const GIB: u64 = 1 << 30;

/// A process's peak resident set (VmHWM), in bytes.
fn peak_rss_of(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM in /proc/self/status");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("VmHWM value");
    kib * 1024
}

fn peak_rss() -> u64 {
    peak_rss_of("self")
}

/// A 64-bit x86_64 ET_DYN header whose `.note.stapsdt` section says it is
/// 3 GiB long, at 4 KiB into the file.
fn hostile_elf_head() -> Vec<u8> {
    let mut f = vec![0u8; 512];
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = 2; // ELFCLASS64
    f[5] = 1; // little-endian
    f[6] = 1; // EV_CURRENT
    f[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
    f[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    f[20..24].copy_from_slice(&1u32.to_le_bytes());
    f[40..48].copy_from_slice(&64u64.to_le_bytes()); // e_shoff
    f[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    f[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
    f[60..62].copy_from_slice(&3u16.to_le_bytes()); // e_shnum
    f[62..64].copy_from_slice(&1u16.to_le_bytes()); // e_shstrndx
    let names = b"\0.shstrtab\0.note.stapsdt\0";
    let names_at = 256u64;
    f[names_at as usize..names_at as usize + names.len()].copy_from_slice(names);
    // sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size.
    let section = |f: &mut Vec<u8>, i: usize, name: u32, kind: u32, offset: u64, size: u64| {
        let at = 64 + i * 64;
        f[at..at + 4].copy_from_slice(&name.to_le_bytes());
        f[at + 4..at + 8].copy_from_slice(&kind.to_le_bytes());
        f[at + 24..at + 32].copy_from_slice(&offset.to_le_bytes());
        f[at + 32..at + 40].copy_from_slice(&size.to_le_bytes());
        f[at + 48..at + 56].copy_from_slice(&4u64.to_le_bytes()); // sh_addralign
    };
    section(&mut f, 1, 1, 3, names_at, names.len() as u64); // SHT_STRTAB
    section(&mut f, 2, 11, 7, 4096, 3 * GIB); // SHT_NOTE
    f
}

/// A real sparse file of `len` bytes beginning with `head`.
fn sparse(path: &Path, head: &[u8], len: u64) {
    let file = std::fs::File::create(path).unwrap();
    file.write_all_at(head, 0).unwrap();
    file.set_len(len).unwrap();
}

/// A process mapping a 4 GiB sparse data file and a 4 GiB sparse file with
/// a hostile ELF header; removed (and killed) on drop.
struct MapsHugeFiles {
    child: std::process::Child,
    files: [std::path::PathBuf; 2],
}

impl MapsHugeFiles {
    fn start(name: &str) -> MapsHugeFiles {
        let dir = common::scratch_dir(name);
        let files = [dir.join("data.bin"), dir.join("hostile.so")];
        sparse(&files[0], b"not an ELF file, just data", 4 * GIB);
        sparse(&files[1], &hostile_elf_head(), 4 * GIB);
        let exe = common::compile_c("map_files.c", &[]);
        let mut child = Command::new(exe)
            .args(&files)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "the mapping process failed");
        MapsHugeFiles { child, files }
    }
}

impl Drop for MapsHugeFiles {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

#[test]
fn discovery_of_huge_sparse_mappings_stays_bounded() {
    let target = MapsHugeFiles::start("discover-bounded-lib");
    let before = peak_rss();
    let found = Scanner::default()
        .probe_files(allocprof::ids::Pid(target.child.id()))
        .unwrap();
    let grown = peak_rss().saturating_sub(before);
    assert!(found.is_empty(), "no probes there: {found:?}");
    assert!(
        grown < BOUND,
        "discovery of two 4 GiB sparse mappings raised the peak RSS by {} MiB",
        grown >> 20
    );
}

#[test]
fn allocprof_system_wide_stays_small_next_to_huge_sparse_mappings() {
    common::require_bpf();
    let _target = MapsHugeFiles::start("discover-bounded-bin");
    let mut allocprof = Command::new(env!("CARGO_BIN_EXE_allocprof"))
        .args(["--duration", "60s", "--format", "collapsed"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It says so once its scan of every process is done.
    let mut said = String::new();
    for line in BufReader::new(allocprof.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        said.push_str(&line);
        said.push('\n');
        if line.contains("attached") {
            break;
        }
    }
    let peak = peak_rss_of(&allocprof.id().to_string());
    let _ = allocprof.kill();
    let _ = allocprof.wait();
    assert!(
        said.contains("attached"),
        "allocprof did not start:\n{said}"
    );
    assert!(
        peak < BOUND,
        "allocprof's peak RSS after scanning every process is {} MiB",
        peak >> 20
    );
}

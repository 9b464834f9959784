//! Discovery reads what it needs of a mapped file, not the file: a process
//! mapping huge sparse files (one of them with an ELF header claiming an
//! absurd note section) costs allocprof next to nothing. The only test of
//! its binary, so the process's peak RSS is this test's.

mod common;

use std::{
    io::{BufRead, BufReader},
    os::unix::fs::FileExt,
    path::Path,
    process::{Command, Stdio},
};

use profiler_user::discover::Scanner;

const GIB: u64 = 1 << 30;

/// The process's peak resident set (VmHWM), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
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

#[test]
fn discovery_of_huge_sparse_mappings_stays_bounded() {
    let dir = common::scratch_dir("discover-bounded");
    let data = dir.join("data.bin");
    let elf = dir.join("hostile.so");
    sparse(&data, b"not an ELF file, just data", 4 * GIB);
    sparse(&elf, &hostile_elf_head(), 4 * GIB);

    let exe = common::compile_c("map_files.c", &[]);
    let mut child = Command::new(exe)
        .arg(&data)
        .arg(&elf)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "the mapping process failed");

    let before = peak_rss();
    let found = Scanner::default().probe_files(child.id()).unwrap();
    let grown = peak_rss().saturating_sub(before);
    let _ = child.kill();
    let _ = child.wait();
    std::fs::remove_file(&data).unwrap();
    std::fs::remove_file(&elf).unwrap();

    assert!(found.is_empty(), "no probes there: {found:?}");
    assert!(
        grown < 64 << 20,
        "discovery of two 4 GiB sparse mappings raised the peak RSS by {} MiB",
        grown >> 20
    );
}

//! The USDT probes: notes as readelf sees them, the probe sites (a 5-byte NOP
//! and a 1-byte `nop` per probe), and bpftrace actually receiving the events.

mod common;

use std::{process::Command, time::Duration};

use common::{
    BACKENDS, Backend, Bpftrace, apply, c_program, field, library, output_within, preloaded,
    require_tool, run_ok,
};

struct Probe {
    name: String,
    pc: u64,
    args: String,
}

fn probes(lib: &std::path::Path) -> Vec<Probe> {
    require_tool("readelf", "binutils");
    let out = run_ok(Command::new("readelf").arg("-n").arg(lib), "readelf -n");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut probes = Vec::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if line != "Provider: otel_memory" {
            continue;
        }
        let name = lines
            .next()
            .unwrap()
            .strip_prefix("Name: ")
            .unwrap()
            .to_string();
        let loc = lines.next().unwrap();
        let pc = loc
            .strip_prefix("Location: 0x")
            .and_then(|s| s.split(',').next())
            .map(|h| u64::from_str_radix(h, 16).unwrap())
            .expect("Location line");
        assert!(loc.contains("Semaphore: 0x0000000000000000"), "{loc}");
        let args = lines
            .next()
            .unwrap()
            .strip_prefix("Arguments: ")
            .unwrap()
            .to_string();
        probes.push(Probe { name, pc, args });
    }
    probes
}

/// File offset of virtual address `addr`, from the section headers.
fn file_offset(lib: &std::path::Path, addr: u64) -> u64 {
    let out = run_ok(Command::new("readelf").arg("-SW").arg(lib), "readelf -SW");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(rest) = line.trim_start().strip_prefix('[') else {
            continue;
        };
        let fields: Vec<&str> = rest
            .split(']')
            .nth(1)
            .unwrap_or("")
            .split_whitespace()
            .collect();
        if fields.len() < 5 || fields[1] != "PROGBITS" {
            continue;
        }
        let (Ok(sh_addr), Ok(off), Ok(size)) = (
            u64::from_str_radix(fields[2], 16),
            u64::from_str_radix(fields[3], 16),
            u64::from_str_radix(fields[4], 16),
        ) else {
            continue;
        };
        if sh_addr != 0 && (sh_addr..sh_addr + size).contains(&addr) {
            return addr - sh_addr + off;
        }
    }
    panic!(
        "address {addr:#x} not in any PROGBITS section of {}",
        lib.display()
    );
}

#[test]
fn notes_declare_both_probes_with_their_arguments() {
    for backend in BACKENDS {
        let lib = library(backend);
        let probes = probes(lib);
        let mut names: Vec<_> = probes
            .iter()
            .map(|p| (p.name.as_str(), p.args.as_str()))
            .collect();
        names.sort();
        let mut expected = vec![
            ("alloc", "8@%rdi 8@%rsi 8@%rdx"),
            ("alloc", "8@%rdi 8@%rsi 8@%rdx"),
            ("free", "8@%rdi"),
            ("free", "8@%rdi"),
        ];
        // liballocprof.so also announces what its mimalloc maps.
        if matches!(backend, Backend::Mimalloc) {
            expected.extend([
                ("mmap", "8@%rdi 8@%rsi"),
                ("mmap", "8@%rdi 8@%rsi"),
                ("munmap", "8@%rdi 8@%rsi"),
                ("munmap", "8@%rdi 8@%rsi"),
            ]);
        }
        assert_eq!(
            names,
            expected,
            "exactly two sites (fast and trap) per probe in {}",
            lib.display()
        );
        let out = run_ok(Command::new("readelf").arg("-SW").arg(lib), "readelf -SW");
        assert!(String::from_utf8_lossy(&out.stdout).contains(".stapsdt.base"));
    }
}

/// Each probe has a fast site, a 5-byte NOP (the kernel optimizes a uprobe
/// on it into a call), and a trap site, a 1-byte `nop` (never optimized:
/// the site a fork child of an optimized process uses; see
/// `allocator/src/usdt.rs`).
#[test]
fn each_probe_has_a_five_byte_nop_site_and_a_one_byte_nop_site() {
    for backend in BACKENDS {
        let lib = library(backend);
        let bytes = std::fs::read(lib).unwrap();
        let names: &[&str] = match backend {
            Backend::Mimalloc => &["alloc", "free", "mmap", "munmap"],
            Backend::Glibc => &["alloc", "free"],
        };
        for &name in names {
            let mut sites: Vec<&[u8]> = probes(lib)
                .iter()
                .filter(|p| p.name == name)
                .map(|p| {
                    let off = file_offset(lib, p.pc) as usize;
                    if bytes[off] == 0x90 {
                        &bytes[off..off + 1]
                    } else {
                        &bytes[off..off + 5]
                    }
                })
                .collect();
            sites.sort();
            assert_eq!(
                sites,
                [&[0x0f, 0x1f, 0x44, 0x00, 0x00][..], &[0x90][..]],
                "{name} sites in {}",
                lib.display()
            );
        }
    }
}

#[test]
fn library_uses_static_tls() {
    for backend in BACKENDS {
        let out = run_ok(
            Command::new("readelf").arg("-d").arg(library(backend)),
            "readelf -d",
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("STATIC_TLS"), "{text}");
    }
}

fn bpftrace_sees_events(backend: Backend) {
    let lib = library(backend);
    // `comm` is the executable name truncated to 15 characters.
    let exe_name = "usdt_probes";
    let exe = c_program("probes", exe_name);
    let script = format!(
        "usdt:{lib}:otel_memory:alloc /comm == \"{exe_name}\"/ {{ printf(\"A %lu %lu %lu\\n\", arg0, arg1, arg2); }}\n\
         usdt:{lib}:otel_memory:free /comm == \"{exe_name}\"/ {{ printf(\"F %lu\\n\", arg0); }}\n",
        lib = lib.display()
    );
    // Not `bpftrace -c`: it resolves USDT locations in the child before exec,
    // when the preloaded library is not mapped yet.
    let bt = Bpftrace::attach(&script);
    const N: u64 = 40;
    let mut cmd = Command::new(&exe);
    cmd.arg(N.to_string());
    apply(&mut cmd, preloaded(backend, Some("1")));
    run_ok(&mut cmd, "probes program");
    let rest = bt.stop();

    let mut allocs = Vec::new();
    let mut frees = Vec::new();
    for line in rest.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["A", p, s, w] => allocs.push((
                p.parse::<u64>().unwrap(),
                s.parse::<u64>().unwrap(),
                w.parse::<u64>().unwrap(),
            )),
            ["F", p] => frees.push(p.parse::<u64>().unwrap()),
            _ => {}
        }
    }
    let big: Vec<_> = allocs.iter().filter(|a| a.1 >= 1 << 20).collect();
    assert!(
        big.len() as u64 >= N,
        "{backend:?}: {} large alloc events:\n{rest}",
        big.len()
    );
    for i in 0..N {
        let size = (1 << 20) + i * 4096;
        let ev = big
            .iter()
            .find(|a| a.1 == size)
            .unwrap_or_else(|| panic!("no alloc event of size {size}"));
        // At R = 1 byte the weight of a big block is its size.
        assert_eq!(ev.2, size, "weight at rate 1");
        assert!(
            frees.contains(&ev.0),
            "block {:#x} freed without a free event",
            ev.0
        );
    }
    assert!(frees.len() as u64 >= N);
}

#[test]
fn bpftrace_receives_alloc_and_free_events() {
    // Sequential: both attach to probes filtered by the same comm.
    for backend in BACKENDS {
        bpftrace_sees_events(backend);
    }
}

/// Fork children (and a grandchild) of a process whose probes fired under an
/// attached tracer all exit 0, with both libraries: on Linux 6.18+ the
/// parent's fast sites are calls to its `[uprobes-trampoline]` page, which
/// fork does not copy, so a child must use the trap sites. Before they
/// existed, every child died of SIGSEGV at its first sample.
#[test]
fn fork_children_of_a_traced_process_survive_their_samples() {
    for backend in BACKENDS {
        let lib = library(backend);
        let exe_name = "usdt_forks";
        let exe = c_program("forks", exe_name);
        let script = format!(
            "usdt:{lib}:otel_memory:alloc /comm == \"{exe_name}\"/ {{ @a = count(); }}\n\
             usdt:{lib}:otel_memory:free /comm == \"{exe_name}\"/ {{ @f = count(); }}\n",
            lib = lib.display()
        );
        let bt = Bpftrace::attach(&script);
        let mut cmd = Command::new(&exe);
        cmd.arg("20");
        apply(&mut cmd, preloaded(backend, Some("1")));
        let out = output_within(&mut cmd, Duration::from_secs(20), "forks program");
        let counts = bt.stop();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("crashed 0"),
            "{backend:?}: {}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        if stdout.contains("trampoline no") {
            eprintln!("{backend:?}: this kernel does not optimize uprobes: nothing to inherit");
        }
        // The children's samples reach the tracer too: 21 processes x 1000+.
        let count = |name: &str| -> u64 {
            counts
                .lines()
                .find_map(|l| l.strip_prefix(&format!("@{name}: ")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        assert!(
            count("a") >= 21 * 1000 && count("f") >= 21 * 1000,
            "{backend:?}: events {counts}"
        );
    }
}

/// Big unsampled blocks served from the region's warm slot fire no probe:
/// every alloc event is a sample the program counted, every free event a
/// sampled block it freed, and at the slot alloc and free events pair up,
/// while more unsampled blocks than sampled ones came and went there.
#[test]
fn unsampled_blocks_in_the_region_fire_no_probe() {
    for backend in BACKENDS {
        let lib = library(backend);
        let exe_name = "usdt_unsampled";
        let exe = c_program("region", exe_name);
        let script = format!(
            "usdt:{lib}:otel_memory:alloc /comm == \"{exe_name}\"/ {{ printf(\"A %lu\\n\", arg0); }}\n\
             usdt:{lib}:otel_memory:free /comm == \"{exe_name}\"/ {{ printf(\"F %lu\\n\", arg0); }}\n",
            lib = lib.display()
        );
        let bt = Bpftrace::attach(&script);
        let mut cmd = Command::new(&exe);
        cmd.arg("unsampled");
        apply(&mut cmd, preloaded(backend, Some("4m")));
        let text = String::from_utf8_lossy(&run_ok(&mut cmd, "unsampled").stdout).into_owned();
        let events = bt.stop();
        assert!(text.contains("unsampled ok"), "{backend:?}: {text}");
        let slot = field(&text, "slot");
        let (mut allocs, mut frees, mut at_slot) = (0, 0, (0, 0));
        for line in events.lines() {
            match line.split_whitespace().collect::<Vec<_>>().as_slice() {
                ["A", p] => {
                    allocs += 1;
                    at_slot.0 += u64::from(p.parse::<u64>().unwrap() == slot);
                }
                ["F", p] => {
                    frees += 1;
                    at_slot.1 += u64::from(p.parse::<u64>().unwrap() == slot);
                }
                _ => {}
            }
        }
        println!(
            "{backend:?}: {allocs} alloc and {frees} free events, {at_slot:?} at the slot; {}",
            text.trim()
        );
        assert!(!events.contains("Lost"), "{backend:?}: {events}");
        assert_eq!(allocs, field(&text, "sampled"), "{backend:?}: {text}");
        assert_eq!(frees, field(&text, "freed"), "{backend:?}: {text}");
        assert_eq!(at_slot.0, at_slot.1, "{backend:?}: {text}");
        assert!(
            at_slot.0 >= field(&text, "sampled_big"),
            "{backend:?}: {text}"
        );
        assert!(field(&text, "unsampled") >= 9, "{backend:?}: {text}");
    }
}

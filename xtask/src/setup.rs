//! Toolchain bootstrap and kernel checks. Installs only what is missing.

use std::{fs, path::Path, process::Command};

use anyhow::Result;

use crate::{shell, toolchain};

pub const BPF_LINKER_VERSION: &str = "0.10.3";

/// Installs the pinned nightly (with rust-src and clippy) and `bpf-linker`
/// when missing, then reports kernel features. `verbose` prints the report
/// even when all is well (for `cargo xtask setup`).
pub fn run(root: &Path, verbose: bool) -> Result<()> {
    let nightly = toolchain::ensure_nightly(root)?;
    ensure_bpf_linker(root, &nightly)?;
    let missing: Vec<Check> = kernel_checks().into_iter().filter(|c| !c.ok).collect();
    if verbose || !missing.is_empty() {
        report(&missing);
    }
    Ok(())
}

fn ensure_bpf_linker(root: &Path, nightly: &str) -> Result<()> {
    let want = format!("bpf-linker {BPF_LINKER_VERSION}");
    let have = Command::new("bpf-linker").arg("--version").output();
    if let Ok(out) = &have
        && String::from_utf8_lossy(&out.stdout).contains(&want)
    {
        return Ok(());
    }
    eprintln!("setup: installing {want} (builds against {nightly}'s LLVM, about a minute)");
    shell::run(
        root,
        "cargo",
        &[
            &toolchain::plus(nightly),
            "install",
            "--locked",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
        ],
    )
}

struct Check {
    what: &'static str,
    ok: bool,
    fix: &'static str,
}

fn kernel_checks() -> Vec<Check> {
    vec![
        Check {
            what: "BPF syscall",
            ok: bpf_syscall_exists(),
            fix: "a kernel built with CONFIG_BPF_SYSCALL=y",
        },
        Check {
            what: "BTF (/sys/kernel/btf/vmlinux)",
            ok: Path::new("/sys/kernel/btf/vmlinux").exists(),
            fix: "a kernel built with CONFIG_DEBUG_INFO_BTF=y",
        },
        Check {
            what: "uprobe perf PMU (/sys/bus/event_source/devices/uprobe)",
            ok: Path::new("/sys/bus/event_source/devices/uprobe/type").exists(),
            fix: "a kernel built with CONFIG_UPROBE_EVENTS=y",
        },
        Check {
            what: "privileges (root, or CAP_BPF + CAP_PERFMON)",
            ok: has_bpf_privileges(),
            fix: "run as root (allocprof and its BPF tests load kernel programs)",
        },
    ]
}

fn report(missing: &[Check]) {
    if missing.is_empty() {
        eprintln!("setup: eBPF toolchain present; kernel has BPF, BTF and uprobes");
        return;
    }
    eprintln!("setup: this machine lacks what allocprof's profiler needs:");
    for c in missing {
        eprintln!("  - {}: missing; needs {}", c.what, c.fix);
    }
    eprintln!("  building works; profiling and the BPF tests will fail until this is fixed");
}

fn bpf_syscall_exists() -> bool {
    // An invalid command: ENOSYS means no BPF syscall at all; anything else
    // (EINVAL, EPERM) means the syscall is there.
    // SAFETY: bpf() with a null attribute pointer and size 0 reads nothing.
    let r = unsafe { libc::syscall(libc::SYS_bpf, 0xffff, std::ptr::null::<u8>(), 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS)
}

fn has_bpf_privileges() -> bool {
    if shell::is_root() {
        return true;
    }
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let Ok(status) = fs::read_to_string("/proc/self/status") else {
        return false;
    };
    let Some(eff) = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    else {
        return false;
    };
    let has = |cap: u32| eff & (1 << cap) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

//! SystemTap SDT (v3) probes without `sys/sdt.h`.
//!
//! Each probe has two sites, both declared in `.note.stapsdt` with the same
//! provider, name and arguments:
//!
//! - the *fast* site, a 5-byte NOP (`0f 1f 44 00 00`): on the first hit the
//!   kernel (6.18+, `arch_uprobe_optimize`) rewrites it into a `call` to a
//!   per-process `[uprobes-trampoline]` page (~0.7 µs per hit, no trap);
//! - the *trap* site, the 1-byte `nop` of `sys/sdt.h`, which the kernel never
//!   optimizes (only 5-byte NOPs qualify): always an int3 trap, after which
//!   the kernel emulates the `nop` (measured ~0.2 µs per hit more than the
//!   fast site; see docs/benchmarks.md).
//!
//! The trampoline mapping is `VM_DONTCOPY`, but the rewritten text page is an
//! anonymous copy that fork does copy: a fork child of a process whose fast
//! site was optimized inherits `call <trampoline>` and no trampoline, and
//! would die of SIGSEGV at its first sample. So before using a fast site, a
//! process checks it: a site that does not hold a `call` yet (NOP, or the
//! kernel's int3) is its own from then on (the kernel can only optimize it
//! in this process's memory after a hit here); one that already holds a
//! `call` the first time this process looks was inherited, and the process
//! uses the trap site instead for the rest of its life. The verdict lives in
//! the pid page (`MADV_WIPEONFORK`), so every fork child decides afresh.
//! Without that page a `call` always means the trap site.
//!
//! The note layout is the one `sys/sdt.h` emits: `.note.stapsdt`, type 3,
//! owner "stapsdt", desc = pc, `_.stapsdt.base` address, semaphore (0 =
//! none), provider, name, args.
//!
//! The site functions are `#[inline(never)]` and non-generic, and each fast
//! one defines a hidden data symbol holding its site's address (a duplicate
//! would not link), so each probe has exactly two sites in any binary that
//! links this crate.

use core::sync::atomic::{AtomicU8, Ordering};

use crate::thread_state;

/// Emit one SDT probe site plus its note. `$site` is the assembly of the
/// site: local label `990:` on the probe instruction. Operands follow the
/// args string; the caller pins them to the registers the args string names.
#[macro_export]
macro_rules! usdt_probe {
    ($site:literal, $provider:literal, $name:literal, $args:literal, $($operands:tt)*) => {
        ::core::arch::asm!(
            $site,
            ".pushsection .note.stapsdt,\"\",\"note\"",
            ".balign 4",
            ".4byte 992f-991f, 994f-993f, 3",
            "991: .asciz \"stapsdt\"",
            "992: .balign 4",
            "993: .8byte 990b",
            ".8byte _.stapsdt.base",
            ".8byte 0",
            concat!(".asciz \"", $provider, "\""),
            concat!(".asciz \"", $name, "\""),
            concat!(".asciz \"", $args, "\""),
            "994: .balign 4",
            ".popsection",
            // One-byte anchor that lets consumers detect prelink-style
            // address shifts; retained ("R") because only the non-alloc
            // note refers to it and --gc-sections would drop it otherwise.
            ".ifndef _.stapsdt.base",
            ".pushsection .stapsdt.base,\"aGR\",\"progbits\",.stapsdt.base,comdat",
            ".weak _.stapsdt.base",
            ".hidden _.stapsdt.base",
            "_.stapsdt.base: .space 1",
            ".size _.stapsdt.base, 1",
            ".popsection",
            ".endif",
            $($operands)*
        )
    };
}

// The fast sites' addresses, each in a read-only data word that the fast
// site's asm defines (hidden: nothing is exported, and no symbol lands in
// the text, where it would rename the site function for symbolizers).
unsafe extern "C" {
    static allocprof_usdt_alloc_fast_site: *const u8;
    static allocprof_usdt_free_fast_site: *const u8;
}

/// Per-process verdict on a fast site, in the pid page (0 after fork).
const UNDECIDED: u8 = 0;
const OWN: u8 = 1;
const INHERITED: u8 = 2;
const CALL_OPCODE: u8 = 0xe8;

/// May this process execute the fast site at `site` (state byte `index`)?
/// Slow path only; once decided, one load of the verdict byte. Indices: 0
/// `alloc`, 1 `free`, 2 and 3 `mmap` and `munmap` (liballocprof.so's, in
/// its own crate: only it has those probes); at most 64.
#[inline(always)]
pub fn fast_site_usable(site: *const u8, index: usize) -> bool {
    let verdict = thread_state::fork_local_byte(index);
    if let Some(v) = verdict {
        match v.load(Ordering::Acquire) {
            OWN => return true,
            INHERITED => return false,
            _ => {}
        }
    }
    decide(site, verdict)
}

#[cold]
#[inline(never)]
fn decide(site: *const u8, verdict: Option<&AtomicU8>) -> bool {
    // SAFETY: `site` is the address of a probe instruction in our own
    // mapped, readable text; volatile because the kernel rewrites it.
    let opcode = unsafe { core::ptr::read_volatile(site) };
    let Some(v) = verdict else {
        // No fork-local memory: trust only an unoptimized site.
        return opcode != CALL_OPCODE;
    };
    if opcode != CALL_OPCODE {
        // Recorded before the first hit, so a thread that later sees the
        // `call` this hit may produce also sees OWN (x86 keeps loads and
        // stores in order: the text byte is read before the verdict).
        let _ = v.compare_exchange(UNDECIDED, OWN, Ordering::AcqRel, Ordering::Acquire);
        return v.load(Ordering::Acquire) == OWN;
    }
    match v.compare_exchange(UNDECIDED, INHERITED, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => false,
        Err(current) => current == OWN,
    }
}

/// `otel_memory:alloc(ptr, size, weight)`: a sampled block went live.
#[inline(always)]
pub fn alloc(ptr: usize, size: usize, weight: u64) {
    // SAFETY: a pointer the linker initialised (see `alloc_fast`), never written.
    let site = unsafe { allocprof_usdt_alloc_fast_site };
    if fast_site_usable(site, 0) {
        alloc_fast(ptr, size, weight)
    } else {
        alloc_trap(ptr, size, weight)
    }
}

/// `otel_memory:free(ptr)`: a sampled block was released.
#[inline(always)]
pub fn free(ptr: usize) {
    // SAFETY: a pointer the linker initialised (see `free_fast`), never written.
    let site = unsafe { allocprof_usdt_free_fast_site };
    if fast_site_usable(site, 1) {
        free_fast(ptr)
    } else {
        free_trap(ptr)
    }
}

// A named symbol, defined once: the function is never inlined nor generic.
#[allow(named_asm_labels)]
#[inline(never)]
fn alloc_fast(ptr: usize, size: usize, weight: u64) {
    // SAFETY: the asm is a NOP plus assembler directives that only add
    // data to other sections; it reads the three registers and touches
    // neither memory nor the stack nor flags.
    unsafe {
        usdt_probe!(
            "990: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n.pushsection .data.rel.ro.allocprof_usdt_alloc_fast_site,\"aw\"\n.balign 8\n.globl allocprof_usdt_alloc_fast_site\n.hidden allocprof_usdt_alloc_fast_site\nallocprof_usdt_alloc_fast_site: .8byte 990b\n.popsection",
            "otel_memory", "alloc", "8@%rdi 8@%rsi 8@%rdx",
            in("rdi") ptr, in("rsi") size, in("rdx") weight,
            options(nomem, nostack, preserves_flags)
        );
    }
}

#[inline(never)]
fn alloc_trap(ptr: usize, size: usize, weight: u64) {
    // SAFETY: as in `alloc_fast`.
    unsafe {
        usdt_probe!(
            "990: nop",
            "otel_memory", "alloc", "8@%rdi 8@%rsi 8@%rdx",
            in("rdi") ptr, in("rsi") size, in("rdx") weight,
            options(nomem, nostack, preserves_flags)
        );
    }
}

// A named symbol, defined once: the function is never inlined nor generic.
#[allow(named_asm_labels)]
#[inline(never)]
fn free_fast(ptr: usize) {
    // SAFETY: as in `alloc_fast`: a NOP plus note data, one register read.
    unsafe {
        usdt_probe!(
            "990: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n.pushsection .data.rel.ro.allocprof_usdt_free_fast_site,\"aw\"\n.balign 8\n.globl allocprof_usdt_free_fast_site\n.hidden allocprof_usdt_free_fast_site\nallocprof_usdt_free_fast_site: .8byte 990b\n.popsection",
            "otel_memory", "free", "8@%rdi",
            in("rdi") ptr,
            options(nomem, nostack, preserves_flags)
        );
    }
}

#[inline(never)]
fn free_trap(ptr: usize) {
    // SAFETY: as in `alloc_fast`.
    unsafe {
        usdt_probe!(
            "990: nop",
            "otel_memory", "free", "8@%rdi",
            in("rdi") ptr,
            options(nomem, nostack, preserves_flags)
        );
    }
}

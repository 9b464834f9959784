//! SystemTap SDT (v3) probes without `sys/sdt.h`.
//!
//! Each probe site is a 5-byte NOP (`0f 1f 44 00 00`): the kernel can
//! optimise a uprobe on it into a jump (~0.7 µs per hit) where the 1-byte
//! `nop` of `sys/sdt.h` costs an int3 trap (~11 µs). The note layout is the
//! one `sys/sdt.h` emits: `.note.stapsdt`, type 3, owner "stapsdt", desc =
//! pc, `_.stapsdt.base` address, semaphore (0 = none), provider, name, args.
//!
//! The probe functions are `#[inline(never)]` and non-generic, so each probe
//! has exactly one site in any binary that links this crate.

/// Emit one SDT probe site plus its note. Operands follow the args string;
/// the caller pins them to the registers the args string names.
#[macro_export]
macro_rules! usdt_probe {
    ($provider:literal, $name:literal, $args:literal, $($operands:tt)*) => {
        ::core::arch::asm!(
            "990: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00",
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

/// `otel_memory:alloc(ptr, size, weight)`: a sampled block went live.
#[inline(never)]
pub fn alloc(ptr: usize, size: usize, weight: u64) {
    // SAFETY: the asm is a NOP plus assembler directives that only add
    // data to other sections; it reads the three registers and touches
    // neither memory nor the stack nor flags.
    unsafe {
        usdt_probe!(
            "otel_memory", "alloc", "8@%rdi 8@%rsi 8@%rdx",
            in("rdi") ptr, in("rsi") size, in("rdx") weight,
            options(nomem, nostack, preserves_flags)
        );
    }
}

/// `otel_memory:free(ptr)`: a sampled block was released.
#[inline(never)]
pub fn free(ptr: usize) {
    // SAFETY: as in `alloc`: a NOP plus note data, one register read.
    unsafe {
        usdt_probe!(
            "otel_memory", "free", "8@%rdi",
            in("rdi") ptr,
            options(nomem, nostack, preserves_flags)
        );
    }
}

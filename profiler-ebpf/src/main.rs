//! Kernel side of allocprof: programs on the allocator's `otel_memory` USDT
//! probes and on process lifecycle raw tracepoints. The bodies are thin
//! `try_*` functions; everything that needs no kernel lives in user space.
#![no_std]
#![no_main]
// Atomic adds on shared map values (see probes::add).
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod maps;
mod probes;
mod process;
mod python;
mod unwind;
mod usdt;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";

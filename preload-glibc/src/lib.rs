//! `liballocprof_glibc.so`: the same sampling layer as `liballocprof.so`,
//! passing unsampled allocations through to glibc (`__libc_malloc` & co.,
//! found at run time: the library exports those names itself, see
//! `allocator::backend::resolve_glibc`).

use allocator::backend::{GLIBC_FREE, GLIBC_MALLOC};

allocator::export_c_allocator!(
    allocator::backend::Glibc,
    indirect malloc = GLIBC_MALLOC,
    indirect free = GLIBC_FREE,
);

/// Finds glibc's entry points before `main` and before other libraries'
/// constructors, so the first allocations do not pay for it (an allocation
/// that comes earlier resolves them itself).
#[used]
#[unsafe(link_section = ".init_array")]
static RESOLVE_GLIBC: extern "C" fn() = {
    extern "C" fn resolve() {
        allocator::backend::resolve_glibc();
    }
    resolve
};

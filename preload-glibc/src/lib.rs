//! `liballocprof_glibc.so`: the same sampling layer as `liballocprof.so`,
//! passing unsampled allocations through to glibc (`__libc_malloc` & co.).

use allocator::backend::{__libc_free, __libc_malloc};

allocator::export_c_allocator!(
    allocator::backend::Glibc,
    malloc = __libc_malloc,
    free = __libc_free,
);

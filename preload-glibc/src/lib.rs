//! `liballocprof_glibc.so`: the same sampling layer as `liballocprof.so`,
//! passing unsampled allocations through to glibc (`__libc_malloc` & co.).

allocator::export_c_allocator!(allocator::backend::Glibc);

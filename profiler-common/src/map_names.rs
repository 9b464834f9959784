//! The kernel object's map names, as user space looks them up (the kernel
//! side names each map by its `static`; loading fails on any mismatch).

pub const USDT_SPECS: &str = "USDT_SPECS";
pub const LIVE: &str = "LIVE";
pub const AGGS: &str = "AGGS";
pub const STACKS: &str = "STACKS";
pub const PROCS: &str = "PROCS";
pub const DROPS: &str = "DROPS";
pub const PROC_EVENTS: &str = "PROC_EVENTS";
pub const UNWIND_ROWS: &str = "UNWIND_ROWS";
pub const UNWIND_PROCS: &str = "UNWIND_PROCS";
pub const SEEDED_PIDS: &str = "SEEDED_PIDS";
pub const UNSEEN_FREES: &str = "UNSEEN_FREES";
pub const FOLLOWED: &str = "FOLLOWED";
pub const PY_PROCS: &str = "PY_PROCS";
pub const PY_STACK_PRINTS: &str = "PY_STACK_PRINTS";

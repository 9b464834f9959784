//! The map types as `aya::Pod`, for user space's map reads (feature `user`).

use super::*;
// SAFETY: all of these are #[repr(C)] with only integer fields and explicit
// padding, so every bit pattern is valid and there are no padding bytes.
unsafe impl aya::Pod for LiveKey {}
// SAFETY: as above.
unsafe impl aya::Pod for LiveSample {}
// SAFETY: as above.
unsafe impl aya::Pod for AggKey {}
// SAFETY: as above.
unsafe impl aya::Pod for StackAgg {}
// SAFETY: as above.
unsafe impl aya::Pod for StackTrace {}
// SAFETY: as above.
unsafe impl aya::Pod for ProcCounters {}
// SAFETY: as above.
unsafe impl aya::Pod for ProcEvent {}
// SAFETY: as above.
unsafe impl aya::Pod for UnseenFree {}
// SAFETY: as above.
unsafe impl aya::Pod for UsdtSpec {}
// SAFETY: as above.
unsafe impl aya::Pod for unwind::UnwindRow {}
// SAFETY: as above.
unsafe impl aya::Pod for unwind::UnwindMapping {}
// SAFETY: as above.
unsafe impl aya::Pod for unwind::ProcUnwind {}
// SAFETY: as above.
unsafe impl aya::Pod for unwind::UnwindCacheEntry {}
// SAFETY: as above.
unsafe impl aya::Pod for python::PyProcConfig {}
// SAFETY: as above.
unsafe impl aya::Pod for python::PyStackPrints {}
// SAFETY: as above.
unsafe impl aya::Pod for python::PyCodePrint {}

//! The profile model and its statistics: unbiased estimates, their
//! intervals, and the ages of live samples. Pure: no I/O.

pub mod age;
pub mod profile;
pub mod stats;

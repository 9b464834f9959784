//! The ids the profiler passes around, each a type of its own so that one
//! is never taken for another: a host pid (the kernel's) for one of ours, a
//! thread-group id where a live thread is needed, an incarnation for a pid.
//! The kernel-facing `#[repr(C)]` types of `profiler_common` keep plain
//! integers; they become these where they are read.

use std::fmt;

/// A pid as the kernel sees it: of the initial pid namespace, what the
/// eBPF maps and events carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPid(pub u32);

/// A pid of allocprof's own pid namespace: what its `/proc`, `--pid` and
/// the reports speak (the same as the host's outside a container).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pid(pub u32);

/// A thread id (of our namespace): a live thread of a process, through
/// which its memory is read and its per-process probes follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tid(pub u32);

/// Which incarnation of a pid a process is: a pid, once reused, is another
/// process (whose stack ids may coincide with the old one's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Incarnation(pub u64);

/// Identity of a file on disk, independent of the path it was reached by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

macro_rules! display_number {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    )*};
}
display_number!(HostPid, Pid, Tid, Incarnation);

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}:{}", self.dev, self.ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_show_as_their_numbers() {
        assert_eq!(HostPid(42).to_string(), "42");
        assert_eq!(Pid(7).to_string(), "7");
        assert_eq!(Tid(8).to_string(), "8");
        assert_eq!(Incarnation(3).to_string(), "3");
        assert_eq!(
            FileId {
                dev: 0x803,
                ino: 12
            }
            .to_string(),
            "803:12"
        );
    }
}

//! The kernel programs see host pids; allocprof may run in a pid namespace
//! (a container, a sidecar sharing a pod's namespace) whose `/proc`, `--pid`
//! and reports speak that namespace's pids. This maps one to the other.
//!
//! Outside the initial pid namespace no interface tells an unprivileged view
//! the host pid of a process (its `/proc` lists only the namespace's levels,
//! and the kernel side must not change), so a host pid is recognised by what
//! the kernel recorded for it: the probe-site address its stacks start at.
//! Address-space layouts are randomized per exec, so exactly one of the
//! namespace's probe-carrying processes maps a probe file there; when
//! several do (fork children share their parent's layout), the pid stays
//! unmapped rather than guessed.

use std::collections::HashMap;

use crate::{
    ids::{FileId, HostPid, Pid},
    process::normalize::AddressSpace,
};

/// The inode of the initial pid namespace (`PROC_PID_INIT_INO`).
const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// Host pids ↔ pids of allocprof's own pid namespace.
#[derive(Debug, Default)]
pub struct PidMap {
    /// In the initial namespace, the pids are the same.
    translating: bool,
    to_local: HashMap<HostPid, Pid>,
    to_host: HashMap<Pid, HostPid>,
}

impl PidMap {
    /// For the namespace this process runs in.
    pub(crate) fn detect() -> PidMap {
        if in_initial_pid_namespace() {
            PidMap::identity()
        } else {
            PidMap::translating()
        }
    }

    pub fn identity() -> PidMap {
        PidMap::default()
    }

    pub(crate) fn translating() -> PidMap {
        PidMap {
            translating: true,
            ..PidMap::default()
        }
    }

    pub(crate) fn is_identity(&self) -> bool {
        !self.translating
    }

    /// Our pid of a host pid, if known.
    pub(crate) fn local(&self, host: HostPid) -> Option<Pid> {
        if self.translating {
            self.to_local.get(&host).copied()
        } else {
            Some(Pid(host.0))
        }
    }

    /// The host pid of one of ours, if known.
    pub fn host(&self, local: Pid) -> Option<HostPid> {
        if self.translating {
            self.to_host.get(&local).copied()
        } else {
            Some(HostPid(local.0))
        }
    }

    /// Whether our pid `local` has its host pid.
    pub(crate) fn is_mapped(&self, local: Pid) -> bool {
        self.host(local).is_some()
    }

    pub fn insert(&mut self, host: HostPid, local: Pid) {
        if self.translating {
            self.to_local.insert(host, local);
            self.to_host.insert(local, host);
        }
    }

    /// Forgets a process that is gone (its pid may be reused).
    pub(crate) fn remove_local(&mut self, local: Pid) {
        if let Some(host) = self.to_host.remove(&local) {
            self.to_local.remove(&host);
        }
    }
}

/// Whether this process runs in the initial pid namespace (or cannot tell).
pub(crate) fn in_initial_pid_namespace() -> bool {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata("/proc/self/ns/pid") {
        Ok(ns) => ns.ino() == INIT_PID_NS_INO,
        Err(_) => true,
    }
}

/// The pid namespace of process `pid` (ours) when it is not the initial one:
/// (the kernel's `dev_t` of its nsfs file, its inode), as
/// `bpf_get_ns_current_pid_tgid` takes them. None in the initial namespace,
/// or when it cannot be read (a `stat` of a `/proc` link: never blocks).
pub(crate) fn process_namespace(pid: Pid) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let ns = std::fs::metadata(format!("/proc/{}/ns/pid", pid.0)).ok()?;
    if ns.ino() == INIT_PID_NS_INO {
        return None;
    }
    // stat's encoding of the device to the kernel's (MAJOR << 20 | MINOR).
    let dev = ns.dev();
    let (major, minor) = (u64::from(libc::major(dev)), u64::from(libc::minor(dev)));
    Some((major << 20 | minor, ns.ino()))
}

/// The outcome of [`correlate`].
#[derive(Debug, PartialEq, Eq)]
pub enum Correlation {
    /// Exactly this candidate matches.
    Unique(Pid),
    /// No candidate matches (yet: the process may not have been scanned).
    None,
    /// Several match: their layouts are the same.
    Ambiguous(Vec<Pid>),
}

/// Which candidate process (our pid, its address space) places every one of
/// `addresses` (the first frames of a host pid's stacks: probe sites) in a
/// file for which `is_probe_file` holds.
pub(crate) fn correlate<'a>(
    addresses: &[u64],
    candidates: impl IntoIterator<Item = (Pid, &'a AddressSpace)>,
    is_probe_file: impl Fn(FileId) -> bool,
) -> Correlation {
    if addresses.is_empty() {
        return Correlation::None;
    }
    let matching: Vec<Pid> = candidates
        .into_iter()
        .filter(|(_, space)| {
            addresses.iter().all(|&addr| {
                space
                    .normalize(addr)
                    .and_then(|at| at.file.open.as_ref().map(|f| f.id))
                    .is_some_and(&is_probe_file)
            })
        })
        .map(|(pid, _)| pid)
        .collect();
    match matching.as_slice() {
        [] => Correlation::None,
        [pid] => Correlation::Unique(*pid),
        _ => Correlation::Ambiguous(matching),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_outside_namespaces() {
        let map = PidMap::identity();
        assert_eq!(map.local(HostPid(42)), Some(Pid(42)));
        assert_eq!(map.host(Pid(42)), Some(HostPid(42)));
    }

    #[test]
    fn translation_both_ways_and_forgetting() {
        let mut map = PidMap::translating();
        assert_eq!(map.local(HostPid(4242)), None);
        map.insert(HostPid(4242), Pid(2));
        assert_eq!(map.local(HostPid(4242)), Some(Pid(2)));
        assert_eq!(map.host(Pid(2)), Some(HostPid(4242)));
        map.remove_local(Pid(2));
        assert_eq!(map.local(HostPid(4242)), None);
        assert_eq!(map.host(Pid(2)), None);
    }

    #[test]
    fn correlation_needs_one_probe_file_at_the_addresses() {
        // Our own address space: this function's address is in our
        // executable; say the executable carries the probes.
        let ours = AddressSpace::read(Pid(std::process::id())).unwrap();
        let addr = correlation_needs_one_probe_file_at_the_addresses as *const () as u64;
        let exe = ours.normalize(addr).unwrap().file.open.clone().unwrap().id;
        let elsewhere = AddressSpace::default();
        let probe = |id: FileId| id == exe;
        assert_eq!(
            correlate(&[addr], [(Pid(7), &elsewhere), (Pid(2), &ours)], probe),
            Correlation::Unique(Pid(2))
        );
        assert_eq!(
            correlate(&[addr], [(Pid(2), &ours), (Pid(3), &ours)], probe),
            Correlation::Ambiguous(vec![Pid(2), Pid(3)])
        );
        assert_eq!(
            correlate(&[addr], [(Pid(2), &ours)], |_| false),
            Correlation::None
        );
        assert_eq!(correlate(&[], [(Pid(2), &ours)], probe), Correlation::None);
    }
}

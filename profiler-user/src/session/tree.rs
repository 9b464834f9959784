//! `--pid`'s trees (`Target::Trees`): each named process and its
//! descendants. The kernel follows them (`FOLLOWED`): user space puts the
//! roots and the descendants running at attach, the fork tracepoint adds
//! each later child before it runs (`PROC_EVENT_FORK`), the exit
//! tracepoint takes a process out. The session keeps each process's parent
//! for the views.

use std::{collections::HashSet, sync::Arc};

use super::{KernelPort, ProcessPort, Session, Target};
use crate::{
    ids::{HostPid, Pid},
    process::resource::ProcessResource,
};

/// Passes over /proc at attach, at most: each finds the children of the
/// processes the previous one followed (forked before they were followed);
/// deeper trees are a fork race, and their later forks the kernel sees.
const MAX_DISCOVERY_PASSES: usize = 64;

impl<K: KernelPort, P: ProcessPort> Session<K, P> {
    /// Follows the trees of `roots` (with `Target::Trees`; nothing
    /// otherwise): the roots, then their descendants found in /proc, each
    /// in the kernel before its own children are looked for, so a child
    /// forked meanwhile is either in /proc at the next pass or followed by
    /// the kernel. Returns the descendants found (not the roots).
    pub(super) fn follow_trees(&mut self, roots: &[Pid]) -> Vec<Pid> {
        if !matches!(self.target, Target::Trees(_)) {
            return Vec::new();
        }
        let mut followed: HashSet<Pid> = HashSet::new();
        let mut root_of = std::collections::HashMap::new();
        for &root in roots {
            if self.follow(root, root) {
                followed.insert(root);
                root_of.insert(root, root);
            }
        }
        let mut found = Vec::new();
        for _ in 0..MAX_DISCOVERY_PASSES {
            let mut new = Vec::new();
            for (pid, parent) in self.processes.all_parents() {
                if !followed.contains(&pid) && followed.contains(&parent) {
                    new.push((pid, parent));
                }
            }
            if new.is_empty() {
                break;
            }
            // Each parent was followed in an earlier pass: its root is known.
            for (pid, parent) in new {
                let Some(&root) = root_of.get(&parent) else {
                    continue;
                };
                followed.insert(pid);
                if self.follow(pid, root) {
                    root_of.insert(pid, root);
                    self.track_pid(pid).parent = Some(parent);
                    found.push(pid);
                }
            }
        }
        for &root in roots {
            let parent = self.processes.parent(root);
            self.track_pid(root).parent = parent;
        }
        found
    }

    /// A followed process whose main thread left with pthread_exit while
    /// its other threads run on: the kernel took it for gone (its leader's
    /// exit) and stopped following it, with its unwind entry. Follows it
    /// again, under its tree's root (its parents' chain up to a named
    /// process), and has its tables loaded anew.
    pub(super) fn refollow(&mut self, pid: Pid) {
        if !matches!(self.target, Target::Trees(_)) {
            return;
        }
        let roots = self.target.roots();
        let mut root = pid;
        // Bounded: a chain cannot be longer than what is tracked.
        for _ in 0..=self.tracked.len() {
            if roots.contains(&root) {
                break;
            }
            match self.tracked.get(&root).and_then(|t| t.parent) {
                Some(parent) => root = parent,
                None => return, // not of a tree: never followed
            }
        }
        if !roots.contains(&root) {
            return;
        }
        self.forget_tables(pid);
        self.follow(pid, root);
    }

    /// Follows `pid` in the kernel; false (said) where it cannot be.
    fn follow(&mut self, pid: Pid, root: Pid) -> bool {
        let (Some(host), Some(host_root)) = (self.pids.host(pid), self.pids.host(root)) else {
            self.warnings.push(format!(
                "process {pid}: its host pid is unknown (allocprof runs in another pid \
                 namespace): its children are not followed"
            ));
            return false;
        };
        match self.kernel.follow(host, host_root) {
            Ok(()) => true,
            Err(e) => {
                self.warnings.push(format!(
                    "process {pid}: not followed, the process cap is reached ({e})"
                ));
                false
            }
        }
    }

    /// A followed process forked `child` (host pids), which the kernel now
    /// follows: it is tracked with its parent, and scanned (its probe files,
    /// its ledger: the heap it inherited) at once.
    pub(super) fn forked(&mut self, child: HostPid, parent: HostPid) -> Option<Pid> {
        let child = self.pids.local(child)?;
        let parent = self.pids.local(parent);
        // Its image is a copy of its parent's until it execs (an exec
        // resets the image): so is its rate, even when its environ is read
        // only after an exec this poll has not seen yet, or after it is gone.
        let rate = parent
            .and_then(|p| self.tracked.get(&p))
            .and_then(|t| t.image.identity.as_ref())
            .map(|(_, rate)| *rate);
        let tracked = self.track_pid(child);
        tracked.parent = parent;
        if tracked.image.forked_rate.is_none() {
            tracked.image.forked_rate = rate;
        }
        Some(child)
    }

    /// Gives a fork child gone before its scan its parent's address space
    /// (what it mapped, unless it mapped more before it exited), so its
    /// stacks are named, and its parent's resource (the same executable,
    /// cgroup and environment) with its own host pid (its rate is its
    /// parent's already: [`Session::forked`]).
    pub(super) fn inherit_from_parent(&mut self, pid: Pid) {
        let Some(parent) = self.parent_of(pid) else {
            return;
        };
        let space = self.space(parent).cloned();
        let resource = self
            .tracked
            .get(&parent)
            .and_then(|t| t.image.resource.as_deref())
            .map(|r| ProcessResource {
                host_pid: self.pids.host(pid).map(|h| h.0),
                ..r.clone()
            });
        let image = &mut self.track_pid(pid).image;
        if image.space.is_none() {
            image.space = space;
        }
        if image.resource.is_none() {
            image.resource = resource.map(Arc::new);
        }
    }

    /// The parent of a tracked process, as forked or found at attach.
    pub(super) fn parent_of(&self, pid: Pid) -> Option<Pid> {
        self.tracked.get(&pid)?.parent
    }
}

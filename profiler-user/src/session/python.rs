//! Which processes the kernel walks Python frames of: a process that maps
//! CPython (its executable or a `libpython`, `python::discover`) gets a
//! kernel entry with its `_PyRuntime`'s address and its version's offsets
//! when it is scanned, once its runtime reads as one; the entry goes with
//! its image (exec, exit). A file exporting `_PyRuntime` that is no CPython
//! allocprof can walk (by its version, or by what its runtime holds) is
//! said once, and its processes keep native frames only.

use std::collections::HashSet;

use super::{KernelPort, ProcessPort, Session};
use crate::{
    ids::{FileId, Pid},
    python::{
        discover::{self, Inspection},
        runtime::{self, PythonRuntime},
    },
};

impl<K: KernelPort, P: ProcessPort> Session<K, P> {
    /// Looks for CPython in `pid`'s executable mappings (each file once per
    /// session) and gives the kernel its entry.
    pub(super) fn detect_python(&mut self, pid: Pid) {
        if !self.kernel.python_frames() {
            return;
        }
        let Some(tracked) = self.tracked.get(&pid) else {
            return;
        };
        if tracked.python.is_some() {
            return;
        }
        let Some(space) = tracked.image.space.as_ref() else {
            return;
        };
        let mut seen = HashSet::new();
        let mut found = None;
        for m in space.mappings().iter().filter(|m| m.executable) {
            let Some(file) = &m.file.open else {
                continue;
            };
            if !seen.insert(file.id) {
                continue;
            }
            let inspection = self
                .python_files
                .entry(file.id)
                .or_insert_with(|| discover::inspect(&file.file))
                .clone();
            match inspection {
                Inspection::NotPython => {}
                Inspection::Python(interp) => {
                    found = Some((file.id, m.file.path.clone(), interp));
                    break;
                }
                Inspection::Unsupported(why) => {
                    if self.python_warned.insert(file.id) {
                        self.warnings.push(format!(
                            "{}: {why}: its processes have native frames only",
                            m.file.path.display()
                        ));
                    }
                }
            }
        }
        let Some((file, path, interp)) = found else {
            return;
        };
        self.give_python(pid, file, &path, interp);
    }

    /// Gives the kernel `pid`'s entry, once its runtime reads as a CPython
    /// runtime (`runtime::check_runtime`): a file that exports the symbols
    /// over something else is said once, and its processes keep native
    /// frames only (looked at again at their next scan, said no more).
    fn give_python(
        &mut self,
        pid: Pid,
        file: FileId,
        path: &std::path::Path,
        interp: discover::Interpreter,
    ) {
        let (Some(tracked), Some(host)) = (self.tracked.get(&pid), self.pids.host(pid)) else {
            return;
        };
        let Some(space) = tracked.image.space.as_ref() else {
            return;
        };
        let Some(runtime) = discover::runtime_address(space, file, interp.runtime_offset) else {
            return; // not mapped (yet): the next scan looks again
        };
        let mut config = interp.config;
        config.runtime = runtime;
        let memory = self.processes.python_memory(pid);
        let checked = match &memory {
            Some(memory) => runtime::check_runtime(&**memory, runtime, interp.version, &config),
            None => Ok(()),
        };
        if let Err(why) = checked {
            if self.python_warned.insert(file) {
                self.warnings.push(format!(
                    "{}: claims CPython {} but {why}: its processes have native frames only",
                    path.display(),
                    interp.version
                ));
            }
            return;
        }
        // In a container, its thread states hold the container's thread ids.
        if let Some((dev, ino)) = self.processes.pid_namespace(pid) {
            config.pidns_dev = dev;
            config.pidns_ino = ino;
        }
        if let Err(e) = self.kernel.set_process_python(host, &config) {
            self.warnings.push(format!("process {pid}: {e}"));
            return;
        }
        let objects = memory
            .and_then(|memory| runtime::read_object_allocator(&*memory, runtime, interp.version));
        if let Some(tracked) = self.tracked.get_mut(&pid) {
            tracked.python = Some(interp.version);
            tracked.image.python_runtime = Some(PythonRuntime {
                version: interp.version,
                objects,
            });
        }
    }

    /// The image of `pid` is gone (exec or exit): so is its interpreter.
    pub(super) fn forget_python(&mut self, pid: Pid) {
        if self
            .tracked
            .get_mut(&pid)
            .and_then(|t| t.python.take())
            .is_some()
            && let Some(host) = self.pids.host(pid)
        {
            self.kernel.clear_process_python(host);
        }
    }
}

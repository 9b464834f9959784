//! One stack from a native stack and the Python frames of its thread, as
//! `py-spy --native` shows them: each native `_PyEval_EvalFrameDefault`
//! frame is replaced by the Python frames it was running. Pure.
//!
//! Both lists are innermost first. The Python frames come in runs, one per
//! call of the eval function: a run goes from the innermost frame not yet
//! placed through the next entry frame (3.11's `is_entry`). The native
//! frames above and below (`malloc`, C extensions, the interpreter's entry)
//! stay where they are.

use std::path::Path;

use crate::symbolize::Frame;

/// The interpreter's eval function: each call runs one run of Python frames.
pub const EVAL_FUNCTION: &str = "_PyEval_EvalFrameDefault";

/// A Python frame resolved, or a marker in its place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyItem {
    pub frame: Frame,
    /// The first frame its eval call ran (the run ends here).
    pub entry: bool,
}

/// The merged stack, innermost first. Python frames never placed at an
/// eval frame (more runs than named eval frames: an interpreter whose eval
/// frames have no name, a native walk cut short) are not dropped: they go
/// just outside the last run placed, else where the interpreter's unnamed
/// frames begin, else at the outer end.
pub fn merge(native: Vec<Frame>, python: Vec<PyItem>) -> Vec<Frame> {
    if python.is_empty() {
        return native;
    }
    let mut out = Vec::with_capacity(native.len() + python.len());
    let mut python = python.into_iter().peekable();
    let mut after_last_run = None;
    for frame in native {
        if python.peek().is_some() && is_eval_frame(&frame) {
            for item in python.by_ref() {
                out.push(item.frame);
                if item.entry {
                    break;
                }
            }
            after_last_run = Some(out.len());
        } else {
            out.push(frame);
        }
    }
    let rest: Vec<Frame> = python.map(|item| item.frame).collect();
    if !rest.is_empty() {
        let at = after_last_run
            .or_else(|| out.iter().position(is_unnamed_interpreter_frame))
            .unwrap_or(out.len());
        out.splice(at..at, rest);
    }
    out
}

fn is_eval_frame(frame: &Frame) -> bool {
    !frame.inlined && &*frame.function == EVAL_FUNCTION
}

/// A frame of the interpreter (`python3.11`, `libpython3.11.so.1.0`) that
/// the symbolizer could not name (it is then `file+0xoffset`).
fn is_unnamed_interpreter_frame(frame: &Frame) -> bool {
    let Some(module) = frame.module.as_deref() else {
        return false;
    };
    let file = Path::new(module)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    (file.starts_with("python") || file.starts_with("libpython"))
        && frame.location.is_none()
        && frame.function.starts_with(&format!("{file}+0x"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(names: &[&str]) -> Vec<Frame> {
        names.iter().map(|n| Frame::named(*n)).collect()
    }

    fn py(name: &str, entry: bool) -> PyItem {
        PyItem {
            frame: Frame::python(name, "app.py", Some(1)),
            entry,
        }
    }

    fn names(frames: &[Frame]) -> Vec<&str> {
        frames.iter().map(|f| &*f.function).collect()
    }

    #[test]
    fn each_eval_frame_takes_its_run() {
        // main → eval(f0, f1) → json.loads (C) → eval(f2 entry, f3) → malloc
        let stack = native(&[
            "malloc",
            "PyObject_Malloc",
            EVAL_FUNCTION,
            "_PyEval_Vector",
            "scanner_call",
            EVAL_FUNCTION,
            "PyEval_EvalCode",
            "main",
        ]);
        let python = vec![
            py("f3", false),
            py("f2", true),
            py("f1", false),
            py("f0", true),
        ];
        assert_eq!(
            names(&merge(stack, python)),
            [
                "malloc",
                "PyObject_Malloc",
                "f3",
                "f2",
                "_PyEval_Vector",
                "scanner_call",
                "f1",
                "f0",
                "PyEval_EvalCode",
                "main"
            ]
        );
    }

    #[test]
    fn eval_frames_without_python_frames_stay() {
        let stack = native(&["malloc", EVAL_FUNCTION, "x", EVAL_FUNCTION, "main"]);
        assert_eq!(
            names(&merge(stack, vec![py("f", true)])),
            ["malloc", "f", "x", EVAL_FUNCTION, "main"]
        );
        // No Python part: the native stack as it is.
        let stack = native(&["malloc", EVAL_FUNCTION]);
        assert_eq!(merge(stack.clone(), vec![]), stack);
    }

    #[test]
    fn runs_left_over_go_outside_the_last_placed() {
        let stack = native(&["malloc", EVAL_FUNCTION, "[stack cut at 127 frames]"]);
        let python = vec![py("f1", true), py("f0", true)];
        assert_eq!(
            names(&merge(stack, python)),
            ["malloc", "f1", "f0", "[stack cut at 127 frames]"]
        );
    }

    #[test]
    fn without_named_eval_frames_python_goes_where_the_interpreter_is() {
        let unnamed = |offset: u64| Frame {
            module: Some("/usr/bin/python3.11".into()),
            ..Frame::named(format!("python3.11+{offset:#x}"))
        };
        let stack = vec![
            Frame::named("malloc"),
            unnamed(0x10),
            unnamed(0x20),
            Frame::named("__libc_start_main"),
        ];
        let python = vec![py("f1", false), py("f0", true)];
        assert_eq!(
            names(&merge(stack, python.clone())),
            [
                "malloc",
                "f1",
                "f0",
                "python3.11+0x10",
                "python3.11+0x20",
                "__libc_start_main"
            ]
        );
        // Nothing of the interpreter at all: at the outer end, never dropped.
        let stack = native(&["malloc", "start"]);
        assert_eq!(
            names(&merge(stack, python)),
            ["malloc", "start", "f1", "f0"]
        );
    }

    #[test]
    fn a_truncation_marker_ends_its_run() {
        let stack = native(&["malloc", EVAL_FUNCTION, "x", EVAL_FUNCTION]);
        let python = vec![
            py("f", false),
            PyItem {
                frame: Frame::python_marker("[python stack truncated]"),
                entry: true,
            },
        ];
        assert_eq!(
            names(&merge(stack, python)),
            [
                "malloc",
                "f",
                "[python stack truncated]",
                "x",
                EVAL_FUNCTION
            ]
        );
    }
}

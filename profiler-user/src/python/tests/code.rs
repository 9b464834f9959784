//! Code objects of a running interpreter read through `/proc`'s reader
//! (`process_vm_readv`, the session's bounded reader): the same qualified
//! names, files, first lines and per-instruction lines as the interpreter
//! says; and a code object freed and allocated over is never named again.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Child, Command, Stdio},
};

use profiler_common::python::{PY_TRUNCATED_FRAME, encode_python_frame};

use super::interpreters;
use crate::{
    ids::{Pid, Tid},
    process::target_memory::{LiveThread, TargetMemory},
    python::{
        PyVersion,
        cache::{CodeCache, FREED_MARKER, TRUNCATED_MARKER},
        code::{Layout, Memory, TargetReader, read_code, read_fingerprint},
        merge::{EVAL_FUNCTION, merge},
    },
    symbolize::{Frame, FrameKind},
};

/// The script, running; killed when dropped.
struct Script {
    child: Child,
    lines: BufReader<std::process::ChildStdout>,
}

impl Script {
    fn start(python: &std::path::Path) -> Script {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("src/python/tests/code_objects.py");
        let mut child = Command::new(python)
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
        let lines = BufReader::new(child.stdout.take().unwrap());
        Script { child, lines }
    }

    fn line(&mut self) -> serde_json::Value {
        let mut line = String::new();
        self.lines.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    fn say(&mut self, what: &str) {
        writeln!(self.child.stdin.as_mut().unwrap(), "{what}").unwrap();
    }

    fn thread(&self) -> LiveThread {
        LiveThread::found(Pid(self.child.id()), Tid(self.child.id()), 0)
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn code_objects_read_as_the_interpreter_has_them_and_freed_ones_are_never_named() {
    for python in interpreters() {
        let mut script = Script::start(&python);
        let known = script.line();
        let v: Vec<u8> = known["version"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap() as u8)
            .collect();
        let version = PyVersion {
            major: v[0],
            minor: v[1],
            micro: v[2],
        };
        let layout = Layout::for_version(version).unwrap();
        let memory = TargetMemory::default();
        let reader = TargetReader {
            memory: &memory,
            thread: script.thread(),
        };
        let mut cache = CodeCache::default();
        let functions = known["functions"].as_array().unwrap();
        let mut stack = Vec::new();
        for f in functions {
            let address = f["address"].as_u64().unwrap();
            let code = read_code(&reader, &layout, address, None)
                .unwrap_or_else(|e| panic!("{}: {f}: {e}", python.display()));
            assert_eq!(code.qualname, f["qualname"].as_str().unwrap());
            assert_eq!(code.filename, f["filename"].as_str().unwrap());
            assert_eq!(
                i64::from(code.fingerprint.first_line),
                f["first"].as_i64().unwrap()
            );
            let lines = f["lines"].as_array().unwrap();
            assert_eq!(
                code.fingerprint.units,
                lines.len() as u64,
                "{}",
                code.qualname
            );
            for (i, line) in lines.iter().enumerate() {
                assert_eq!(
                    code.line(i as u32),
                    line.as_i64().map(|l| l as i32),
                    "{}: {} instruction {i}",
                    python.display(),
                    code.qualname
                );
                assert!(code.holds(i as u32));
            }
            assert!(!code.holds(lines.len() as u32));
            // The same through the cache, as a stack's frame at its last
            // instruction with a line.
            let (instr, line) = lines
                .iter()
                .enumerate()
                .rev()
                .find_map(|(i, l)| Some((i, l.as_i64()?)))
                .unwrap();
            stack.push((
                encode_python_frame(address, instr as i64, stack.len() % 2 == 1),
                format!("{}:{line}", code.filename),
                code.qualname.clone(),
            ));
        }
        let values: Vec<u64> = stack.iter().map(|(v, ..)| *v).collect();
        // A figure for the report, not an assertion: what a stack's Python
        // part costs when its code objects are new, and when cached.
        let fresh = std::time::Instant::now();
        let items = CodeCache::default().resolve(&reader, Ok(layout), &values, None);
        let fresh = fresh.elapsed();
        assert_eq!(items.len(), values.len());
        let items = cache.resolve(&reader, Ok(layout), &values, None);
        let cached = std::time::Instant::now();
        cache.resolve(&reader, Ok(layout), &values, None);
        eprintln!(
            "{}: {} frames resolved in {fresh:?} (new code objects), {:?} (cached)",
            python.display(),
            values.len(),
            cached.elapsed()
        );
        for (item, (_, location, qualname)) in items.iter().zip(&stack) {
            assert_eq!(item.frame.kind, FrameKind::Python);
            assert_eq!(&*item.frame.function, qualname);
            assert_eq!(item.frame.location.as_deref(), Some(location.as_str()));
        }
        assert_eq!(cache.len(), functions.len());
        // An instruction past its code's end: that code did not run it.
        let past = encode_python_frame(values[0] & ((1 << 47) - 1), 5000, true);
        let items = cache.resolve(&reader, Ok(layout), &[past, PY_TRUNCATED_FRAME], None);
        assert_eq!(&*items[0].frame.function, FREED_MARKER);
        assert_eq!(&*items[1].frame.function, TRUNCATED_MARKER);

        // Merged in place of the native eval frames.
        let native = vec![
            Frame::named("malloc"),
            Frame::named(EVAL_FUNCTION),
            Frame::named("main"),
        ];
        let merged = merge(
            native,
            cache.resolve(&reader, Ok(layout), &values[..2], None),
        );
        let names: Vec<&str> = merged.iter().map(|f| &*f.function).collect();
        assert_eq!(names, ["malloc", "plain", "Handler.handle_request", "main"]);
        assert_eq!(
            merged[1].site_name(),
            format!(
                "plain (code_objects.py:{})",
                stack[0].1.rsplit(':').next().unwrap()
            )
        );

        // A function made by exec, freed, nothing allocated since: its
        // header is as it was but for the allocator's free-list link in its
        // first word, its print still the sampled one. Freed all the same.
        let quiet = &functions[functions.len() - 3];
        let address = quiet["address"].as_u64().unwrap();
        let header = |reader: &TargetReader| reader.read(address, 144).unwrap();
        let before = header(&reader);
        let print = read_fingerprint(&reader, &layout, address, None)
            .unwrap()
            .kernel_print;
        script.say("quiet");
        script.line();
        let after = header(&reader);
        assert_eq!(
            before[8..],
            after[8..],
            "{}: the freed code object's header kept all but its first word: \
             the test shows nothing",
            python.display()
        );
        let value = encode_python_frame(address, 0, true);
        for items in [
            CodeCache::default().resolve(&reader, Ok(layout), &[value], Some(&[print])),
            cache.resolve(&reader, Ok(layout), &[value], None),
        ] {
            assert_eq!(
                &*items[0].frame.function,
                FREED_MARKER,
                "{}: doomed_quiet freed",
                python.display()
            );
        }

        // The two functions made by exec, freed and allocated over.
        let doomed: Vec<(u64, String)> = functions[functions.len() - 2..]
            .iter()
            .map(|f| {
                (
                    f["address"].as_u64().unwrap(),
                    f["qualname"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        // The prints the kernel would have taken of them at a sample.
        let sampled: Vec<u32> = doomed
            .iter()
            .map(|(address, _)| {
                read_fingerprint(&reader, &layout, *address, None)
                    .unwrap()
                    .kernel_print
            })
            .collect();
        script.say("free");
        let reused = script.line();
        let reused = reused["reused"].as_object().unwrap();
        eprintln!("{}: addresses reused: {reused:?}", python.display());
        assert_eq!(
            reused.len(),
            2,
            "{}: the script reused both addresses",
            python.display()
        );
        for ((address, name), print) in doomed.iter().zip(sampled) {
            let value = encode_python_frame(*address, 0, true);
            // A stack sampled before the free, first read now: freed,
            // whatever a fresh cache finds at the address.
            let items = CodeCache::default().resolve(&reader, Ok(layout), &[value], Some(&[print]));
            assert_eq!(
                &*items[0].frame.function,
                FREED_MARKER,
                "{}: {name} sampled, freed and allocated over",
                python.display()
            );
            let items = cache.resolve(&reader, Ok(layout), &[value], None);
            let got = &*items[0].frame.function;
            assert_ne!(
                got,
                name,
                "{}: a freed code object kept its name",
                python.display()
            );
            match reused[&address.to_string()].as_str() {
                Some("bytes") => assert_eq!(got, FREED_MARKER),
                _ => assert_eq!(got, "usurper"),
            }
            eprintln!("{}: {name} freed, now {got}", python.display());
        }
    }
}

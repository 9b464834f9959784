//! Symbolization on a thread of its own (blazesym's `Symbolizer` is !Send):
//! normalized stacks go in, frames with demangled names, inlined functions
//! and file:line come out. Allocator-internal frames are dropped here.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Weak, mpsc},
    thread,
};

use blazesym::symbolize::{
    CodeInfo, Input, Symbolized, Symbolizer,
    evict::Evict,
    source::{Elf, Source},
};

use crate::{
    discover::OpenFile,
    normalize::{FileAddr, MappedFile},
};

/// One frame of a symbolized stack.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    pub function: String,
    /// `file:line` where debug info has it.
    pub location: Option<String>,
    /// The file (executable or library) the frame is in.
    pub module: Option<String>,
    /// An inlined call (its caller is the next frame, at the same address).
    pub inlined: bool,
}

impl Frame {
    /// A frame known only by a name (placeholders, unknown code, tests).
    pub fn named(function: impl Into<String>) -> Frame {
        Frame {
            function: function.into(),
            location: None,
            module: None,
            inlined: false,
        }
    }

    fn unknown(addr: u64, at: Option<&FileAddr>) -> Frame {
        match at {
            Some(a) => Frame {
                module: Some(a.file.path.display().to_string()),
                ..Frame::named(format!("{}+{:#x}", basename(&a.file.path), a.file_offset))
            },
            None => Frame::named(format!("[unknown {addr:#x}]")),
        }
    }
}

/// A stack to symbolize: its frames innermost first, each with the address
/// the kernel saw and where it was in a file, if anywhere.
pub struct Request<K> {
    pub key: K,
    pub frames: Vec<(u64, Option<FileAddr>)>,
}

/// Symbolized stack, innermost frame first, allocator frames removed.
pub struct Response<K> {
    pub key: K,
    pub frames: Vec<Frame>,
}

/// Handle to the symbolization thread.
pub struct SymbolizerThread<K> {
    requests: mpsc::Sender<Vec<Request<K>>>,
    responses: mpsc::Receiver<Response<K>>,
}

impl<K: Send + 'static> SymbolizerThread<K> {
    pub fn spawn() -> SymbolizerThread<K> {
        let (req_tx, req_rx) = mpsc::channel::<Vec<Request<K>>>();
        let (resp_tx, resp_rx) = mpsc::channel();
        thread::Builder::new()
            .name("symbolize".into())
            .spawn(move || {
                let mut symbolizer = Symbolizer::new();
                let mut used = UsedFiles::default();
                for batch in req_rx {
                    for Request { key, frames } in batch {
                        used.note(&frames);
                        let symbolized = symbolize_stack(&symbolizer, &frames);
                        // The request held the files open: release them
                        // before answering (nothing else may need them).
                        drop(frames);
                        let response = Response {
                            key,
                            frames: symbolized,
                        };
                        if resp_tx.send(response).is_err() {
                            return;
                        }
                    }
                    used.evict_released(&mut symbolizer);
                }
            })
            .expect("spawning the symbolization thread");
        SymbolizerThread {
            requests: req_tx,
            responses: resp_rx,
        }
    }

    pub fn submit(&self, batch: Vec<Request<K>>) {
        if !batch.is_empty() {
            // The thread only stops when we drop the receiver side.
            let _ = self.requests.send(batch);
        }
    }

    /// Everything symbolized so far.
    pub fn ready(&self) -> Vec<Response<K>> {
        self.responses.try_iter().collect()
    }

    /// Waits for `n` responses (used before a final report).
    pub fn wait(&self, n: usize) -> Vec<Response<K>> {
        self.responses.iter().take(n).collect()
    }
}

/// The files blazesym opened (by our descriptors' `/proc/self/fd/N`
/// paths): its cache holds a descriptor of its own for each, so once nobody
/// else needs a file (its process was pruned and its stacks symbolized) the
/// cache entry goes too.
#[derive(Default)]
struct UsedFiles {
    files: HashMap<PathBuf, Weak<OpenFile>>,
}

impl UsedFiles {
    fn note(&mut self, frames: &[(u64, Option<FileAddr>)]) {
        for open in frames
            .iter()
            .filter_map(|(_, at)| at.as_ref()?.file.open.as_ref())
        {
            // A released file's number may be reused: the path then names
            // the new file (evicting the path evicts both).
            let known = self.files.entry(open.fd_path()).or_default();
            if known.strong_count() == 0 {
                *known = Arc::downgrade(open);
            }
        }
    }

    fn evict_released(&mut self, symbolizer: &mut Symbolizer) {
        self.files.retain(|path, file| {
            if file.strong_count() > 0 {
                return true;
            }
            let _ = symbolizer.evict(&Evict::Elf(blazesym::symbolize::evict::Elf::new(path)));
            false
        });
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.files.len()
    }
}

/// Symbolizes one stack, innermost first.
pub fn symbolize_stack(symbolizer: &Symbolizer, frames: &[(u64, Option<FileAddr>)]) -> Vec<Frame> {
    // Group frames by file: one blazesym call per file.
    let mut by_file: HashMap<&MappedFile, Vec<(usize, u64)>> = HashMap::new();
    for (i, (_, at)) in frames.iter().enumerate() {
        if let Some(at) = at {
            // Return addresses point past the call; step back into it. The
            // first frame is the probe site itself.
            let offset = if i == 0 {
                at.file_offset
            } else {
                at.file_offset.saturating_sub(1)
            };
            by_file.entry(&at.file).or_default().push((i, offset));
        }
    }
    let mut symbolized: Vec<Option<Vec<Frame>>> = vec![None; frames.len()];
    for (file, entries) in by_file {
        let offsets: Vec<u64> = entries.iter().map(|(_, o)| *o).collect();
        let module = file.path.display().to_string();
        // Only the file the process mapped, through the descriptor opened
        // for it: a path may name another file by now (or in our namespace).
        let Some(open) = &file.open else {
            continue;
        };
        let source = Source::Elf(Elf::new(open.fd_path()));
        let Ok(results) = symbolizer.symbolize(&source, Input::FileOffset(&offsets)) else {
            continue;
        };
        for ((i, _), result) in entries.iter().zip(results) {
            if let Symbolized::Sym(sym) = result {
                symbolized[*i] = Some(expand(&sym, Some(module.clone())));
            }
        }
    }
    let mut out = Vec::with_capacity(frames.len());
    for ((addr, at), sym) in frames.iter().zip(symbolized) {
        match sym {
            Some(expanded) => out.extend(expanded),
            None => out.push(Frame::unknown(*addr, at.as_ref())),
        }
    }
    strip_allocator_frames(out)
}

/// A symbol and its inlined calls, innermost first.
fn expand(sym: &blazesym::symbolize::Sym<'_>, module: Option<String>) -> Vec<Frame> {
    // blazesym lists inlined calls outermost first (f calls g calls h: g, h);
    // the location of each call site is the caller's line.
    let mut frames = Vec::with_capacity(1 + sym.inlined.len());
    for inlined in sym.inlined.iter().rev() {
        frames.push(Frame {
            function: inlined.name.to_string(),
            location: inlined.code_info.as_ref().map(location),
            module: module.clone(),
            inlined: true,
        });
    }
    frames.push(Frame {
        function: sym.name.to_string(),
        location: sym.code_info.as_deref().map(location),
        module,
        inlined: false,
    });
    frames
}

fn location(info: &CodeInfo<'_>) -> String {
    let file = info.to_path();
    match info.line {
        Some(line) => format!("{}:{line}", file.display()),
        None => file.display().to_string(),
    }
}

/// Drops the innermost frames that belong to the allocator itself (the
/// LD_PRELOAD library, the Rust global allocator and the standard library's
/// allocation shims): a stack starts where the program asked for memory.
pub fn strip_allocator_frames(frames: Vec<Frame>) -> Vec<Frame> {
    let keep_from = frames
        .iter()
        .position(|f| !is_allocator_frame(f))
        .unwrap_or(0);
    frames.into_iter().skip(keep_from).collect()
}

pub fn is_allocator_frame(frame: &Frame) -> bool {
    const PREFIXES: &[&str] = &[
        "allocator::",
        "<allocator::",
        "preload::",
        "__rust_alloc",
        "__rust_realloc",
        "__rust_dealloc",
        "__rustc::__rust",
        "__rdl_",
        "alloc::alloc::",
        "<alloc::alloc::Global",
    ];
    let in_preload = frame
        .module
        .as_deref()
        .is_some_and(|m| basename(Path::new(m)).starts_with("liballocprof"));
    in_preload || PREFIXES.iter().any(|p| frame.function.starts_with(p))
}

/// A frame of the language's standard library or the C runtime: rarely the
/// answer to "who allocated this".
pub fn is_library_frame(frame: &Frame) -> bool {
    const PREFIXES: &[&str] = &[
        "alloc::", "core::", "std::", "<alloc::", "<core::", "<std::", "__libc_", "_start",
    ];
    // /rustc/ is the standard library's source, /rust/deps/ the crates it
    // vendors (hashbrown behind HashMap).
    frame
        .location
        .as_deref()
        .is_some_and(|l| l.starts_with("/rustc/") || l.starts_with("/rust/deps/"))
        || PREFIXES.iter().any(|p| frame.function.starts_with(p))
}

/// The frame that best names a stack: the first that is neither allocator
/// nor standard library, else the innermost.
pub fn most_informative(frames: &[Frame]) -> Option<&Frame> {
    frames
        .iter()
        .find(|f| !is_allocator_frame(f) && !is_library_frame(f))
        .or_else(|| frames.first())
}

fn basename(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, module: &str) -> Frame {
        Frame {
            function: function.into(),
            location: None,
            module: Some(module.into()),
            inlined: false,
        }
    }

    #[test]
    fn allocator_frames_are_stripped_from_the_top_only() {
        let frames = vec![
            frame("fire_alloc_probe", "/opt/allocprof/liballocprof.so"),
            frame("malloc", "/opt/allocprof/liballocprof.so"),
            frame("__rust_alloc", "/usr/bin/app"),
            frame("app::build", "/usr/bin/app"),
            frame("alloc::alloc::alloc", "/usr/bin/app"),
            frame("main", "/usr/bin/app"),
        ];
        let kept = strip_allocator_frames(frames);
        let names: Vec<_> = kept.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(names, ["app::build", "alloc::alloc::alloc", "main"]);
    }

    #[test]
    fn own_test_binary_symbolizes_with_file_and_line() {
        // Symbolize an address of this very test function from our own file.
        let space = crate::normalize::AddressSpace::read(std::process::id()).unwrap();
        let addr = own_test_binary_symbolizes_with_file_and_line as *const () as u64;
        let at = space.normalize(addr).expect("our code is file-backed");
        let frames = symbolize_stack(&Symbolizer::new(), &[(addr, Some(at))]);
        let f = frames.last().unwrap();
        assert!(
            f.function
                .contains("own_test_binary_symbolizes_with_file_and_line"),
            "{f:?}"
        );
        assert!(
            f.location
                .as_deref()
                .is_some_and(|l| l.contains("symbolize.rs")),
            "{f:?}"
        );
    }

    #[test]
    fn files_are_released_once_their_stacks_are_symbolized() {
        let space = crate::normalize::AddressSpace::read(std::process::id()).unwrap();
        let addr = files_are_released_once_their_stacks_are_symbolized as *const () as u64;
        let at = space.normalize(addr).expect("our code is file-backed");
        let file = Arc::downgrade(at.file.open.as_ref().expect("opened"));
        // The process is gone and its image pruned; its stack is pending.
        drop(space);
        assert!(file.upgrade().is_some(), "a pending stack keeps its file");
        let thread = SymbolizerThread::spawn();
        thread.submit(vec![Request {
            key: 1u32,
            frames: vec![(addr, Some(at))],
        }]);
        let responses = thread.wait(1);
        assert!(
            responses[0]
                .frames
                .iter()
                .any(|f| f.function.contains("files_are_released")),
            "{:?}",
            responses[0].frames
        );
        assert!(file.upgrade().is_none(), "symbolized: the file is released");
    }

    #[test]
    fn blazesym_forgets_released_files() {
        let mut symbolizer = Symbolizer::new();
        let mut used = UsedFiles::default();
        let space = crate::normalize::AddressSpace::read(std::process::id()).unwrap();
        let addr = blazesym_forgets_released_files as *const () as u64;
        let frames = vec![(addr, space.normalize(addr))];
        used.note(&frames);
        let symbolized = symbolize_stack(&symbolizer, &frames);
        assert!(symbolized[0].function.contains("blazesym_forgets"));
        used.evict_released(&mut symbolizer);
        assert_eq!(used.len(), 1, "still held by the address space");
        drop((space, frames));
        used.evict_released(&mut symbolizer);
        assert_eq!(used.len(), 0, "released files leave blazesym's cache");
    }
}

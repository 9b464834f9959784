//! Symbolization on a thread of its own (blazesym's `Symbolizer` is !Send):
//! normalized stacks go in, frames with demangled names, inlined functions
//! and file:line come out. Allocator-internal frames are dropped here.

use std::{
    cell::Cell,
    collections::{HashMap, HashSet},
    panic::AssertUnwindSafe,
    path::{Path, PathBuf},
    sync::{Arc, Weak, mpsc},
    thread,
};

use blazesym::symbolize::{
    CodeInfo, Input, Symbolized, Symbolizer,
    evict::Evict,
    source::{Elf, Source},
};

use profiler_common::unwind::{
    DEPTH_CUT_FRAME, NO_TABLES_DEPTH_FRAME, NO_TABLES_FRAME, TRUNCATED_FRAME,
};

use crate::{
    discover::OpenFile,
    normalize::{FileAddr, MappedFile},
};

/// A name in a frame. Names repeat across stacks and processes (a module's
/// path in each of its frames, a function in each stack through it): the
/// symbolizer shares them (see [`Interner`]).
pub type Name = Arc<str>;

/// One frame of a symbolized stack.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    pub function: Name,
    /// `file:line` where debug info has it.
    pub location: Option<Name>,
    /// The file (executable or library) the frame is in.
    pub module: Option<Name>,
    /// An inlined call (its caller is the next frame, at the same address).
    pub inlined: bool,
}

impl Frame {
    /// A frame known only by a name (placeholders, unknown code, tests).
    pub fn named(function: impl Into<Name>) -> Frame {
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
                module: Some(a.file.path.display().to_string().into()),
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
                let mut symbolizer = symbolizer();
                let mut used = UsedFiles::default();
                let mut names = Interner::default();
                for batch in req_rx {
                    let _quiet = QuietContainedPanics::install();
                    for Request { key, frames } in batch {
                        used.note(&frames);
                        let symbolized = symbolize_stack(&symbolizer, &mut names, &frames);
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
                    names.sweep();
                }
            })
            .expect("spawning the symbolization thread");
        SymbolizerThread {
            requests: req_tx,
            responses: resp_rx,
        }
    }

    pub(crate) fn submit(&self, batch: Vec<Request<K>>) {
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

thread_local! {
    /// Set while this thread symbolizes one file under `catch_unwind`.
    static CONTAINED: Cell<bool> = const { Cell::new(false) };
}

type PanicHook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Send + Sync>;

/// While alive, a panic hook that stays silent for the panics
/// `symbolize_stack` contains (they become unknown frames): the hook in
/// place (the TUI's leaves the alternate screen, the default one prints
/// over the screen) must not run for them. Other panics, and other threads',
/// reach that hook as before. Dropping it puts that hook back.
struct QuietContainedPanics {
    previous: Option<Arc<PanicHook>>,
}

impl QuietContainedPanics {
    fn install() -> QuietContainedPanics {
        let previous: Arc<PanicHook> = Arc::new(std::panic::take_hook());
        let outer = previous.clone();
        std::panic::set_hook(Box::new(move |info| {
            if !CONTAINED.get() {
                outer(info);
            }
        }));
        QuietContainedPanics {
            previous: Some(previous),
        }
    }
}

impl Drop for QuietContainedPanics {
    fn drop(&mut self) {
        if thread::panicking() {
            return; // set_hook would panic; the process is going down anyway
        }
        // Dropping our hook drops its clone, so the original comes back as
        // it was (no chain of wrappers grows batch after batch).
        drop(std::panic::take_hook());
        if let Some(previous) = self.previous.take() {
            match Arc::try_unwrap(previous) {
                Ok(hook) => std::panic::set_hook(hook),
                Err(shared) => std::panic::set_hook(Box::new(move |info| shared(info))),
            }
        }
    }
}

/// Shares equal names across frames: each distinct name is held once, for
/// as long as some frame holds it.
#[derive(Default)]
pub(crate) struct Interner {
    names: HashSet<Name>,
    /// How many were left by the last sweep (the next is due at twice that).
    swept: usize,
}

impl Interner {
    pub(crate) fn name(&mut self, name: &str) -> Name {
        if let Some(shared) = self.names.get(name) {
            return shared.clone();
        }
        let shared: Name = name.into();
        self.names.insert(shared.clone());
        shared
    }

    /// Forgets the names no frame holds any more, once enough have come
    /// since the last sweep (a sweep costs one pass over the set).
    fn sweep(&mut self) {
        if self.names.len() < 2 * self.swept.max(4096) {
            return;
        }
        self.names.retain(|n| Arc::strong_count(n) > 1);
        self.swept = self.names.len();
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

/// The heap `frames` take as an `Arc<[Frame]>`, estimated: with the
/// allocator's per-block overhead, and names counted whole although the
/// interner shares them (an upper bound).
pub(crate) fn heap_bytes(frames: &[Frame]) -> usize {
    const BLOCK: usize = 16;
    let names: usize = frames
        .iter()
        .map(|f| {
            f.function.len()
                + f.location.as_ref().map_or(0, |l| l.len())
                + f.module.as_ref().map_or(0, |m| m.len())
        })
        .sum();
    2 * size_of::<usize>() + size_of_val(frames) + BLOCK + names
}

/// The frame that ends a stack taken before its process's unwind tables
/// were in, past the frames that could be vouched for (see
/// `profiler_common::unwind::NO_TABLES_FRAME`).
pub const BEFORE_TABLES_MARKER: &str = "[stack before unwind tables were loaded]";

/// The frame that ends a stack deeper than the kernel keeps, in place of its
/// 127th frame (`profiler_common::unwind::DEPTH_CUT_FRAME`).
pub const DEPTH_CUT_MARKER: &str = "[stack cut at 127 frames]";

/// The frame that ends a walk the kernel could not continue: which file's
/// code had no unwind rule it could apply.
fn truncation_marker(last: Option<&FileAddr>) -> Frame {
    Frame::named(match last {
        Some(at) => format!(
            "[truncated: no unwind info for {}]",
            basename(&at.file.path)
        ),
        None => "[truncated: no unwind info]".to_string(),
    })
}

/// A symbolizer that leaves names as the files have them ([`demangle`] does
/// the rest).
fn symbolizer() -> Symbolizer {
    Symbolizer::builder().enable_demangling(false).build()
}

/// Symbolizes one stack, innermost first.
pub(crate) fn symbolize_stack(
    symbolizer: &Symbolizer,
    names: &mut Interner,
    frames: &[(u64, Option<FileAddr>)],
) -> Vec<Frame> {
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
    let mut failures: Vec<Option<String>> = vec![None; frames.len()];
    for (file, entries) in by_file {
        let offsets: Vec<u64> = entries.iter().map(|(_, o)| *o).collect();
        let module = names.name(&file.path.display().to_string());
        // Only the file the process mapped, through the descriptor opened
        // for it: a path may name another file by now (or in our namespace).
        let Some(open) = &file.open else {
            continue;
        };
        let path = open.fd_path();
        // A malformed file may make the ELF/DWARF reader panic: that costs
        // this file's frames, not the thread (nor the TUI).
        CONTAINED.set(true);
        let results = std::panic::catch_unwind(AssertUnwindSafe(|| {
            resolve(symbolizer, &Source::Elf(Elf::new(&path)), &offsets)
        }));
        CONTAINED.set(false);
        match results {
            Ok(Ok(results)) => {
                for ((i, _), result) in entries.iter().zip(results) {
                    if let Some(sym) = result {
                        symbolized[*i] = Some(expand(&sym, &module, names));
                    }
                }
            }
            Ok(Err(_)) => {}
            Err(panic) => {
                let reason = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".into());
                for (i, _) in &entries {
                    failures[*i] = Some(format!("symbolizer panicked: {reason}"));
                }
            }
        }
    }
    let mut out = Vec::with_capacity(frames.len());
    let mut previous: Option<&FileAddr> = None;
    for (((addr, at), sym), failure) in frames.iter().zip(symbolized).zip(failures) {
        if *addr == TRUNCATED_FRAME {
            out.push(truncation_marker(previous));
            continue;
        }
        if *addr == crate::ledger::CUT_FRAME {
            out.push(Frame::named("[cut short by the allocator]"));
            continue;
        }
        if *addr == DEPTH_CUT_FRAME {
            out.push(Frame::named(DEPTH_CUT_MARKER));
            continue;
        }
        // (The session has vouched for such a stack's frames before it
        // came here: see `Session::vouch_for`.)
        if *addr == NO_TABLES_FRAME || *addr == NO_TABLES_DEPTH_FRAME {
            out.push(Frame::named(BEFORE_TABLES_MARKER));
            continue;
        }
        previous = at.as_ref();
        match (sym, failure) {
            (Some(expanded), _) => out.extend(expanded),
            (None, Some(reason)) => {
                let unknown = Frame::unknown(*addr, at.as_ref());
                out.push(Frame {
                    function: format!("{} [{reason}]", unknown.function).into(),
                    ..unknown
                });
            }
            (None, None) => out.push(Frame::unknown(*addr, at.as_ref())),
        }
    }
    strip_allocator_frames(out)
}

/// The symbols at `offsets` of one file (`None` where it has none).
fn resolve<'a>(
    symbolizer: &'a Symbolizer,
    source: &Source<'_>,
    offsets: &[u64],
) -> Result<Vec<Option<blazesym::symbolize::Sym<'a>>>, blazesym::Error> {
    #[cfg(test)]
    tests::maybe_inject_panic(source);
    Ok(symbolizer
        .symbolize(source, Input::FileOffset(offsets))?
        .into_iter()
        .map(|r| match r {
            Symbolized::Sym(sym) => Some(sym),
            Symbolized::Unknown(_) => None,
        })
        .collect())
}

/// A symbol and its inlined calls, innermost first.
fn expand(sym: &blazesym::symbolize::Sym<'_>, module: &Name, names: &mut Interner) -> Vec<Frame> {
    // blazesym lists inlined calls outermost first (f calls g calls h: g, h);
    // the location of each call site is the caller's line.
    let mut frames = Vec::with_capacity(1 + sym.inlined.len());
    for inlined in sym.inlined.iter().rev() {
        frames.push(Frame {
            function: names.name(&demangle(&inlined.name)),
            location: inlined.code_info.as_ref().map(|c| names.name(&location(c))),
            module: Some(module.clone()),
            inlined: true,
        });
    }
    frames.push(Frame {
        function: names.name(&demangle(&sym.name)),
        location: sym.code_info.as_deref().map(|c| names.name(&location(c))),
        module: Some(module.clone()),
        inlined: false,
    });
    frames
}

/// A symbol name as people write it. Only names in a mangling scheme are
/// demangled: Rust's (`_R…`, and legacy `_ZN…E` with its hash dropped) and
/// the Itanium C++ ABI's (`_Z…`). blazesym's own demangling, for names of
/// unknown language, also feeds plain C names to the C++ demangler, which
/// reads short ones as type encodings (`ra` became "signed char restrict").
pub fn demangle(name: &str) -> String {
    if (name.starts_with("_R") || name.starts_with("_ZN"))
        && let Ok(rust) = rustc_demangle::try_demangle(name)
    {
        return format!("{rust:#}");
    }
    if name.starts_with("_Z")
        && let Ok(symbol) = cpp_demangle::Symbol::new(name)
        && let Ok(cpp) = symbol.demangle()
    {
        return cpp;
    }
    name.to_string()
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
pub(crate) fn strip_allocator_frames(frames: Vec<Frame>) -> Vec<Frame> {
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
/// answer to "who allocated this". Rust's (`alloc::`, `core::`, `std::`,
/// their sources), C++'s (`operator new`, `std::` and `__gnu_cxx::`
/// templates such as `std::vector<…>::_M_realloc_insert`, whatever return
/// type the demangler put first; any frame of libstdc++ or libc++) and libc's.
pub fn is_library_frame(frame: &Frame) -> bool {
    const PREFIXES: &[&str] = &[
        "alloc::",
        "core::",
        "std::",
        "<alloc::",
        "<core::",
        "<std::",
        "__libc_",
        "_start",
        "__gnu_cxx::",
        "operator new",
        "operator delete",
        "__cxa_",
    ];
    const MODULES: &[&str] = &["libstdc++", "libc++"];
    // /rustc/ is the standard library's source, /rust/deps/ the crates it
    // vendors (hashbrown behind HashMap).
    let name = qualified_name(&frame.function);
    frame
        .location
        .as_deref()
        .is_some_and(|l| l.starts_with("/rustc/") || l.starts_with("/rust/deps/"))
        || frame.module.as_deref().is_some_and(|m| {
            let file = basename(Path::new(m));
            MODULES.iter().any(|lib| file.starts_with(lib))
        })
        || PREFIXES.iter().any(|p| name.starts_with(p))
}

/// A demangled C++ name without the return type the demangler writes
/// before template functions' names: `void std::vector<int>::_M_realloc_insert<int>(…)`
/// → `std::vector<int>::_M_realloc_insert<int>(…)`. The name starts after
/// the last space outside brackets before the parameter list; `operator
/// new(…)` and Rust names (no such space) are kept whole.
fn qualified_name(name: &str) -> &str {
    if name.starts_with("operator ") {
        return name;
    }
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in name.char_indices() {
        match c {
            '<' | '[' | '{' => depth += 1,
            '>' | ']' | '}' => depth -= 1,
            '(' if depth == 0 => break,
            '(' => depth += 1,
            ')' => depth -= 1,
            ' ' if depth == 0 => {
                if name[i + 1..].starts_with("operator ") {
                    return &name[i + 1..];
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    &name[start..]
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
    fn equal_names_are_shared_and_forgotten_once_unused() {
        let mut names = Interner::default();
        let held = names.name("main");
        assert!(Arc::ptr_eq(&held, &names.name("main")));
        for i in 0..10_000 {
            names.name(&format!("f{i}"));
        }
        names.sweep();
        assert_eq!(names.names.len(), 1, "only the name a frame holds stays");
        assert!(Arc::ptr_eq(&held, &names.name("main")));
    }

    #[test]
    fn cxx_allocator_and_standard_library_frames_are_library_frames() {
        let lib = |name: &str| is_library_frame(&frame(name, "/usr/bin/app"));
        for name in [
            "operator new(unsigned long)",
            "operator new[](unsigned long)",
            "operator new(unsigned long, std::align_val_t)",
            "std::__new_allocator<int>::allocate(unsigned long, void const*)",
            "__gnu_cxx::new_allocator<int>::allocate(unsigned long, void const*)",
            "std::allocator_traits<std::allocator<int> >::allocate(std::allocator<int>&, \
             unsigned long)",
            "std::_Vector_base<int, std::allocator<int> >::_M_allocate(unsigned long)",
            "void std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>\
             (__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > >, \
             int const&)",
            "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> \
             >::_M_create(unsigned long&, unsigned long)",
            "std::vector<Foo, std::allocator<Foo> >::push_back(Foo const&)",
            "std::unique_ptr<ns::Foo, std::default_delete<ns::Foo> > \
             std::make_unique<ns::Foo>()",
            "__gnu_cxx::__normal_iterator<int*, std::vector<int> >::operator++()",
        ] {
            assert!(lib(name), "{name}");
        }
        // The program's own functions, even returning standard types.
        for name in [
            "grow_vector()",
            "ns::make_foo()",
            "std::vector<int, std::allocator<int> > ns::load(char const*)",
            "unsigned long ns::Cache::fill(std::__cxx11::basic_string<char> const&)",
            "ns::Foo::operator new(unsigned long)",
            "main",
            "app::load::{{closure}}",
        ] {
            assert!(!lib(name), "{name}");
        }
        // Anything libstdc++ (or libc++) runs is the library's.
        assert!(is_library_frame(&frame(
            "some_internal_helper",
            "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"
        )));
        assert!(is_library_frame(&frame("f", "/usr/lib/libc++.so.1")));
        // A C++ stack is named by its first frame of the program.
        let stack = [
            frame(
                "operator new(unsigned long)",
                "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
            ),
            frame(
                "std::__new_allocator<int>::allocate(unsigned long, void const*)",
                "/usr/bin/app",
            ),
            frame(
                "void std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>\
                 (__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > \
                 >, int const&)",
                "/usr/bin/app",
            ),
            frame("grow_vector()", "/usr/bin/app"),
            frame("main", "/usr/bin/app"),
        ];
        assert_eq!(
            &*most_informative(&stack).unwrap().function,
            "grow_vector()"
        );
    }

    #[test]
    fn only_mangled_names_are_demangled() {
        for c_name in ["ra", "rb", "rc", "main", "Z", "_start", "malloc"] {
            assert_eq!(demangle(c_name), c_name);
        }
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi"),
            "std::vector<int, std::allocator<int> >::push_back(int const&)"
        );
        assert_eq!(
            demangle("_ZN9allocator4usdt5alloc17h367255860e0173dfE"),
            "allocator::usdt::alloc"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate4main"), "mycrate::main");
        assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
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
        let names: Vec<_> = kept.iter().map(|f| &*f.function).collect();
        assert_eq!(names, ["app::build", "alloc::alloc::alloc", "main"]);
    }

    #[test]
    fn own_test_binary_symbolizes_with_file_and_line() {
        // Symbolize an address of this very test function from our own file.
        let space = crate::normalize::AddressSpace::read(std::process::id()).unwrap();
        let addr = own_test_binary_symbolizes_with_file_and_line as *const () as u64;
        let at = space.normalize(addr).expect("our code is file-backed");
        let frames = symbolize_stack(&symbolizer(), &mut Interner::default(), &[(addr, Some(at))]);
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
        let mut symbolizer = symbolizer();
        let mut used = UsedFiles::default();
        let space = crate::normalize::AddressSpace::read(std::process::id()).unwrap();
        let addr = blazesym_forgets_released_files as *const () as u64;
        let frames = vec![(addr, space.normalize(addr))];
        used.note(&frames);
        let symbolized = symbolize_stack(&symbolizer, &mut Interner::default(), &frames);
        assert!(symbolized[0].function.contains("blazesym_forgets"));
        used.evict_released(&mut symbolizer);
        assert_eq!(used.len(), 1, "still held by the address space");
        drop((space, frames));
        used.evict_released(&mut symbolizer);
        assert_eq!(used.len(), 0, "released files leave blazesym's cache");
    }

    thread_local! {
        /// Makes `resolve` panic for this file (tests of containment: no
        /// file at hand is known to make blazesym itself panic).
        static PANIC_ON: std::cell::RefCell<Option<PathBuf>> =
            const { std::cell::RefCell::new(None) };
    }

    pub(super) fn maybe_inject_panic(source: &Source<'_>) {
        if let Source::Elf(elf) = source
            && PANIC_ON.with_borrow(|p| p.as_ref() == Some(&elf.path))
        {
            panic!("injected for {}", elf.path.display());
        }
    }

    /// A malformed ELF: a valid identification, then garbage (section
    /// headers "at" an absurd offset).
    fn malformed_elf(name: &str) -> OpenFile {
        let path = std::env::temp_dir().join(format!("allocprof-{name}-{}", std::process::id()));
        let mut data = b"\x7fELF\x02\x01\x01\0".to_vec();
        data.resize(64, 0);
        data[16] = 3; // ET_DYN
        data[18] = 62; // EM_X86_64
        data[40..48].copy_from_slice(&u64::MAX.to_le_bytes()); // e_shoff
        data[58] = 64; // e_shentsize
        data[60] = 0xff; // e_shnum
        data.extend(std::iter::repeat_n(0xa5, 4096));
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        OpenFile {
            id: crate::discover::FileId { dev: 0, ino: 1 },
            file,
            display: PathBuf::from("/opt/broken/libbroken.so"),
        }
    }

    #[test]
    fn a_panic_in_one_file_costs_only_that_file_s_frames() {
        let space = crate::normalize::AddressSpace::read(std::process::id()).unwrap();
        // As a return address (callers' frames are looked up one byte back).
        let addr = a_panic_in_one_file_costs_only_that_file_s_frames as *const () as u64 + 1;
        let ours = space.normalize(addr).expect("our code is file-backed");
        let broken = Arc::new(malformed_elf("broken"));
        let at_broken = FileAddr {
            file: Arc::new(MappedFile {
                path: broken.display.clone(),
                open: Some(broken.clone()),
            }),
            file_offset: 0x1234,
        };
        let stack = [(0x7f00_0000_1234, Some(at_broken)), (addr, Some(ours))];
        let symbolizer = symbolizer();
        // Malformed, blazesym reports an error: an unknown frame.
        let frames = symbolize_stack(&symbolizer, &mut Interner::default(), &stack);
        assert_eq!(&*frames[0].function, "libbroken.so+0x1234", "{frames:?}");
        // Panicking on it (injected), the frame is unknown with the reason,
        // the other file still symbolizes, and the panic hook stays quiet.
        PANIC_ON.set(Some(broken.fd_path()));
        let hook_ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ran = hook_ran.clone();
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |_| {
            ran.store(true, std::sync::atomic::Ordering::SeqCst)
        }));
        let frames = {
            let _quiet = QuietContainedPanics::install();
            symbolize_stack(&symbolizer, &mut Interner::default(), &stack)
        };
        std::panic::set_hook(previous);
        PANIC_ON.set(None);
        assert!(
            frames[0]
                .function
                .starts_with("libbroken.so+0x1234 [symbolizer panicked: injected"),
            "{frames:?}"
        );
        assert!(
            frames
                .iter()
                .any(|f| f.function.contains("a_panic_in_one_file_costs_only")),
            "{frames:?}"
        );
        assert!(
            !hook_ran.load(std::sync::atomic::Ordering::SeqCst),
            "a contained panic must not reach the panic hook (the TUI's restores the terminal)"
        );
        // The thread is still usable.
        let again = symbolize_stack(&symbolizer, &mut Interner::default(), &stack[1..]);
        assert!(again[0].function.contains("a_panic_in_one_file_costs_only"));
    }
}

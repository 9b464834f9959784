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

pub(crate) use self::frames::strip_allocator_frames;
pub use self::frames::{is_allocator_frame, is_library_frame, most_informative};
use crate::{
    process::discover::OpenFile,
    process::normalize::{FileAddr, MappedFile},
};

mod frames;
#[cfg(test)]
mod tests;

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
    /// Where the frame's instruction is in `module`, as a file offset (a
    /// caller's return address stepped back into its call): set only on
    /// frames left unsymbolized for the backend to symbolize
    /// ([`Symbolization::Addresses`]), whose names say no more than this.
    pub offset: Option<u64>,
    /// Machine code, or a Python function.
    pub kind: FrameKind,
}

/// What a frame runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrameKind {
    /// Machine code: `function` a symbol, `module` the file it is in.
    #[default]
    Native,
    /// Python code of a CPython process: `function` the code's qualified
    /// name, `location` its `file:line` (the file alone when the line is
    /// unknown), `module` [`PYTHON_MODULE`] (pprof's and OTLP's mapping).
    Python,
}

/// The module of every Python frame: what the exports file Python code
/// under (its files are in the frames' locations).
pub const PYTHON_MODULE: &str = "[python]";

impl Frame {
    /// A Python frame: `qualname` at `file:line`.
    pub fn python(qualname: &str, file: &str, line: Option<i32>) -> Frame {
        Frame {
            location: Some(match line {
                Some(line) => format!("{file}:{line}").into(),
                None => file.into(),
            }),
            module: Some(PYTHON_MODULE.into()),
            kind: FrameKind::Python,
            ..Frame::named(qualname)
        }
    }

    /// A marker among Python frames (code that could not be read, a walk
    /// cut short).
    pub fn python_marker(text: &str) -> Frame {
        Frame {
            kind: FrameKind::Python,
            ..Frame::named(text)
        }
    }

    /// Its name in a flamegraph: a Python frame's function and line
    /// ([`Frame::site_name`]; each line its own box, as py-spy draws them),
    /// a native frame's function.
    pub fn flame_name(&self) -> Name {
        match self.kind {
            FrameKind::Python => self.site_name().into(),
            FrameKind::Native => self.function.clone(),
        }
    }

    /// How a site is named by this frame: a Python frame by its function,
    /// file name and line (`handle_request (server.py:42)`), a native one by
    /// its function.
    pub fn site_name(&self) -> String {
        match (self.kind, self.location.as_deref()) {
            (FrameKind::Python, Some(location)) => format!(
                "{} ({})",
                self.function,
                location.rsplit('/').next().unwrap_or(location)
            ),
            _ => self.function.to_string(),
        }
    }
}

impl Frame {
    /// A frame known only by a name (placeholders, unknown code, tests).
    pub fn named(function: impl Into<Name>) -> Frame {
        Frame {
            function: function.into(),
            location: None,
            module: None,
            inlined: false,
            offset: None,
            kind: FrameKind::Native,
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
    /// The thread's Python frames, resolved, innermost first: they take
    /// the place of the native eval frames (`python::merge`).
    pub python: Vec<crate::python::merge::PyItem>,
}

/// Symbolized stack, innermost frame first, allocator frames removed.
pub struct Response<K> {
    pub key: K,
    /// Shared with every other answer of the same stack (500 copies of a
    /// program ask for the same stacks: one copy each, not 500).
    pub frames: Arc<[Frame]>,
}

/// Handle to the symbolization thread.
pub struct SymbolizerThread<K> {
    requests: mpsc::Sender<Vec<Request<K>>>,
    responses: mpsc::Receiver<Response<K>>,
}

/// What becomes of the stacks' addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Symbolization {
    /// Function names, inlined calls and file:line, from the files.
    #[default]
    Names,
    /// No symbolization: each frame is its file and file offset
    /// ([`Frame::offset`]), for a backend that symbolizes (`allocprof agent
    /// --no-symbolize`). Allocator frames are still dropped by file.
    Addresses,
}

impl<K: Send + 'static> SymbolizerThread<K> {
    pub fn spawn() -> SymbolizerThread<K> {
        SymbolizerThread::spawn_with(Symbolization::Names)
    }

    pub fn spawn_with(mode: Symbolization) -> SymbolizerThread<K> {
        let (req_tx, req_rx) = mpsc::channel::<Vec<Request<K>>>();
        let (resp_tx, resp_rx) = mpsc::channel();
        thread::Builder::new()
            .name("symbolize".into())
            .spawn(move || {
                let mut symbolizer = symbolizer();
                let mut used = UsedFiles::default();
                let mut names = Interner::default();
                let mut memo = Memo::default();
                for batch in req_rx {
                    let _quiet = QuietContainedPanics::install();
                    for Request {
                        key,
                        frames,
                        python,
                    } in batch
                    {
                        used.note(&frames);
                        let symbolized = match mode {
                            Symbolization::Names => memo.symbolize(&frames, |frames| {
                                symbolize_stack(&symbolizer, &mut names, frames)
                            }),
                            Symbolization::Addresses => address_stack(&mut names, &frames).into(),
                        };
                        let symbolized = if python.is_empty() {
                            symbolized
                        } else {
                            crate::python::merge::merge(symbolized.to_vec(), python).into()
                        };
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

/// Equal values held once, by every holder, for as long as some holder
/// does: names across frames ([`Interner`]), and in the session one copy of
/// a symbolized stack for every process running the same program (500
/// copies of a program were 500 copies of each of its stacks) and one of a
/// set of build ids; sharing also lets the exports tell equal stacks by
/// their address. Unheld values are swept once the set has doubled since
/// the last sweep (and reached `2 * MIN`): a sweep is one pass over it.
pub(crate) struct Shared<T: ?Sized, const MIN: usize = 1024> {
    values: HashSet<Arc<T>, foldhash::fast::RandomState>,
    /// How many were left by the last sweep.
    swept: usize,
}

/// Shares equal names across frames.
pub(crate) type Interner = Shared<str, 4096>;

impl<T: ?Sized, const MIN: usize> Default for Shared<T, MIN> {
    fn default() -> Self {
        Shared {
            values: HashSet::default(),
            swept: 0,
        }
    }
}

impl<T: ?Sized + std::hash::Hash + Eq, const MIN: usize> Shared<T, MIN> {
    /// The one copy of `value`.
    pub(crate) fn share<V: Into<Arc<T>> + std::borrow::Borrow<T>>(&mut self, value: V) -> Arc<T> {
        if let Some(shared) = self.values.get(value.borrow()) {
            return shared.clone();
        }
        let shared: Arc<T> = value.into();
        self.values.insert(shared.clone());
        shared
    }

    /// Forgets the values nobody else holds, once enough have come since
    /// the last sweep (its holders call it after a batch of `share`s).
    pub(crate) fn sweep(&mut self) {
        if self.values.len() < 2 * self.swept.max(MIN) {
            return;
        }
        self.values.retain(|v| Arc::strong_count(v) > 1);
        self.swept = self.values.len();
    }
}

impl Interner {
    pub(crate) fn name(&mut self, name: &str) -> Name {
        self.share(name)
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
            by_file
                .entry(&at.file)
                .or_default()
                .push((i, call_offset(i, at)));
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
    assemble(frames, symbolized, failures, None)
}

/// Stacks symbolized lately, by all that their names depend on: where
/// each frame is (the file as the process names it, the file itself, the
/// offset) or, outside any file, its address. Copies of one program share
/// their stacks at that level: 500 of them asked for the same 40 stacks
/// 500 times, most of the agent's start-up.
#[derive(Default)]
pub(crate) struct Memo {
    stacks: HashMap<Vec<MemoFrame>, Arc<[Frame]>, foldhash::fast::RandomState>,
}

#[derive(PartialEq, Eq, Hash)]
enum MemoFrame {
    In {
        path: PathBuf,
        file: Option<crate::ids::FileId>,
        offset: u64,
    },
    At(u64),
}

/// The stacks [`Memo`] keeps (about 2 KiB each): forgotten all at once
/// when full.
const MEMO_STACKS: usize = 2048;

impl Memo {
    /// The names of `frames`, from `symbolize` unless known.
    pub(crate) fn symbolize(
        &mut self,
        frames: &[(u64, Option<FileAddr>)],
        symbolize: impl FnOnce(&[(u64, Option<FileAddr>)]) -> Vec<Frame>,
    ) -> Arc<[Frame]> {
        let key: Vec<MemoFrame> = frames
            .iter()
            .map(|(addr, at)| match at {
                Some(at) => MemoFrame::In {
                    path: at.file.path.clone(),
                    file: at.file.open.as_ref().map(|o| o.id),
                    offset: at.file_offset,
                },
                None => MemoFrame::At(*addr),
            })
            .collect();
        if let Some(known) = self.stacks.get(&key) {
            return known.clone();
        }
        let symbolized: Arc<[Frame]> = symbolize(frames).into();
        if self.stacks.len() >= MEMO_STACKS {
            self.stacks.clear();
        }
        self.stacks.insert(key, symbolized.clone());
        symbolized
    }
}

/// One stack left unsymbolized, innermost first: a frame per address, named
/// by file and offset, with its offset ([`Symbolization::Addresses`]).
pub(crate) fn address_stack(
    names: &mut Interner,
    frames: &[(u64, Option<FileAddr>)],
) -> Vec<Frame> {
    let n = frames.len();
    assemble(frames, vec![None; n], vec![None; n], Some(names))
}

/// The stack's frames: each address's symbols, else a marker or an unknown
/// frame (with its offset when `offsets` interns their names).
fn assemble(
    frames: &[(u64, Option<FileAddr>)],
    symbolized: Vec<Option<Vec<Frame>>>,
    failures: Vec<Option<String>>,
    mut offsets: Option<&mut Interner>,
) -> Vec<Frame> {
    let mut out = Vec::with_capacity(frames.len());
    let mut previous: Option<&FileAddr> = None;
    for (i, (((addr, at), sym), failure)) in frames.iter().zip(symbolized).zip(failures).enumerate()
    {
        if *addr == TRUNCATED_FRAME {
            out.push(truncation_marker(previous));
            continue;
        }
        if *addr == crate::process::ledger::CUT_FRAME {
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
            (None, None) => {
                let unknown = Frame::unknown(*addr, at.as_ref());
                match (offsets.as_deref_mut(), at) {
                    (Some(names), Some(at)) => out.push(Frame {
                        function: names.name(&unknown.function),
                        module: unknown.module.as_deref().map(|m| names.name(m)),
                        offset: Some(call_offset(i, at)),
                        ..unknown
                    }),
                    _ => out.push(unknown),
                }
            }
        }
    }
    strip_allocator_frames(out)
}

/// The file offset of frame `i`'s instruction: return addresses point past
/// the call, so a caller's steps back into it; the first frame is the probe
/// site itself.
fn call_offset(i: usize, at: &FileAddr) -> u64 {
    if i == 0 {
        at.file_offset
    } else {
        at.file_offset.saturating_sub(1)
    }
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
            offset: None,
            kind: FrameKind::Native,
        });
    }
    frames.push(Frame {
        function: names.name(&demangle(&sym.name)),
        location: sym.code_info.as_deref().map(|c| names.name(&location(c))),
        module: Some(module.clone()),
        inlined: false,
        offset: None,
        kind: FrameKind::Native,
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

/// A file's name without its directories.
fn basename(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

//! The tables a profile's encodings share: strings, functions, mappings,
//! locations and stacks. pprof (`pprof/encode.rs`) and OTLP (`otlp/`) walk a
//! profile's processes and stacks and intern each stack here as they write
//! its samples; each then writes these same tables in its own messages.
//!
//! - Entries are interned once, in first-use order, and only when asked
//!   for: a table holds nothing no sample references.
//! - An entry's id in both encodings is its position + 1: pprof's ids start
//!   at 1 (0 is "none"), OTLP's index 0 is each table's zero value. The
//!   string table's index 0 is "" (both formats').
//! - A location is a machine frame and the frames inlined into it,
//!   innermost first; a stack the locations of a profile stack's frames.
//! - A mapping is a file by path and GNU build id (one path may name
//!   different files in different processes: containers, a library upgraded
//!   in place), its build id read from the files the process mapped, or from
//!   the path where those are unknown.
//! - Addresses only (OTLP's `--no-symbolize`): a frame with a file offset
//!   ([`Frame::offset`]) gets no lines; its location's address is the
//!   offset, its mapping the file as if mapped at 0 (`memory_limit` just
//!   past the highest address).

use std::{collections::HashMap, path::Path, sync::Arc};

use foldhash::fast::RandomState;

use super::build_id::build_id;
use crate::{
    model::profile::BuildIds,
    symbolize::{Frame, FrameKind, PYTHON_MODULE},
};

/// A stack and the build ids it was interned with.
type SharedStack = (Arc<[Frame]>, Option<Arc<BuildIds>>);

/// The tables under construction (see the module doc).
pub struct Tables {
    pub strings: Vec<String>,
    pub functions: Vec<FunctionEntry>,
    pub mappings: Vec<MappingEntry>,
    pub locations: Vec<LocationEntry>,
    /// Each stack's locations, innermost first.
    pub stacks: Vec<Vec<usize>>,
    // foldhash: the keys hash target-controlled names, as the profile's
    // merge does (SipHash over them was most of an export's time).
    string_ids: HashMap<String, usize, RandomState>,
    function_ids: HashMap<(usize, usize), usize, RandomState>,
    mapping_ids: HashMap<(String, Option<String>), usize, RandomState>,
    location_ids: HashMap<(Vec<Frame>, Option<usize>), usize, RandomState>,
    stack_ids: HashMap<Vec<usize>, usize, RandomState>,
    /// [`Tables::shared_stack`]'s: a stack by the addresses of its frames
    /// and its build ids, which `held` keeps from being reused.
    shared_ids: HashMap<(usize, usize), usize, RandomState>,
    held: Vec<SharedStack>,
    addresses_only: bool,
}

/// A function: its name and source file (string indices).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FunctionEntry {
    pub name: usize,
    pub file: usize,
}

/// A mapped file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MappingEntry {
    /// Its path (a string index).
    pub path: usize,
    /// Its GNU build id (hex), if it has one.
    pub build_id: Option<String>,
    /// What its locations' lines hold (pprof's mapping flags).
    pub has_filenames: bool,
    pub has_line_numbers: bool,
    pub has_inline_frames: bool,
    /// Just past the highest address of its locations (0: none has one).
    pub memory_limit: u64,
}

/// A machine frame with the frames inlined into it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocationEntry {
    /// Its file's mapping, if the frame has a file.
    pub mapping: Option<usize>,
    /// The file offset of its instruction (addresses only; else 0).
    pub address: u64,
    /// Innermost first; none for an address left to the backend.
    pub lines: Vec<LineEntry>,
    /// Machine code or Python (OTLP names a Python frame's type).
    pub kind: FrameKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineEntry {
    pub function: usize,
    /// 0 where unknown.
    pub line: i64,
}

impl Tables {
    /// Empty tables (the string table holds ""); `addresses_only` leaves
    /// frames with an offset without lines.
    pub fn new(addresses_only: bool) -> Tables {
        let mut t = Tables {
            strings: Vec::new(),
            functions: Vec::new(),
            mappings: Vec::new(),
            locations: Vec::new(),
            stacks: Vec::new(),
            string_ids: HashMap::default(),
            function_ids: HashMap::default(),
            mapping_ids: HashMap::default(),
            location_ids: HashMap::default(),
            stack_ids: HashMap::default(),
            shared_ids: HashMap::default(),
            held: Vec::new(),
            addresses_only,
        };
        t.string("");
        t
    }

    pub fn string(&mut self, s: &str) -> usize {
        if let Some(&i) = self.string_ids.get(s) {
            return i;
        }
        let i = self.strings.len();
        self.strings.push(s.to_owned());
        self.string_ids.insert(s.to_owned(), i);
        i
    }

    /// The mapping of file `module`; its build id from the files the
    /// process mapped (`ids`), or read from the path where those are
    /// unknown.
    pub fn mapping(&mut self, module: &str, ids: Option<&BuildIds>) -> usize {
        let build_id = match ids {
            Some(ids) => ids.get(module).map(|id| id.to_string()),
            // Python code's mapping is no file.
            None if module == PYTHON_MODULE => None,
            None => build_id(Path::new(module)),
        };
        let key = (module.to_owned(), build_id);
        if let Some(&i) = self.mapping_ids.get(&key) {
            return i;
        }
        let i = self.mappings.len();
        let path = self.string(module);
        self.mappings.push(MappingEntry {
            path,
            build_id: key.1.clone(),
            ..MappingEntry::default()
        });
        self.mapping_ids.insert(key, i);
        i
    }

    pub fn function(&mut self, name: &str, file: &str) -> usize {
        let key = (self.string(name), self.string(file));
        if let Some(&i) = self.function_ids.get(&key) {
            return i;
        }
        let i = self.functions.len();
        self.functions.push(FunctionEntry {
            name: key.0,
            file: key.1,
        });
        self.function_ids.insert(key, i);
        i
    }

    /// The stack of `frames` (innermost first): each machine frame with the
    /// frames inlined into it (which precede it).
    pub fn stack(&mut self, frames: &[Frame], ids: Option<&BuildIds>) -> usize {
        let mut locations = Vec::new();
        let mut start = 0;
        for (i, f) in frames.iter().enumerate() {
            if f.inlined && i + 1 < frames.len() {
                continue;
            }
            locations.push(self.location(&frames[start..=i], ids));
            start = i + 1;
        }
        if let Some(&i) = self.stack_ids.get(&locations) {
            return i;
        }
        let i = self.stacks.len();
        self.stack_ids.insert(locations.clone(), i);
        self.stacks.push(locations);
        i
    }

    /// [`Tables::stack`] of a profile's stack, found again by address: a
    /// session holds each distinct stack and set of build ids once (500
    /// processes of one program share theirs), so a stack's second and
    /// later samples, in any process, cost one lookup.
    pub fn shared_stack(&mut self, frames: &Arc<[Frame]>, ids: Option<&Arc<BuildIds>>) -> usize {
        let key = (
            Arc::as_ptr(frames).cast::<Frame>() as usize,
            ids.map_or(0, |ids| Arc::as_ptr(ids) as usize),
        );
        if let Some(&i) = self.shared_ids.get(&key) {
            return i;
        }
        let i = self.stack(frames, ids.map(|ids| &**ids));
        self.shared_ids.insert(key, i);
        self.held.push((frames.clone(), ids.cloned()));
        i
    }

    /// A machine frame and the frames inlined into it, innermost first.
    fn location(&mut self, chain: &[Frame], ids: Option<&BuildIds>) -> usize {
        let outer = chain.last().expect("a location has a frame");
        let mapping = outer.module.as_deref().map(|m| self.mapping(m, ids));
        let key = (chain.to_vec(), mapping);
        if let Some(&i) = self.location_ids.get(&key) {
            return i;
        }
        let lines: Vec<LineEntry> = if self.addresses_only && outer.offset.is_some() {
            Vec::new()
        } else {
            chain
                .iter()
                .map(|f| {
                    let (file, line) = split_location(f.location.as_deref());
                    LineEntry {
                        function: self.function(&f.function, file),
                        line,
                    }
                })
                .collect()
        };
        // An address lies within its mapping, which starts at 0.
        let address = outer.offset.filter(|_| mapping.is_some()).unwrap_or(0);
        if let Some(m) = mapping {
            let filenames = lines.iter().any(|l| self.functions[l.function].file != 0);
            let line_numbers = lines.iter().any(|l| l.line != 0);
            let file = &mut self.mappings[m];
            file.has_filenames |= filenames;
            file.has_line_numbers |= line_numbers;
            file.has_inline_frames |= chain.len() > 1;
            if address != 0 {
                file.memory_limit = file.memory_limit.max(address.saturating_add(1));
            }
        }
        let i = self.locations.len();
        self.locations.push(LocationEntry {
            mapping,
            address,
            lines,
            kind: outer.kind,
        });
        self.location_ids.insert(key, i);
        i
    }
}

/// `file:line` → (file, line); a location without a line number → (it, 0).
pub fn split_location(location: Option<&str>) -> (&str, i64) {
    let Some(loc) = location else {
        return ("", 0);
    };
    match loc.rsplit_once(':') {
        Some((file, line)) => match line.parse::<i64>() {
            Ok(n) if n > 0 => (file, n),
            _ => (loc, 0),
        },
        None => (loc, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::export::tests::frame;

    fn at(function: &str, module: &str, location: &str) -> Frame {
        let mut f = frame(function, Some(module));
        f.location = Some(location.into());
        f
    }

    fn ids(pairs: &[(&str, &str)]) -> BuildIds {
        pairs
            .iter()
            .map(|&(path, id)| (path.into(), id.into()))
            .collect()
    }

    #[test]
    fn entries_are_interned_once_in_first_use_order() {
        let ids = ids(&[("/bin/a", "aa"), ("/lib/libc.so.6", "cc")]);
        let mut t = Tables::new(false);
        let leaf = at("leaf", "/bin/a", "/src/a.c:3");
        let main = at("main", "/bin/a", "/src/a.c:9");
        let start = frame("__libc_start_main", Some("/lib/libc.so.6"));
        let first = t.stack(&[leaf.clone(), main.clone(), start.clone()], Some(&ids));
        let again = t.stack(&[leaf, main.clone(), start.clone()], Some(&ids));
        let other = t.stack(&[main, start], Some(&ids));
        assert_eq!((first, again, other), (0, 0, 1));
        assert_eq!(t.stacks, [vec![0, 1, 2], vec![1, 2]]);
        assert_eq!(t.locations.len(), 3, "main and start shared");
        assert_eq!(t.mappings.len(), 2);
        let string = |i: usize| t.strings[i].as_str();
        assert_eq!(string(0), "");
        assert_eq!(string(t.mappings[0].path), "/bin/a");
        assert_eq!(t.mappings[0].build_id.as_deref(), Some("aa"));
        assert_eq!(t.mappings[1].build_id.as_deref(), Some("cc"));
        let names: Vec<&str> = t.functions.iter().map(|f| string(f.name)).collect();
        assert_eq!(names, ["leaf", "main", "__libc_start_main"]);
        assert_eq!(string(t.functions[0].file), "/src/a.c");
        assert_eq!(
            t.locations[0].lines,
            [LineEntry {
                function: 0,
                line: 3
            }]
        );
        assert_eq!(t.locations[2].mapping, Some(1));
        // Flags: a's lines have files and line numbers, libc's none.
        let a = &t.mappings[0];
        assert!(a.has_filenames && a.has_line_numbers && !a.has_inline_frames);
        let libc = &t.mappings[1];
        assert!(!libc.has_filenames && !libc.has_line_numbers);
    }

    #[test]
    fn inlined_frames_share_their_caller_s_location_innermost_first() {
        let mut t = Tables::new(false);
        let mut helper = at("helper", "/bin/a", "/src/a.c:40");
        helper.inlined = true;
        let caller = at("caller", "/bin/a", "/src/a.c:42");
        t.stack(&[helper, caller], None);
        assert_eq!(t.stacks, [vec![0]]);
        let lines: Vec<(&str, i64)> = t.locations[0]
            .lines
            .iter()
            .map(|l| (t.strings[t.functions[l.function].name].as_str(), l.line))
            .collect();
        assert_eq!(lines, [("helper", 40), ("caller", 42)]);
        assert!(t.mappings[0].has_inline_frames);
    }

    #[test]
    fn one_path_naming_two_files_is_two_mappings() {
        let mut t = Tables::new(false);
        let f = at("f", "/bin/a", "/src/a.c:1");
        let old = t.stack(std::slice::from_ref(&f), Some(&ids(&[("/bin/a", "01")])));
        let new = t.stack(std::slice::from_ref(&f), Some(&ids(&[("/bin/a", "02")])));
        assert_ne!(old, new);
        assert_eq!(t.mappings.len(), 2);
        assert_eq!(t.locations.len(), 2, "a location per file");
        assert_eq!(t.functions.len(), 1, "one function all the same");
        assert_eq!(t.mappings[0].path, t.mappings[1].path);
    }

    #[test]
    fn addresses_only_frames_with_offsets_get_no_lines_and_bound_their_mapping() {
        let mut t = Tables::new(true);
        let mut low = frame("a+0x10", Some("/bin/a"));
        low.offset = Some(0x10);
        let mut high = frame("a+0x2f0", Some("/bin/a"));
        high.offset = Some(0x2f0);
        let marker = frame("[truncated]", None);
        t.stack(&[low, high, marker], None);
        assert_eq!(t.locations[0].address, 0x10);
        assert_eq!(t.locations[1].address, 0x2f0);
        assert!(t.locations[0].lines.is_empty() && t.locations[1].lines.is_empty());
        assert_eq!(t.mappings[0].memory_limit, 0x2f1);
        // allocprof's own markers stay named, without a mapping.
        assert_eq!(t.locations[2].mapping, None);
        assert_eq!(t.locations[2].lines.len(), 1);
        // Symbolized, the same frames keep their names.
        let mut t = Tables::new(false);
        let mut f = frame("a+0x10", Some("/bin/a"));
        f.offset = Some(0x10);
        t.stack(&[f], None);
        assert_eq!(t.locations[0].lines.len(), 1);
    }

    #[test]
    fn locations_split_file_and_line() {
        assert_eq!(split_location(Some("/src/a.c:12")), ("/src/a.c", 12));
        assert_eq!(split_location(Some("/src/a.c")), ("/src/a.c", 0));
        assert_eq!(split_location(Some("C:x")), ("C:x", 0));
        assert_eq!(split_location(None), ("", 0));
    }
}

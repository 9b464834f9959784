//! What the tables show: rows with identities that stay the same across
//! refreshes (a process image, a stack, a function), so that selection,
//! history and baselines follow the row rather than its position.

use std::{
    collections::HashSet,
    hash::{Hash, Hasher},
    sync::Arc,
};

use foldhash::fast::RandomState;

use allocprof::{
    model::profile::{ProcessKey, ProcessProfile, ProcessState, Profile, StackProfile},
    model::stats::Totals,
    output::inert::inert,
    symbolize::{Frame, FrameKind, Name, is_allocator_frame, is_library_frame, most_informative},
};

/// How the stack view groups stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grouping {
    /// A row per distinct symbolized stack.
    Stack,
    /// A row per most informative function: its stacks summed.
    Function,
}

impl Grouping {
    pub fn describe(self) -> &'static str {
        match self {
            Grouping::Stack => "by stack",
            Grouping::Function => "by function",
        }
    }
}

/// The stable identity of a row. `scope` is the process a stack row belongs
/// to: every stack row is one process's, even in the all-processes view, so
/// that each row can say whose it is (it is `Option` only for identities
/// made before a profile names the process).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RowId {
    Process(ProcessKey),
    Stack {
        scope: Option<ProcessKey>,
        frames: Arc<[Frame]>,
    },
    Function {
        scope: Option<ProcessKey>,
        /// The frame's own name (shared: no copy per stack).
        name: Name,
    },
}

/// Hashes part of what equality compares (a stack's function names, not
/// their lines and modules): equal ids hash alike, and tens of thousands of
/// stacks are hashed at every refresh.
impl Hash for RowId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            RowId::Process(key) => key.hash(state),
            RowId::Stack { scope, frames } => {
                scope.hash(state);
                state.write_usize(frames.len());
                for f in frames.iter() {
                    state.write(f.function.as_bytes());
                }
            }
            RowId::Function { scope, name } => {
                scope.hash(state);
                name.hash(state);
            }
        }
    }
}

/// Maps keyed by row: foldhash, much faster than SipHash on long keys (no
/// key here is chosen to collide: names are hashed with a random seed).
pub type HashMap<K, V> = std::collections::HashMap<K, V, RandomState>;

/// One row of a table, with everything its columns show.
#[derive(Clone, Debug)]
pub struct Row {
    pub id: RowId,
    pub label: String,
    pub totals: Totals,
    /// Share of the view's live bytes, 0..=1.
    pub share: f64,
    /// Bytes allocated per second, over the rate window.
    pub alloc_rate: Option<f64>,
    /// Live bytes gained over the growth window (about a minute).
    pub growth: Option<f64>,
    /// Live bytes gained since the baseline, when one is marked.
    pub since_baseline: Option<f64>,
    /// The stack shown in the detail pane: the row's own, or for a function
    /// row, its heaviest. Empty for process rows.
    pub frames: Arc<[Frame]>,
    /// Process rows only.
    pub process: Option<ProcessInfo>,
    /// The row's process exited or exec'ed: its figures are as they were
    /// then ("at exit"), not live heap, and it sorts apart, after the
    /// running processes' rows.
    pub gone: bool,
    /// Its place in its process tree, in the process table's trees (`t`).
    pub tree: Option<TreeMark>,
}

impl Row {
    /// The process the row is (a process row) or is of (a stack or
    /// function row).
    pub fn process_key(&self) -> Option<ProcessKey> {
        match &self.id {
            RowId::Process(key) => Some(*key),
            RowId::Stack { scope, .. } | RowId::Function { scope, .. } => *scope,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    pub name: String,
    pub state: ProcessState,
    /// What it has resident (running processes).
    pub resident: Option<allocprof::process::discover::Resident>,
    /// The combined thinning factor when its samples were thinned (the
    /// allocator's budget, the kernel's back-pressure): its ± is marked.
    pub thinned: Option<u64>,
}

/// The profiles a set of rows is computed from.
#[derive(Clone, Copy)]
pub struct Inputs<'a> {
    pub current: &'a Profile,
    /// A few seconds older than `current`: allocation rates.
    pub rate_ref: Option<&'a Profile>,
    /// About a minute older than `current`: growth.
    pub growth_ref: Option<&'a Profile>,
    pub baseline: Option<&'a Profile>,
}

/// The function that names a stack (`symbolize::most_informative`).
pub fn function_of(frames: &[Frame]) -> String {
    most_informative(frames)
        .map(Frame::site_name)
        .unwrap_or_else(|| "[empty stack]".into())
}

/// [`function_of`] without a copy: the naming frame's own name.
pub fn function_name(frames: &[Frame]) -> Name {
    most_informative(frames)
        .map(|f| f.function.clone())
        .unwrap_or_else(|| "[empty stack]".into())
}

/// A stack from the frame that names it (`function_of`) outward: what is
/// under that frame is the allocator's and the library's.
pub fn from_naming_frame(frames: &Arc<[Frame]>) -> Arc<[Frame]> {
    let naming = most_informative(frames).map(std::ptr::from_ref);
    match frames
        .iter()
        .position(|f| Some(std::ptr::from_ref(f)) == naming)
    {
        Some(at) if at > 0 => frames[at..].into(),
        _ => frames.clone(),
    }
}

/// A stack's label: its most informative frame and that frame's nearest
/// informative caller, which tells apart stacks through the same function.
pub fn stack_label(frames: &[Frame]) -> String {
    // A Python process's stack: by its innermost Python function and line.
    if let Some(python) = most_informative(frames).filter(|f| f.kind == FrameKind::Python) {
        return python.site_name();
    }
    let informative = |f: &&Frame| !is_allocator_frame(f) && !is_library_frame(f);
    let Some(first) = frames.iter().position(|f| informative(&f)) else {
        return function_of(frames);
    };
    match frames[first + 1..].iter().find(informative) {
        Some(caller) => format!("{} ← {}", frames[first].function, caller.function),
        None => frames[first].function.to_string(),
    }
}

/// Tells apart stacks whose labels are equal (same function, same caller):
/// by the line of the naming frame, else by the innermost frame (where the
/// allocation was made, e.g. `vec::from_elem` or `RawVec::grow`), else by an
/// ordinal in frame order (stable across refreshes; the help explains `#N`).
fn disambiguate(rows: &mut [Row]) {
    let naming_line = |r: &Row| {
        most_informative(&r.frames)
            .and_then(|f| f.location.as_deref())
            .map(|l| format!(" @{}", l.rsplit('/').next().unwrap_or(l)))
    };
    let innermost = |r: &Row| {
        let first = r.frames.first()?;
        let naming = most_informative(&r.frames)?;
        (first != naming).then(|| format!(" via {}", short_function(&first.function)))
    };
    split_duplicates(rows, naming_line);
    split_duplicates(rows, innermost);
    let mut ordinal = |_: &Row| None::<String>;
    split_duplicates(rows, &mut ordinal);
}

/// Appends `suffix(row)` to the labels of rows that share a label, where
/// the suffix tells at least two of them apart; numbers them as a last
/// resort (no suffix given).
fn split_duplicates(rows: &mut [Row], mut suffix: impl FnMut(&Row) -> Option<String>) {
    // Rows of different processes are told apart by their process.
    let mut by_label: HashMap<(String, Option<ProcessKey>), Vec<usize>> = HashMap::default();
    for (i, r) in rows.iter().enumerate() {
        let process = match &r.id {
            RowId::Process(key) => Some(*key),
            RowId::Stack { scope, .. } | RowId::Function { scope, .. } => *scope,
        };
        by_label
            .entry((r.label.clone(), process))
            .or_default()
            .push(i);
    }
    for (_, mut same) in by_label.into_iter().filter(|(_, v)| v.len() > 1) {
        let suffixes: Vec<Option<String>> = same.iter().map(|&i| suffix(&rows[i])).collect();
        let distinct = suffixes.iter().collect::<HashSet<_>>().len();
        if suffixes.iter().all(Option::is_none) {
            same.sort_by(|&a, &b| rows[a].id.cmp(&rows[b].id));
            for (n, i) in same.into_iter().enumerate() {
                rows[i].label.push_str(&format!(" #{}", n + 1));
            }
        } else if distinct > 1 {
            for (i, s) in same.into_iter().zip(suffixes) {
                rows[i].label.push_str(&s.unwrap_or_default());
            }
        }
    }
}

/// `alloc::raw_vec::RawVec<T,A>::grow_one` → `RawVec<T,A>::grow_one`.
fn short_function(name: &str) -> &str {
    if name.starts_with('<') {
        return name;
    }
    // The start of the last two path segments, outside generics.
    let (mut depth, mut last, mut before) = (0, 0, 0);
    let bytes = name.as_bytes();
    for (i, c) in name.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            ':' if depth == 0 && bytes.get(i + 1) == Some(&b':') => {
                before = last;
                last = i + 2;
            }
            _ => {}
        }
    }
    &name[before..]
}

fn in_scope(p: &ProcessProfile, scope: Option<ProcessKey>) -> bool {
    scope.is_none_or(|k| p.key == k)
}

fn stack_id(scope: Option<ProcessKey>, grouping: Grouping, s: &StackProfile) -> RowId {
    match grouping {
        Grouping::Stack => RowId::Stack {
            scope,
            frames: s.frames.clone(),
        },
        Grouping::Function => RowId::Function {
            scope,
            name: function_name(&s.frames),
        },
    }
}

/// The stacks behind one row of the stack view.
#[derive(Clone, Debug)]
pub struct Group {
    pub totals: Totals,
    /// The heaviest stack (live, then allocated bytes).
    pub frames: Arc<[Frame]>,
    /// The process the stacks are of.
    pub process: ProcessKey,
    heaviest: (f64, f64),
}

/// The stacks of a profile grouped into rows, a process's apart from
/// another's (the all-processes view sums nothing across processes).
pub fn stack_groups(
    profile: &Profile,
    scope: Option<ProcessKey>,
    grouping: Grouping,
) -> HashMap<RowId, Group> {
    let stacks = profile
        .processes
        .iter()
        .filter(|p| in_scope(p, scope))
        .map(|p| p.stacks.len())
        .sum();
    // Sized once: growing rehashes every key.
    let mut groups: HashMap<RowId, Group> =
        HashMap::with_capacity_and_hasher(stacks, RandomState::default());
    for p in profile.processes.iter().filter(|p| in_scope(p, scope)) {
        for s in &p.stacks {
            let weight = (s.totals.live_bytes, s.totals.alloc_bytes);
            let group = groups
                .entry(stack_id(Some(p.key), grouping, s))
                .or_insert_with(|| Group {
                    totals: Totals::default(),
                    frames: s.frames.clone(),
                    process: p.key,
                    heaviest: weight,
                });
            group.totals += s.totals;
            if weight > group.heaviest {
                group.frames = s.frames.clone();
                group.heaviest = weight;
            }
        }
    }
    groups
}

/// The totals of one row in a profile (for its history), if it is there.
pub fn totals_of(profile: &Profile, id: &RowId) -> Option<Totals> {
    let scope = match id {
        RowId::Process(key) => {
            return profile
                .processes
                .iter()
                .find(|p| p.key == *key)
                .map(|p| p.totals);
        }
        RowId::Stack { scope, .. } | RowId::Function { scope, .. } => *scope,
    };
    let matches = |s: &StackProfile| match id {
        RowId::Stack { frames, .. } => s.frames == *frames,
        RowId::Function { name, .. } => function_name(&s.frames) == *name,
        RowId::Process(_) => false,
    };
    let mut found = None;
    for p in profile.processes.iter().filter(|p| in_scope(p, scope)) {
        for s in p.stacks.iter().filter(|s| matches(s)) {
            *found.get_or_insert_with(Totals::default) += s.totals;
        }
    }
    found
}

/// Allocated bytes per second between `then` and `now`.
fn rate(now: &Totals, then: Option<&Totals>, seconds: f64) -> f64 {
    let before = then.map_or(0.0, |t| t.alloc_bytes);
    // Never negative: an exec'ed or forgotten image can only lose counts.
    ((now.alloc_bytes - before) / seconds).max(0.0)
}

fn seconds_between(now: &Profile, then: &Profile) -> Option<f64> {
    let dt = now.elapsed.checked_sub(then.elapsed)?.as_secs_f64();
    (dt > 0.0).then_some(dt)
}

/// A row per process image.
pub fn process_rows(inputs: Inputs<'_>) -> Vec<Row> {
    let by_key = |p: Option<&Profile>| -> HashMap<ProcessKey, Totals> {
        p.map(|p| p.processes.iter().map(|q| (q.key, q.totals)).collect())
            .unwrap_or_default()
    };
    let rate_then = by_key(inputs.rate_ref);
    let growth_then = by_key(inputs.growth_ref);
    let baseline = by_key(inputs.baseline);
    let dt = inputs
        .rate_ref
        .and_then(|r| seconds_between(inputs.current, r));
    let gone = |p: &ProcessProfile| p.state != ProcessState::Live;
    let totals = split_total(inputs.current.processes.iter().map(|p| (gone(p), p.totals)));
    inputs
        .current
        .processes
        .iter()
        .map(|p| Row {
            id: RowId::Process(p.key),
            label: inert(&p.name).into_owned(),
            totals: p.totals,
            share: share(p.totals.live_bytes, totals[usize::from(gone(p))]),
            alloc_rate: dt.map(|dt| rate(&p.totals, rate_then.get(&p.key), dt)),
            growth: inputs.growth_ref.and_then(|g| {
                seconds_between(inputs.current, g)?;
                Some(p.totals.live_bytes - growth_then.get(&p.key).map_or(0.0, |t| t.live_bytes))
            }),
            since_baseline: inputs
                .baseline
                .map(|_| p.totals.live_bytes - baseline.get(&p.key).map_or(0.0, |t| t.live_bytes)),
            frames: Arc::from(Vec::new()),
            process: Some(ProcessInfo {
                name: inert(&p.name).into_owned(),
                state: p.state,
                resident: p.resident,
                thinned: p.thinned().then(|| p.combined_thin_factor()),
            }),
            gone: gone(p),
            tree: None,
        })
        .collect()
}

/// A row per stack (or function) of one process, or of each process: then
/// the label names the process (`leak ← tick · python3 (1234)`).
pub fn stack_rows(inputs: Inputs<'_>, scope: Option<ProcessKey>, grouping: Grouping) -> Vec<Row> {
    let groups = stack_groups(inputs.current, scope, grouping);
    let groups_of = |p: Option<&Profile>| p.map(|p| stack_groups(p, scope, grouping));
    let rate_then = groups_of(inputs.rate_ref);
    let growth_then = groups_of(inputs.growth_ref);
    let baseline = groups_of(inputs.baseline);
    let dt = inputs
        .rate_ref
        .and_then(|r| seconds_between(inputs.current, r));
    let growth_ok = inputs
        .growth_ref
        .and_then(|g| seconds_between(inputs.current, g))
        .is_some();

    let live_in = |m: &Option<HashMap<RowId, Group>>, id: &RowId| {
        m.as_ref()
            .and_then(|m| m.get(id))
            .map_or(0.0, |g| g.totals.live_bytes)
    };
    let names: HashMap<ProcessKey, String> = match scope {
        Some(_) => HashMap::default(),
        None => inputs
            .current
            .processes
            .iter()
            .map(|p| match p.state {
                ProcessState::Live => (p.key, format!(" · {}", p.label())),
                // Its figures are at exit (at exec): apart from the live heap.
                state => (p.key, format!(" · {} {}", p.label(), state.describe())),
            })
            .collect(),
    };
    let gone: HashSet<ProcessKey> = inputs
        .current
        .processes
        .iter()
        .filter(|p| p.state != ProcessState::Live)
        .map(|p| p.key)
        .collect();
    let split = split_total(
        groups
            .values()
            .map(|g| (gone.contains(&g.process), g.totals)),
    );
    let mut rows: Vec<Row> = groups
        .iter()
        .map(
            |(
                id,
                Group {
                    totals,
                    frames,
                    process,
                    ..
                },
            )| Row {
                id: id.clone(),
                label: inert(&match grouping {
                    Grouping::Stack => stack_label(frames),
                    Grouping::Function => function_of(frames),
                })
                .into_owned(),
                totals: *totals,
                share: share(
                    totals.live_bytes,
                    split[usize::from(gone.contains(process))],
                ),
                alloc_rate: dt.map(|dt| {
                    let then = rate_then
                        .as_ref()
                        .and_then(|m| m.get(id))
                        .map(|g| &g.totals);
                    rate(totals, then, dt)
                }),
                growth: growth_ok.then(|| totals.live_bytes - live_in(&growth_then, id)),
                since_baseline: baseline
                    .as_ref()
                    .map(|_| totals.live_bytes - live_in(&baseline, id)),
                frames: frames.clone(),
                process: None,
                gone: gone.contains(process),
                tree: None,
            },
        )
        .collect();
    if grouping == Grouping::Stack {
        disambiguate(&mut rows);
    }
    // After telling apart: a process's stacks are told apart among
    // themselves, then named.
    for r in &mut rows {
        if let Some(name) = groups.get(&r.id).and_then(|g| names.get(&g.process)) {
            r.label.push_str(&inert(name));
        }
    }
    rows
}

/// The live bytes of running processes' rows, and of gone ones': each
/// row's share is of its own kind's (the gone held theirs at exit).
fn split_total(rows: impl Iterator<Item = (bool, Totals)>) -> [f64; 2] {
    let mut split = [0.0; 2];
    for (gone, totals) in rows {
        split[usize::from(gone)] += totals.live_bytes;
    }
    split
}

fn share(part: f64, total: f64) -> f64 {
    if total > 0.0 {
        (part / total).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

#[cfg(test)]
pub(crate) mod tests;
pub mod tree;

pub use self::tree::TreeMark;

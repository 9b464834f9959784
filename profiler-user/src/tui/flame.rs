//! The flamegraph's tree, a pure function of a profile: stacks merged from
//! the root (`all`, then a node per process; or one process) down to the
//! allocation sites, and the columns each frame gets on a screen of a given
//! width. Frames are merged by function and module (not by line: one
//! function is one frame however many lines in it allocate).
//!
//! The state (`state/flame.rs`) keeps the selection and zoom as paths of
//! [`Key`]s, so they survive a rebuild from the next profile.
//!
//! (Over 600 lines on purpose: building the tree and laying it out share
//! one node type and its invariants.)

use std::collections::{HashMap, hash_map::Entry};

use foldhash::fast::RandomState;

use allocprof::{
    model::profile::{ProcessKey, ProcessState, Profile, StackProfile},
    model::stats::Totals,
    symbolize::{Frame, Name},
};

pub type NodeId = usize;

/// Children by parent and key, while building.
type Index = HashMap<(NodeId, Key), NodeId, RandomState>;
pub const ROOT: NodeId = 0;

/// What a node is, among its siblings: its identity across rebuilds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    Process(ProcessKey),
    Frame {
        function: Name,
        module: Option<Name>,
    },
}

/// What the widths are proportional to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The estimated live bytes.
    Live,
    /// Live bytes gained since the baseline, stack by stack, with shrinking
    /// stacks counted as 0 (as `allocprof diff`'s folded output omits them).
    Growth,
}

/// Whose stacks the tree holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every running process (the live heap): gone images held their bytes
    /// when they went, which is not live heap.
    All,
    Process(ProcessKey),
    /// A process tree's stacks merged, in a profile where the tree is one
    /// image keyed by its root (`view_model::merged_tree`).
    Tree(ProcessKey),
}

#[derive(Clone, Debug)]
pub struct Node {
    /// `None` for the root.
    pub key: Option<Key>,
    /// As the target named it: the renderer makes it inert.
    pub name: Name,
    /// The module's path (raw too); frames only.
    pub module: Option<Name>,
    /// The live bytes of the stacks through this node, and their variance
    /// (all a node needs of their totals: a tree can have 100k's of nodes).
    pub live_bytes: f64,
    pub live_var: f64,
    /// The largest `Totals::unseen_var` of those stacks (a sum's).
    pub unseen_var: f64,
    /// Σ max(0, growth since the baseline) over those stacks.
    pub growth: f64,
    pub stacks: usize,
    pub parent: Option<NodeId>,
    /// Ordered by name, so that frames keep their place between refreshes.
    pub children: Vec<NodeId>,
    pub depth: usize,
}

impl Node {
    /// The live bytes' 95% interval half-width; NaN when unavailable.
    pub fn live_ci95(&self) -> f64 {
        Totals {
            live_var: self.live_var,
            unseen_var: self.unseen_var,
            ..Totals::default()
        }
        .live_ci95()
    }
}

#[derive(Clone, Debug)]
pub struct Tree {
    nodes: Vec<Node>,
    pub scope: Scope,
    /// Whether `growth` was computed (a baseline was marked).
    pub has_baseline: bool,
}

/// A frame's place on the screen: columns `x..x + width` of row `row`
/// (the node's depth: the root is row 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    pub node: NodeId,
    pub x: u16,
    pub width: u16,
    pub row: usize,
}

impl Tree {
    /// Merges the stacks of `scope` in `profile`; `baseline` gives each
    /// stack's growth (same process image, same frames).
    pub fn build(profile: &Profile, scope: Scope, baseline: Option<&Profile>) -> Tree {
        let root_name = match scope {
            Scope::All => "all".to_string(),
            Scope::Process(key) => profile
                .processes
                .iter()
                .find(|p| p.key == key)
                .map_or_else(|| format!("pid {}", key.pid), |p| p.label()),
            Scope::Tree(key) => {
                profile
                    .processes
                    .iter()
                    .find(|p| p.key == key)
                    .map_or_else(|| format!("pid {}", key.pid), |p| p.label())
                    + " and children"
            }
        };
        let mut tree = Tree {
            nodes: vec![Node {
                key: None,
                name: root_name.into(),
                module: None,
                live_bytes: 0.0,
                live_var: 0.0,
                unseen_var: 0.0,
                growth: 0.0,
                stacks: 0,
                parent: None,
                children: Vec::new(),
                depth: 0,
            }],
            scope,
            has_baseline: baseline.is_some(),
        };
        let before: HashMap<(ProcessKey, &[Frame]), f64, RandomState> = baseline
            .map(|b| {
                b.processes
                    .iter()
                    .flat_map(|p| {
                        p.stacks
                            .iter()
                            .map(move |s| ((p.key, &*s.frames), s.totals.live_bytes))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let frames: usize = profile
            .processes
            .iter()
            .flat_map(|p| &p.stacks)
            .map(|s| s.frames.len())
            .sum();
        let mut index = Index::with_capacity_and_hasher(frames, RandomState::default());
        for p in &profile.processes {
            let under = match scope {
                Scope::All if p.state == ProcessState::Live => {
                    let key = Key::Process(p.key);
                    tree.child(&mut index, ROOT, key, || (p.label().into(), None))
                }
                Scope::Process(k) | Scope::Tree(k) if p.key == k => ROOT,
                _ => continue,
            };
            for s in &p.stacks {
                let growth = baseline.map_or(0.0, |_| {
                    let then = before.get(&(p.key, &*s.frames)).copied().unwrap_or(0.0);
                    (s.totals.live_bytes - then).max(0.0)
                });
                tree.add(&mut index, under, s, growth);
            }
        }
        for i in 0..tree.nodes.len() {
            let mut children = std::mem::take(&mut tree.nodes[i].children);
            children.sort_by(|&a, &b| {
                let (a, b) = (&tree.nodes[a], &tree.nodes[b]);
                a.name.cmp(&b.name).then_with(|| a.module.cmp(&b.module))
            });
            tree.nodes[i].children = children;
        }
        tree
    }

    /// The child of `parent` keyed `key`, made if new.
    fn child(
        &mut self,
        index: &mut Index,
        parent: NodeId,
        key: Key,
        names: impl FnOnce() -> (Name, Option<Name>),
    ) -> NodeId {
        let slot = match index.entry((parent, key)) {
            Entry::Occupied(e) => return *e.get(),
            Entry::Vacant(slot) => slot,
        };
        let (name, module) = names();
        let id = self.nodes.len();
        self.nodes.push(Node {
            key: Some(slot.key().1.clone()),
            name,
            module,
            live_bytes: 0.0,
            live_var: 0.0,
            unseen_var: 0.0,
            growth: 0.0,
            stacks: 0,
            parent: Some(parent),
            children: Vec::new(),
            depth: self.nodes[parent].depth + 1,
        });
        self.nodes[parent].children.push(id);
        slot.insert(id);
        id
    }

    /// Adds one stack below `under` (and to every node above it).
    fn add(&mut self, index: &mut Index, under: NodeId, stack: &StackProfile, growth: f64) {
        let mut chain = vec![under];
        let mut at = under;
        // Frames are innermost first: the tree grows from the outermost.
        for f in stack.frames.iter().rev() {
            let function = f.flame_name();
            let key = Key::Frame {
                function: function.clone(),
                module: f.module.clone(),
            };
            at = self.child(index, at, key, || (function, f.module.clone()));
            chain.push(at);
        }
        let mut up = self.nodes[under].parent;
        while let Some(p) = up {
            chain.push(p);
            up = self.nodes[p].parent;
        }
        for id in chain {
            let n = &mut self.nodes[id];
            n.live_bytes += stack.totals.live_bytes;
            n.live_var += stack.totals.live_var;
            n.unseen_var = n.unseen_var.max(stack.totals.unseen_var);
            n.growth += growth;
            n.stacks += 1;
        }
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id]
    }

    /// Nodes: one per distinct frame path.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The node's width in `mode`: never negative.
    pub fn weight(&self, id: NodeId, mode: Mode) -> f64 {
        let n = &self.nodes[id];
        match mode {
            Mode::Live => n.live_bytes.max(0.0),
            Mode::Growth => n.growth.max(0.0),
        }
    }

    /// The keys from the root down to `id`.
    pub fn path(&self, id: NodeId) -> Vec<Key> {
        let mut path = Vec::new();
        let mut at = id;
        while let Some(key) = &self.nodes[at].key {
            path.push(key.clone());
            at = self.nodes[at].parent.unwrap_or(ROOT);
        }
        path.reverse();
        path
    }

    /// The node at `path`, or the deepest one on its way that still exists.
    pub fn find(&self, path: &[Key]) -> NodeId {
        let mut at = ROOT;
        for key in path {
            match self.nodes[at]
                .children
                .iter()
                .find(|&&c| self.nodes[c].key.as_ref() == Some(key))
            {
                Some(&c) => at = c,
                None => break,
            }
        }
        at
    }

    /// Whether `ancestor` is `id` or above it.
    pub fn contains(&self, ancestor: NodeId, id: NodeId) -> bool {
        let mut at = Some(id);
        while let Some(n) = at {
            if n == ancestor {
                return true;
            }
            at = self.nodes[n].parent;
        }
        false
    }

    /// Whether the node's name holds `query` (lowercase).
    pub fn matches(&self, id: NodeId, query: &str) -> bool {
        !query.is_empty() && self.nodes[id].name.to_lowercase().contains(query)
    }

    /// The share of `within`'s weight in nodes matching `query`, counting
    /// each stack once (a match's matching descendants are not added again).
    pub fn matched_weight(&self, within: NodeId, query: &str, mode: Mode) -> f64 {
        let mut sum = 0.0;
        let mut todo = vec![within];
        while let Some(id) = todo.pop() {
            if self.weight(id, mode) <= 0.0 {
                // Nothing to add below it: spare the names a lowercasing.
                continue;
            }
            if self.matches(id, query) {
                sum += self.weight(id, mode);
            } else {
                todo.extend(&self.nodes[id].children);
            }
        }
        sum
    }

    /// The frames drawn `width` columns wide with `zoom` as the full width:
    /// `zoom`'s ancestors and itself span the width, its descendants get
    /// their share of it. Columns come from rounding cumulative positions,
    /// so children stay within their parent and never overlap; a node that
    /// rounds to no column is left out with everything below it.
    pub fn layout(&self, zoom: NodeId, mode: Mode, width: u16) -> Vec<Placed> {
        let mut placed = Vec::new();
        if width == 0 {
            return placed;
        }
        let mut up = Some(zoom);
        while let Some(id) = up {
            placed.push(Placed {
                node: id,
                x: 0,
                width,
                row: self.nodes[id].depth,
            });
            up = self.nodes[id].parent;
        }
        placed.reverse();
        let mut todo = vec![(zoom, 0.0_f64, f64::from(width))];
        while let Some((id, from, to)) = todo.pop() {
            let total = self.weight(id, mode);
            if total <= 0.0 {
                continue;
            }
            let mut before = 0.0;
            for &c in &self.nodes[id].children {
                let w = self.weight(c, mode);
                let a = from + (to - from) * before / total;
                before += w;
                let b = from + (to - from) * (before / total).min(1.0);
                let (x0, x1) = (a.round() as u16, b.round() as u16);
                if x1 > x0 {
                    placed.push(Placed {
                        node: c,
                        x: x0,
                        width: x1 - x0,
                        row: self.nodes[c].depth,
                    });
                    todo.push((c, a, b));
                }
            }
        }
        placed
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tui::rows::tests::{process, profile};

    fn names(tree: &Tree, ids: &[NodeId]) -> Vec<String> {
        ids.iter().map(|&i| tree.node(i).name.to_string()).collect()
    }

    /// `server (7)`: main → handle → {leak, parse}, main → cache_fill.
    pub fn two_processes() -> Profile {
        profile(
            3,
            vec![
                process(
                    7,
                    "server",
                    &[
                        (&["leak", "handle", "main"], 1000.0, 1000.0),
                        (&["parse", "handle", "main"], 3000.0, 3000.0),
                        (&["cache_fill", "main"], 4000.0, 4000.0),
                    ],
                ),
                process(9, "worker", &[(&["cache_fill", "main"], 2000.0, 2000.0)]),
            ],
        )
    }

    #[test]
    fn common_prefixes_merge_and_widths_sum_to_parents() {
        let tree = Tree::build(&two_processes(), Scope::All, None);
        let root = tree.node(ROOT);
        assert_eq!(&*root.name, "all");
        assert_eq!(root.live_bytes, 10_000.0);
        assert_eq!(root.stacks, 4);
        assert_eq!(names(&tree, &root.children), ["server (7)", "worker (9)"]);
        let server = root.children[0];
        let main = tree.node(server).children[0];
        assert_eq!(tree.node(server).children.len(), 1, "one `main`");
        assert_eq!(
            names(&tree, &tree.node(main).children),
            ["cache_fill", "handle"]
        );
        let handle = tree.node(main).children[1];
        assert_eq!(names(&tree, &tree.node(handle).children), ["leak", "parse"]);
        assert_eq!(tree.node(handle).stacks, 2);
        assert_eq!(tree.node(handle).depth, 3);
        assert_eq!(tree.node(handle).module.as_deref(), Some("/usr/bin/work"));
        // Every node with children is the sum of them here (no stack ends
        // in the middle).
        for id in 0..tree.node_count() {
            let n = tree.node(id);
            if !n.children.is_empty() {
                let sum: f64 = n.children.iter().map(|&c| tree.weight(c, Mode::Live)).sum();
                assert_eq!(sum, tree.weight(id, Mode::Live), "{}", n.name);
            }
        }
        // Variances add: the interval of a merge is the merged interval.
        assert_eq!(tree.node(handle).live_var, (1000.0 + 3000.0) * 100.0);
    }

    #[test]
    fn a_process_scope_roots_at_the_process_and_all_skips_gone_images() {
        let mut p = two_processes();
        p.processes[1].state = ProcessState::Exited;
        let all = Tree::build(&p, Scope::All, None);
        assert_eq!(names(&all, &all.node(ROOT).children), ["server (7)"]);
        assert_eq!(all.node(ROOT).live_bytes, 8000.0);
        let one = Tree::build(&p, Scope::Process(p.processes[1].key), None);
        assert_eq!(&*one.node(ROOT).name, "worker (9)");
        assert_eq!(names(&one, &one.node(ROOT).children), ["main"]);
        assert_eq!(one.node(ROOT).live_bytes, 2000.0);
        let missing = Tree::build(
            &p,
            Scope::Process(ProcessKey {
                pid: allocprof::ids::Pid(42),
                generation: 0,
            }),
            None,
        );
        assert_eq!(&*missing.node(ROOT).name, "pid 42");
        assert_eq!(missing.node_count(), 1);
    }

    #[test]
    fn growth_is_per_stack_and_shrinking_counts_as_zero() {
        let before = two_processes();
        let mut now = two_processes();
        now.processes[0].stacks[0].totals.live_bytes = 5000.0; // leak +4000
        now.processes[0].stacks[1].totals.live_bytes = 1000.0; // parse −2000
        let tree = Tree::build(&now, Scope::All, Some(&before));
        assert!(tree.has_baseline);
        assert_eq!(tree.node(ROOT).growth, 4000.0);
        let path = |names: &[&str]| -> NodeId {
            let mut at = ROOT;
            for n in names {
                at = *tree
                    .node(at)
                    .children
                    .iter()
                    .find(|&&c| &*tree.node(c).name == *n)
                    .unwrap();
            }
            at
        };
        let handle = path(&["server (7)", "main", "handle"]);
        assert_eq!(tree.weight(handle, Mode::Growth), 4000.0);
        assert_eq!(
            tree.weight(
                path(&["server (7)", "main", "handle", "parse"]),
                Mode::Growth
            ),
            0.0
        );
        // A stack new since the baseline is all growth.
        let fresh = Tree::build(&now, Scope::All, Some(&profile(0, vec![])));
        assert_eq!(fresh.node(ROOT).growth, 12_000.0);
        // Zero-width nodes are not laid out.
        let placed = tree.layout(ROOT, Mode::Growth, 100);
        let shown: Vec<&str> = placed.iter().map(|p| &*tree.node(p.node).name).collect();
        assert!(
            shown.contains(&"leak") && !shown.contains(&"parse"),
            "{shown:?}"
        );
        assert!(!shown.contains(&"worker (9)"), "{shown:?}");
    }

    #[test]
    fn layout_nests_children_within_parents() {
        let tree = Tree::build(&two_processes(), Scope::All, None);
        for width in [0, 1, 7, 80, 333] {
            let placed = tree.layout(ROOT, Mode::Live, width);
            if width == 0 {
                assert!(placed.is_empty());
                continue;
            }
            let at: HashMap<NodeId, Placed> = placed.iter().map(|p| (p.node, *p)).collect();
            for p in &placed {
                assert!(p.width > 0 && p.x + p.width <= width, "{p:?}");
                if let Some(parent) = tree.node(p.node).parent {
                    let q = at[&parent];
                    assert!(
                        q.x <= p.x && p.x + p.width <= q.x + q.width,
                        "{p:?} in {q:?}"
                    );
                    assert_eq!(p.row, q.row + 1);
                }
            }
            // Siblings do not overlap, and fill their parent (no stack ends
            // midway here).
            for p in &placed {
                let kids: Vec<&Placed> = tree
                    .node(p.node)
                    .children
                    .iter()
                    .filter_map(|c| at.get(c))
                    .collect();
                let sum: u16 = kids.iter().map(|k| k.width).sum();
                if !kids.is_empty() {
                    assert!(sum <= p.width);
                }
                if width >= 80 && !kids.is_empty() {
                    assert_eq!(sum, p.width, "{}", tree.node(p.node).name);
                }
                for w in kids.windows(2) {
                    assert!(w[0].x + w[0].width <= w[1].x);
                }
            }
        }
        // 100 columns: server has 80% of the bytes.
        let placed = tree.layout(ROOT, Mode::Live, 100);
        let server = tree.node(ROOT).children[0];
        let p = placed.iter().find(|p| p.node == server).unwrap();
        assert_eq!((p.x, p.width, p.row), (0, 80, 1));
    }

    #[test]
    fn zoom_makes_a_frame_the_full_width_under_its_ancestors() {
        let tree = Tree::build(&two_processes(), Scope::All, None);
        let server = tree.node(ROOT).children[0];
        let main = tree.node(server).children[0];
        let handle = tree.node(main).children[1];
        let placed = tree.layout(handle, Mode::Live, 80);
        let of = |id| placed.iter().find(|p| p.node == id).copied();
        for id in [ROOT, server, main, handle] {
            assert_eq!(of(id).map(|p| (p.x, p.width)), Some((0, 80)));
        }
        let leak = tree.node(handle).children[0];
        assert_eq!(of(leak).map(|p| p.width), Some(20));
        assert_eq!(
            of(tree.node(main).children[0]),
            None,
            "cache_fill is outside"
        );
        assert!(
            of(tree.node(ROOT).children[1]).is_none(),
            "worker is outside"
        );
    }

    #[test]
    fn paths_find_nodes_across_rebuilds_or_their_nearest_ancestor() {
        let tree = Tree::build(&two_processes(), Scope::All, None);
        let server = tree.node(ROOT).children[0];
        let main = tree.node(server).children[0];
        let handle = tree.node(main).children[1];
        let leak = tree.node(handle).children[0];
        let path = tree.path(leak);
        assert_eq!(path.len(), 4);
        assert_eq!(tree.find(&path), leak);
        assert_eq!(tree.path(ROOT), []);
        let mut later = two_processes();
        later.processes[0].stacks.remove(0); // leak is freed
        let later = Tree::build(&later, Scope::All, None);
        assert_eq!(&*later.node(later.find(&path)).name, "handle");
        assert!(tree.contains(server, leak) && !tree.contains(leak, server));
    }

    #[test]
    fn search_matches_names_and_counts_each_stack_once() {
        let tree = Tree::build(&two_processes(), Scope::All, None);
        let matching: Vec<String> = (0..tree.node_count())
            .filter(|&i| tree.matches(i, "a"))
            .map(|i| tree.node(i).name.to_string())
            .collect();
        assert!(matching.contains(&"main".to_string()));
        assert!(matching.contains(&"leak".to_string()));
        assert!(!tree.matches(ROOT, ""), "an empty query matches nothing");
        // `main` holds everything; `leak` under it is not counted again.
        assert_eq!(tree.matched_weight(ROOT, "a", Mode::Live), 10_000.0);
        assert_eq!(tree.matched_weight(ROOT, "parse", Mode::Live), 3000.0);
    }

    #[test]
    fn an_empty_profile_is_a_lone_root() {
        let tree = Tree::build(&profile(0, vec![]), Scope::All, None);
        assert_eq!(tree.node_count(), 1);
        assert_eq!(tree.weight(ROOT, Mode::Live), 0.0);
        let placed = tree.layout(ROOT, Mode::Live, 80);
        assert_eq!(placed.len(), 1);
        // A process whose stacks hold 0 bytes.
        let zero = profile(0, vec![process(1, "idle", &[(&["f", "main"], 0.0, 0.0)])]);
        let tree = Tree::build(&zero, Scope::All, None);
        assert_eq!(tree.layout(ROOT, Mode::Live, 80).len(), 1);
        assert_eq!(tree.node(ROOT).stacks, 1);
    }
}

//! The flamegraph view's state: its tree, the selected frame, the zooms,
//! the width mode, the freeze and the search; and its keys. Selection and
//! zooms are kept as paths of frame keys, so a rebuilt tree (the next
//! profile) finds them again, or their nearest surviving ancestor.

use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::{Position, Rect};

use super::search::Search;
use crate::tui::flame::{Key, Mode, NodeId, ROOT, Scope, Tree};

pub struct FlameView {
    tree: Tree,
    selected: NodeId,
    /// Zoomed frames, outermost first; the last is the full width. Empty:
    /// the root is.
    zooms: Vec<NodeId>,
    mode: Mode,
    frozen: bool,
    /// When the profile the tree was built from was taken.
    built_at: Duration,
    pub search: Search,
}

/// Frames a tree may hold and still be rebuilt at every refresh: building
/// one takes about a microsecond a frame, on the UI's thread.
const FRAMES_PER_SECOND: usize = 100_000;

/// The first row of the icicle on screen: the first rows scroll off when
/// the selection is deeper than the view is high (one row of callees kept
/// in sight).
pub fn first_row(selected_row: usize, rows: usize) -> usize {
    (selected_row + 2).saturating_sub(rows).min(selected_row)
}

/// What a key did, for the app.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Leave the view.
    Close,
    /// Δ asked for, without a baseline.
    NoBaseline,
    /// The freeze ended: rebuild from the latest profile.
    Thawed,
    /// Not a flame key: the app may handle it.
    Unhandled,
}

impl FlameView {
    pub fn new(tree: Tree, built_at: Duration) -> FlameView {
        FlameView {
            tree,
            selected: ROOT,
            zooms: Vec::new(),
            mode: Mode::Live,
            frozen: false,
            built_at,
            search: Search::default(),
        }
    }

    pub fn tree(&self) -> &Tree {
        &self.tree
    }
    pub fn scope(&self) -> Scope {
        self.tree.scope
    }
    pub fn selected(&self) -> NodeId {
        self.selected
    }
    /// The frame drawn at the full width.
    pub fn zoom(&self) -> NodeId {
        self.zooms.last().copied().unwrap_or(ROOT)
    }
    pub fn zoom_depth(&self) -> usize {
        self.zooms.len()
    }
    pub fn frozen(&self) -> bool {
        self.frozen
    }
    /// The width mode in effect: Δ needs a tree built with a baseline.
    pub fn mode(&self) -> Mode {
        if self.tree.has_baseline {
            self.mode
        } else {
            Mode::Live
        }
    }

    /// The search query as matched: trimmed, lowercase; empty for none.
    pub fn query(&self) -> String {
        self.search.query.trim().to_lowercase()
    }

    /// How often the tree is rebuilt at most: at every refresh, but a
    /// second per 100k frames for larger trees (the UI stays responsive,
    /// and under a tenth of a core goes to rebuilding).
    pub fn refresh_gap(&self) -> Duration {
        Duration::from_secs((self.tree.node_count() / FRAMES_PER_SECOND) as u64)
    }

    /// Whether a profile taken at `elapsed` should be drawn: never while
    /// frozen; at once when `now`, else once the refresh gap is over.
    pub fn due(&self, elapsed: Duration, now: bool) -> bool {
        !self.frozen && (now || elapsed.saturating_sub(self.built_at) >= self.refresh_gap())
    }

    /// A fresh tree from the profile taken at `elapsed`; ignored while
    /// frozen.
    pub fn update(&mut self, tree: Tree, elapsed: Duration) {
        if self.frozen {
            return;
        }
        self.built_at = elapsed;
        let selected = self.tree.path(self.selected);
        let zooms: Vec<Vec<Key>> = self.zooms.iter().map(|&z| self.tree.path(z)).collect();
        self.tree = tree;
        if !self.tree.has_baseline {
            // The baseline was cleared: a new one starts on live bytes.
            self.mode = Mode::Live;
        }
        self.zooms = zooms.iter().map(|p| self.tree.find(p)).collect();
        // A zoomed frame that is gone leaves its ancestor: the same zoom
        // twice in a row would take two Esc to leave.
        self.zooms.dedup();
        if self.zooms.last() == Some(&ROOT) {
            self.zooms.clear();
        }
        self.selected = self.tree.find(&selected);
        if !self.tree.contains(self.zoom(), self.selected) {
            self.selected = self.zoom();
        }
    }

    pub fn key(&mut self, key: KeyEvent) -> Outcome {
        if self.search.editing {
            match key.code {
                KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::CONTROL) => {
                    self.search.query.push(c);
                }
                KeyCode::Backspace => {
                    self.search.query.pop();
                }
                KeyCode::Enter => self.search.editing = false,
                KeyCode::Esc => self.search = Search::default(),
                _ => return self.navigate(key.code),
            }
            return Outcome::Done;
        }
        match key.code {
            KeyCode::Char('q') => Outcome::Close,
            KeyCode::Esc => {
                if self.zooms.pop().is_some() {
                    Outcome::Done
                } else {
                    Outcome::Close
                }
            }
            KeyCode::Enter => {
                if self.selected != self.zoom() {
                    self.zooms.push(self.selected);
                }
                Outcome::Done
            }
            KeyCode::Char(' ' | 'p') => {
                self.frozen = !self.frozen;
                if self.frozen {
                    Outcome::Done
                } else {
                    Outcome::Thawed
                }
            }
            KeyCode::Char('d') => {
                if !self.tree.has_baseline {
                    return Outcome::NoBaseline;
                }
                self.mode = match self.mode {
                    Mode::Live => Mode::Growth,
                    Mode::Growth => Mode::Live,
                };
                Outcome::Done
            }
            KeyCode::Char('/') => {
                self.search.editing = true;
                Outcome::Done
            }
            KeyCode::Char('n') => {
                self.next_match(1);
                Outcome::Done
            }
            KeyCode::Char('N') => {
                self.next_match(-1);
                Outcome::Done
            }
            code => self.navigate(code),
        }
    }

    fn navigate(&mut self, code: KeyCode) -> Outcome {
        match code {
            KeyCode::Char('h') | KeyCode::Left => self.sibling(-1),
            KeyCode::Char('l') | KeyCode::Right => self.sibling(1),
            KeyCode::Char('j') | KeyCode::Down => self.child(),
            KeyCode::Char('k') | KeyCode::Up => self.parent(),
            KeyCode::Home => self.selected = self.zoom(),
            _ => return Outcome::Unhandled,
        }
        Outcome::Done
    }

    /// A click at `(x, y)` on the screen, the icicle drawn in `graph`:
    /// selects the frame there, if any (the rows scrolled as drawn).
    pub fn click(&mut self, x: u16, y: u16, graph: Rect) -> bool {
        if !graph.contains(Position::new(x, y)) {
            return false;
        }
        let skip = first_row(self.tree.node(self.selected).depth, graph.height as usize);
        let row = skip + usize::from(y - graph.y);
        let x = x - graph.x;
        let hit = self
            .tree
            .layout(self.zoom(), self.mode(), graph.width)
            .into_iter()
            .find(|p| p.row == row && (p.x..p.x + p.width).contains(&x));
        if let Some(p) = hit {
            self.selected = p.node;
        }
        hit.is_some()
    }

    /// The wheel: up to the caller, down to the widest callee.
    pub fn wheel(&mut self, down: bool) {
        if down { self.child() } else { self.parent() }
    }

    /// The callees of `id` that have a width in the mode shown.
    fn visible_children(&self, id: NodeId) -> Vec<NodeId> {
        let mode = self.mode();
        self.tree
            .node(id)
            .children
            .iter()
            .copied()
            .filter(|&c| self.tree.weight(c, mode) > 0.0)
            .collect()
    }

    /// Down to the widest callee (the first of equals).
    fn child(&mut self) {
        let mode = self.mode();
        let mut best: Option<(NodeId, f64)> = None;
        for c in self.visible_children(self.selected) {
            let w = self.tree.weight(c, mode);
            if best.is_none_or(|(_, b)| w > b) {
                best = Some((c, w));
            }
        }
        if let Some((c, _)) = best {
            self.selected = c;
        }
    }

    /// Up to the caller, never above the zoomed frame.
    fn parent(&mut self) {
        if self.selected != self.zoom()
            && let Some(p) = self.tree.node(self.selected).parent
        {
            self.selected = p;
        }
    }

    /// The next visible sibling `step` away; nothing at the edges, nor on
    /// the zoomed frame (its siblings are off screen).
    fn sibling(&mut self, step: isize) {
        if self.selected == self.zoom() {
            return;
        }
        let Some(parent) = self.tree.node(self.selected).parent else {
            return;
        };
        let siblings = self.visible_children(parent);
        let Some(i) = siblings.iter().position(|&s| s == self.selected) else {
            return;
        };
        if let Some(&s) = i.checked_add_signed(step).and_then(|j| siblings.get(j)) {
            self.selected = s;
        }
    }

    /// Selects the next (or previous) matching frame under the zoom, in
    /// depth-first order, wrapping around.
    fn next_match(&mut self, step: isize) {
        let query = self.query();
        if query.is_empty() {
            return;
        }
        let mut order = Vec::new();
        let mut todo = vec![self.zoom()];
        while let Some(id) = todo.pop() {
            order.push(id);
            todo.extend(self.visible_children(id).into_iter().rev());
        }
        let matches: Vec<NodeId> = order
            .into_iter()
            .filter(|&id| self.tree.matches(id, &query))
            .collect();
        if matches.is_empty() {
            return;
        }
        let next = match matches.iter().position(|&m| m == self.selected) {
            Some(i) => (i as isize + step).rem_euclid(matches.len() as isize) as usize,
            None if step > 0 => 0,
            None => matches.len() - 1,
        };
        self.selected = matches[next];
    }
}

#[cfg(test)]
mod tests {
    use crossterm::event::KeyModifiers;

    use super::*;
    use crate::tui::{
        flame::tests::two_processes,
        rows::tests::{process, profile},
    };

    fn press(view: &mut FlameView, code: KeyCode) -> Outcome {
        view.key(KeyEvent::new(code, KeyModifiers::NONE))
    }

    fn name(view: &FlameView) -> &str {
        &view.tree().node(view.selected()).name
    }

    fn all() -> FlameView {
        FlameView::new(
            Tree::build(&two_processes(), Scope::All, None),
            Duration::ZERO,
        )
    }

    #[test]
    fn hjkl_walk_the_tree_and_stop_at_the_edges() {
        let mut v = all();
        assert_eq!(name(&v), "all");
        // At the root: no caller, no siblings.
        for k in ['k', 'h', 'l'] {
            press(&mut v, KeyCode::Char(k));
            assert_eq!(name(&v), "all", "{k}");
        }
        press(&mut v, KeyCode::Char('j'));
        assert_eq!(name(&v), "server (7)", "the widest callee");
        press(&mut v, KeyCode::Char('l'));
        assert_eq!(name(&v), "worker (9)");
        press(&mut v, KeyCode::Right);
        assert_eq!(name(&v), "worker (9)", "the last sibling stays");
        press(&mut v, KeyCode::Left);
        press(&mut v, KeyCode::Char('h'));
        assert_eq!(name(&v), "server (7)", "the first sibling stays");
        for _ in 0..2 {
            press(&mut v, KeyCode::Down);
        }
        // main → cache_fill (4000) or handle (4000): the first of equals.
        assert_eq!(name(&v), "cache_fill");
        press(&mut v, KeyCode::Char('l'));
        press(&mut v, KeyCode::Char('j'));
        assert_eq!(name(&v), "parse");
        press(&mut v, KeyCode::Char('j'));
        assert_eq!(name(&v), "parse", "a leaf has no callee");
        press(&mut v, KeyCode::Char('h'));
        assert_eq!(name(&v), "leak");
        press(&mut v, KeyCode::Up);
        assert_eq!(name(&v), "handle");
        assert_eq!(press(&mut v, KeyCode::Char('x')), Outcome::Unhandled);
    }

    #[test]
    fn enter_zooms_and_esc_zooms_out_then_closes() {
        let mut v = all();
        for k in ['j', 'j'] {
            press(&mut v, KeyCode::Char(k));
        }
        assert_eq!(name(&v), "main");
        assert_eq!(v.tree().node(v.selected()).depth, 2);
        press(&mut v, KeyCode::Enter);
        assert_eq!(v.zoom(), v.selected());
        assert_eq!(v.zoom_depth(), 1);
        // The zoomed frame is the top: no caller, no sibling from it.
        press(&mut v, KeyCode::Char('k'));
        press(&mut v, KeyCode::Char('l'));
        assert_eq!(name(&v), "main");
        press(&mut v, KeyCode::Enter);
        assert_eq!(v.zoom_depth(), 1, "zooming on the zoom is no new level");
        press(&mut v, KeyCode::Char('j'));
        press(&mut v, KeyCode::Char('l'));
        press(&mut v, KeyCode::Enter);
        assert_eq!(v.tree().node(v.zoom()).name.as_ref(), "handle");
        assert_eq!(v.zoom_depth(), 2);
        assert_eq!(press(&mut v, KeyCode::Esc), Outcome::Done);
        assert_eq!(v.tree().node(v.zoom()).name.as_ref(), "main");
        assert_eq!(name(&v), "handle", "the selection stays");
        press(&mut v, KeyCode::Home);
        assert_eq!(name(&v), "main");
        assert_eq!(press(&mut v, KeyCode::Esc), Outcome::Done);
        assert_eq!(v.zoom(), ROOT);
        assert_eq!(press(&mut v, KeyCode::Esc), Outcome::Close);
        assert_eq!(press(&mut all(), KeyCode::Char('q')), Outcome::Close);
    }

    #[test]
    fn freeze_ignores_updates_and_selection_follows_rebuilds() {
        let mut v = all();
        for k in ['j', 'j', 'j', 'l', 'j', 'h'] {
            press(&mut v, KeyCode::Char(k));
        }
        assert_eq!(name(&v), "leak");
        press(&mut v, KeyCode::Char('k'));
        press(&mut v, KeyCode::Enter); // zoom on handle
        press(&mut v, KeyCode::Char('j'));
        press(&mut v, KeyCode::Char('h'));
        assert_eq!(name(&v), "leak");
        let mut later = two_processes();
        later.processes[0].stacks[0].totals.live_bytes = 9e9;
        assert_eq!(press(&mut v, KeyCode::Char(' ')), Outcome::Done);
        assert!(v.frozen());
        v.update(Tree::build(&later, Scope::All, None), Duration::ZERO);
        assert_eq!(v.tree().node(ROOT).live_bytes, 10_000.0);
        assert_eq!(press(&mut v, KeyCode::Char(' ')), Outcome::Thawed);
        v.update(Tree::build(&later, Scope::All, None), Duration::ZERO);
        assert!(v.tree().node(ROOT).live_bytes > 9e9);
        assert_eq!(name(&v), "leak", "found again by its path");
        assert_eq!(v.tree().node(v.zoom()).name.as_ref(), "handle");
        // The zoomed frame goes: zoom and selection fall back to `main`.
        let mut gone = two_processes();
        gone.processes[0].stacks.truncate(0);
        gone.processes[0]
            .stacks
            .push(process(7, "server", &[(&["cache_fill", "main"], 1.0, 1.0)]).stacks[0].clone());
        v.update(Tree::build(&gone, Scope::All, None), Duration::ZERO);
        assert_eq!(v.tree().node(v.zoom()).name.as_ref(), "main");
        assert_eq!(name(&v), "main");
        assert_eq!(v.zoom_depth(), 1);
        // Everything goes: back at the root, one Esc leaves.
        v.update(
            Tree::build(&profile(5, vec![]), Scope::All, None),
            Duration::ZERO,
        );
        assert_eq!((v.selected(), v.zoom(), v.zoom_depth()), (ROOT, ROOT, 0));
        assert_eq!(press(&mut v, KeyCode::Esc), Outcome::Close);
    }

    #[test]
    fn delta_mode_needs_a_baseline_and_moves_by_growth() {
        let mut v = all();
        assert_eq!(press(&mut v, KeyCode::Char('d')), Outcome::NoBaseline);
        assert_eq!(v.mode(), Mode::Live);
        let before = two_processes();
        let mut now = two_processes();
        now.processes[0].stacks[1].totals.live_bytes += 500.0; // parse grows
        let mut v = FlameView::new(Tree::build(&now, Scope::All, Some(&before)), Duration::ZERO);
        assert_eq!(press(&mut v, KeyCode::Char('d')), Outcome::Done);
        assert_eq!(v.mode(), Mode::Growth);
        // Only growth is visible: j follows it, h/l skip the flat.
        for _ in 0..4 {
            press(&mut v, KeyCode::Char('j'));
        }
        assert_eq!(name(&v), "parse");
        press(&mut v, KeyCode::Char('h'));
        assert_eq!(name(&v), "parse", "leak did not grow: not visible");
        press(&mut v, KeyCode::Char('d'));
        press(&mut v, KeyCode::Char('h'));
        assert_eq!(name(&v), "leak");
        // A tree without a baseline shows live bytes whatever was chosen.
        press(&mut v, KeyCode::Char('d'));
        v.update(Tree::build(&now, Scope::All, None), Duration::ZERO);
        assert_eq!(v.mode(), Mode::Live);
    }

    #[test]
    fn search_edits_its_query_and_n_jumps_between_matches() {
        let mut v = all();
        press(&mut v, KeyCode::Char('/'));
        for c in "CACHE".chars() {
            press(&mut v, KeyCode::Char(c));
        }
        // While typing, hjkl are letters; arrows still move.
        press(&mut v, KeyCode::Char('j'));
        press(&mut v, KeyCode::Backspace);
        assert_eq!(v.search.query, "CACHE");
        assert_eq!(v.query(), "cache");
        press(&mut v, KeyCode::Down);
        assert_eq!(name(&v), "server (7)");
        press(&mut v, KeyCode::Enter);
        assert!(!v.search.editing);
        press(&mut v, KeyCode::Char('n'));
        assert_eq!(name(&v), "cache_fill");
        let first = v.selected();
        press(&mut v, KeyCode::Char('n'));
        assert_eq!(name(&v), "cache_fill");
        assert_ne!(v.selected(), first, "the worker's");
        press(&mut v, KeyCode::Char('n'));
        assert_eq!(v.selected(), first, "wraps around");
        press(&mut v, KeyCode::Char('N'));
        assert_ne!(v.selected(), first);
        press(&mut v, KeyCode::Char('/'));
        press(&mut v, KeyCode::Esc);
        assert_eq!(v.search, Search::default());
        assert_eq!(press(&mut v, KeyCode::Esc), Outcome::Close);
    }

    #[test]
    fn large_trees_are_rebuilt_less_often_but_at_once_when_asked() {
        let v = all();
        assert_eq!(v.refresh_gap(), Duration::ZERO);
        assert!(v.due(Duration::ZERO, false));
        // One stack of 150k frames: 150k nodes, a 1 s gap.
        let names: Vec<String> = (0..150_000).map(|i| format!("f{i}")).collect();
        let frames: Vec<&str> = names.iter().map(String::as_str).collect();
        let deep = profile(10, vec![process(1, "deep", &[(&frames, 1.0, 1.0)])]);
        let mut v = FlameView::new(
            Tree::build(&deep, Scope::All, None),
            Duration::from_secs(10),
        );
        assert_eq!(v.refresh_gap(), Duration::from_secs(1));
        assert!(!v.due(Duration::from_millis(10_500), false));
        assert!(v.due(Duration::from_millis(10_500), true), "baseline, thaw");
        assert!(v.due(Duration::from_secs(11), false));
        press(&mut v, KeyCode::Char(' '));
        assert!(!v.due(Duration::from_secs(99), true), "never while frozen");
    }
}

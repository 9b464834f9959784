//! The flamegraph view: an icicle (the root on top, callers above their
//! callees, allocation sites at the bottom), widths from the tree's layout;
//! below it, the selected frame's status.

use ratatui::{
    Frame,
    buffer::Buffer,
    layout::{Alignment, Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Paragraph},
};

use super::{ACCENT, BOLD, DIM, GROWING, detail::short_path, header, interval, truncate};
use crate::tui::{
    flame::{Mode, NodeId, ROOT, Scope},
    state::{App, FlameView, first_row, format_elapsed},
};
use allocprof::{model::stats::human_bytes, output::inert::inert};

/// Frames narrower than this show no text: a letter or two misleads.
const LABEL_MIN: u16 = 3;

/// Warm colours for frames, picked by name so a function keeps its colour.
const WARM: [u8; 6] = [166, 172, 178, 208, 214, 136];
const PROCESS: Color = Color::Indexed(67);
const ABOVE_ZOOM: Color = Color::Indexed(240);
const MATCH: Color = Color::Magenta;

pub(super) fn draw(frame: &mut Frame, app: &App, flame: &FlameView, area: Rect) {
    let [top, body, status, bottom] = areas(area);
    header::header(frame, app, top);
    graph(frame, app, flame, body);
    status_lines(frame, flame, status);
    super::footer::footer(frame, app, bottom);
}

/// Where the icicle itself is drawn, for a screen of `area`: inside the
/// graph's border (the state maps mouse clicks with it).
pub(super) fn graph_area(area: Rect) -> Rect {
    let [_, body, _, _] = areas(area);
    Block::bordered().inner(body)
}

fn areas(area: Rect) -> [Rect; 4] {
    Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(3),
        Constraint::Length(2),
        Constraint::Length(1),
    ])
    .areas(area)
}

fn graph(frame: &mut Frame, app: &App, flame: &FlameView, area: Rect) {
    let tree = flame.tree();
    let mode = flame.mode();
    let query = flame.query();
    let mut title = vec![
        Span::styled(" Flamegraph", BOLD),
        Span::styled(" · ", DIM),
        Span::raw(match flame.scope() {
            Scope::All => "all processes",
            Scope::Process(_) => "one process",
            Scope::Tree(_) => "a process tree",
        }),
        Span::styled(" · ", DIM),
        Span::raw(match (mode, app.baseline()) {
            (Mode::Growth, Some(b)) => format!("growth since {} ", format_elapsed(b.elapsed)),
            (Mode::Growth, None) => "growth since the baseline ".into(),
            (Mode::Live, _) => "live bytes ".into(),
        }),
    ];
    let gap = flame.refresh_gap();
    if !gap.is_zero() {
        title.push(Span::styled(
            format!("· redrawn every {}s (large) ", gap.as_secs()),
            DIM,
        ));
    }
    if !query.is_empty() {
        let total = tree.weight(flame.zoom(), mode);
        let matched = tree.matched_weight(flame.zoom(), &query, mode);
        let share = if total > 0.0 {
            100.0 * matched / total
        } else {
            0.0
        };
        title.push(Span::styled(
            format!("· matched {share:.1}% "),
            Style::new().fg(MATCH),
        ));
    }
    let mut badges = Vec::new();
    if flame.zoom_depth() > 0 {
        badges.push(Span::styled(format!(" zoom {} ", flame.zoom_depth()), DIM));
    }
    if flame.frozen() {
        badges.push(Span::styled(
            " FROZEN ",
            Style::new()
                .fg(Color::Black)
                .bg(Color::LightBlue)
                .add_modifier(Modifier::BOLD),
        ));
    }
    let block = Block::bordered()
        .border_style(Style::new().fg(ACCENT))
        .title(Line::from(title))
        .title(Line::from(badges).alignment(Alignment::Right))
        .title_bottom(
            Line::styled(" icicle: callers above callees · ? keys ", DIM).right_aligned(),
        );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if inner.width == 0 || inner.height == 0 {
        return;
    }
    let rows = inner.height as usize;
    let selected = flame.selected();
    let skip = first_row(tree.node(selected).depth, rows);
    let zoom_row = tree.node(flame.zoom()).depth;
    let placed = tree.layout(flame.zoom(), mode, inner.width);
    let buf = frame.buffer_mut();
    for p in &placed {
        let Some(row) = p.row.checked_sub(skip).filter(|&r| r < rows) else {
            continue;
        };
        let cell = Rect::new(inner.x + p.x, inner.y + row as u16, p.width, 1);
        let node = tree.node(p.node);
        let style = if p.node == selected {
            Style::new()
                .fg(Color::Black)
                .bg(Color::White)
                .add_modifier(Modifier::BOLD)
        } else if tree.matches(p.node, &query) {
            Style::new().fg(Color::White).bg(MATCH)
        } else if p.row < zoom_row {
            Style::new().fg(Color::Gray).bg(ABOVE_ZOOM)
        } else {
            Style::new().fg(Color::Black).bg(colour(tree, p.node))
        };
        label(buf, cell, &inert(&node.name), style);
    }
    let below_zoom = (zoom_row + 1).checked_sub(skip).filter(|&r| r < rows);
    if let (true, Some(row)) = (tree.weight(flame.zoom(), mode) <= 0.0, below_zoom) {
        let empty = match mode {
            Mode::Live => "no live bytes here (yet)",
            Mode::Growth => "no growth here since the baseline",
        };
        frame.render_widget(
            Line::styled(empty, DIM).alignment(Alignment::Center),
            Rect::new(inner.x, inner.y + row as u16, inner.width, 1),
        );
    }
}

fn colour(tree: &crate::tui::flame::Tree, id: NodeId) -> Color {
    let node = tree.node(id);
    if id == ROOT || matches!(node.key, Some(crate::tui::flame::Key::Process(_))) {
        return PROCESS;
    }
    // FNV-1a: stable across runs (the std hasher is seeded).
    let hash = node.name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    Color::Indexed(WARM[(hash % WARM.len() as u64) as usize])
}

/// Fills `cell` with `style` and writes `name` in it: nothing when too
/// narrow, cut with `…` when too long, a blank column kept at the end so
/// neighbouring frames read apart.
fn label(buf: &mut Buffer, cell: Rect, name: &str, style: Style) {
    buf.set_style(cell, style);
    if cell.width < LABEL_MIN {
        return;
    }
    let room = usize::from(cell.width - 1);
    if Span::raw(name).width() <= room {
        buf.set_stringn(cell.x, cell.y, name, room, style);
    } else {
        // `set_stringn` never splits a wide character: the `…` goes where
        // the name stopped.
        let (end, _) = buf.set_stringn(cell.x, cell.y, name, room - 1, style);
        buf.set_stringn(end, cell.y, "…", 1, style);
    }
}

/// The selected frame: its full name; then its module, live bytes with the
/// interval, share, stack count, and growth when a baseline is marked.
fn status_lines(frame: &mut Frame, flame: &FlameView, area: Rect) {
    let tree = flame.tree();
    let id = flame.selected();
    let node = tree.node(id);
    let mode = flame.mode();
    let width = area.width as usize;
    let name = Line::from(vec![
        Span::raw(" "),
        Span::styled(truncate(&inert(&node.name), width.saturating_sub(1)), BOLD),
    ]);
    let sep = || Span::styled(" · ", DIM);
    let mut facts = vec![Span::raw(" ")];
    match (&node.module, &node.key) {
        (Some(m), _) => facts.push(Span::styled(format!("[{}]", inert(&short_path(m))), DIM)),
        (None, Some(_)) => facts.push(Span::styled("process", DIM)),
        (None, None) => facts.push(Span::styled("root", DIM)),
    }
    facts.extend([
        sep(),
        Span::raw("live "),
        Span::styled(human_bytes(node.live_bytes), BOLD),
        Span::styled(interval(node.live_bytes, node.live_ci95()), DIM),
    ]);
    if tree.has_baseline {
        facts.extend([
            sep(),
            Span::raw("Δ "),
            Span::styled(
                format!("+{}", human_bytes(node.growth)),
                Style::new().fg(GROWING),
            ),
        ]);
    }
    let total = tree.weight(ROOT, mode);
    let share = if total > 0.0 {
        100.0 * tree.weight(id, mode) / total
    } else {
        0.0
    };
    facts.extend([
        sep(),
        Span::raw(format!(
            "{share:.1}% of {}",
            match mode {
                Mode::Live => "total",
                Mode::Growth => "growth",
            }
        )),
        sep(),
        Span::raw(format!(
            "{} stack{}",
            node.stacks,
            if node.stacks == 1 { "" } else { "s" }
        )),
    ]);
    frame.render_widget(Paragraph::new(vec![name, Line::from(facts)]), area);
}

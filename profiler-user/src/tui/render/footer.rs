//! The status line (notices, the search being typed, key hints) and the
//! help overlay listing every key.

use ratatui::{
    Frame,
    layout::{Constraint, Layout, Rect},
    style::{Color, Style},
    text::{Line, Span, Text},
    widgets::{Block, Clear, Paragraph},
};

use super::{ACCENT, BOLD, DIM, GROWING};
use crate::tui::state::{App, Notice};
use allocprof::output::inert::inert;

pub(super) fn footer(frame: &mut Frame, app: &App, area: Rect) {
    let wide = area.width >= 110 && app.notice().is_none();
    let hints = match (app.flame().is_some(), wide) {
        (false, true) => {
            "?:help  /:search  s:sort  g:group  t:trees  b:baseline  p:pause  f:flame  e:export  q:quit "
        }
        (false, false) => "?:help  q:quit ",
        (true, true) => {
            "hjkl:move  Enter:zoom  Space:freeze  d:Δ  /:search  ?:help  Esc:out  q:table "
        }
        (true, false) => "?:help  q:table ",
    };
    // The flamegraph keeps a search of its own (frames, not rows).
    let search = app.flame().map_or(app.search(), |f| &f.search);
    let [left, right] = Layout::horizontal([
        Constraint::Min(0),
        Constraint::Length(hints.chars().count() as u16),
    ])
    .areas(area);
    let line = if search.editing {
        Line::from(vec![
            Span::styled(" /", Style::new().fg(Color::Yellow)),
            Span::raw(inert(&search.query).into_owned()),
            Span::styled("█", Style::new().fg(Color::Yellow)),
            Span::styled("  Enter: keep · Esc: clear", DIM),
        ])
    } else {
        match app.notice() {
            None => Line::raw(""),
            Some(Notice::Info(t)) => Line::raw(format!(" {t}")),
            Some(Notice::Warning(t)) => {
                Line::styled(format!(" warning: {t}"), Style::new().fg(Color::Yellow))
            }
            Some(Notice::Error(t)) => Line::styled(format!(" {t}"), Style::new().fg(GROWING)),
        }
    };
    frame.render_widget(line, left);
    frame.render_widget(Line::styled(hints, DIM).right_aligned(), right);
}

/// Every key, as the help overlay lists them.
pub const KEYS: &[(&str, &str)] = &[
    ("Tab a", "processes / stacks; a: all processes' stacks"),
    (
        "Enter d",
        "open process (root: its tree) / detail: j k PgDn",
    ),
    ("g t → ←", "group stacks / process trees: → unfold, ← fold"),
    ("Esc", "back: smaller detail, clear search, leave process"),
    ("↑↓ j k", "move (mouse: click, wheel); PgUp PgDn Home End"),
    ("s S r", "sort by next / previous column; r reverses"),
    ("/", "search functions (processes: names); Enter, Esc"),
    ("b B", "mark a baseline (Δ BASELINE: growth since) / clear"),
    ("p Space", "pause / resume the view; profiling goes on"),
    ("c", "callers and callees of the row's function"),
    ("x e", "exited processes: 60 s / all / none; e: export"),
    (
        "f",
        "flamegraph of the process (or of all); ? there: its keys",
    ),
    ("q F10 ? F1", "quit (also Ctrl-C) / help; again: legend"),
];

/// What the columns and markers mean: the help's second page.
pub const LEGEND: &[(&str, &str)] = &[
    ("LIVE", "estimated bytes allocated and not yet freed"),
    ("± x", "95% interval; (0 B – x) where it reaches 0"),
    ("SAMPLES", "sampled allocations still live, behind LIVE"),
    ("LIVE >1m", "of LIVE, allocated over a minute ago (leaks)"),
    ("RSS ANON", "resident anonymous memory, where the heap is"),
    ("ALLOC/s", "bytes allocated per second, last few seconds"),
    ("GROWTH 1m", "live bytes gained over the last minute"),
    ("Δ BASELINE", "live bytes gained since the baseline (b)"),
    (
        "· name (pid)",
        "all processes' stacks: the process of the row",
    ),
    (
        "#N",
        "stacks alike up to callers further out (d shows them)",
    ),
    ("via f", "the same, told apart by the allocating frame f"),
    (
        "@file:line",
        "the same, told apart by the naming frame's line",
    ),
    ("dim row", "nothing live; or exited: at exit, last (x)"),
];

/// The flamegraph's keys, as its help overlay lists them.
pub const FLAME_KEYS: &[(&str, &str)] = &[
    ("", "icicle: the root on top, callers above callees,"),
    ("", "allocation sites at the bottom; width = bytes"),
    ("h l ← →", "previous / next sibling; mouse: click, wheel"),
    ("j k ↓ ↑", "down to the widest callee / up to the caller"),
    ("Enter", "zoom: the frame becomes the full width"),
    ("Esc", "zoom out one level; at the top, back to the table"),
    ("Space p", "freeze / thaw the picture (FROZEN: no updates)"),
    ("d", "width: live bytes / growth since the baseline"),
    ("b B", "mark a baseline (then d shows growth) / clear it"),
    ("/ n N", "search: highlight frames; next / previous match"),
    ("Home", "select the zoomed frame"),
    ("q", "back to the table (F10, Ctrl-C: quit)"),
    ("? F1", "this help; any key closes it"),
];

/// A page of the help: `keys` under `title`, `bottom` saying how to leave.
pub(super) fn help(
    frame: &mut Frame,
    area: Rect,
    (title, bottom): (&str, &str),
    keys: &[(&str, &str)],
) {
    let key_width = keys
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let lines: Vec<Line> = keys
        .iter()
        .map(|(k, d)| {
            Line::from(vec![
                Span::styled(format!(" {k:<key_width$}  "), BOLD.fg(ACCENT)),
                Span::raw(*d),
            ])
        })
        .collect();
    let width = (lines.iter().map(Line::width).max().unwrap_or(0) as u16 + 3).min(area.width);
    let height = (lines.len() as u16 + 2).min(area.height);
    let popup = area.centered(Constraint::Length(width), Constraint::Length(height));
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(Text::from(lines)).block(
            Block::bordered()
                .border_style(Style::new().fg(ACCENT))
                .title(Line::styled(format!(" {title} "), BOLD))
                .title_bottom(Line::styled(format!(" {bottom} "), DIM).right_aligned()),
        ),
        popup,
    );
}

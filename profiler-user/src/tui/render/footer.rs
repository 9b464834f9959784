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

pub(super) fn footer(frame: &mut Frame, app: &App, area: Rect) {
    let hints = if area.width >= 110 && app.notice().is_none() {
        "?:help  /:search  s:sort  g:group  b:baseline  p:pause  e:export  q:quit "
    } else {
        "?:help  q:quit "
    };
    let [left, right] = Layout::horizontal([
        Constraint::Min(0),
        Constraint::Length(hints.chars().count() as u16),
    ])
    .areas(area);
    let line = if app.search().editing {
        Line::from(vec![
            Span::styled(" /", Style::new().fg(Color::Yellow)),
            Span::raw(app.search().query.clone()),
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
    ("Tab", "switch between processes and stacks"),
    ("Enter", "open the process / enlarge the detail (also d)"),
    ("a", "stacks of all processes, merged"),
    ("g", "group stacks by full stack / by function"),
    ("Esc", "back: smaller detail, clear search, leave process"),
    ("↑↓ j k", "move; PgUp PgDn Home End: by page, to the ends"),
    ("s S r", "sort by next / previous column; r reverses"),
    ("/", "search functions (processes: names); Enter, Esc"),
    ("b B", "mark a baseline (Δ BASELINE: growth since) / clear"),
    ("p Space", "pause / resume the view; profiling goes on"),
    ("e", "export the view to a file (the path is shown)"),
    ("?", "this help; any key closes it"),
    ("q Ctrl-C", "quit"),
];

pub(super) fn help(frame: &mut Frame, area: Rect) {
    let key_width = KEYS
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let lines: Vec<Line> = KEYS
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
                .title(Line::styled(" Keys ", BOLD))
                .title_bottom(Line::styled(" any key closes ", DIM).right_aligned()),
        ),
        popup,
    );
}

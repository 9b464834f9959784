//! The callers and callees view (`c`), in the table's and detail's place:
//! the function, the live bytes through it, then who called it and what it
//! called, each with its live bytes and share, the selection highlighted.

use ratatui::{
    Frame,
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Paragraph},
};

use super::{ACCENT, BOLD, DIM, truncate};
use crate::tui::{
    callers::Edge,
    state::{App, CallersView},
};
use allocprof::{model::stats::human_bytes, output::inert::inert};

pub(super) fn draw(frame: &mut Frame, app: &App, view: &CallersView, area: Rect) {
    let c = &view.callers;
    let scope = match view.scope {
        Some(key) => app.process_label(key),
        None => "all processes".into(),
    };
    let block = Block::bordered()
        .border_style(Style::new().fg(ACCENT))
        .title(Line::from(vec![
            Span::styled(" Callers and callees ", BOLD),
            Span::styled("· ", DIM),
            Span::raw(format!("{scope} ")),
        ]))
        .title_bottom(
            Line::styled(" ↑↓ select · Enter follow · Esc back · c close ", DIM).right_aligned(),
        );
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if inner.height < 3 {
        return;
    }
    let [head, callers, callees] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Fill(1),
        Constraint::Fill(1),
    ])
    .areas(inner);
    let width = inner.width as usize;
    let live = human_bytes(c.live_bytes);
    let stacks = format!(
        " live through it · {} stack{}",
        c.stacks,
        if c.stacks == 1 { "" } else { "s" }
    );
    let room = width.saturating_sub(live.chars().count() + stacks.chars().count() + 2);
    frame.render_widget(
        Line::from(vec![
            Span::styled(truncate(&inert(&c.function), room.max(8)), BOLD.fg(ACCENT)),
            Span::raw("  "),
            Span::styled(live, BOLD),
            Span::styled(stacks, DIM),
        ]),
        head,
    );
    let n = c.callers.len();
    let (in_callers, in_callees) = match view.selected.checked_sub(n) {
        None => (Some(view.selected), None),
        Some(i) => (None, Some(i)),
    };
    section(frame, "Called by", &c.callers, in_callers, callers);
    section(frame, "Calls", &c.callees, in_callees, callees);
}

/// A titled list of edges, scrolled to keep `selected` in sight.
fn section(frame: &mut Frame, title: &str, edges: &[Edge], selected: Option<usize>, area: Rect) {
    if area.height == 0 {
        return;
    }
    let rows = area.height.saturating_sub(1) as usize;
    let skip = selected.map_or(0, |s| (s + 1).saturating_sub(rows));
    let mut lines = vec![Line::styled(
        format!("{title} ({})", edges.len()),
        BOLD.add_modifier(Modifier::UNDERLINED),
    )];
    if edges.is_empty() {
        lines.push(Line::styled("  none", DIM));
    }
    let name_width = (area.width as usize).saturating_sub(23).max(8);
    for (i, e) in edges.iter().enumerate().skip(skip).take(rows) {
        let mut line = Line::from(vec![
            Span::raw(if selected == Some(i) { "▶ " } else { "  " }),
            Span::raw(format!("{:>11}", human_bytes(e.live_bytes))),
            Span::styled(format!(" {:>6.1}%  ", 100.0 * e.share), DIM),
            Span::raw(truncate(&inert(&e.name), name_width)),
        ]);
        if selected == Some(i) {
            line = line.style(
                Style::new()
                    .bg(Color::Indexed(236))
                    .add_modifier(Modifier::BOLD),
            );
        }
        lines.push(line);
    }
    frame.render_widget(Paragraph::new(lines), area);
}

#[cfg(test)]
mod tests {
    use crossterm::event::KeyCode;

    use super::*;
    use crate::tui::{
        render::tests::screen_lines,
        state::{
            AppEvent,
            tests::{options, press, sample},
        },
    };

    #[test]
    fn callers_and_callees_at_both_sizes() {
        let mut app = App::new(options());
        for s in 0..=4 {
            app.update(AppEvent::Profile(sample(s)));
        }
        // `parse`, through handle: its caller is handle, it allocates itself.
        press(&mut app, KeyCode::End);
        assert!(app.selected_row().unwrap().label.starts_with("parse"));
        press(&mut app, KeyCode::Char('c'));
        press(&mut app, KeyCode::Enter);
        for (w, h) in [(80, 24), (160, 48)] {
            let lines = screen_lines(&mut app, w, h);
            let text = lines.join("\n");
            // The header stays; the view takes the table's and detail's place.
            assert!(lines[0].contains("live heap"), "{text}");
            assert!(
                lines[2].contains("Callers and callees · server (7)"),
                "{text}"
            );
            assert!(
                lines[3].contains("handle  7.9 KiB live through it · 2 stacks"),
                "{text}"
            );
            let by = lines
                .iter()
                .position(|l| l.contains("Called by (1)"))
                .unwrap();
            assert!(
                lines[by + 1].contains("▶     7.9 KiB  100.0%  main"),
                "{text}"
            );
            let calls = lines.iter().position(|l| l.contains("Calls (2)")).unwrap();
            assert!(calls > by + 1, "{text}");
            assert!(lines[calls + 1].contains("5.0 KiB   62.9%  leak"), "{text}");
            assert!(
                lines[calls + 2].contains("2.9 KiB   37.1%  parse"),
                "{text}"
            );
            assert!(!text.contains("ALLOCATED AT"), "{text}");
            assert!(text.contains("Enter follow · Esc back"), "{text}");
            assert_eq!(lines.len(), h as usize);
        }
    }
}

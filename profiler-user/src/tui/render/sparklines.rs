//! The history pane: sparklines of the live heap and of the selected row.

use ratatui::{
    Frame,
    layout::{Constraint, Layout, Rect},
    style::{Color, Style},
    text::{Line, Span},
    widgets::{Block, Sparkline},
};

use super::{ACCENT, BOLD, DIM, signed_bytes, truncate};
use crate::tui::{
    history::GROWTH_WINDOW,
    state::{App, View, format_elapsed},
};
use allocprof::model::stats::human_bytes;

pub(super) fn history(frame: &mut Frame, app: &App, area: Rect) {
    let block = Block::bordered().border_style(DIM).title(" History ");
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let Some(profile) = app.shown() else {
        return;
    };
    let now = profile.elapsed;
    let [top, bottom] = Layout::vertical([Constraint::Fill(1), Constraint::Fill(1)]).areas(inner);
    let width = inner.width as usize;

    let total = app.history().live_series(now);
    let growth = app
        .history()
        .reference(now, GROWTH_WINDOW)
        .map(|r| profile.live_totals().live_bytes - r.live_totals().live_bytes);
    // The figure and its growth are never cut: the words and the span of
    // the history go first when narrow.
    let figures = [
        Span::styled(human_bytes(profile.live_totals().live_bytes), BOLD),
        Span::raw(" "),
        signed_bytes(growth),
        Span::styled("/1m", DIM),
    ];
    let span = span_of(&total, width, now);
    let title = [
        [
            vec![Span::raw("live heap ")],
            figures.to_vec(),
            vec![span.clone()],
        ]
        .concat(),
        [vec![Span::raw("live heap ")], figures.to_vec()].concat(),
        [vec![Span::raw("heap ")], figures.to_vec()].concat(),
        figures.to_vec(),
    ]
    .into_iter()
    .map(Line::from)
    .find(|l| l.width() <= width)
    .unwrap_or_else(|| Line::from(figures.to_vec()));
    sparkline(frame, top, title, &total, width, ACCENT);

    if let Some(row) = app.selected_row() {
        let tree = app
            .scope()
            .filter(|_| app.scope_tree() && app.view() == View::Stacks);
        let series = app.history().row_series(now, &row.id, tree);
        let value = Span::raw(format!(" {}", human_bytes(row.totals.live_bytes)));
        let span = span_of(&series, width, now);
        let room = width.saturating_sub(value.width() + span.width()).max(8);
        let title = Line::from(vec![
            Span::styled(truncate(&row.label, room), BOLD),
            value,
            span,
        ]);
        sparkline(frame, bottom, title, &series, width, Color::Magenta);
    }
}

/// ` · 2m 10s` : how far back the shown points go.
fn span_of(
    series: &[(std::time::Duration, u64)],
    width: usize,
    now: std::time::Duration,
) -> Span<'static> {
    let shown = &series[series.len().saturating_sub(width)..];
    match shown.first() {
        Some((first, _)) if *first < now => {
            Span::styled(format!(" · {}", format_elapsed(now - *first)), DIM)
        }
        _ => Span::raw(""),
    }
}

fn sparkline(
    frame: &mut Frame,
    area: Rect,
    title: Line<'static>,
    series: &[(std::time::Duration, u64)],
    width: usize,
    color: Color,
) {
    let [title_area, spark_area] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    frame.render_widget(title, title_area);
    let data: Vec<u64> = series[series.len().saturating_sub(width)..]
        .iter()
        .map(|(_, v)| *v)
        .collect();
    frame.render_widget(
        Sparkline::default()
            .data(data)
            .style(Style::new().fg(color)),
        spark_area,
    );
}

//! Drawing the state: the header (`header`), the process or stack table
//! (`table`), the detail pane (`detail`), the history sparklines
//! (`sparklines`), the status line and the help overlay (`footer`); or,
//! when open, the flamegraph (`flame`).
//!
//! Drawing only reads the state. What it needs of the screen to scroll, the
//! table's height and the detail's, the state is told first: [`fit_and_draw`]
//! computes the layout, hands the heights to [`App::fit_table`] and
//! [`App::fit_detail`], then draws.

mod callers;
mod detail;
mod flame;
mod footer;
mod header;
#[cfg(test)]
mod sizes;
mod sparklines;
mod table;
#[cfg(test)]
mod tests;

use ratatui::{
    Frame, Terminal,
    backend::Backend,
    layout::{Alignment, Constraint, Layout, Rect, Size},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Paragraph},
};

use super::state::{App, Screen};
use allocprof::model::stats::human_bytes;

/// Below this, the layout cannot show a useful table; say so instead.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 15;

const ACCENT: Color = Color::Cyan;
const DIM: Style = Style::new().fg(Color::DarkGray);
const BOLD: Style = Style::new().add_modifier(Modifier::BOLD);
const GROWING: Color = Color::Red;
const SHRINKING: Color = Color::Green;

/// Tells the state the table's height for the terminal's size, then draws.
pub fn fit_and_draw<B: Backend>(terminal: &mut Terminal<B>, app: &mut App) -> Result<(), B::Error> {
    let size = terminal.size()?;
    if let Some(page) = table_page(size, app.zoom()) {
        app.fit_table(page);
    }
    let screen = Rect::new(0, 0, size.width, size.height);
    let mut pointable = Screen::default();
    if let Some(areas) = areas(screen, app.zoom()) {
        let lines = detail::content(app).map_or(0, |(_, lines, _)| lines.len());
        app.fit_detail(detail::page(areas.detail), lines);
        if app.flame().is_some() {
            pointable.flame = flame::graph_area(screen);
        } else {
            let inner = Block::bordered().inner(areas.table);
            // Under the column titles.
            pointable.rows = Rect {
                y: inner.y + 1,
                height: inner.height.saturating_sub(1),
                ..inner
            };
            pointable.detail = Block::bordered().inner(areas.detail);
        }
    }
    app.fit_screen(pointable);
    terminal.draw(|f| draw(f, app))?;
    Ok(())
}

/// Where each part of the screen goes.
struct Areas {
    header: Rect,
    table: Rect,
    detail: Rect,
    /// Not when the detail is enlarged.
    history: Option<Rect>,
    footer: Rect,
}

/// The layout of `area`; `None` when it is too small for one.
fn areas(area: Rect, zoom: bool) -> Option<Areas> {
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        return None;
    }
    let [header, body, footer] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(8),
        Constraint::Length(1),
    ])
    .areas(area);
    if zoom {
        let [table, detail] =
            Layout::vertical([Constraint::Length(7), Constraint::Min(4)]).areas(body);
        Some(Areas {
            header,
            table,
            detail,
            history: None,
            footer,
        })
    } else {
        let [table, bottom] =
            Layout::vertical([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(body);
        let [detail, history] =
            Layout::horizontal([Constraint::Percentage(60), Constraint::Percentage(40)])
                .areas(bottom);
        Some(Areas {
            header,
            table,
            detail,
            history: Some(history),
            footer,
        })
    }
}

/// The table's rows on a screen of `size`; `None` when no table is drawn.
pub fn table_page(size: Size, zoom: bool) -> Option<usize> {
    let areas = areas(Rect::new(0, 0, size.width, size.height), zoom)?;
    Some(table::page(Block::bordered().inner(areas.table)))
}

pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let Some(areas) = areas(area, app.zoom()) else {
        too_small(frame, area);
        return;
    };
    if let Some(view) = app.flame() {
        flame::draw(frame, app, view, area);
        if app.help() {
            footer::help(frame, area, ("Keys", "any key closes"), footer::FLAME_KEYS);
        }
        return;
    }
    header::header(frame, app, areas.header);
    if let Some(view) = app.callers() {
        let body = areas.table.union(areas.detail);
        let body = areas.history.map_or(body, |h| body.union(h));
        callers::draw(frame, app, view, body);
        footer::footer(frame, app, areas.footer);
        if app.help() {
            footer::help(frame, area, ("Keys", "any key closes"), footer::KEYS);
        }
        return;
    }
    table::table(frame, app, areas.table);
    detail::detail(frame, app, areas.detail);
    if let Some(history) = areas.history {
        sparklines::history(frame, app, history);
    }
    footer::footer(frame, app, areas.footer);
    if app.help() {
        if app.legend() {
            footer::help(frame, area, ("Legend", "any key closes"), footer::LEGEND);
        } else {
            footer::help(
                frame,
                area,
                ("Keys", "?: legend · any key closes"),
                footer::KEYS,
            );
        }
    }
}

fn too_small(frame: &mut Frame, area: Rect) {
    let lines = vec![
        Line::styled("Terminal too small", BOLD),
        Line::from(format!("{}×{}", area.width, area.height)),
        Line::from(format!("allocprof needs at least {MIN_WIDTH}×{MIN_HEIGHT}")),
        Line::from("enlarge the window, or press q to quit"),
    ];
    let height = (lines.len() as u16).min(area.height);
    let [_, middle, _] = Layout::vertical([
        Constraint::Fill(1),
        Constraint::Length(height),
        Constraint::Fill(1),
    ])
    .areas(area);
    frame.render_widget(Paragraph::new(lines).alignment(Alignment::Center), middle);
}

fn signed_bytes(v: Option<f64>) -> Span<'static> {
    match v {
        None => Span::styled("–", DIM),
        Some(v) if v.abs() < 0.5 => Span::styled("0 B", DIM),
        Some(v) if v > 0.0 => {
            Span::styled(format!("+{}", human_bytes(v)), Style::new().fg(GROWING))
        }
        Some(v) => Span::styled(human_bytes(v), Style::new().fg(SHRINKING)),
    }
}

/// An estimate's 95% interval, after its value: `± 1.2 KiB`; or, when it
/// reaches below 0, clipped there, `(0 B – 1.5 MiB)`: no byte count is
/// negative, and `512 KiB ± 1003 KiB` would read as possibly so. The help's
/// legend says the same.
pub(super) fn interval(value: f64, ci: f64) -> String {
    if ci.is_nan() {
        " ± ?".into()
    } else if ci <= 0.0 || ci < value {
        format!(" ± {}", human_bytes(ci))
    } else {
        format!(" (0 B – {})", human_bytes(value + ci))
    }
}

fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let keep: String = s.chars().take(width.saturating_sub(1)).collect();
        format!("{keep}…")
    }
}

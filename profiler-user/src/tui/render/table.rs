//! The process or stack table: tabs and scope in its title, columns fitted
//! to the width (the least important dropped first), the rows on screen.

use ratatui::{
    Frame,
    layout::{Constraint, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Cell, Paragraph, Row as TableRow, Table, TableState, Wrap},
};

use super::{ACCENT, BOLD, DIM, SHRINKING, interval, signed_bytes, truncate};
use crate::tui::{
    rows::{Row, RowId},
    state::{App, Column, View},
};
use allocprof::{
    model::profile::ProcessState,
    model::stats::{human_bytes, human_count},
};

/// Table rows that fit in the table's `inner` area, under the column titles.
pub(super) fn page(inner: Rect) -> usize {
    inner.height.saturating_sub(1).max(1) as usize
}

fn cell_spans(column: Column, row: &Row) -> Vec<Span<'static>> {
    match column {
        Column::Name => vec![Span::raw(row.label.clone())],
        Column::Pid => vec![Span::raw(match row.id {
            RowId::Process(k) => k.pid.to_string(),
            _ => String::new(),
        })],
        Column::Live => vec![
            Span::raw(human_bytes(row.totals.live_bytes)),
            Span::styled(
                format!(
                    "{}{}",
                    interval(row.totals.live_bytes, row.totals.live_ci95()),
                    // Thinned samples: the detail pane says by how much.
                    if row.process.as_ref().is_some_and(|p| p.thinned.is_some()) {
                        allocprof::output::report::THIN_MARK
                    } else {
                        ""
                    }
                ),
                DIM,
            ),
        ],
        Column::Old => vec![if row.totals.ages.over_old > 0.0 {
            Span::raw(human_bytes(row.totals.ages.over_old))
        } else {
            Span::styled("–", DIM)
        }],
        Column::Share => vec![Span::raw(format!("{:.1}%", 100.0 * row.share))],
        Column::Objects => vec![Span::raw(human_count(row.totals.live_objects))],
        Column::AllocRate => vec![match row.alloc_rate {
            None => Span::styled("–", DIM),
            Some(r) => Span::raw(human_bytes(r)),
        }],
        // Nothing grows after exit: its figures are as they were then.
        Column::Growth if row.gone => vec![Span::styled("at exit", DIM)],
        Column::Growth => vec![signed_bytes(row.growth)],
        Column::Baseline => vec![signed_bytes(row.since_baseline)],
        Column::Samples => vec![Span::raw(human_count(row.totals.live_samples as f64))],
        Column::Resident => vec![match row.process.as_ref().and_then(|p| p.resident) {
            Some(r) => Span::raw(human_bytes(r.anon as f64)),
            None => Span::styled("–", DIM),
        }],
        Column::State => match &row.process {
            Some(p) => vec![Span::styled(
                p.state.describe(),
                match p.state {
                    ProcessState::Live => Style::new().fg(SHRINKING),
                    _ => DIM,
                },
            )],
            None => vec![],
        },
    }
}

fn width_of(spans: &[Span]) -> usize {
    spans.iter().map(|s| s.width()).sum()
}

/// Columns dropped first when the terminal is narrow.
fn drop_order(view: View) -> &'static [Column] {
    match view {
        // PID and STATE stay: which process, and whether it still runs.
        View::Processes => &[
            Column::Resident,
            Column::Old,
            Column::Samples,
            Column::Objects,
            Column::AllocRate,
            Column::Growth,
            Column::Baseline,
        ],
        View::Stacks => &[
            Column::Old,
            Column::Objects,
            Column::Share,
            Column::Samples,
            Column::AllocRate,
        ],
    }
}

/// The name column's least width before columns are dropped: a stack's
/// name in the all-processes view ends with its process, which must show.
fn name_min(view: View) -> usize {
    match view {
        View::Processes => 18,
        View::Stacks => 30,
    }
}
const HIGHLIGHT: &str = "▶ ";

pub(super) fn table(frame: &mut Frame, app: &App, area: Rect) {
    let view = app.view();
    let sort = app.sort();
    let title = table_title(app);
    let arrow = if sort.descending { "▼" } else { "▲" };
    let n = app.rows().len();
    let mut right = vec![Span::styled(
        format!(
            " {n} row{} · sort {} {arrow} ",
            if n == 1 { "" } else { "s" },
            sort.column.short()
        ),
        DIM,
    )];
    if !app.search().query.is_empty() {
        right.insert(
            0,
            Span::styled(
                format!(" /{} ", app.search().query),
                Style::new().fg(Color::Yellow),
            ),
        );
    }
    let block = Block::bordered()
        .border_style(DIM)
        .title(title)
        .title_top(Line::from(right).right_aligned());
    let inner = block.inner(area);
    frame.render_widget(block, area);

    if app.shown().is_none() {
        return;
    }
    let nothing_profiled = app.shown().is_some_and(|p| p.processes.is_empty());
    if app.search().query.is_empty() && nothing_profiled {
        frame.render_widget(
            Paragraph::new(how_to_profile(app)).wrap(Wrap { trim: false }),
            inner,
        );
        return;
    }
    if app.rows().is_empty() {
        let text = if !app.search().query.is_empty() {
            "no row matches the search (Esc clears it)"
        } else if view == View::Processes {
            "no process has sampled allocations yet"
        } else {
            "no sampled allocations yet"
        };
        frame.render_widget(Paragraph::new(Line::styled(text, DIM)), inner);
        return;
    }

    // The state scrolled for this height (`fit_table`); render only what
    // shows.
    let rows = app.rows();
    let shown = app.table().visible(rows.len());
    let offset = shown.start;
    let visible = &rows[shown];

    // Widths from the content (a bounded sample), so they do not jump as
    // rows scroll; the name column takes what is left.
    let mut columns = app.columns();
    let measured: Vec<usize> = columns
        .iter()
        .map(|c| {
            rows.iter()
                .take(2000)
                .map(|r| width_of(&cell_spans(*c, r)))
                .max()
                .unwrap_or(0)
                .max(c.title(view).chars().count() + 2)
        })
        .collect();
    let mut widths: Vec<(Column, usize)> = columns.iter().copied().zip(measured).collect();
    let budget = inner.width as usize - HIGHLIGHT.chars().count();
    let fixed = |w: &[(Column, usize)]| -> usize {
        w.iter()
            .filter(|(c, _)| *c != Column::Name)
            .map(|(_, w)| w + 1)
            .sum()
    };
    for drop in drop_order(view) {
        if fixed(&widths) + name_min(view) <= budget {
            break;
        }
        widths.retain(|(c, _)| c != drop);
    }
    columns.retain(|c| widths.iter().any(|(w, _)| w == c));
    let name_width = budget.saturating_sub(fixed(&widths)).max(8);
    // Wide: the name column takes what its names need, and the space left
    // goes between the figures, not after the names.
    let name_need = widths
        .iter()
        .find(|(c, _)| *c == Column::Name)
        .map_or(0, |(_, w)| w + 2);
    let spare = name_width.saturating_sub(name_need.max(name_min(view)));
    let name_width = name_width - spare;
    let others = widths.len().saturating_sub(1).max(1);
    for (i, (_, w)) in widths
        .iter_mut()
        .filter(|(c, _)| *c != Column::Name)
        .enumerate()
    {
        *w += spare / others + usize::from(i < spare % others);
    }

    let header = TableRow::new(columns.iter().map(|c| {
        let mut title = c.title(view).to_string();
        let sorted = *c == sort.column || (sort.column == Column::Live && *c == Column::Share);
        if sorted {
            title = format!("{title} {arrow}");
        }
        let style = if sorted { BOLD.fg(ACCENT) } else { BOLD };
        let line = Line::styled(title, style);
        Cell::from(if *c == Column::Name {
            line
        } else {
            line.right_aligned()
        })
    }));
    let body = visible.iter().map(|r| {
        let row = TableRow::new(columns.iter().map(|c| {
            let spans = cell_spans(*c, r);
            if *c == Column::Name {
                Cell::from(Line::from(vec![Span::raw(truncate(&r.label, name_width))]))
            } else {
                Cell::from(Line::from(spans).right_aligned())
            }
        }));
        // Nothing live: only of interest for its allocation rate; or gone.
        if r.totals.live_bytes < 0.5 || r.gone {
            row.style(DIM)
        } else {
            row
        }
    });
    let constraints = columns.iter().map(|c| match c {
        Column::Name => Constraint::Length(name_width as u16),
        c => Constraint::Length(
            widths
                .iter()
                .find(|(w, _)| w == c)
                .map_or(0, |(_, w)| *w as u16),
        ),
    });
    let table = Table::new(body, constraints)
        .header(header)
        .column_spacing(1)
        .row_highlight_style(
            Style::new()
                .bg(Color::Indexed(236))
                .add_modifier(Modifier::BOLD),
        )
        .highlight_symbol(HIGHLIGHT);
    let selected = app
        .selected_index()
        .and_then(|i| i.checked_sub(offset))
        .filter(|i| *i < visible.len());
    let mut state = TableState::new().with_selected(selected);
    frame.render_stateful_widget(table, inner, &mut state);
}

/// The first screen when no process has the probes: how to get one that
/// has (README's "Make a program profilable", briefly).
fn how_to_profile(app: &App) -> Vec<Line<'static>> {
    let preload = app
        .options
        .preload
        .clone()
        .unwrap_or_else(|| "/path/to/liballocprof.so".into());
    let code = Style::new().fg(Color::Yellow);
    vec![
        Line::styled(
            "Nothing profiled yet: no process allocates through allocprof's probes.",
            BOLD,
        ),
        Line::raw("Start a program with them, and it shows up here as it allocates:"),
        Line::raw("  C, C++ and other programs on libc:"),
        Line::styled(format!("    LD_PRELOAD={preload} your-program"), code),
        Line::raw("  Rust, as the global allocator (the allocator crate):"),
        Line::styled("    #[global_allocator]", code),
        Line::styled(
            "    static A: SamplingAllocator<System> = SamplingAllocator::new(System);",
            code,
        ),
    ]
}

fn table_title(app: &App) -> Line<'static> {
    let tab = |name: &'static str, active: bool| {
        if active {
            Span::styled(
                format!(" {name} "),
                Style::new()
                    .fg(Color::Black)
                    .bg(ACCENT)
                    .add_modifier(Modifier::BOLD),
            )
        } else {
            Span::styled(format!(" {name} "), DIM)
        }
    };
    let view = app.view();
    let mut spans = vec![
        tab("Processes", view == View::Processes),
        Span::raw(" "),
        tab("Stacks", view == View::Stacks),
    ];
    if view == View::Stacks {
        let scope = match app.scope() {
            Some(key) if app.scope_tree() => format!("tree of {}", app.process_label(key)),
            Some(key) => app.process_label(key),
            None => "all processes".into(),
        };
        spans.push(Span::raw(format!(
            " {scope} · {} ",
            app.grouping().describe()
        )));
    } else if app.trees() {
        spans.push(Span::raw(" trees "));
    } else {
        spans.push(Span::raw(" "));
    }
    Line::from(spans)
}

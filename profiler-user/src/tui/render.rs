//! Drawing the state: header, the process or stack table, the detail pane,
//! the history sparklines, the status line, and the help overlay. Reads the
//! state; writes back only the table's scroll position and page height.

use profiler_common::DropReason;
use ratatui::{
    Frame,
    layout::{Alignment, Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span, Text},
    widgets::{Block, Cell, Clear, Paragraph, Row as TableRow, Sparkline, Table, TableState},
};

use super::{
    history::GROWTH_WINDOW,
    rows::{Row, RowId, stack_label},
    state::{App, Column, Notice, View, format_elapsed},
};
use allocprof::{
    inert::inert,
    profile::{ProcessProfile, ProcessState, Profile},
    stats::{Totals, human_bytes, human_count},
    symbolize::{Frame as StackFrame, is_allocator_frame, is_library_frame, most_informative},
};

/// Below this, the layout cannot show a useful table; say so instead.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 15;

const ACCENT: Color = Color::Cyan;
const DIM: Style = Style::new().fg(Color::DarkGray);
const BOLD: Style = Style::new().add_modifier(Modifier::BOLD);
const GROWING: Color = Color::Red;
const SHRINKING: Color = Color::Green;

pub fn draw(frame: &mut Frame, app: &mut App) {
    let area = frame.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        too_small(frame, area);
        return;
    }
    let [header_area, body, footer_area] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(8),
        Constraint::Length(1),
    ])
    .areas(area);
    header(frame, app, header_area);
    if app.zoom() {
        let [table_area, detail_area] =
            Layout::vertical([Constraint::Length(7), Constraint::Min(4)]).areas(body);
        table(frame, app, table_area);
        detail(frame, app, detail_area);
    } else {
        let [table_area, bottom] =
            Layout::vertical([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(body);
        let [detail_area, history_area] =
            Layout::horizontal([Constraint::Percentage(60), Constraint::Percentage(40)])
                .areas(bottom);
        table(frame, app, table_area);
        detail(frame, app, detail_area);
        history(frame, app, history_area);
    }
    footer(frame, app, footer_area);
    if app.help() {
        help(frame, area);
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

// ---- header ----

fn header(frame: &mut Frame, app: &App, area: Rect) {
    let [line1, line2] = Layout::vertical([Constraint::Length(1); 2]).areas(area);
    let mut badges = Vec::new();
    if app.paused() {
        badges.push(Span::styled(
            " PAUSED ",
            Style::new().fg(Color::Black).bg(Color::Yellow),
        ));
        badges.push(Span::raw(" "));
    }
    if let Some(b) = app.baseline() {
        badges.push(Span::styled(
            format!(" BASELINE @{} ", format_elapsed(b.elapsed)),
            Style::new().fg(Color::Black).bg(Color::Magenta),
        ));
    }
    let badges = Line::from(badges).alignment(Alignment::Right);
    let title = Span::styled(
        " allocprof ",
        Style::new()
            .fg(Color::Black)
            .bg(ACCENT)
            .add_modifier(Modifier::BOLD),
    );
    let sep = || Span::styled(" · ", DIM);
    let Some(profile) = app.shown() else {
        frame.render_widget(
            Line::from(vec![
                title,
                Span::raw(" "),
                Span::raw(app.options.target.clone()),
                sep(),
                Span::styled("waiting for the first refresh…", DIM),
            ]),
            line1,
        );
        return;
    };
    let total = profile.totals();
    let n = profile.processes.len();
    let gone = profile
        .processes
        .iter()
        .filter(|p| p.state != ProcessState::Live)
        .count();
    let mut first = vec![
        title,
        Span::raw(" "),
        Span::raw(app.options.target.clone()),
        sep(),
        Span::raw(format!("{n} process{}", if n == 1 { "" } else { "es" })),
    ];
    if gone > 0 {
        first.push(Span::styled(format!(" ({gone} exited)"), DIM));
    }
    // Samples lost to the live sums make the estimate a lower bound.
    let lost = profile.lost_live_bytes();
    first.extend([
        sep(),
        Span::raw(if lost > 0 {
            "live heap ≥ "
        } else {
            "live heap "
        }),
        Span::styled(human_bytes(total.live_bytes), BOLD),
        Span::styled(format!(" ± {}", human_bytes(total.live_ci95())), DIM),
        sep(),
        Span::raw(format_elapsed(profile.elapsed)),
    ]);
    frame.render_widget(Line::from(first), line1);
    frame.render_widget(badges, line1);

    let events = app
        .history()
        .events_per_second(profile.elapsed)
        .map_or("–".into(), human_count);
    let dropped: u64 = profile.drops.iter().sum();
    let drop_style = if dropped > 0 {
        Style::new().fg(GROWING).add_modifier(Modifier::BOLD)
    } else {
        Style::new()
    };
    let mut second = vec![
        Span::raw(" sampled "),
        Span::styled(events, BOLD),
        Span::raw(" events/s"),
        sep(),
        Span::raw("drops "),
        Span::styled(human_count(dropped as f64), drop_style),
    ];
    if lost > 0 {
        second.push(Span::styled(
            format!(" (up to {} untracked live)", human_bytes(lost as f64)),
            drop_style,
        ));
    }
    second.extend([
        sep(),
        Span::raw(rates(profile)),
        sep(),
        Span::styled(
            format!(
                "refresh {}",
                humantime::format_duration(app.options.interval)
            ),
            DIM,
        ),
    ]);
    frame.render_widget(Line::from(second), line2);
}

/// The sampling rate(s) in use: `rate 512 KiB`, `rates 64 KiB, 512 KiB`.
fn rates(profile: &Profile) -> String {
    let mut rates: Vec<u64> = profile.processes.iter().map(|p| p.rate).collect();
    rates.sort_unstable();
    rates.dedup();
    let show = |r: &u64| {
        if *r == 0 {
            "off".to_string()
        } else {
            human_bytes(*r as f64)
        }
    };
    match rates.as_slice() {
        [] => "rate –".into(),
        [one] => format!("sampling rate {}", show(one)),
        [a, b] => format!("rates {}, {}", show(a), show(b)),
        [a, .., z] => format!("rates {}…{} ({})", show(a), show(z), rates.len()),
    }
}

// ---- table ----

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

fn cell_spans(column: Column, row: &Row) -> Vec<Span<'static>> {
    match column {
        Column::Name => vec![Span::raw(row.label.clone())],
        Column::Pid => vec![Span::raw(match row.id {
            RowId::Process(k) => k.pid.to_string(),
            _ => String::new(),
        })],
        Column::Live => vec![
            Span::raw(human_bytes(row.totals.live_bytes)),
            Span::styled(format!(" ± {}", human_bytes(row.totals.live_ci95())), DIM),
        ],
        Column::Share => vec![Span::raw(format!("{:.1}%", 100.0 * row.share))],
        Column::Objects => vec![Span::raw(human_count(row.totals.live_objects))],
        Column::AllocRate => vec![match row.alloc_rate {
            None => Span::styled("–", DIM),
            Some(r) => Span::raw(human_bytes(r)),
        }],
        Column::Growth => vec![signed_bytes(row.growth)],
        Column::Baseline => vec![signed_bytes(row.since_baseline)],
        Column::Samples => vec![Span::raw(human_count(row.totals.alloc_samples as f64))],
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
        View::Processes => &[
            Column::Samples,
            Column::Objects,
            Column::State,
            Column::AllocRate,
            Column::Pid,
        ],
        View::Stacks => &[Column::Objects, Column::Share, Column::AllocRate],
    }
}

const NAME_MIN: usize = 18;
const HIGHLIGHT: &str = "▶ ";

fn table(frame: &mut Frame, app: &mut App, area: Rect) {
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

    // Scroll so the selection stays on screen; render only what shows.
    let page = inner.height.saturating_sub(1).max(1) as usize;
    app.page = page;
    let selected = app.selected_index().unwrap_or(0);
    let len = app.rows().len();
    let mut offset = app.offset.min(len.saturating_sub(page));
    if selected < offset {
        offset = selected;
    } else if selected >= offset + page {
        offset = selected + 1 - page;
    }
    app.offset = offset;
    let rows = app.rows();
    let visible = &rows[offset..(offset + page).min(len)];

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
        if fixed(&widths) + NAME_MIN <= budget {
            break;
        }
        widths.retain(|(c, _)| c != drop);
    }
    columns.retain(|c| widths.iter().any(|(w, _)| w == c));
    let name_width = budget.saturating_sub(fixed(&widths)).max(8);

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
        // Nothing live: only of interest for its allocation rate.
        if r.totals.live_bytes < 0.5 {
            row.style(DIM)
        } else {
            row
        }
    });
    let constraints = columns.iter().map(|c| match c {
        Column::Name => Constraint::Fill(1),
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
    let mut state = TableState::new().with_selected(Some(selected - offset));
    frame.render_stateful_widget(table, inner, &mut state);
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
            Some(key) => app.process_label(key),
            None => "all processes".into(),
        };
        spans.push(Span::raw(format!(
            " {scope} · {} ",
            app.grouping().describe()
        )));
    } else {
        spans.push(Span::raw(" "));
    }
    Line::from(spans)
}

fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let keep: String = s.chars().take(width.saturating_sub(1)).collect();
        format!("{keep}…")
    }
}

// ---- detail ----

fn detail(frame: &mut Frame, app: &App, area: Rect) {
    let block = Block::bordered().border_style(DIM);
    let Some(row) = app.selected_row() else {
        frame.render_widget(block.title(" Detail "), area);
        return;
    };
    let (title, lines) = match &row.id {
        RowId::Process(key) => {
            let p = app
                .shown()
                .and_then(|p| p.processes.iter().find(|p| p.key == *key));
            (
                format!(" Process {} ", app.process_label(*key)),
                p.map(process_detail).unwrap_or_default(),
            )
        }
        RowId::Stack { .. } => (
            format!(" Stack: {} ", row.label),
            stack_detail(&row.frames, app.zoom()),
        ),
        RowId::Function { .. } => {
            let mut lines = vec![Line::styled(
                format!("heaviest stack through {}:", row.label),
                DIM,
            )];
            lines.extend(stack_detail(&row.frames, app.zoom()));
            (format!(" Function: {} ", row.label), lines)
        }
    };
    let block = block.title(Line::styled(title, BOLD)).title_bottom(
        Line::styled(
            if app.zoom() {
                " Esc/d: smaller "
            } else {
                " Enter/d: larger "
            },
            DIM,
        )
        .right_aligned(),
    );
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

/// Frames innermost first: the naming frame bold, the standard library and
/// the allocator dimmed, inlined calls marked.
fn stack_detail(frames: &[StackFrame], full_paths: bool) -> Vec<Line<'static>> {
    let naming = most_informative(frames).map(std::ptr::from_ref::<StackFrame>);
    frames
        .iter()
        .map(|f| {
            let style = if Some(std::ptr::from_ref::<StackFrame>(f)) == naming {
                BOLD.fg(Color::White)
            } else if is_library_frame(f) || is_allocator_frame(f) {
                DIM
            } else {
                Style::new()
            };
            let mut spans = vec![Span::styled(inert(&f.function).into_owned(), style)];
            if f.inlined {
                spans.push(Span::styled(" (inlined)", Style::new().fg(Color::Magenta)));
            }
            match (&f.location, &f.module) {
                (Some(loc), _) => spans.push(Span::styled(
                    format!(
                        "  {}",
                        inert(&if full_paths {
                            loc.clone()
                        } else {
                            short_path(loc)
                        })
                    ),
                    Style::new().fg(Color::Blue),
                )),
                (None, Some(module)) => spans.push(Span::styled(
                    format!("  [{}]", inert(&short_path(module))),
                    DIM,
                )),
                (None, None) => {}
            }
            Line::from(spans)
        })
        .collect()
}

/// The last two components of a path: enough to recognise a file.
fn short_path(path: &str) -> String {
    let parts: Vec<&str> = path.rsplitn(3, '/').collect();
    match parts.as_slice() {
        [last, parent, _] => format!("{parent}/{last}"),
        _ => path.to_string(),
    }
}

fn process_detail(p: &ProcessProfile) -> Vec<Line<'static>> {
    let t: &Totals = &p.totals;
    let mut lines = vec![
        Line::from(vec![
            Span::raw(format!("pid {} · ", p.key.pid)),
            Span::raw(p.state.describe()),
            Span::styled(
                format!(
                    " · sampling rate {}",
                    if p.rate == 0 {
                        "off".into()
                    } else {
                        human_bytes(p.rate as f64)
                    }
                ),
                DIM,
            ),
        ]),
        Line::from(vec![
            Span::raw("live "),
            Span::styled(human_bytes(t.live_bytes), BOLD),
            Span::styled(format!(" ± {}", human_bytes(t.live_ci95())), DIM),
            Span::raw(format!(" in {} objects", human_count(t.live_objects))),
        ]),
        Line::from(format!(
            "allocated {} ± {} since attach ({} samples)",
            human_bytes(t.alloc_bytes),
            human_bytes(t.alloc_ci95()),
            human_count(t.alloc_samples as f64)
        )),
        Line::from(format!(
            "sampled events: {} allocs, {} frees · dropped {}",
            human_count(p.alloc_events as f64),
            human_count(p.free_events as f64),
            p.dropped()
        )),
    ];
    for reason in DropReason::ALL {
        let n = p.drops[reason as usize];
        if n > 0 {
            lines.push(Line::styled(
                format!("  {n} dropped: {}", reason.describe()),
                Style::new().fg(GROWING),
            ));
        }
    }
    lines.push(Line::styled("top stacks (Enter: all of them):", DIM));
    for s in p.stacks.iter().take(5) {
        lines.push(Line::from(vec![
            Span::raw(format!("  {:>10}  ", human_bytes(s.totals.live_bytes))),
            Span::raw(stack_label(&s.frames)),
        ]));
    }
    lines
}

// ---- history ----

fn history(frame: &mut Frame, app: &App, area: Rect) {
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
        .map(|r| profile.totals().live_bytes - r.totals().live_bytes);
    let mut title = vec![
        Span::raw("live heap "),
        Span::styled(human_bytes(profile.totals().live_bytes), BOLD),
        Span::raw(" "),
        signed_bytes(growth),
        Span::styled("/1m", DIM),
    ];
    title.push(span_of(&total, width, now));
    sparkline(frame, top, Line::from(title), &total, width, ACCENT);

    if let Some(row) = app.selected_row() {
        let series = app.history().row_series(now, &row.id);
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

// ---- footer and help ----

fn footer(frame: &mut Frame, app: &App, area: Rect) {
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

fn help(frame: &mut Frame, area: Rect) {
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

#[cfg(test)]
mod tests {
    use crossterm::event::KeyCode;
    use ratatui::{Terminal, backend::TestBackend, buffer::Buffer};

    use super::*;
    use crate::tui::state::{
        AppEvent,
        tests::{options, press, sample},
    };

    /// The screen as text, one line per row, trailing spaces trimmed.
    fn text(buffer: &Buffer) -> String {
        let area = buffer.area;
        let mut out = String::new();
        for y in 0..area.height {
            let mut line = String::new();
            for x in 0..area.width {
                line.push_str(buffer[(x, y)].symbol());
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    fn screen(app: &mut App, width: u16, height: u16) -> (String, Buffer) {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|f| draw(f, app)).unwrap();
        let buffer = terminal.backend().buffer().clone();
        (text(&buffer), buffer)
    }

    fn app_at(secs: u64) -> App {
        let mut app = App::new(options());
        for s in 0..=secs {
            app.update(AppEvent::Profile(sample(s)));
        }
        app
    }

    #[test]
    fn stack_view_snapshot() {
        let mut app = app_at(3);
        let (text, buffer) = screen(&mut app, 80, 24);
        let expected = " allocprof  pid 7 · 2 processes · live heap 75.3 KiB ± 5.3 KiB · 3s
 sampled 0 events/s · drops 0 · sampling rate 512.0 KiB · refresh 1s
┌ Processes   Stacks  all processes · by stack ────────── 3 rows · sort live ▼ ┐
│  ALLOCATED AT                       LIVE ± 95% CI ▼   % ▼   OBJECTS   ALLOC/s│
│▶ cache_fill ← main               68.4 KiB ± 5.1 KiB 90.8%      1094       0 B│
│  leak ← handle                    4.0 KiB ± 1.2 KiB  5.3%        64   2.0 KiB│
│  parse ← handle                   2.9 KiB ± 1.0 KiB  3.9%        47 390.6 KiB│
│                                                                              │
│                                                                              │
│                                                                              │
│                                                                              │
│                                                                              │
│                                                                              │
└──────────────────────────────────────────────────────────────────────────────┘
┌ Stack: cache_fill ← main ────────────────────┐┌ History ─────────────────────┐
│cache_fill  src/work.c:10                     ││live heap 75.3 KiB +3.0 KiB/1m│
│main  src/work.c:4                            ││▇▇▇█                          │
│                                              ││████                          │
│                                              ││████                          │
│                                              ││cache_fill ← ma… 68.4 KiB · 3s│
│                                              ││████                          │
│                                              ││████                          │
└───────────────────────────── Enter/d: larger ┘└──────────────────────────────┘
                                                                 ?:help  q:quit
";
        assert_eq!(text, expected, "\n{text}");
        // The selected row is highlighted, the naming frame bold.
        assert!(buffer[(3, 4)].modifier.contains(Modifier::BOLD));
        assert_eq!(buffer[(3, 4)].bg, Color::Indexed(236));
        assert_eq!(buffer[(3, 5)].bg, Color::Reset);
        assert!(buffer[(1, 15)].modifier.contains(Modifier::BOLD));
        // Growth is red.
        assert_eq!(buffer[(71, 15)].fg, GROWING);
    }

    #[test]
    fn the_stack_flood_is_shown_as_its_frame() {
        let mut app = App::new(options());
        let mut profile = sample(0);
        profile.processes[0].stacks[0].frames =
            std::sync::Arc::from(vec![StackFrame::named(allocprof::profile::STACK_FLOOD)]);
        profile.processes[0].stacks[0].totals.live_bytes = 1e9;
        app.update(AppEvent::Profile(profile));
        let (text, _) = screen(&mut app, 120, 24);
        assert!(
            text.contains("[stack flood: new stacks over the per-process limit]"),
            "{text}"
        );
    }

    #[test]
    fn lost_live_bytes_show_the_live_heap_as_a_lower_bound() {
        let mut app = App::new(options());
        let mut profile = sample(0);
        profile.processes[0].lost_live_bytes = 2 << 20;
        app.update(AppEvent::Profile(profile));
        let (text, _) = screen(&mut app, 120, 24);
        let header: Vec<&str> = text.lines().take(2).collect();
        assert!(header[0].contains("live heap ≥ "), "{text}");
        assert!(
            header[1].contains("(up to 2.0 MiB untracked live)"),
            "{text}"
        );
    }

    #[test]
    fn hostile_names_are_shown_inert() {
        let mut app = App::new(options());
        let mut profile = sample(0);
        profile.processes[0].name = "\u{1b}]0;x\u{7}".into();
        app.update(AppEvent::Profile(profile));
        press(&mut app, KeyCode::Tab);
        let (text, _) = screen(&mut app, 120, 30);
        assert!(text.contains("\\x1b]0;x\\x07"), "{text}");
    }

    #[test]
    fn process_view_has_a_row_per_process_with_growth_and_state() {
        let mut app = app_at(3);
        press(&mut app, KeyCode::Tab);
        press(&mut app, KeyCode::Char('s')); // by pid, ascending
        press(&mut app, KeyCode::Char('s')); // back to live
        let (text, _) = screen(&mut app, 120, 30);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[3].contains("PROCESS")
                && lines[3].contains("PID")
                && lines[3].contains("LIVE ± 95% CI")
                && lines[3].contains("OBJECTS")
                && lines[3].contains("ALLOC/s")
                && lines[3].contains("GROWTH 1m")
                && lines[3].contains("SAMPLES")
                && lines[3].contains("STATE"),
            "{text}"
        );
        assert!(lines[4].starts_with("│▶ server"), "{text}");
        assert!(lines[4].contains("55.7 KiB ± 4.6 KiB"), "{text}");
        assert!(lines[4].contains("+3.0 KiB"), "{text}");
        assert!(
            lines[4].trim_end_matches('│').trim_end().ends_with("live"),
            "{text}"
        );
        assert!(lines[5].starts_with("│  worker"), "{text}");
        // The detail pane describes the process and its top stacks.
        assert!(text.contains("Process server (7)"), "{text}");
        assert!(
            text.contains("sampled events: 10 allocs, 5 frees · dropped 0"),
            "{text}"
        );
        assert!(text.contains("48.8 KiB  cache_fill ← main"), "{text}");
        // Narrow: less important columns go, the name stays readable.
        let (narrow, _) = screen(&mut app, 60, 20);
        assert!(narrow.contains("▶ server"), "{narrow}");
        assert!(!narrow.contains("SAMPLES"), "{narrow}");
    }

    #[test]
    fn sorting_marks_the_column_and_reorders() {
        let mut app = app_at(3);
        for _ in 0..3 {
            press(&mut app, KeyCode::Char('s'));
        }
        let (text, _) = screen(&mut app, 80, 24);
        assert!(text.contains("ALLOCATED AT ▲"), "{text}");
        assert!(text.contains("sort name ▲"), "{text}");
        let at = |s: &str| text.find(s).unwrap();
        assert!(at("cache_fill ← main") < at("leak ← handle"));
        assert!(at("leak ← handle") < at("parse ← handle"));
    }

    #[test]
    fn baseline_and_pause_show_as_badges_and_a_column() {
        let mut app = app_at(3);
        press(&mut app, KeyCode::Char('b'));
        for s in 4..=6 {
            app.update(AppEvent::Profile(sample(s)));
        }
        press(&mut app, KeyCode::Char('p'));
        let (text, buffer) = screen(&mut app, 120, 30);
        let first = text.lines().next().unwrap();
        assert!(first.ends_with("PAUSED   BASELINE @3s"), "{text}");
        assert!(text.contains("Δ BASELINE ▼"), "{text}");
        let leak = text.lines().nth(4).unwrap();
        assert!(
            leak.starts_with("│  leak ← handle"),
            "the grower is on top:\n{text}"
        );
        assert!(leak.contains("+3.0 KiB"), "{text}");
        assert!(text.contains("paused: the view is frozen"), "{text}");
        let badge = first.find("PAUSED").unwrap();
        let x = first[..badge].chars().count() as u16;
        assert_eq!(buffer[(x, 0)].bg, Color::Yellow);
    }

    #[test]
    fn grouping_by_function_and_search() {
        let mut app = app_at(3);
        press(&mut app, KeyCode::Char('g'));
        press(&mut app, KeyCode::Char('/'));
        for c in "lea".chars() {
            press(&mut app, KeyCode::Char(c));
        }
        let (text, _) = screen(&mut app, 80, 24);
        assert!(text.contains("all processes · by function"), "{text}");
        assert!(text.contains("/lea"), "{text}");
        assert!(text.contains("1 row · sort live ▼"), "{text}");
        assert!(text.contains("│▶ leak "), "{text}");
        assert!(text.contains("Function: leak"), "{text}");
        assert!(text.contains("heaviest stack through leak:"), "{text}");
        assert!(text.contains(" /lea█  Enter: keep · Esc: clear"), "{text}");
        press(&mut app, KeyCode::Char('x'));
        let (text, _) = screen(&mut app, 80, 24);
        assert!(
            text.contains("no row matches the search (Esc clears it)"),
            "{text}"
        );
    }

    #[test]
    fn detail_shows_locations_inlined_and_library_frames() {
        let mut app = App::new(options());
        let mut p = sample(1);
        let frames: Vec<StackFrame> = vec![
            StackFrame {
                function: "alloc::raw_vec::finish_grow".into(),
                location: Some("/rustc/abc/library/alloc/src/raw_vec.rs:1".into()),
                module: Some("/usr/bin/app".into()),
                inlined: false,
            },
            StackFrame {
                function: "app::index::insert".into(),
                location: Some("/home/me/app/src/index.rs:42".into()),
                module: Some("/usr/bin/app".into()),
                inlined: true,
            },
            StackFrame {
                function: "app::main".into(),
                location: Some("/home/me/app/src/main.rs:7".into()),
                module: Some("/usr/bin/app".into()),
                inlined: false,
            },
            StackFrame {
                function: "__libc_start_call_main".into(),
                location: None,
                module: Some("/usr/lib/x86_64-linux-gnu/libc.so.6".into()),
                inlined: false,
            },
        ];
        p.processes[0].stacks[0].frames = frames.into();
        p.processes[0].stacks[0].totals.live_bytes = 1e9;
        app.update(AppEvent::Profile(p));
        let (text, buffer) = screen(&mut app, 100, 30);
        assert!(
            text.contains("Stack: app::index::insert ← app::main"),
            "{text}"
        );
        assert!(
            text.contains("app::index::insert (inlined)  src/index.rs:42"),
            "{text}"
        );
        assert!(
            text.contains("__libc_start_call_main  [x86_64-linux-gnu/libc.so.6]"),
            "{text}"
        );
        let y = text
            .lines()
            .position(|l| l.contains("│alloc::raw_vec::finish_grow"))
            .unwrap() as u16;
        assert_eq!(
            buffer[(1, y)].fg,
            Color::DarkGray,
            "library frames are dimmed"
        );
        assert!(buffer[(1, y + 1)].modifier.contains(Modifier::BOLD));
        // Enlarged, the detail shows full paths.
        press(&mut app, KeyCode::Enter);
        let (text, _) = screen(&mut app, 100, 30);
        assert!(text.contains("/home/me/app/src/index.rs:42"), "{text}");
        assert!(text.contains("Esc/d: smaller"), "{text}");
    }

    #[test]
    fn the_selection_stays_on_screen() {
        let mut app = App::new(options());
        let mut p = sample(1);
        p.processes[0].stacks = (0..100)
            .map(|i| allocprof::profile::StackProfile {
                frames: crate::tui::rows::tests::frames(&[&format!("f{i:03}"), "main"]),
                totals: crate::tui::rows::tests::totals(1e6 - f64::from(i), 0.0),
            })
            .collect();
        app.update(AppEvent::Profile(p));
        let selected_line = |app: &mut App| {
            let (text, _) = screen(app, 80, 24);
            let line = text.lines().find(|l| l.contains('▶')).map(str::to_string);
            let label = app.selected_row().unwrap().label.clone();
            assert!(
                line.as_deref().is_some_and(|l| l.contains(&label)),
                "{label} is not on screen:\n{text}"
            );
            label
        };
        press(&mut app, KeyCode::End);
        assert_eq!(selected_line(&mut app), "cache_fill ← main");
        press(&mut app, KeyCode::PageUp);
        assert_eq!(app.selected_index(), Some(100 - app.page));
        selected_line(&mut app);
        press(&mut app, KeyCode::Home);
        assert_eq!(selected_line(&mut app), "f000 ← main");
        press(&mut app, KeyCode::PageDown);
        selected_line(&mut app);
    }

    #[test]
    fn help_lists_every_key_even_at_the_minimum_size() {
        let mut app = app_at(1);
        press(&mut app, KeyCode::Char('?'));
        for (w, h) in [(80, 24), (MIN_WIDTH, MIN_HEIGHT)] {
            let (text, _) = screen(&mut app, w, h);
            assert!(text.contains("Keys"), "{text}");
            for (key, description) in KEYS {
                let line = text
                    .lines()
                    .find(|l| l.contains(&format!("│ {key} ")))
                    .unwrap_or_else(|| panic!("{key} missing at {w}×{h}:\n{text}"));
                let start: String = description.chars().take(20).collect();
                assert!(line.contains(&start), "{key} at {w}×{h}:\n{text}");
            }
        }
    }

    #[test]
    fn a_small_terminal_gets_a_message_not_garbage() {
        let mut app = app_at(1);
        for (w, h) in [(MIN_WIDTH - 1, 30), (120, MIN_HEIGHT - 1), (20, 5)] {
            let (text, _) = screen(&mut app, w, h);
            assert!(text.contains("Terminal too small"), "{w}×{h}:\n{text}");
            if w >= 40 {
                assert!(text.contains(&format!("{w}×{h}")), "{text}");
                assert!(text.contains("needs at least 60×15"), "{text}");
            }
            assert!(!text.contains("allocprof  pid"), "{text}");
        }
    }

    #[test]
    fn before_the_first_profile() {
        let mut app = App::new(options());
        app.set_notice(Notice::Info("attached 2 probe sites".into()));
        let (text, _) = screen(&mut app, 80, 24);
        assert!(
            text.starts_with(" allocprof  pid 7 · waiting for the first refresh…"),
            "{text}"
        );
        assert!(text.contains(" attached 2 probe sites"), "{text}");
        app.update(AppEvent::Profile(crate::tui::rows::tests::profile(
            1,
            vec![],
        )));
        let (text, _) = screen(&mut app, 80, 24);
        assert!(text.contains("0 processes"), "{text}");
        assert!(text.contains("no sampled allocations yet"), "{text}");
    }

    #[test]
    fn drops_and_several_rates_show_in_the_header() {
        let mut app = App::new(options());
        let mut p = sample(1);
        p.drops[0] = 3;
        p.processes[1].rate = 65_536;
        app.update(AppEvent::Profile(p));
        let (text, buffer) = screen(&mut app, 80, 24);
        let second = text.lines().nth(1).unwrap();
        assert!(second.contains("drops 3"), "{text}");
        assert!(second.contains("rates 64.0 KiB, 512.0 KiB"), "{text}");
        let x = second[..second.find("drops 3").unwrap()].chars().count() as u16 + 6;
        assert_eq!(buffer[(x, 1)].fg, GROWING);
    }
}

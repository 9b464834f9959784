//! The detail pane: the selected process, or the selected stack's frames.

use profiler_common::{DropReason, WeightForm};
use ratatui::{
    Frame,
    layout::Rect,
    style::{Color, Style},
    text::{Line, Span},
    widgets::{Block, Paragraph},
};

use super::{BOLD, DIM, GROWING, interval};
use crate::tui::{
    rows::{RowId, stack_label},
    state::App,
};
use allocprof::{
    model::profile::ProcessProfile,
    model::stats::{Totals, human_bytes, human_count},
    output::inert::inert,
    python::runtime::ObjectAllocator,
    symbolize::{Frame as StackFrame, is_allocator_frame, is_library_frame, most_informative},
};

/// The detail's title, lines, and what its lines are (for "+N more").
pub(super) fn content(app: &App) -> Option<(String, Vec<Line<'static>>, &'static str)> {
    let row = app.selected_row()?;
    Some(match &row.id {
        RowId::Process(key) => {
            let shown = app.shown();
            let attached = shown.and_then(|p| p.attached_clock());
            let p = shown.and_then(|p| p.processes.iter().find(|p| p.key == *key));
            (
                format!(" Process {} ", app.process_label(*key)),
                p.map(|p| process_detail(p, attached.as_deref()))
                    .unwrap_or_default(),
                "lines",
            )
        }
        RowId::Stack { .. } => {
            let mut lines = before_attach(&row.totals);
            lines.extend(stack_detail(&row.frames, app.zoom()));
            (format!(" Stack: {} ", row.label), lines, "frames")
        }
        RowId::Function { name, .. } => {
            let mut lines = vec![Line::styled(
                format!("heaviest stack through {}:", inert(name)),
                DIM,
            )];
            lines.extend(stack_detail(&row.frames, app.zoom()));
            (format!(" Function: {} ", row.label), lines, "frames")
        }
    })
}

/// Rows of text inside a detail pane of `area`.
pub(super) fn page(area: Rect) -> usize {
    area.height.saturating_sub(2) as usize
}

pub(super) fn detail(frame: &mut Frame, app: &App, area: Rect) {
    let block = Block::bordered().border_style(DIM);
    let Some((title, lines, unit)) = content(app) else {
        frame.render_widget(block.title(" Detail "), area);
        return;
    };
    let lines = window(lines, app.detail_scroll(), page(area), unit, app.zoom());
    let block = block.title(Line::styled(title, BOLD)).title_bottom(
        Line::styled(
            if app.zoom() {
                " j/k PgUp/PgDn: scroll · Esc/d: smaller "
            } else {
                " Enter/d: larger "
            },
            DIM,
        )
        .right_aligned(),
    );
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

/// The `page` lines from `offset` on; when more follow, the last row says
/// how many instead of cutting them silently.
fn window(
    lines: Vec<Line<'static>>,
    offset: usize,
    page: usize,
    unit: &str,
    zoom: bool,
) -> Vec<Line<'static>> {
    let offset = offset.min(lines.len().saturating_sub(page));
    let total = lines.len();
    let mut shown: Vec<Line<'static>> = lines.into_iter().skip(offset).collect();
    if shown.len() > page && page > 0 {
        shown.truncate(page - 1);
        let more = total - offset - shown.len();
        let how = if zoom { "j: scroll" } else { "d: all" };
        shown.push(Line::styled(
            format!("+{more} more {unit} ({how})"),
            Style::new().fg(Color::Yellow),
        ));
    }
    shown
}

/// A stack's live bytes from before attach, if any (read from its
/// process's ledger).
fn before_attach(t: &Totals) -> Vec<Line<'static>> {
    if t.before_attach_bytes <= 0.0 {
        return Vec::new();
    }
    vec![Line::styled(
        format!(
            "{} of its {} live allocated before attach",
            human_bytes(t.before_attach_bytes),
            human_bytes(t.live_bytes)
        ),
        DIM,
    )]
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
                            loc.to_string()
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

/// A process's weight form, briefly (its intervals depend on it).
fn weight_form(form: WeightForm) -> String {
    match form {
        WeightForm::NoSamples => "-".into(),
        WeightForm::InverseProbability => "size/p".into(),
        WeightForm::PointsTimesInterval { interval } => {
            format!("n×R (R {})", human_bytes(interval as f64))
        }
        WeightForm::Unrecognized => "unrecognized (± ?)".into(),
    }
}

/// The last two components of a path: enough to recognise a file.
pub(super) fn short_path(path: &str) -> String {
    let parts: Vec<&str> = path.rsplitn(3, '/').collect();
    match parts.as_slice() {
        [last, parent, _] => format!("{parent}/{last}"),
        _ => path.to_string(),
    }
}

/// After a thinned process's intervals: by how much (both thinnings).
fn thinned_mark(p: &ProcessProfile) -> String {
    if p.thinned() {
        format!(" (thinned 1 in {})", p.combined_thin_factor())
    } else {
        String::new()
    }
}

fn process_detail(p: &ProcessProfile, attached: Option<&str>) -> Vec<Line<'static>> {
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
            Span::styled(
                format!(
                    " · {} · weights {}",
                    p.contract(),
                    weight_form(p.weight_form)
                ),
                DIM,
            ),
        ]),
        Line::from(vec![
            Span::raw("live "),
            Span::styled(human_bytes(t.live_bytes), BOLD),
            Span::styled(interval(t.live_bytes, t.live_ci95()), DIM),
            Span::styled(thinned_mark(p), DIM),
            Span::raw(format!(" in {} objects", human_count(t.live_objects))),
        ]),
        Line::from(format!(
            "allocated {}{}{} since attach ({} samples, {} still live)",
            human_bytes(t.alloc_bytes),
            interval(t.alloc_bytes, t.alloc_ci95()),
            thinned_mark(p),
            human_count(t.alloc_samples as f64),
            human_count(t.live_samples as f64)
        )),
        Line::from(format!(
            "sampled events: {} allocs, {} frees · dropped {}",
            human_count(p.alloc_events as f64),
            human_count(p.free_events as f64),
            p.dropped()
        )),
    ];
    if let Some(r) = p.resident {
        // The heap lives in anonymous memory; the rest of it is overhead,
        // fragmentation or memory not from malloc.
        lines.push(Line::from(vec![
            Span::raw(format!(
                "resident {} (anonymous {}, file {}, shared {})",
                human_bytes((r.anon + r.file + r.shmem) as f64),
                human_bytes(r.anon as f64),
                human_bytes(r.file as f64),
                human_bytes(r.shmem as f64),
            )),
            Span::styled(
                format!(
                    " · {} anonymous beyond the live heap",
                    human_bytes((r.anon as f64 - t.live_bytes).max(0.0))
                ),
                DIM,
            ),
        ]));
    }
    if p.since_attach {
        lines.push(Line::from(format!(
            "ran before allocprof attached{}: live figures count only what it allocated since",
            attached.map_or_else(String::new, |t| format!(" at {t}"))
        )));
    }
    if let Some(l) = p.ledger.filter(|l| l.read && l.seeded > 0) {
        lines.push(Line::from(format!(
            "before attach{}: {} of the live heap (ledger: {} blocks, {} freed)",
            attached.map_or_else(String::new, |t| format!(" ({t})")),
            human_bytes(t.before_attach_bytes),
            human_count(l.seeded as f64),
            human_count(l.retired as f64),
        )));
    }
    if let Some(t) = p.alloc_thinning.filter(|t| t.thinned > 0) {
        lines.push(Line::from(format!(
            "allocator's sample budget{}: {} sampled allocations dropped since the process started, counted by the kept ones (1 in {} now)",
            t.max_event_rate
                .map_or_else(String::new, |r| format!(" ({r}/s)")),
            human_count(t.thinned as f64),
            t.factor
        )));
    }
    if p.thinned_events > 0 {
        lines.push(Line::from(format!(
            "back-pressure: {} sampled allocations not walked, counted by the kept ones (1 in {} now)",
            human_count(p.thinned_events as f64),
            p.thin_factor
        )));
    }
    if let Some(b) = &p.backend_heap {
        lines.push(Line::from(format!("allocator {}", b.describe())));
    }
    if let Some(python) = &p.python {
        let style = match python.objects {
            // Part of the heap is out of sight: said as loudly as a drop.
            Some(ObjectAllocator::Pymalloc) => Style::new().fg(GROWING),
            _ => Style::new(),
        };
        lines.push(Line::styled(python.describe(), style));
    }
    if p.mmap_events > 0 {
        lines.push(Line::from(format!(
            "mapped {} beside the heap ({} mmap probes)",
            human_bytes(p.mapped_bytes as f64),
            human_count(p.mmap_events as f64)
        )));
    }
    for reason in DropReason::ALL
        .into_iter()
        .filter(|&r| allocprof::model::profile::is_loss(r))
    {
        let n = p.drops[reason as usize];
        if n > 0 {
            lines.push(Line::styled(
                format!("  {n} dropped: {}", reason.describe()),
                Style::new().fg(GROWING),
            ));
        }
    }
    if p.unmatched_frees() > 0 {
        lines.push(Line::styled(
            format!(
                "  {} frees matched no live sample (sampled before allocprof saw them): nothing lost",
                p.unmatched_frees()
            ),
            DIM,
        ));
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

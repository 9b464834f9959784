//! The two header lines: what is profiled, the live heap, time, event
//! and drop counts, sampling rates; and the paused and baseline badges.

use ratatui::{
    Frame,
    layout::{Alignment, Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
};

use super::{ACCENT, BOLD, DIM, GROWING, interval};
use crate::tui::state::{App, format_elapsed};
use allocprof::{
    model::profile::{ProcessState, Profile},
    model::stats::{human_bytes, human_count},
};

pub(super) fn header(frame: &mut Frame, app: &App, area: Rect) {
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
    // Gone images held their figures when they went: not live heap.
    let total = profile.live_totals();
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
    let hidden = app.hidden_processes();
    if hidden > 0 {
        first.push(Span::styled(
            format!(" ({gone} exited, {hidden} hidden: x)"),
            DIM,
        ));
    } else if gone > 0 {
        first.push(Span::styled(format!(" ({gone} exited)"), DIM));
    }
    // Samples lost to the live sums make the estimate a lower bound.
    let lost = profile.lost_live_bytes();
    let exited = first.len() - 5;
    first.extend([
        sep(),
        // Processes profiled since before we attached: what they held then
        // is not in the figure, and it must not read as their whole heap.
        Span::raw(match (profile.live_since_attach(), lost > 0) {
            (true, true) => "live since attach ≥ ",
            (true, false) => "live since attach ",
            (false, true) => "live heap ≥ ",
            (false, false) => "live heap ",
        }),
        Span::styled(human_bytes(total.live_bytes), BOLD),
        Span::styled(interval(total.live_bytes, total.live_ci95()), DIM),
        sep(),
        Span::raw(format_elapsed(profile.elapsed)),
    ]);
    // Narrow: the interval, the exited count, then what is profiled go
    // before the live heap and the elapsed time would be cut.
    let room = (line1.width as usize).saturating_sub(badges.width());
    let interval_at = first.len() - 3;
    if Line::from(first.clone()).width() > room {
        first.remove(interval_at);
    }
    if Line::from(first.clone()).width() > room && exited > 0 {
        first.remove(5);
    }
    if Line::from(first.clone()).width() > room {
        // " allocprof " and the live heap, without the target.
        first.drain(1..3);
    }
    frame.render_widget(Line::from(first), line1);
    frame.render_widget(badges, line1);

    let events = app
        .history()
        .events_per_second(profile.elapsed)
        .map_or("–".into(), human_count);
    let dropped = profile.dropped();
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

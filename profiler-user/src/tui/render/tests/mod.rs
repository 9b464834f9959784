//! Snapshots of the screen (ratatui's `TestBackend`) for the states the
//! keys lead to, by what they show: the tables (`table.rs`), the header
//! (`header.rs`), the detail pane (`detail.rs`), the flamegraph (`flame.rs`),
//! and the help, the status line and a terminal too small (`help.rs`).
//! Here, the helpers and imports they share.

mod detail;
mod flame;
mod header;
mod help;
mod table;

use crossterm::event::KeyCode;
use ratatui::{Terminal, backend::TestBackend, buffer::Buffer};

use super::{
    footer::{KEYS, LEGEND},
    *,
};
use crate::tui::state::{
    AppEvent, Notice,
    tests::{options, press, sample},
};
use allocprof::symbolize::Frame as StackFrame;

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
    fit_and_draw(&mut terminal, app).unwrap();
    let buffer = terminal.backend().buffer().clone();
    (text(&buffer), buffer)
}

/// The screen as lines, trailing blanks trimmed (for the other test modules).
pub(super) fn screen_lines(app: &mut App, width: u16, height: u16) -> Vec<String> {
    screen(app, width, height)
        .0
        .lines()
        .map(str::to_owned)
        .collect()
}

fn app_at(secs: u64) -> App {
    let mut app = App::new(options());
    for s in 0..=secs {
        app.update(AppEvent::Profile(sample(s)));
    }
    app
}

/// The line index where `s` first shows, if it does.
fn line_of(text: &str, s: &str) -> Option<usize> {
    text.lines().position(|l| l.contains(s))
}

/// The screen cell where `s` first shows.
fn cell_of(text: &str, s: &str) -> (u16, u16) {
    let y = line_of(text, s).unwrap_or_else(|| panic!("{s} not on screen:\n{text}"));
    let line = text.lines().nth(y).unwrap();
    let x = line[..line.find(s).unwrap()].chars().count();
    (x as u16, y as u16)
}

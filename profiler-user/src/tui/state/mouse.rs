//! The mouse (crossterm's mouse capture): a click selects the row (or, in
//! the flamegraph, the frame) under it, a click on the selected root of a
//! process tree folds or unfolds it, the wheel moves the selection, or
//! scrolls the detail pane when over it. Where things are on screen comes
//! from the last draw ([`App::fit_screen`]), as the table's height does.

use crossterm::event::{MouseButton, MouseEvent, MouseEventKind};
use ratatui::layout::{Position, Rect};

use super::{App, Effect};
use crate::tui::rows::TreeMark;

/// What the mouse can point at, as last drawn; empty before the first draw
/// and for what is not on screen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Screen {
    /// The table's rows (under its column titles).
    pub rows: Rect,
    /// The detail pane's text.
    pub detail: Rect,
    /// The flamegraph's icicle, when it is open.
    pub flame: Rect,
}

impl App {
    /// Where the coming draw puts the rows, the detail and the icicle.
    pub fn fit_screen(&mut self, screen: Screen) {
        self.screen = screen;
    }

    pub(super) fn mouse(&mut self, mouse: MouseEvent) -> Effect {
        let at = Position::new(mouse.column, mouse.row);
        let click = mouse.kind == MouseEventKind::Down(MouseButton::Left);
        let wheel = match mouse.kind {
            MouseEventKind::ScrollUp => Some(-1),
            MouseEventKind::ScrollDown => Some(1),
            _ => None,
        };
        if self.help {
            // As any key: a click closes the help, and does nothing else.
            if click {
                self.help = false;
                self.legend = false;
            }
            return Effect::None;
        }
        if let Some(flame) = self.flame.as_mut() {
            if click {
                flame.click(at.x, at.y, self.screen.flame);
            } else if let Some(step) = wheel {
                flame.wheel(step > 0);
            }
            return Effect::None;
        }
        if let Some(view) = self.callers.as_mut() {
            // The table is under it: only the wheel, to move its selection.
            if let Some(step) = wheel {
                view.select_by(step);
            }
            return Effect::None;
        }
        if click && self.screen.rows.contains(at) {
            let offset = self.table().visible(self.rows.len()).start;
            let index = offset + usize::from(at.y - self.screen.rows.y);
            if index < self.rows.len() {
                // A click on the selected root of a tree folds or unfolds it.
                if let (true, Some(TreeMark::Root { unfolded, .. })) =
                    (self.selected_index() == Some(index), self.rows[index].tree)
                {
                    self.fold(unfolded);
                } else {
                    self.select(|t, len| t.select(index, len));
                }
            }
        } else if let Some(step) = wheel {
            if self.screen.detail.contains(at) {
                self.scroll_detail(step);
            } else {
                self.select(|t, len| t.select_by(step, len));
            }
        }
        Effect::None
    }
}

#[cfg(test)]
mod tests {
    use crossterm::event::{KeyCode, KeyModifiers};
    use ratatui::{Terminal, backend::TestBackend};

    use super::*;
    use crate::tui::{
        flame::ROOT,
        render::fit_and_draw,
        state::{
            AppEvent,
            tests::{options, press, sample},
        },
    };

    fn mouse(app: &mut App, kind: MouseEventKind, column: u16, row: u16) {
        app.update(AppEvent::Mouse(MouseEvent {
            kind,
            column,
            row,
            modifiers: KeyModifiers::NONE,
        }));
    }

    fn click(app: &mut App, column: u16, row: u16) {
        mouse(app, MouseEventKind::Down(MouseButton::Left), column, row);
    }

    fn app_at(secs: u64) -> App {
        let mut app = App::new(options());
        for s in 0..=secs {
            app.update(AppEvent::Profile(sample(s)));
        }
        app
    }

    fn label(app: &App) -> &str {
        &app.selected_row().unwrap().label
    }

    /// The screen drawn at `width`×`height`, as text lines.
    fn draw(app: &mut App, width: u16, height: u16) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        fit_and_draw(&mut terminal, app).unwrap();
        let buffer = terminal.backend().buffer();
        (0..height)
            .map(|y| (0..width).map(|x| buffer[(x, y)].symbol()).collect())
            .collect()
    }

    #[test]
    fn a_click_selects_the_row_under_it_and_the_wheel_moves() {
        let mut app = app_at(3);
        for (w, h) in [(80, 24), (160, 48)] {
            let lines = draw(&mut app, w, h);
            let y = lines.iter().position(|l| l.contains("worker (9)")).unwrap();
            click(&mut app, 10, y as u16);
            assert_eq!(label(&app), "cache_fill ← main · worker (9)");
            // Below the last row, or on the titles: nothing.
            click(&mut app, 10, (y + 5) as u16);
            click(&mut app, 10, 3);
            assert_eq!(label(&app), "cache_fill ← main · worker (9)");
            mouse(&mut app, MouseEventKind::ScrollDown, 10, 6);
            assert_eq!(app.selected_index(), Some(2));
            mouse(&mut app, MouseEventKind::ScrollUp, 10, 6);
            mouse(&mut app, MouseEventKind::ScrollUp, 10, 6);
            assert_eq!(app.selected_index(), Some(0));
        }
        // Scrolled: the row under the pointer, not the n-th.
        app.fit_table(2);
        press(&mut app, KeyCode::End);
        app.fit_table(2);
        app.fit_screen(Screen {
            rows: Rect::new(1, 4, 78, 2),
            ..Screen::default()
        });
        click(&mut app, 3, 4);
        assert_eq!(app.selected_index(), Some(2));
    }

    #[test]
    fn the_wheel_over_the_detail_scrolls_it_and_a_click_closes_the_help() {
        let mut app = app_at(3);
        app.fit_screen(Screen {
            rows: Rect::new(1, 4, 78, 8),
            detail: Rect::new(1, 16, 40, 4),
            flame: Rect::default(),
        });
        app.fit_detail(4, 10);
        mouse(&mut app, MouseEventKind::ScrollDown, 5, 17);
        mouse(&mut app, MouseEventKind::ScrollDown, 5, 17);
        assert_eq!(app.detail_scroll(), 2);
        assert_eq!(app.selected_index(), Some(0));
        press(&mut app, KeyCode::Char('?'));
        click(&mut app, 3, 5);
        assert!(!app.help());
        assert_eq!(
            app.selected_index(),
            Some(0),
            "the click only closed the help"
        );
    }

    #[test]
    fn in_the_flamegraph_a_click_selects_the_frame_and_the_wheel_walks() {
        let mut app = app_at(3);
        press(&mut app, KeyCode::Char('f'));
        let lines = draw(&mut app, 80, 24);
        let selected = |app: &App| {
            let f = app.flame().unwrap();
            let node = f.tree().node(f.selected());
            (node.name.to_string(), node.depth)
        };
        // The icicle's second row holds the processes: click `worker`.
        let y = lines.iter().position(|l| l.contains("worker")).unwrap();
        let col = lines[y]
            .chars()
            .collect::<Vec<_>>()
            .windows(6)
            .position(|w| w.iter().collect::<String>() == "worker")
            .unwrap();
        click(&mut app, col as u16, y as u16);
        assert_eq!(selected(&app), ("worker (9)".into(), 1));
        mouse(&mut app, MouseEventKind::ScrollDown, 0, 0);
        assert_eq!(selected(&app).1, 2);
        mouse(&mut app, MouseEventKind::ScrollUp, 0, 0);
        mouse(&mut app, MouseEventKind::ScrollUp, 0, 0);
        assert_eq!(app.flame().unwrap().selected(), ROOT);
        // Off the icicle (the header): nothing.
        click(&mut app, 5, 0);
        assert_eq!(app.flame().unwrap().selected(), ROOT);
    }

    #[test]
    fn a_click_on_the_selected_root_of_a_tree_unfolds_it_and_folds_it() {
        let mut app = crate::tui::state::tests::forked_app();
        press(&mut app, KeyCode::Char('t'));
        let row_of = |lines: &[String], text: &str| {
            lines.iter().position(|l| l.contains(text)).unwrap() as u16
        };
        let lines = draw(&mut app, 100, 30);
        let (root, other) = (row_of(&lines, "server"), row_of(&lines, "other"));
        // The first click selects the unrelated process, the next the root.
        click(&mut app, 10, other);
        click(&mut app, 10, root);
        assert_eq!(app.rows().len(), 2, "a click selects, it does not unfold");
        // A click on the selected root unfolds it, another folds it.
        click(&mut app, 10, root);
        assert_eq!(app.rows().len(), 4);
        draw(&mut app, 100, 30);
        click(&mut app, 10, root);
        assert_eq!(app.rows().len(), 2);
    }
}

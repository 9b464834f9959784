//! One table's scroll and selection: the selected row's index, the first
//! row on screen and how many rows the screen holds. Pure: the row count and
//! the viewport height come in as arguments, so drawing only reads it.
//!
//! Moving the selection never scrolls by itself; [`TableState::fit`] does,
//! once per frame before drawing. Scrolling at every step instead would land
//! elsewhere after several moves in one batch of events.

use std::ops::Range;

/// Rows on screen until the first [`TableState::fit`] tells otherwise.
const DEFAULT_PAGE: usize = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableState {
    selected: usize,
    offset: usize,
    page: usize,
}

impl Default for TableState {
    fn default() -> TableState {
        TableState {
            selected: 0,
            offset: 0,
            page: DEFAULT_PAGE,
        }
    }
}

impl TableState {
    /// The selected index among `len` rows; `None` when there are none.
    pub fn selected(&self, len: usize) -> Option<usize> {
        (len > 0).then(|| self.selected.min(len - 1))
    }

    /// The index the selection was at, even if the rows are gone: where a
    /// lost selection falls back to.
    pub fn last_selected(&self) -> usize {
        self.selected
    }

    /// Rows on screen (at least one): the step of PageUp and PageDown.
    pub fn page(&self) -> usize {
        self.page.max(1)
    }

    /// Selects `index`, clamped to the `len` rows; returns what is selected.
    pub fn select(&mut self, index: usize, len: usize) -> Option<usize> {
        self.selected = index.min(len.saturating_sub(1));
        self.selected(len)
    }

    /// Moves the selection `delta` rows, stopping at either end.
    pub fn select_by(&mut self, delta: isize, len: usize) -> Option<usize> {
        let index = self.selected.saturating_add_signed(delta);
        self.select(index, len)
    }

    pub fn page_up(&mut self, len: usize) -> Option<usize> {
        self.select_by(-(self.page() as isize), len)
    }

    pub fn page_down(&mut self, len: usize) -> Option<usize> {
        self.select_by(self.page() as isize, len)
    }

    pub fn home(&mut self, len: usize) -> Option<usize> {
        self.select(0, len)
    }

    pub fn end(&mut self, len: usize) -> Option<usize> {
        self.select(usize::MAX, len)
    }

    /// Back to the top, unscrolled (a new view or scope).
    pub fn reset(&mut self) {
        self.selected = 0;
        self.offset = 0;
    }

    /// Scrolls to the top, keeping the selection.
    pub fn scroll_to_top(&mut self) {
        self.offset = 0;
    }

    /// Takes the viewport's height in rows and scrolls as little as keeps
    /// the selection among the `len` rows on screen.
    pub fn fit(&mut self, page: usize, len: usize) {
        self.resize(page);
        let page = self.page;
        let selected = self.selected(len).unwrap_or(0);
        let mut offset = self.offset.min(len.saturating_sub(page));
        if selected < offset {
            offset = selected;
        } else if selected >= offset + page {
            offset = selected + 1 - page;
        }
        self.offset = offset;
    }

    /// Takes the viewport's height without scrolling (a table not shown).
    pub fn resize(&mut self, page: usize) {
        self.page = page.max(1);
    }

    /// The indices of the rows on screen, among `len`.
    pub fn visible(&self, len: usize) -> Range<usize> {
        let start = self.offset.min(len);
        start..(start + self.page()).min(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fitted(page: usize, len: usize) -> TableState {
        let mut t = TableState::default();
        t.fit(page, len);
        t
    }

    #[test]
    fn an_empty_table_selects_nothing_and_shows_nothing() {
        let mut t = fitted(5, 0);
        assert_eq!(t.selected(0), None);
        assert_eq!(t.select_by(1, 0), None);
        assert_eq!(t.page_down(0), None);
        assert_eq!(t.end(0), None);
        assert_eq!(t.home(0), None);
        assert_eq!(t.visible(0), 0..0);
    }

    #[test]
    fn moves_stop_at_either_end() {
        let mut t = fitted(5, 20);
        assert_eq!(t.select_by(-1, 20), Some(0));
        assert_eq!(t.select_by(3, 20), Some(3));
        assert_eq!(t.end(20), Some(19));
        assert_eq!(t.select_by(1, 20), Some(19));
        assert_eq!(t.home(20), Some(0));
    }

    #[test]
    fn page_up_and_down_move_by_the_viewport_height() {
        let mut t = fitted(5, 12);
        assert_eq!(t.page_down(12), Some(5));
        assert_eq!(t.page_down(12), Some(10));
        assert_eq!(t.page_down(12), Some(11));
        assert_eq!(t.page_up(12), Some(6));
        assert_eq!(t.page_up(12), Some(1));
        assert_eq!(t.page_up(12), Some(0));
        // Before any fit, a page is a default; never zero.
        assert_eq!(TableState::default().page(), DEFAULT_PAGE);
        assert_eq!(fitted(0, 12).page(), 1);
    }

    #[test]
    fn the_selection_clamps_when_rows_shrink() {
        let mut t = fitted(5, 20);
        t.end(20);
        assert_eq!(t.selected(3), Some(2));
        // Where it was is kept, for when rows come back.
        assert_eq!(t.last_selected(), 19);
        t.fit(5, 3);
        assert_eq!(t.visible(3).start, 0);
        assert_eq!(t.visible(3), 0..3);
        assert_eq!(t.select_by(-1, 3), Some(2));
    }

    #[test]
    fn fitting_scrolls_as_little_as_keeps_the_selection_visible() {
        let mut t = fitted(5, 20);
        t.select(7, 20);
        t.fit(5, 20);
        assert_eq!(t.visible(20), 3..8);
        // Moving up inside the viewport does not scroll.
        t.select(4, 20);
        t.fit(5, 20);
        assert_eq!(t.visible(20), 3..8);
        t.select(1, 20);
        t.fit(5, 20);
        assert_eq!(t.visible(20), 1..6);
        // Moves alone never scroll: only a fit does.
        t.end(20);
        assert_eq!(t.visible(20).start, 1);
        t.fit(5, 20);
        assert_eq!(t.visible(20), 15..20);
    }

    #[test]
    fn the_selection_stays_visible_when_the_viewport_changes() {
        let mut t = fitted(10, 30);
        t.select(9, 30);
        t.fit(10, 30);
        assert_eq!(t.visible(30).start, 0);
        // Shrunk: scrolled just enough.
        t.fit(4, 30);
        assert_eq!(t.visible(30), 6..10);
        // Grown: the offset stays while the selection shows ...
        t.fit(8, 30);
        assert_eq!(t.visible(30), 6..14);
        // ... but never leaves blank rows below the last one.
        t.end(30);
        t.fit(8, 30);
        t.fit(20, 30);
        assert_eq!(t.visible(30), 10..30);
        assert!(t.visible(30).contains(&29));
    }

    #[test]
    fn reset_goes_back_to_the_top() {
        let mut t = fitted(5, 20);
        t.end(20);
        t.fit(5, 20);
        t.scroll_to_top();
        assert_eq!((t.visible(20).start, t.selected(20)), (0, Some(19)));
        t.reset();
        assert_eq!((t.visible(20).start, t.selected(20)), (0, Some(0)));
    }
}

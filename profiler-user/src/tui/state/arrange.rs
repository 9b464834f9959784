//! Rows as shown: those the search and the hidden exited processes leave,
//! sorted (gone processes' after the running ones'), and the selection found
//! again by its row's identity.

use super::{App, Column, Row, TableState, View, columns::compare, search::row_matches};
use crate::tui::rows::{HashMap, tree};

impl App {
    /// Filters and sorts the rows, and finds the selected row again.
    pub(super) fn arrange(&mut self) {
        let query = self.settings.query();
        let grouping = self.settings.grouping;
        let mut shown: Vec<Row> = self
            .all_rows
            .iter()
            .filter(|r| !(r.gone && r.process_key().is_some_and(|k| self.hides(k))))
            .filter(|r| query.as_deref().is_none_or(|q| row_matches(r, grouping, q)))
            .cloned()
            .collect();
        let trees = self.settings.trees && self.settings.view == View::Processes;
        if trees && let Some(profile) = self.profiles.shown.as_deref() {
            let parents: HashMap<_, _> = profile
                .processes
                .iter()
                .map(|p| (p.key.pid, p.parent))
                .collect();
            tree::mark(&mut shown, &parents, &self.settings.unfolded);
        }
        let sort = self.sort();
        // Names compared case-insensitively, each lowercased once: a sort
        // of 10k's of rows makes 100k's of comparisons.
        let names: Vec<String> = match sort.column {
            Column::Name => shown.iter().map(|r| r.label.to_lowercase()).collect(),
            _ => Vec::new(),
        };
        let mut order: Vec<usize> = (0..shown.len()).collect();
        // Gone processes' figures are at exit: apart, after the running
        // ones', whatever the column (an exited leak is not growing).
        order.sort_by(|&i, &j| {
            let (a, b) = (&shown[i], &shown[j]);
            let o = match sort.column {
                Column::Name => names[i].cmp(&names[j]),
                column => compare(column, a, b),
            };
            let o = if sort.descending { o.reverse() } else { o };
            a.gone
                .cmp(&b.gone)
                .then(o)
                .then_with(|| b.totals.live_bytes.total_cmp(&a.totals.live_bytes))
                .then_with(|| a.id.cmp(&b.id))
        });
        let mut shown: Vec<Option<Row>> = shown.into_iter().map(Some).collect();
        let shown: Vec<Row> = order.into_iter().filter_map(|i| shown[i].take()).collect();
        self.rows = if trees { tree::order(shown) } else { shown };
        let v = self.settings.view as usize;
        let len = self.rows.len();
        match &self.selected[v] {
            // Nothing chosen yet: the cursor stays on the first row, whatever
            // row that is now (pinning the first row of the first refresh
            // would carry the cursor down the table as others outgrow it).
            None => {
                self.tables[v].select(0, len);
            }
            Some(id) => match self.rows.iter().position(|r| r.id == *id) {
                Some(i) => {
                    self.tables[v].select(i, len);
                }
                // Gone (or filtered out): the row now where it was.
                None => {
                    let last = self.tables[v].last_selected();
                    self.select(|t, len| t.select(last, len));
                }
            },
        }
    }

    /// Moves the shown table's selection, and remembers the row it lands on.
    pub(super) fn select(&mut self, how: impl FnOnce(&mut TableState, usize) -> Option<usize>) {
        let v = self.settings.view as usize;
        if let Some(i) = how(&mut self.tables[v], self.rows.len()) {
            self.selected[v] = Some(self.rows[i].id.clone());
        }
    }
}

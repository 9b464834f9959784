//! Exports: their files, and that what they hold is what the view shows.

use std::collections::BTreeMap;

use crossterm::event::KeyCode;

use super::*;
use crate::tui::{
    rows::tests::{process, profile},
    state::{
        App, AppEvent, Effect,
        tests::{options, press, sample, type_str},
    },
};
use allocprof::output::export::collapsed;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("allocprof-tui-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn one_process() -> ViewSelection {
    ViewSelection {
        process: Some(ProcessKey {
            pid: allocprof::ids::Pid(7),
            generation: 0,
        }),
        name: Some("w".into()),
        ..Default::default()
    }
}

#[test]
fn exports_folded_stacks_to_fresh_files() {
    let dir = scratch("folded");
    let options = export::Options {
        value: Quantity::InuseBytes,
        ..Default::default()
    };
    let export = file_exporter(Format::Collapsed, options, dir.clone());
    let p = profile(
        1,
        vec![process(7, "w", &[(&["leaf", "main"], 100.0, 100.0)])],
    );
    let first = export(&p, &one_process()).unwrap();
    let second = export(&p, &one_process()).unwrap();
    assert_ne!(first, second);
    assert!(first.starts_with(&dir));
    let name = first.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("allocprof-w-7-"), "{name}");
    assert!(name.ends_with("Z.folded"), "{name}");
    assert_eq!(
        std::fs::read_to_string(&second).unwrap(),
        "w (7);main;leaf 100\n"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn without_a_format_the_key_writes_a_flamegraph() {
    let dir = scratch("svg");
    let export = file_exporter(Format::Report, export::Options::default(), dir.clone());
    let p = profile(
        1,
        vec![process(7, "w", &[(&["leaf", "main"], 100.0, 100.0)])],
    );
    let path = export(&p, &ViewSelection::default()).unwrap();
    assert_eq!(path.extension().unwrap(), "svg");
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.contains("<svg") && svg.contains("leaf"), "{svg}");
    // With a baseline, the title says it is growth.
    let since = ViewSelection {
        since: Some(Duration::from_secs(62)),
        ..Default::default()
    };
    let svg = std::fs::read_to_string(export(&p, &since).unwrap()).unwrap();
    assert!(
        svg.contains("growth of live bytes since the baseline"),
        "{svg}"
    );
    assert!(svg.contains("from 1m 2s"), "{svg}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn files_are_named_after_the_process_and_the_time_inertly() {
    let dir = Path::new("/nonexistent-allocprof-dir");
    // 2026-11-25T10:31:02Z
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_602_662);
    let mut selection = ViewSelection {
        process: Some(ProcessKey {
            pid: allocprof::ids::Pid(1234),
            generation: 0,
        }),
        name: Some("python3".into()),
        ..Default::default()
    };
    let name = |s: &ViewSelection| {
        fresh_path(dir, s, "svg", at)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    };
    assert_eq!(
        name(&selection),
        "allocprof-python3-1234-2026-11-25T10-31-02Z.svg"
    );
    selection.name = Some("\u{1b}]0;pwn\u{7}/../.x y".into());
    assert_eq!(
        name(&selection),
        "allocprof-__0_pwn__.._.x_y-1234-2026-11-25T10-31-02Z.svg"
    );
    selection.name = Some("..".into());
    assert_eq!(name(&selection), "allocprof-1234-2026-11-25T10-31-02Z.svg");
    assert_eq!(
        name(&ViewSelection::default()),
        "allocprof-2026-11-25T10-31-02Z.svg"
    );
}

/// The folded stacks of what `e` hands the exporter, leaf first.
fn exported(app: &mut App) -> (BTreeMap<String, u64>, ViewSelection) {
    let Effect::Export { profile, selection } = press(app, KeyCode::Char('e')) else {
        panic!("no export");
    };
    (collapsed::folded(&profile, Quantity::InuseBytes), selection)
}

fn leaves(folded: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let mut leaves = BTreeMap::new();
    for (line, v) in folded {
        let (process, rest) = line.split_once(';').unwrap();
        let leaf = rest.rsplit(';').next().unwrap();
        *leaves.entry(format!("{leaf} · {process}")).or_default() += v;
    }
    leaves
}

/// The rows as `leaf · process (pid)` → rounded figure.
fn rows(app: &App, figure: impl Fn(&crate::tui::rows::Row) -> f64) -> BTreeMap<String, u64> {
    app.rows()
        .iter()
        .map(|r| (r.label.clone(), figure(r).round() as u64))
        .filter(|(_, v)| *v > 0)
        .collect()
}

#[test]
fn the_export_is_what_the_view_shows_filter_grouping_and_baseline() {
    let mut app = App::new(options());
    for s in 0..=3 {
        app.update(AppEvent::Profile(sample(s)));
    }
    // By function: the leaves are the rows, with their live bytes.
    press(&mut app, KeyCode::Char('g'));
    let (folded, selection) = exported(&mut app);
    assert_eq!(selection.grouping, Some(Grouping::Function));
    assert_eq!(leaves(&folded), rows(&app, |r| r.totals.live_bytes));
    assert!(folded.keys().all(|l| l.ends_with(";main;handle;leak")
        || l.ends_with(";main;handle;parse")
        || l.ends_with(";main;cache_fill")));
    // Searched: only the rows the search keeps.
    press(&mut app, KeyCode::Char('/'));
    type_str(&mut app, "cache");
    press(&mut app, KeyCode::Enter);
    let (folded, selection) = exported(&mut app);
    assert_eq!(selection.filter.as_deref(), Some("cache"));
    assert_eq!(leaves(&folded), rows(&app, |r| r.totals.live_bytes));
    assert_eq!(leaves(&folded).len(), 2);
    press(&mut app, KeyCode::Esc);
    // A baseline: the growth since, as Δ BASELINE shows it.
    press(&mut app, KeyCode::Char('b'));
    for s in 4..=9 {
        app.update(AppEvent::Profile(sample(s)));
    }
    let (folded, selection) = exported(&mut app);
    assert_eq!(selection.since, Some(Duration::from_secs(3)));
    let grown = rows(&app, |r| r.since_baseline.unwrap());
    assert_eq!(grown.len(), 1, "{grown:?}");
    assert_eq!(leaves(&folded), grown);
    assert_eq!(
        app.describe_selection(&selection),
        "the stacks of all processes by function (growth since the baseline at 3s)"
    );
    // One process entered: its stacks only, named after it.
    press(&mut app, KeyCode::Tab);
    press(&mut app, KeyCode::Home);
    press(&mut app, KeyCode::Enter);
    let (folded, selection) = exported(&mut app);
    assert_eq!(selection.name.as_deref(), Some("server"));
    assert!(
        folded.keys().all(|l| l.starts_with("server (7);")),
        "{folded:?}"
    );
    assert_eq!(
        leaves(&folded)
            .into_iter()
            .map(|(k, v)| (k.replace(" · server (7)", ""), v))
            .collect::<BTreeMap<_, _>>(),
        rows(&app, |r| r.since_baseline.unwrap())
    );
}

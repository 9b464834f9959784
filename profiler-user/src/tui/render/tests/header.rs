//! The header: the live heap, drops and rates, and before the first profile.

use super::*;

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
    // No process with the probes: the how-to, not an empty table.
    assert!(text.contains("Nothing profiled yet"), "{text}");
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

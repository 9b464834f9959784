//! The detail pane: a stack's frames, a process's figures, scrolling.

use super::*;
use allocprof::symbolize::FrameKind;

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
            offset: None,
            kind: FrameKind::Native,
        },
        StackFrame {
            function: "app::index::insert".into(),
            location: Some("/home/me/app/src/index.rs:42".into()),
            module: Some("/usr/bin/app".into()),
            inlined: true,
            offset: None,
            kind: FrameKind::Native,
        },
        StackFrame {
            function: "app::main".into(),
            location: Some("/home/me/app/src/main.rs:7".into()),
            module: Some("/usr/bin/app".into()),
            inlined: false,
            offset: None,
            kind: FrameKind::Native,
        },
        StackFrame {
            function: "__libc_start_call_main".into(),
            location: None,
            module: Some("/usr/lib/x86_64-linux-gnu/libc.so.6".into()),
            inlined: false,
            offset: None,
            kind: FrameKind::Native,
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
fn the_process_detail_names_its_contract_and_unavailable_intervals() {
    let mut app = App::new(options());
    let mut profile = sample(0);
    let p = &mut profile.processes[0];
    p.contracts = u64::from(profiler_common::CONTRACT_DDHEAP);
    p.weight_form = profiler_common::WeightForm::Unrecognized;
    p.mapped_bytes = 2 << 20;
    p.mmap_events = 3;
    for s in &mut p.stacks {
        s.totals = s
            .totals
            .with_weight_form(profiler_common::WeightForm::Unrecognized, 0, 1);
    }
    p.totals = p.stacks.iter().map(|s| s.totals).sum();
    app.update(AppEvent::Profile(profile));
    press(&mut app, KeyCode::Tab);
    let (text, _) = screen(&mut app, 140, 30);
    assert!(
        text.contains("ddheap · weights unrecognized (± ?)"),
        "{text}"
    );
    assert!(text.contains("± ?"), "{text}");
}

#[test]
fn the_process_detail_says_what_pymalloc_hides() {
    use allocprof::python::{
        PyVersion,
        runtime::{ObjectAllocator, PythonRuntime},
    };
    let mut app = App::new(options());
    let mut profile = sample(0);
    profile.processes[0].python = Some(PythonRuntime {
        version: PyVersion {
            major: 3,
            minor: 11,
            micro: 2,
        },
        objects: Some(ObjectAllocator::Pymalloc),
    });
    app.update(AppEvent::Profile(profile));
    press(&mut app, KeyCode::Tab);
    let (text, _) = screen(&mut app, 200, 30);
    assert!(
        text.contains("CPython 3.11.2, objects through pymalloc: those of 512 bytes"),
        "{text}"
    );
}

/// A profile whose heaviest stack is `depth` frames deep: `f00` innermost.
fn deep(depth: usize) -> App {
    let mut app = App::new(options());
    let mut p = sample(1);
    let names: Vec<String> = (0..depth).map(|i| format!("f{i:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    p.processes[0].stacks[0].frames = crate::tui::rows::tests::frames(&names);
    p.processes[0].stacks[0].totals.live_bytes = 1e9;
    app.update(AppEvent::Profile(p));
    app
}

#[test]
fn a_deep_stack_says_how_many_frames_are_not_shown_and_scrolls() {
    for (w, h) in [(80, 24), (160, 48)] {
        let mut app = deep(60);
        let (text, _) = screen(&mut app, w, h);
        // Small: the frames that fit, then how many more, never a silent cut.
        let shown = text.lines().filter(|l| l.contains("work.c:3")).count();
        assert!(shown > 0, "{text}");
        assert!(
            text.contains(&format!("+{} more frames (d: all)", 60 - shown)),
            "{w}×{h}:\n{text}"
        );
        // Enlarged: more frames, and j scrolls them one by one.
        press(&mut app, KeyCode::Char('d'));
        let (text, _) = screen(&mut app, w, h);
        let page = text.lines().filter(|l| l.contains("work.c:3")).count();
        assert!(page > shown, "{text}");
        assert!(
            text.contains(&format!("+{} more frames (j: scroll)", 60 - page)),
            "{w}×{h}:\n{text}"
        );
        assert!(text.contains("│f00  /src/work.c:3"), "{text}");
        press(&mut app, KeyCode::Char('j'));
        let (text, _) = screen(&mut app, w, h);
        assert!(!text.contains("│f00 "), "{text}");
        assert!(text.contains("│f01  /src/work.c:3"), "{text}");
        // To the end: the last frame shows, and nothing is said to follow.
        for _ in 0..10 {
            press(&mut app, KeyCode::PageDown);
        }
        let (text, _) = screen(&mut app, w, h);
        assert!(text.contains("│f59  /src/work.c:3"), "{text}");
        assert!(!text.contains("more frames"), "{text}");
        // The arrows still move among the rows, and a new row's detail starts
        // at its top.
        press(&mut app, KeyCode::Down);
        let (text, _) = screen(&mut app, w, h);
        assert_eq!(app.detail_scroll(), 0);
        assert!(
            text.contains("Stack: cache_fill ← main · server (7)"),
            "{text}"
        );
    }
}

#[test]
fn a_thinned_process_s_intervals_say_so_in_the_detail_and_the_table() {
    let mut app = App::new(options());
    let mut profile = sample(0);
    profile.processes[0].alloc_thinning = Some(profiler_common::backend_stats::AllocatorThinning {
        thinned: 54_321,
        factor: 16,
        max_event_rate: Some(10_000),
    });
    app.update(AppEvent::Profile(profile));
    press(&mut app, KeyCode::Tab); // the processes, the first selected
    let (wide, _) = screen(&mut app, 160, 48);
    assert!(wide.contains("(thinned 1 in 16)"), "{wide}");
    assert!(
        wide.contains("allocator's sample budget (10000/s): 54.3k sampled allocations dropped"),
        "{wide}"
    );
    let row = wide.lines().find(|l| l.contains("▶ server")).unwrap();
    assert!(row.contains(allocprof::output::report::THIN_MARK), "{wide}");
}

#[test]
fn the_process_detail_sets_the_heap_against_resident_memory() {
    let mut app = App::new(options());
    let mut profile = sample(0);
    profile.processes[0].resident = Some(allocprof::process::discover::Resident {
        anon: 100 << 20,
        file: 18 << 20,
        shmem: 2 << 20,
    });
    profile.processes[0].backend_heap = Some(allocprof::process::backend_stats::BackendHeap {
        backend: "glibc",
        reserved: Some(90 << 20),
        committed: None,
        in_use: Some(50 << 20),
        free: Some(40 << 20),
        mmapped: Some(0),
        age: std::time::Duration::from_millis(400),
    });
    app.update(AppEvent::Profile(profile));
    press(&mut app, KeyCode::Tab); // the processes, the first selected
    for (w, h) in [(80, 24), (160, 48)] {
        let (text, _) = screen(&mut app, w, h);
        assert!(
            // Narrow, the pane cuts it (d enlarges it).
            text.contains("resident 120.0 MiB (anonymous 100.0 MiB, file"),
            "{w}x{h}:\n{text}"
        );
    }
    let (wide, _) = screen(&mut app, 160, 48);
    // Wide, the process table has the column too.
    let header = wide.lines().find(|l| l.contains("PROCESS")).unwrap();
    assert!(header.contains("RSS ANON"), "{wide}");
    let row = wide.lines().find(|l| l.contains("▶ server")).unwrap();
    assert!(row.contains("100.0 MiB"), "{wide}");
    assert!(
        wide.contains("file 18.0 MiB, shared 2.0 MiB) · 99.9 MiB anonymous b"),
        "{wide}"
    );
    // The allocator's own figures, under it.
    assert!(
        wide.contains("allocator glibc: reserved 90.0 MiB, in use 50.0 MiB, free 40.0 MiB"),
        "{wide}"
    );
}

#[test]
fn the_heap_from_before_attach_is_named_in_the_details() {
    let mut app = App::new(options());
    let mut profile = sample(0);
    for p in &mut profile.processes {
        for s in &mut p.stacks {
            s.totals.before_attach_bytes = s.totals.live_bytes;
        }
        p.totals.before_attach_bytes = p.totals.live_bytes;
        p.ledger = Some(allocprof::process::ledger::LedgerStatus {
            read: true,
            seeded: 4,
            retired: 1,
            ..Default::default()
        });
    }
    app.update(AppEvent::Profile(profile));
    let (stacks, _) = screen(&mut app, 160, 48);
    assert!(
        stacks.contains("48.8 KiB of its 48.8 KiB live allocated before attach"),
        "{stacks}"
    );
    press(&mut app, KeyCode::Tab); // the processes, the first selected
    let (text, _) = screen(&mut app, 160, 48);
    assert!(
        text.contains("52.7 KiB of the live heap (ledger: 4 blocks, 1 freed)"),
        "{text}"
    );
}

//! Rows from hand-made profiles: labels, identities, rates and baselines.

use std::time::Duration;

use profiler_common::DROP_REASONS;

use super::*;
use allocprof::model::profile::ProcessState;
use allocprof::symbolize::FrameKind;

pub fn frames(names: &[&str]) -> Arc<[Frame]> {
    names
        .iter()
        .map(|n| Frame {
            function: (*n).into(),
            location: Some(format!("/src/work.c:{}", n.len()).into()),
            module: Some("/usr/bin/work".into()),
            inlined: false,
            offset: None,
            kind: FrameKind::Native,
        })
        .collect()
}

pub fn totals(live: f64, alloc: f64) -> Totals {
    Totals {
        live_bytes: live,
        live_var: live * 100.0,
        live_objects: live / 64.0,
        live_samples: 1,
        alloc_bytes: alloc,
        alloc_var: 0.0,
        alloc_objects: alloc / 64.0,
        alloc_samples: 2,
        ..Totals::default()
    }
}

/// A process with stacks given as (frames, live, allocated).
pub fn process(pid: u32, name: &str, stacks: &[(&[&str], f64, f64)]) -> ProcessProfile {
    let stacks: Vec<StackProfile> = stacks
        .iter()
        .map(|(f, live, alloc)| StackProfile {
            frames: frames(f),
            totals: totals(*live, *alloc),
        })
        .collect();
    ProcessProfile {
        key: ProcessKey {
            pid: allocprof::ids::Pid(pid),
            generation: 0,
        },
        name: name.into(),
        state: ProcessState::Live,
        rate: 524_288,
        totals: stacks.iter().map(|s| s.totals).sum(),
        alloc_events: 10,
        free_events: 5,
        drops: [0; DROP_REASONS],
        lost_live_bytes: 0,
        contracts: profiler_common::CONTRACT_OTEL_MEMORY.into(),
        weight_form: profiler_common::WeightForm::InverseProbability,
        mapped_bytes: 0,
        mmap_events: 0,
        thinned_events: 0,
        thin_factor: 1,
        alloc_thinning: None,
        since_attach: false,
        ledger: None,
        resident: None,
        backend_heap: None,
        resource: None,
        build_ids: None,
        parent: None,
        python: None,
        stacks,
    }
}

pub fn profile(secs: u64, processes: Vec<ProcessProfile>) -> Profile {
    Profile {
        processes,
        drops: [0; DROP_REASONS],
        elapsed: Duration::from_secs(secs),
        unwind: Default::default(),
        min_age: Duration::ZERO,
        attached_at: None,
        ran_before_attach: Vec::new(),
    }
}

#[test]
fn labels_skip_allocator_and_library_frames() {
    let f = frames(&[
        "malloc",
        "alloc::vec::Vec::push",
        "app::load",
        "std::rt::main",
        "main",
    ]);
    // malloc has no allocator marker here; give it one through its module.
    let mut v = f.to_vec();
    v[0].module = Some("/opt/liballocprof.so".into());
    assert_eq!(stack_label(&v), "app::load ← main");
    assert_eq!(function_of(&v), "app::load");
    assert_eq!(stack_label(&frames(&["std::alloc"])), "std::alloc");
}

#[test]
fn a_python_process_s_sites_are_named_by_their_innermost_python_frame() {
    // PyUnicode_New ← (interpreter) ← handle_request ← main.py's serve.
    let mut v = frames(&["PyUnicode_New", "list_append"]).to_vec();
    v.push(Frame::python(
        "Handler.handle_request",
        "/srv/app/server.py",
        Some(42),
    ));
    v.push(Frame::python("serve", "/srv/app/main.py", Some(13)));
    v.extend(frames(&["Py_RunMain", "main"]).iter().cloned());
    assert_eq!(stack_label(&v), "Handler.handle_request (server.py:42)");
    assert_eq!(function_of(&v), "Handler.handle_request (server.py:42)");
    // A marker (code freed) does not name a site.
    v[2] = Frame::python_marker("[python code freed]");
    assert_eq!(stack_label(&v), "serve (main.py:13)");
}

#[test]
fn all_process_rows_name_their_process_and_get_rates_and_baselines() {
    let then = profile(
        10,
        vec![process(1, "a", &[(&["leak", "main"], 100.0, 100.0)])],
    );
    let now = profile(
        15,
        vec![
            process(1, "a", &[(&["leak", "main"], 600.0, 1100.0)]),
            process(2, "b\u{1b}[2J", &[(&["leak", "main"], 400.0, 400.0)]),
        ],
    );
    let mut rows = stack_rows(
        Inputs {
            current: &now,
            rate_ref: Some(&then),
            growth_ref: Some(&then),
            baseline: Some(&then),
        },
        None,
        Grouping::Stack,
    );
    rows.sort_by(|a, b| a.label.cmp(&b.label));
    // A row per process, not a sum, named (inertly) after it.
    let labels: Vec<&str> = rows.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(
        labels,
        ["leak ← main · a (1)", "leak ← main · b\\x1b[2J (2)"]
    );
    let r = &rows[0];
    assert_eq!(r.totals.live_bytes, 600.0);
    assert_eq!(r.share, 0.6);
    // (1100 - 100) bytes over 5 s.
    assert_eq!(r.alloc_rate, Some(200.0));
    assert_eq!(r.growth, Some(500.0));
    assert_eq!(r.since_baseline, Some(500.0));
    assert_eq!(totals_of(&now, &r.id).unwrap().live_bytes, 600.0);
    assert_eq!(totals_of(&then, &r.id).unwrap().live_bytes, 100.0);
    // New in `now`: everything it holds is growth.
    assert_eq!(rows[1].since_baseline, Some(400.0));
    assert_eq!(totals_of(&then, &rows[1].id), None);
    // By function, too.
    let rows = stack_rows(
        Inputs {
            current: &now,
            rate_ref: None,
            growth_ref: None,
            baseline: None,
        },
        None,
        Grouping::Function,
    );
    assert!(rows.iter().any(|r| r.label == "leak · a (1)"));
}

#[test]
fn stacks_alike_in_two_processes_need_no_ordinal() {
    let now = profile(
        1,
        vec![
            process(1, "a", &[(&["q", "main", "x"], 1.0, 1.0)]),
            process(2, "a", &[(&["q", "main", "y"], 1.0, 1.0)]),
        ],
    );
    let inputs = Inputs {
        current: &now,
        rate_ref: None,
        growth_ref: None,
        baseline: None,
    };
    let mut labels: Vec<String> = stack_rows(inputs, None, Grouping::Stack)
        .into_iter()
        .map(|r| r.label)
        .collect();
    labels.sort();
    assert_eq!(labels, ["q ← main · a (1)", "q ← main · a (2)"]);
}

#[test]
fn equal_labels_are_told_apart() {
    let mut p = process(
        1,
        "a",
        &[
            (&["alloc::vec::from_elem", "load", "main"], 1.0, 1.0),
            (
                &["alloc::raw_vec::RawVec<T>::grow", "load", "main"],
                2.0,
                2.0,
            ),
            (
                &["alloc::raw_vec::RawVec<T>::grow", "load", "x", "main"],
                3.0,
                3.0,
            ),
            (
                &["alloc::raw_vec::RawVec<T>::grow", "load", "y", "main"],
                3.0,
                3.0,
            ),
            (&["parse", "main"], 4.0, 4.0),
            (&["parse", "main"], 4.0, 4.0),
            (&["q", "main", "x"], 4.0, 4.0),
            (&["q", "main", "y"], 4.0, 4.0),
        ],
    );
    // `parse` at two lines.
    let mut v = p.stacks[5].frames.to_vec();
    v[0].location = Some("/src/parse.c:99".into());
    p.stacks[5].frames = v.into();
    let now = profile(1, vec![p]);
    let inputs = Inputs {
        current: &now,
        rate_ref: None,
        growth_ref: None,
        baseline: None,
    };
    let mut labels: Vec<String> = stack_rows(inputs, Some(now.processes[0].key), Grouping::Stack)
        .into_iter()
        .map(|r| r.label)
        .collect();
    labels.sort();
    assert_eq!(
        labels,
        [
            "load ← main via RawVec<T>::grow",
            "load ← main via vec::from_elem",
            "load ← x",
            "load ← y",
            "parse ← main @parse.c:99",
            "parse ← main @work.c:5",
            "q ← main #1",
            "q ← main #2",
        ]
    );
    assert_eq!(short_function("a::b::<impl c::D>::e"), "<impl c::D>::e");
    assert_eq!(short_function("main"), "main");
}

#[test]
fn function_grouping_sums_stacks_and_keeps_the_heaviest() {
    let now = profile(
        1,
        vec![process(
            1,
            "a",
            &[
                (&["parse", "load"], 10.0, 10.0),
                (&["parse", "main"], 30.0, 30.0),
                (&["other", "main"], 5.0, 5.0),
            ],
        )],
    );
    let key = ProcessKey {
        pid: allocprof::ids::Pid(1),
        generation: 0,
    };
    let rows = stack_rows(
        Inputs {
            current: &now,
            rate_ref: None,
            growth_ref: None,
            baseline: None,
        },
        Some(key),
        Grouping::Function,
    );
    let parse = rows.iter().find(|r| r.label == "parse").unwrap();
    assert_eq!(parse.totals.live_bytes, 40.0);
    assert_eq!(&*parse.frames[1].function, "main");
    assert_eq!(parse.alloc_rate, None);
    assert_eq!(parse.since_baseline, None);
    assert_eq!(
        parse.id,
        RowId::Function {
            scope: Some(key),
            name: "parse".into()
        }
    );
    assert_eq!(totals_of(&now, &parse.id).unwrap().live_bytes, 40.0);
}

#[test]
fn cxx_stacks_are_named_past_operator_new_and_the_standard_library() {
    let mut f = frames(&[
        "operator new(unsigned long)",
        "std::__new_allocator<char>::allocate(unsigned long, void const*)",
        "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> \
         >::_M_create(unsigned long&, unsigned long)",
        "void std::vector<std::__cxx11::basic_string<char, std::char_traits<char>, \
         std::allocator<char> >, std::allocator<std::__cxx11::basic_string<char, \
         std::char_traits<char>, std::allocator<char> > > >::_M_realloc_insert<char const*>\
         (__gnu_cxx::__normal_iterator<std::__cxx11::basic_string<char>*, \
         std::vector<std::__cxx11::basic_string<char> > >, char const*&&)",
        "Index::add(char const*)",
        "__gnu_cxx::__ops::_Iter_pred<bool (*)(int)>::operator()(int*)",
        "load_words(std::istream&)",
        "main",
    ])
    .to_vec();
    f[0].module = Some("/usr/lib/x86_64-linux-gnu/libstdc++.so.6".into());
    assert_eq!(
        stack_label(&f),
        "Index::add(char const*) ← load_words(std::istream&)"
    );
    assert_eq!(function_of(&f), "Index::add(char const*)");
}

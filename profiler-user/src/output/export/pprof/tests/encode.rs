use std::path::Path;

use super::super::{SAMPLE_TYPES, encode::to_proto};
use crate::output::export::{
    build_id::build_id,
    tests::{frame, hand_made},
};

#[test]
fn totals_are_the_rounded_totals() {
    let profile = hand_made();
    let p = to_proto(&profile, 0);
    let sum = |i: usize| p.sample.iter().map(|s| s.value[i]).sum::<i64>();
    let t = profile.totals();
    assert_eq!(sum(0), t.alloc_objects.round() as i64);
    assert_eq!(sum(1), t.alloc_bytes.round() as i64);
    assert_eq!(sum(2), t.live_objects.round() as i64);
    assert_eq!(sum(3), t.live_bytes.round() as i64);
}

#[test]
fn go_heap_profile_shape() {
    let p = to_proto(&hand_made(), 0);
    let s = |i: i64| p.string_table[i as usize].as_str();
    let types: Vec<_> = p
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(types, SAMPLE_TYPES);
    assert_eq!(s(p.default_sample_type), "inuse_space");
    let period = p.period_type.unwrap();
    assert_eq!((s(period.r#type), s(period.unit)), ("space", "bytes"));
    assert_eq!(p.string_table[0], "");
    // The executable, not libc's start code, is the first mapping.
    assert_eq!(s(p.mapping[0].filename), "/usr/bin/demo");
    assert!(p.mapping.iter().all(|m| m.has_functions));
    // The inlined frame shares a location with its caller, innermost first.
    let inlined = p.location.iter().find(|l| l.line.len() == 2).unwrap();
    let names: Vec<_> = inlined
        .line
        .iter()
        .map(|l| s(p.function[l.function_id as usize - 1].name))
        .collect();
    assert_eq!(names, ["inlined_helper", "site_large"]);
    assert_eq!(inlined.line[1].line, 42);
}

#[test]
fn mappings_carry_build_ids() {
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap();
    let mut profile = hand_made();
    let mut f = frame("main", Some(exe));
    f.location = Some("main.rs:3".into());
    profile.processes[0].stacks[0].frames = vec![f].into();
    let p = to_proto(&profile, 0);
    let m = p
        .mapping
        .iter()
        .find(|m| p.string_table[m.filename as usize] == exe)
        .unwrap();
    assert_eq!(
        p.string_table[m.build_id as usize],
        build_id(Path::new(exe)).unwrap()
    );
    assert!(m.has_filenames && m.has_line_numbers);
}

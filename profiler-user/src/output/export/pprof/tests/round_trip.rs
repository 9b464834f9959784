use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use profiler_common::DROP_REASONS;
use proptest::prelude::*;
use prost::Message;

use super::{
    super::{
        Limits, decode,
        encode::to_proto,
        limits::{DECODED_PER_BYTE, prescan},
        render,
    },
    decoded,
};
use crate::{
    model::profile::{ProcessKey, ProcessProfile, ProcessState, Profile, StackProfile},
    model::stats::Totals,
    output::export::tests::hand_made,
    symbolize::{Frame, FrameKind, Name, PYTHON_MODULE},
};

#[test]
fn round_trip_keeps_processes_stacks_frames_and_values() {
    let profile = hand_made();
    let back = decoded(&profile);
    assert_eq!(back.processes.len(), profile.processes.len());
    for (a, b) in profile.processes.iter().zip(&back.processes) {
        assert_eq!((a.key, &a.name), (b.key, &b.name));
        assert_eq!(a.stacks.len(), b.stacks.len());
        for (sa, sb) in a.stacks.iter().zip(&b.stacks) {
            assert_eq!(sa.frames, sb.frames, "frames survive, inlining included");
            // Values are whole bytes and objects in the file.
            assert!((sa.totals.live_bytes - sb.totals.live_bytes).abs() <= 1.0);
            assert!((sa.totals.alloc_objects - sb.totals.alloc_objects).abs() <= 1.0);
        }
    }
    assert_eq!(back.elapsed, profile.elapsed);
    assert_eq!(back.processes[0].rate, 65_536);
}

/// A small arbitrary profile whose values are whole numbers (what the
/// file keeps exactly) and whose stacks are distinct per process.
fn arbitrary_profile() -> impl Strategy<Value = Profile> {
    let frame = (
        "[a-z_:<>]{0,8}",
        proptest::option::of(("[a-z/]{1,6}", 0u32..50)),
        proptest::option::of(prop_oneof![
            "/[a-z]{1,6}(\\.so)?",
            Just(PYTHON_MODULE.to_string())
        ]),
        any::<bool>(),
    )
        .prop_map(|(function, location, module, inlined)| Frame {
            function: function.into(),
            location: location.map(|(file, line)| match line {
                0 => file.into(),
                n => format!("{file}:{n}").into(),
            }),
            // Python frames are told apart by their mapping.
            kind: match module.as_deref() {
                Some(PYTHON_MODULE) => FrameKind::Python,
                _ => FrameKind::Native,
            },
            module: module.map(Name::from),
            inlined,
            offset: None,
        });
    let stack = (
        proptest::collection::vec(frame, 0..6),
        [0u32..1000, 0u32..100_000, 0u32..1000, 1u32..100_000],
    )
        .prop_map(|(mut frames, values)| {
            // What a stack walk gives: an inlined frame shares its
            // caller's module; the outermost frame is a machine frame.
            for i in (0..frames.len()).rev() {
                if i + 1 == frames.len() {
                    frames[i].inlined = false;
                } else if frames[i].inlined {
                    frames[i].module = frames[i + 1].module.clone();
                    frames[i].kind = frames[i + 1].kind;
                }
            }
            let [ao, ab, lo, lb] = values.map(f64::from);
            let totals = Totals {
                alloc_objects: ao,
                alloc_bytes: ab,
                live_objects: lo,
                live_bytes: lb,
                ..Default::default()
            };
            (frames, totals)
        });
    let process = ("[a-z]{1,8}", proptest::collection::vec(stack, 1..5));
    proptest::collection::btree_map((1u32..1000, 0u32..3), process, 1..4).prop_map(|ps| {
        let processes = ps
            .into_iter()
            .map(|((pid, generation), (name, stacks))| {
                let mut seen = std::collections::HashSet::new();
                let stacks = stacks
                    .into_iter()
                    .filter(|(frames, _)| seen.insert(frames.clone()))
                    .map(|(frames, totals)| StackProfile {
                        frames: frames.into(),
                        totals,
                    })
                    .collect();
                let key = ProcessKey {
                    pid: crate::ids::Pid(pid),
                    generation,
                };
                ProcessProfile::from_stacks(key, name, ProcessState::Live, 4096, stacks)
            })
            .collect();
        Profile {
            processes,
            drops: [0; DROP_REASONS],
            elapsed: Duration::from_millis(1500),
            unwind: Default::default(),
            min_age: Duration::ZERO,
            attached_at: None,
            ran_before_attach: Vec::new(),
        }
    })
}

type Stacks = BTreeMap<ProcessKey, (String, HashMap<Vec<Frame>, [u64; 4]>)>;

fn stacks(profile: &Profile) -> Stacks {
    profile
        .processes
        .iter()
        .map(|p| {
            let stacks = p
                .stacks
                .iter()
                .map(|s| {
                    let t = &s.totals;
                    let v = [t.alloc_objects, t.alloc_bytes, t.live_objects, t.live_bytes];
                    (s.frames.to_vec(), v.map(|v| v as u64))
                })
                .collect();
            (p.key, (p.name.clone(), stacks))
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn arbitrary_profiles_round_trip(profile in arbitrary_profile()) {
        let back = decode(&render(&profile, 1)).unwrap();
        prop_assert_eq!(stacks(&back), stacks(&profile));
        // Within the size limit, a real profile is within the decoded one.
        let plain = to_proto(&profile, 1).encode_to_vec();
        let estimate = prescan(&plain, &Limits::default()).unwrap();
        prop_assert!(estimate < DECODED_PER_BYTE * plain.len() as u64);
        prop_assert_eq!(back.elapsed, profile.elapsed);
    }
}

use prost::Message;

use super::{proto::common::any_value::Value, *};
use crate::output::export::{build_id::build_id, tests::hand_made};
use crate::symbolize::PYTHON_MODULE;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn decoded(data: &ProfilesData) -> ProfilesData {
    ProfilesData::decode(&data.encode_to_vec()[..]).unwrap()
}

fn attribute<'a>(r: &'a ResourceProfiles, key: &str) -> Option<&'a Value> {
    r.resource
        .as_ref()?
        .attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()
}

fn pid(r: &ResourceProfiles) -> i64 {
    match attribute(r, ATTR_PID) {
        Some(Value::IntValue(pid)) => *pid,
        other => panic!("process.pid: {other:?}"),
    }
}

/// Per sample type name: the sum of the process's samples.
fn sums(data: &ProfilesData, r: &ResourceProfiles) -> HashMap<String, i64> {
    let dict = data.dictionary.as_ref().unwrap();
    r.scope_profiles[0]
        .profiles
        .iter()
        .map(|p| {
            let t = p.sample_type.unwrap().type_strindex as usize;
            let sum = p.samples.iter().flat_map(|s| &s.values).sum();
            (dict.string_table[t].clone(), sum)
        })
        .collect()
}

#[test]
fn one_resource_per_process_and_totals_are_the_rounded_estimates() {
    let profile = hand_made();
    let data = decoded(&encode(&profile, at(1_000)));
    assert_eq!(data.resource_profiles.len(), profile.processes.len());
    for (r, p) in data.resource_profiles.iter().zip(&profile.processes) {
        assert_eq!(pid(r), i64::from(p.key.pid.0));
        for key in [ATTR_EXECUTABLE_NAME, ATTR_SERVICE_NAME] {
            assert_eq!(attribute(r, key), Some(&Value::StringValue(p.name.clone())));
        }
        let sums = sums(&data, r);
        let t = &p.totals;
        // A single export: allocated within the window is all since attach.
        for (name, total) in [
            ("inuse_space", t.live_bytes),
            ("inuse_objects", t.live_objects),
            ("alloc_space", t.alloc_bytes),
            ("alloc_objects", t.alloc_objects),
        ] {
            assert_eq!(sums[name], total.round() as i64, "{} {name}", p.name);
        }
        let scope = &r.scope_profiles[0];
        assert_eq!(scope.scope.as_ref().unwrap().name, "allocprof");
        for profile in &scope.profiles {
            assert_eq!(profile.period, p.rate as i64);
            assert_eq!(profile.time_unix_nano, 1_000_000_000_000 - 12_500_000_000);
            assert_eq!(profile.duration_nano, 12_500_000_000);
        }
    }
    // The exited process says so; the running one says nothing.
    let states: Vec<_> = data
        .resource_profiles
        .iter()
        .map(|r| attribute(r, ATTR_STATE).cloned())
        .collect();
    assert_eq!(states, [None, Some(Value::StringValue("exited".into()))]);
    assert_eq!(
        attribute(&data.resource_profiles[1], ATTR_GENERATION),
        Some(&Value::IntValue(1))
    );
}

#[test]
fn the_dictionary_starts_with_zero_values_and_stacks_read_back() {
    let data = decoded(&encode(&hand_made(), at(1_000)));
    let d = data.dictionary.as_ref().unwrap();
    assert_eq!(d.string_table[0], "");
    assert_eq!(d.mapping_table[0], Mapping::default());
    assert_eq!(d.location_table[0], Location::default());
    assert_eq!(d.function_table[0], Function::default());
    assert_eq!(d.attribute_table[0], KeyValueAndUnit::default());
    assert_eq!(d.stack_table[0], Stack::default());
    assert_eq!(
        (
            d.link_table[0].trace_id.len(),
            d.link_table[0].span_id.len()
        ),
        (16, 8)
    );
    // Every stack is referenced, none twice.
    let mut referenced: Vec<i32> = data
        .resource_profiles
        .iter()
        .flat_map(|r| &r.scope_profiles[0].profiles)
        .flat_map(|p| &p.samples)
        .map(|s| s.stack_index)
        .collect();
    referenced.sort_unstable();
    referenced.dedup();
    assert_eq!(
        referenced,
        (1..d.stack_table.len() as i32).collect::<Vec<_>>()
    );

    // The demo's inuse_space samples, by their stacks' function names.
    let demo = &data.resource_profiles[0].scope_profiles[0].profiles[0];
    let stacks: Vec<Vec<String>> = demo
        .samples
        .iter()
        .map(|s| stack_functions(d, s.stack_index))
        .collect();
    assert_eq!(
        stacks,
        [
            vec![
                "inlined_helper",
                "site_large",
                "main",
                "__libc_start_call_main"
            ],
            vec!["site_small", "__libc_start_call_main", "main"],
        ]
    );
    // The inlined frame shares its caller's location (lines innermost
    // first), with the file and line of each.
    let stack = &d.stack_table[demo.samples[0].stack_index as usize];
    assert_eq!(stack.location_indices.len(), 3);
    let location = &d.location_table[stack.location_indices[0] as usize];
    let lines: Vec<(String, i64)> = location
        .lines
        .iter()
        .map(|l| {
            let f = &d.function_table[l.function_index as usize];
            (d.string_table[f.filename_strindex as usize].clone(), l.line)
        })
        .collect();
    assert_eq!(
        lines,
        [("/src/demo.c".into(), 40), ("/src/demo.c".into(), 42)]
    );
    let mapping = &d.mapping_table[location.mapping_index as usize];
    assert_eq!(
        d.string_table[mapping.filename_strindex as usize],
        "/usr/bin/demo"
    );
}

#[test]
fn mappings_carry_the_files_gnu_build_id() {
    let exe = std::env::current_exe().unwrap();
    let id = build_id(&exe).expect("cargo links test binaries with a build id");
    let mut profile = hand_made();
    profile.processes.truncate(1);
    let mut frame = crate::output::export::tests::frame("main", exe.to_str());
    frame.location = Some("/src/main.rs:3".into());
    profile.processes[0].stacks[0].frames = vec![frame].into();
    let data = decoded(&encode(&profile, at(1_000)));
    let d = data.dictionary.as_ref().unwrap();
    let mapping = d
        .mapping_table
        .iter()
        .find(|m| d.string_table[m.filename_strindex as usize] == exe.to_str().unwrap())
        .expect("a mapping of the executable");
    let attributes: Vec<(&str, &Option<AnyValue>)> = mapping
        .attribute_indices
        .iter()
        .map(|&i| {
            let a = &d.attribute_table[i as usize];
            (d.string_table[a.key_strindex as usize].as_str(), &a.value)
        })
        .collect();
    assert_eq!(attributes, [(ATTR_BUILD_ID, &Some(string_value(&id)))]);
}

#[test]
fn alloc_figures_are_deltas_and_gone_processes_are_sent_once() {
    let mut profile = hand_made();
    let mut encoder = Encoder::new();
    encoder.encode(&profile, at(1_000));
    // Later: the demo's largest stack allocated 3 MiB more, of which
    // 1 MiB is still live; nothing else changed.
    let s = &mut profile.processes[0].stacks[0].totals;
    s.alloc_bytes += 3.0 * 1048576.0;
    s.alloc_objects += 3.0;
    s.live_bytes += 1048576.0;
    let live = profile.processes[0].totals.live_bytes + 1048576.0;
    let data = decoded(&encoder.encode(&profile, at(1_015)));
    assert_eq!(data.resource_profiles.len(), 1, "the exited one was sent");
    let r = &data.resource_profiles[0];
    let sums = sums(&data, r);
    assert_eq!(sums["alloc_space"], 3 * 1048576);
    assert_eq!(sums["alloc_objects"], 3);
    assert_eq!(sums["inuse_space"], live.round() as i64, "a snapshot");
    let p = &r.scope_profiles[0].profiles[0];
    assert_eq!(
        (p.time_unix_nano, p.duration_nano),
        (1_000_000_000_000, 15_000_000_000),
        "the window from the last export"
    );
    let alloc = &r.scope_profiles[0].profiles[2];
    assert_eq!(alloc.samples.len(), 1, "the stack that allocated");
}

#[test]
fn an_empty_profile_is_an_empty_export() {
    let data = decoded(&encode(&Profile::default(), at(1)));
    assert!(data.resource_profiles.is_empty());
    assert_eq!(data.dictionary.unwrap().string_table, [""]);
}

#[test]
fn unsymbolized_frames_are_addresses_in_mappings_at_zero() {
    let mut profile = hand_made();
    for (i, s) in profile.processes[0].stacks.iter_mut().enumerate() {
        let base = 0x1000 * (i as u64 + 1);
        let mut frames: Vec<Frame> = (0..3)
            .map(|j| Frame {
                module: Some("/usr/bin/app".into()),
                offset: Some(base + j),
                ..Frame::named(format!("app+{:#x}", base + j))
            })
            .collect();
        frames.push(Frame::named("[stack cut at 127 frames]"));
        s.frames = frames.into();
    }
    let n = profile.processes[0].stacks.len() as u64;
    let data = decoded(&Encoder::new().addresses_only().encode(&profile, at(1)));
    let dict = data.dictionary.as_ref().unwrap();
    let string = |i: i32| dict.string_table[i as usize].as_str();
    // Names only for allocprof's marker (and other processes' frames).
    assert!(
        dict.function_table
            .iter()
            .all(|f| !string(f.name_strindex).starts_with("app+"))
    );
    let app = dict
        .mapping_table
        .iter()
        .position(|m| string(m.filename_strindex) == "/usr/bin/app")
        .expect("the app's mapping") as i32;
    let m = &dict.mapping_table[app as usize];
    assert_eq!((m.memory_start, m.file_offset), (0, 0));
    assert_eq!(
        m.memory_limit,
        0x1000 * n + 3,
        "just past the highest address"
    );
    let mut addresses: Vec<u64> = dict
        .location_table
        .iter()
        .filter(|l| l.mapping_index == app)
        .inspect(|l| assert!(l.lines.is_empty(), "{l:?}"))
        .map(|l| l.address)
        .collect();
    addresses.sort_unstable();
    let expected: Vec<u64> = (1..=n)
        .flat_map(|i| (0..3).map(move |j| 0x1000 * i + j))
        .collect();
    assert_eq!(addresses, expected);
    let marker = dict
        .location_table
        .iter()
        .find(|l| l.mapping_index == 0 && !l.lines.is_empty())
        .expect("the marker's location");
    let f = &dict.function_table[marker.lines[0].function_index as usize];
    assert_eq!(string(f.name_strindex), "[stack cut at 127 frames]");
}

#[test]
fn python_frames_are_cpython_locations_in_a_mapping_of_their_own() {
    let mut profile = hand_made();
    let python = Frame::python("handle_request", "/srv/app/server.py", Some(42));
    let native = Frame {
        module: Some("/usr/bin/python3.11".into()),
        ..Frame::named("PyUnicode_New")
    };
    profile.processes[0].stacks[0].frames = vec![native, python].into();
    let data = decoded(&encode(&profile, at(1_000)));
    let dict = data.dictionary.as_ref().unwrap();
    let location_of = |function: &str| {
        dict.location_table
            .iter()
            .find(|l| {
                l.lines.iter().any(|line| {
                    let f = &dict.function_table[line.function_index as usize];
                    dict.string_table[f.name_strindex as usize] == function
                })
            })
            .unwrap_or_else(|| panic!("a location of {function}"))
    };
    let frame_type = |l: &Location| -> Vec<String> {
        l.attribute_indices
            .iter()
            .map(|&a| &dict.attribute_table[a as usize])
            .filter(|a| dict.string_table[a.key_strindex as usize] == ATTR_FRAME_TYPE)
            .map(|a| format!("{:?}", a.value.as_ref().unwrap().value))
            .collect()
    };
    let py = location_of("handle_request");
    let mapping = &dict.mapping_table[py.mapping_index as usize];
    assert_eq!(
        dict.string_table[mapping.filename_strindex as usize],
        PYTHON_MODULE
    );
    assert_eq!(
        frame_type(py),
        [format!("{:?}", Some(Value::StringValue("cpython".into())))]
    );
    assert_eq!(py.lines[0].line, 42);
    let file = dict.function_table[py.lines[0].function_index as usize].filename_strindex;
    assert_eq!(dict.string_table[file as usize], "/srv/app/server.py");
    assert!(frame_type(location_of("PyUnicode_New")).is_empty());
}

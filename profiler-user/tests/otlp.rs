//! OTLP profiles with real eBPF, real workloads and a real OpenTelemetry
//! Collector (tests/common/otelcol.rs): what the collector's file exporter
//! writes, decoded, against allocprof's own JSON of the same profile; and
//! `allocprof agent` pushing to it.

mod common;

use std::{
    collections::{BTreeSet, HashMap},
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, SystemTime},
};

use allocprof::ids::Pid;
use allocprof::{
    agent::{
        self, Accepted,
        config::{Config, Flags, Protocol},
    },
    kernel::Limits,
    output::export::{
        self, Format,
        otlp::{
            self, ATTR_BUILD_ID, ATTR_EXECUTABLE_NAME, ATTR_PID, ATTR_STATE,
            proto::{
                common::any_value::Value,
                profiles::{ProfilesData, ResourceProfiles},
            },
        },
    },
    session::{Session, Target},
};
use prost::Message;
use serde_json::Value as Json;

use common::{
    Workload,
    otelcol::{Certs, Collector},
};

/// site_large: 8 blocks of 1 MiB, sampled with probability 1 - e^-16 each,
/// so its estimate is exact.
const LARGE: i64 = 8 << 20;

/// A resource attribute of `r`, its key and string value resolved through
/// the dictionary where they are references: the collector (pdata v1.67)
/// writes them as `key_strindex` and `string_value_strindex`.
fn attribute(data: &ProfilesData, r: &ResourceProfiles, key: &str) -> Option<Value> {
    let strings = &data.dictionary.as_ref()?.string_table;
    let string = |i: i32| strings.get(usize::try_from(i).ok()?).cloned();
    let found = r.resource.as_ref()?.attributes.iter().find(|a| {
        let k = if a.key_strindex != 0 {
            string(a.key_strindex)
        } else {
            Some(a.key.clone())
        };
        k.as_deref() == Some(key)
    })?;
    match found.value.as_ref()?.value.as_ref()? {
        Value::StringValueStrindex(i) => string(*i).map(Value::StringValue),
        v => Some(v.clone()),
    }
}

fn is_pid(data: &ProfilesData, r: &ResourceProfiles, pid: u32) -> bool {
    attribute(data, r, ATTR_PID) == Some(Value::IntValue(i64::from(pid)))
}

fn resource_of(data: &ProfilesData, pid: u32) -> &ResourceProfiles {
    let found: Vec<_> = data
        .resource_profiles
        .iter()
        .filter(|r| is_pid(data, r, pid))
        .collect();
    assert_eq!(found.len(), 1, "one resource for pid {pid}");
    found[0]
}

/// Per sample type: each sample's function names (innermost first) and
/// value.
fn samples(data: &ProfilesData, r: &ResourceProfiles) -> HashMap<String, Vec<(Vec<String>, i64)>> {
    let dict = data.dictionary.as_ref().expect("a dictionary");
    let mut out = HashMap::new();
    for scope in &r.scope_profiles {
        for p in &scope.profiles {
            let t = p.sample_type.expect("a sample type").type_strindex;
            let name = dict.string_table[t as usize].clone();
            let samples = p
                .samples
                .iter()
                .map(|s| {
                    assert_eq!(s.values.len(), 1, "one value per sample");
                    (otlp::stack_functions(dict, s.stack_index), s.values[0])
                })
                .collect();
            assert!(out.insert(name, samples).is_none(), "one profile per type");
        }
    }
    out
}

fn decode_all(exported: &[Vec<u8>]) -> Vec<ProfilesData> {
    exported
        .iter()
        .map(|m| ProfilesData::decode(&m[..]).expect("the file exporter's ProfilesData"))
        .collect()
}

fn readelf_build_id(exe: &std::path::Path) -> String {
    let notes = Command::new("readelf").arg("-n").arg(exe).output().unwrap();
    String::from_utf8_lossy(&notes.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_owned))
        .expect("gcc links a build id")
}

/// The collector builds (or is built), starts on free ports, listens, and
/// stops cleanly; sent nothing, it writes nothing.
#[test]
fn the_collector_starts_listens_and_stops() {
    let collector = Collector::start("idle");
    assert_ne!(collector.grpc, collector.http);
    assert!(collector.stop_and_read().is_empty());
}

/// A transport to test: its name, endpoint, protocol and variables.
type Way<'a> = (&'a str, String, Protocol, Vec<(&'a str, String)>);

/// The same profile sent over each transport: OTLP/HTTP and OTLP/gRPC,
/// plain and gzip'd, and over TLS with a CA the test made. Each export the
/// collector writes out has the JSON's figures.
#[test]
fn the_collector_writes_out_the_json_exports_totals_and_stacks() {
    common::require_bpf();
    let certs = Certs::make("same-figures");
    let collector = Collector::start_with("same-figures", Some(&certs), None);
    let (grpcs, https) = collector.tls_endpoints();
    let ca = certs.ca.to_str().unwrap().to_owned();
    let transports: Vec<Way> = vec![
        (
            "http",
            collector.http_endpoint(),
            Protocol::HttpProtobuf,
            vec![],
        ),
        ("grpc", collector.grpc_endpoint(), Protocol::Grpc, vec![]),
        (
            "http gzip",
            collector.http_endpoint(),
            Protocol::HttpProtobuf,
            vec![("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip".into())],
        ),
        (
            "grpc gzip",
            collector.grpc_endpoint(),
            Protocol::Grpc,
            vec![("OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION", "gzip".into())],
        ),
        (
            "https",
            https,
            Protocol::HttpProtobuf,
            vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.clone())],
        ),
        (
            "grpc tls",
            grpcs,
            Protocol::Grpc,
            vec![("OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE", ca)],
        ),
    ];
    let mut w = Workload::c(&[]);
    let mut session = Session::start(Target::Pids(vec![Pid(w.pid())]), Limits::default()).unwrap();
    w.allocate();
    let profile = session.complete_profile().unwrap();
    let opts = export::Options::default();
    let json: Json =
        serde_json::from_slice(&export::render(&profile, Format::Json, &opts).unwrap()).unwrap();
    let request = Arc::new(Message::encode_to_vec(&agent::request(otlp::encode(
        &profile,
        SystemTime::now(),
    ))));
    for (name, endpoint, protocol, vars) in &transports {
        let flags = Flags {
            endpoint: Some(endpoint.clone()),
            protocol: Some(*protocol),
            headers: vec![],
        };
        let env = |k: &str| vars.iter().find(|(v, _)| *v == k).map(|(_, v)| v.clone());
        let config = Config::new(&env, &flags).unwrap();
        let accepted = agent::transport(&config)
            .unwrap()
            .export(&request, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(accepted, Accepted::default(), "{name}: nothing rejected");
    }
    let pid = w.pid();
    w.exit();

    let exported = decode_all(&collector.stop_and_read());
    assert_eq!(
        exported.len(),
        transports.len(),
        "one export per transport, written once"
    );
    for data in &exported {
        same_figures(data, &json, pid);
    }
}

/// What the collector wrote out for `pid` is what allocprof's JSON says:
/// the totals per sample type, the stacks, the executable, the build id.
fn same_figures(data: &ProfilesData, json: &Json, pid: u32) {
    let processes = json["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1);
    let p = &processes[0];
    assert_eq!(p["pid"], pid);
    let r = resource_of(data, pid);
    assert_eq!(
        attribute(data, r, ATTR_EXECUTABLE_NAME),
        Some(Value::StringValue(p["name"].as_str().unwrap().into()))
    );
    let by_type = samples(data, r);
    // Per sample type, the collector's total is allocprof's, rounded.
    for (sample_type, key) in [
        ("inuse_space", "live_bytes"),
        ("inuse_objects", "live_objects"),
        ("alloc_space", "alloc_bytes"),
        ("alloc_objects", "alloc_objects"),
    ] {
        let total: i64 = by_type[sample_type].iter().map(|(_, v)| v).sum();
        let expected = p["totals"][key].as_f64().unwrap().round() as i64;
        assert_eq!(total, expected, "{sample_type}");
    }
    let large: i64 = by_type["inuse_space"]
        .iter()
        .filter(|(f, _)| f.iter().any(|f| f == "site_large"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(large, LARGE);

    // The same stacks: every JSON stack that allocated a byte or more is
    // there (rounding keeps each such stack's value nonzero), and nothing
    // else is.
    let json_stacks: Vec<(Vec<String>, f64)> = p["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let frames = s["frames"].as_array().unwrap();
            let names = frames
                .iter()
                .map(|f| f["function"].as_str().unwrap().to_owned())
                .collect();
            (names, s["totals"]["alloc_bytes"].as_f64().unwrap())
        })
        .collect();
    let otlp_stacks: BTreeSet<&Vec<String>> =
        by_type["alloc_space"].iter().map(|(f, _)| f).collect();
    let all: BTreeSet<&Vec<String>> = json_stacks.iter().map(|(f, _)| f).collect();
    let at_least_a_byte: BTreeSet<&Vec<String>> = json_stacks
        .iter()
        .filter(|(_, v)| *v >= 1.0)
        .map(|(f, _)| f)
        .collect();
    assert!(otlp_stacks.is_subset(&all), "{otlp_stacks:?}\nvs {all:?}");
    assert!(
        at_least_a_byte.is_subset(&otlp_stacks),
        "{at_least_a_byte:?}\nvs {otlp_stacks:?}"
    );
    for site in ["site_small", "site_medium", "site_large", "main"] {
        assert!(
            otlp_stacks.iter().any(|s| s.iter().any(|f| f == site)),
            "{site} in {otlp_stacks:?}"
        );
    }

    // The workload's mapping carries its build id, as readelf sees it.
    let exe = common::compile_c("alloc_sites.c", &["-ldl"]);
    let dict = data.dictionary.as_ref().unwrap();
    let mapping = dict
        .mapping_table
        .iter()
        .find(|m| dict.string_table[m.filename_strindex as usize] == exe.to_str().unwrap())
        .unwrap_or_else(|| panic!("no mapping of {exe:?}"));
    let ids: Vec<(&str, Option<Value>)> = mapping
        .attribute_indices
        .iter()
        .map(|&i| {
            let a = &dict.attribute_table[i as usize];
            let value = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValueStrindex(s)) => {
                    Some(Value::StringValue(dict.string_table[*s as usize].clone()))
                }
                v => v.cloned(),
            };
            (dict.string_table[a.key_strindex as usize].as_str(), value)
        })
        .collect();
    assert_eq!(
        ids,
        [(
            ATTR_BUILD_ID,
            Some(Value::StringValue(readelf_build_id(&exe)))
        )]
    );
}

/// `allocprof agent` on one workload, pushing every second until the
/// workload exits: its last export has the process as it was at exit, and
/// the alloc deltas of all exports add up to what it allocated.
#[test]
fn the_agent_pushes_until_its_target_exits_and_its_deltas_add_up() {
    common::require_bpf();
    let collector = Collector::start("agent");
    let mut w = Workload::c(&[]);
    let pid = w.pid();
    let mut agent = Command::new(env!("CARGO_BIN_EXE_allocprof"))
        .args(["agent", "--pid", &pid.to_string(), "--push-interval", "1s"])
        .arg("--otlp-endpoint")
        .arg(collector.http_endpoint())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(agent.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
    assert!(line.contains("pushing to"), "{line}");
    w.allocate();
    // The workload exits once an export has seen it live, allocations made.
    let before = collector.exports_so_far();
    collector.wait_for_exports(before + 1);
    w.exit();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert!(agent.wait().unwrap().success(), "{rest}");
    assert!(!rest.contains("export dropped"), "{rest}");

    let exported = decode_all(&collector.stop_and_read());
    assert!(exported.len() >= 2, "{} exports", exported.len());
    let mut allocated = 0;
    let mut last = None;
    for data in &exported {
        let Some(r) = data.resource_profiles.iter().find(|r| is_pid(data, r, pid)) else {
            continue;
        };
        let by_type = samples(data, r);
        allocated += by_type["alloc_space"]
            .iter()
            .filter(|(f, _)| f.iter().any(|f| f == "site_large"))
            .map(|(_, v)| v)
            .sum::<i64>();
        last = Some((attribute(data, r, ATTR_STATE), by_type));
    }
    assert_eq!(allocated, LARGE, "the deltas of site_large");
    let (state, by_type) = last.expect("exports of the workload");
    assert_eq!(state, Some(Value::StringValue("exited".into())));
    let held: i64 = by_type["inuse_space"]
        .iter()
        .filter(|(f, _)| f.iter().any(|f| f == "site_large"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(held, LARGE, "what it held at exit");
}

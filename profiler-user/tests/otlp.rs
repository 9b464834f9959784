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
            self, ATTR_BUILD_ID, ATTR_COMMAND_LINE, ATTR_CONTAINER_ID, ATTR_EXECUTABLE_NAME,
            ATTR_EXECUTABLE_PATH, ATTR_HOST_ID, ATTR_HOST_NAME, ATTR_PID, ATTR_POD_UID,
            ATTR_SERVICE_NAME, ATTR_STATE,
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
    Proc, Workload,
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

/// The first run of 64 hex digits in `text` (a container id, as the
/// runtimes write them), found without allocprof's parser.
fn hex64_in(text: &str) -> Option<String> {
    let b = text.as_bytes();
    (0..b.len().saturating_sub(63))
        .find(|&i| {
            b[i..i + 64].iter().all(u8::is_ascii_hexdigit)
                && (i == 0 || !b[i - 1].is_ascii_hexdigit())
                && b.get(i + 64).is_none_or(|c| !c.is_ascii_hexdigit())
        })
        .map(|i| text[i..i + 64].to_owned())
}

fn string(v: &str) -> Option<Value> {
    Some(Value::StringValue(v.into()))
}

fn trimmed_file(path: &str) -> String {
    std::fs::read_to_string(path).unwrap().trim().to_owned()
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
    let exe = common::compile_c("alloc_sites.c", &["-ldl"]);
    let mut cmd = Command::new(&exe);
    // Its command line is its argv, not its path (argv[1] would be a
    // library to dlopen).
    std::os::unix::process::CommandExt::arg0(&mut cmd, "alloc-sites-argv0")
        .env("OTEL_SERVICE_NAME", "same-figures-service")
        .env("SOME_SECRET", "hunter2");
    let mut w = Proc::spawn(cmd);
    common::wait_for_mapping(w.pid(), "liballocprof.so");
    // Command lines read (the agent's --otlp-command-line).
    let mut session =
        Session::start_reading(Target::Pids(vec![Pid(w.pid())]), Limits::default(), true).unwrap();
    w.send("go");
    w.expect("ready");
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
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    w.send("exit");
    assert!(w.child.wait().unwrap().success());

    let exported = decode_all(&collector.stop_and_read());
    assert_eq!(
        exported.len(),
        transports.len(),
        "one export per transport, written once"
    );
    for data in &exported {
        same_figures(data, &json, pid, &exe);
        same_attributes(data, pid, &exe, &cgroup);
    }
}

/// What the collector wrote out for `pid` is what allocprof's JSON says:
/// the totals per sample type, the stacks, the executable, the build id.
fn same_figures(data: &ProfilesData, json: &Json, pid: u32, exe: &std::path::Path) {
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
            Some(Value::StringValue(readelf_build_id(exe)))
        )]
    );
}

/// Every resource attribute of the `alloc_sites` process `pid` (started
/// as `alloc-sites-argv0` with its own OTEL_SERVICE_NAME and a secret in its
/// environment), against what the test reads itself.
fn same_attributes(data: &ProfilesData, pid: u32, exe: &std::path::Path, cgroup: &str) {
    let r = resource_of(data, pid);
    // Every resource attribute, against what the test reads itself.
    assert_eq!(
        attribute(data, r, ATTR_EXECUTABLE_NAME),
        string("alloc_sites")
    );
    let path = std::fs::canonicalize(exe).unwrap();
    assert_eq!(
        attribute(data, r, ATTR_EXECUTABLE_PATH),
        string(path.to_str().unwrap())
    );
    assert_eq!(
        attribute(data, r, ATTR_COMMAND_LINE),
        string("alloc-sites-argv0")
    );
    assert_eq!(
        attribute(data, r, ATTR_SERVICE_NAME),
        string("same-figures-service")
    );
    assert_eq!(
        attribute(data, r, ATTR_HOST_NAME),
        string(&trimmed_file("/proc/sys/kernel/hostname"))
    );
    assert_eq!(
        attribute(data, r, ATTR_HOST_ID),
        string(&trimmed_file("/etc/machine-id"))
    );
    // In a container only where its cgroup names one.
    assert_eq!(
        attribute(data, r, ATTR_CONTAINER_ID),
        hex64_in(cgroup).map(Value::StringValue)
    );
    if !cgroup.contains("pod") {
        assert_eq!(attribute(data, r, ATTR_POD_UID), None);
    }
    let keys: BTreeSet<String> = r
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .map(|a| match a.key_strindex {
            0 => a.key.clone(),
            i => data.dictionary.as_ref().unwrap().string_table[i as usize].clone(),
        })
        .collect();
    assert!(
        keys.iter().all(|k| !k.contains("SECRET")) && !format!("{r:?}").contains("hunter2"),
        "nothing else of its environment: {keys:?}"
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

/// A cgroup v2 directory for one test, removed (once its processes are
/// gone) on drop.
struct TestCgroup {
    top: std::path::PathBuf,
    leaf: std::path::PathBuf,
}

impl TestCgroup {
    /// `/sys/fs/cgroup[/unified]/allocprof-test-<our pid>-<tag>/<leaf>`.
    fn new(tag: &str, leaf: &str) -> TestCgroup {
        let root = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .into_iter()
            .map(std::path::Path::new)
            .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.controllers").exists())
            .expect("a cgroup v2 hierarchy (/sys/fs/cgroup/unified or /sys/fs/cgroup)");
        let top = root.join(format!("allocprof-test-{}-{tag}", std::process::id()));
        let leaf = top.join(leaf);
        std::fs::create_dir_all(&leaf)
            .unwrap_or_else(|e| panic!("creating {}: {e} (the test needs root)", leaf.display()));
        TestCgroup { top, leaf }
    }

    /// A shell line that moves the shell itself into the cgroup.
    fn enter(&self) -> String {
        format!("echo 0 > {}/cgroup.procs", self.leaf.display())
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // A killed process leaves its cgroup when reaped: the callers drop
        // their processes first. Every level, innermost first.
        let mut dir = self.leaf.as_path();
        while dir.starts_with(&self.top) {
            let _ = std::fs::remove_dir(dir);
            match dir.parent() {
                Some(parent) => dir = parent,
                None => break,
            }
        }
    }
}

/// `allocprof agent` on a workload in a docker-style cgroup and another in
/// a Kubernetes-style cgroup and its own pid namespace: each export carries
/// its container id (and pod uid), and the pid the host sees; the first to
/// exit gets its final export while the agent runs on; the agent's own
/// OTEL_RESOURCE_ATTRIBUTES and --otlp-command-line are applied.
#[test]
fn containers_carry_their_ids_and_host_pids() {
    common::require_bpf();
    let collector = Collector::start("containers");
    let exe = common::compile_c("alloc_sites.c", &["-ldl"]);
    let docker_id = format!("{:016x}", std::process::id()).repeat(4);
    let cri_id = format!("{:016x}", u64::from(std::process::id()) << 8).repeat(4);
    let pod_uid = "2c48913c-b29f-11e7-9350-020968147796";
    let docker = TestCgroup::new("docker", &format!("docker-{docker_id}.scope"));
    let pod = TestCgroup::new(
        "pod",
        &format!(
            "kubepods-besteffort-pod{}.slice/cri-containerd-{cri_id}.scope",
            pod_uid.replace('-', "_")
        ),
    );
    // The shells move themselves, then exec the workload: it starts there.
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("{} && exec \"$0\"", docker.enter()))
        .arg(&exe);
    let mut a = Proc::spawn(cmd);
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--kill-child", "sh", "-c"])
        .arg(format!("{} && exec \"$0\"", pod.enter()))
        .arg(&exe);
    let mut b = Proc::spawn(cmd);
    let a_pid = a.pid();
    let b_pid = common::first_child(b.pid());
    for pid in [a_pid, b_pid] {
        common::wait_for_mapping(pid, "alloc_sites");
        common::wait_for_mapping(pid, "liballocprof.so");
    }
    assert_eq!(
        common::ns_pids(b_pid),
        [b_pid, 1],
        "b is its namespace's init"
    );

    let mut agent = Command::new(env!("CARGO_BIN_EXE_allocprof"))
        // With their trees (the default): each is its tree's root.
        .args(["agent", "--push-interval", "1s", "--otlp-command-line"])
        .args(["--pid", &a_pid.to_string(), "--pid", &b_pid.to_string()])
        .arg("--otlp-endpoint")
        .arg(collector.http_endpoint())
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=ci%2Ctest",
        )
        .env_remove("OTEL_SERVICE_NAME")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(agent.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
    assert!(line.contains("pushing to"), "{line}");
    for w in [&mut a, &mut b] {
        w.send("go");
        w.expect("ready");
    }
    // a exits once an export has seen both live; b once one has seen a gone.
    let before = collector.exports_so_far();
    collector.wait_for_exports(before + 1);
    a.send("exit");
    assert!(a.child.wait().unwrap().success());
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !decode_all(&collector.read_so_far()).iter().any(|d| {
        d.resource_profiles
            .iter()
            .any(|r| is_pid(d, r, a_pid) && attribute(d, r, ATTR_STATE) == string("exited"))
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "no export of a as exited:\n{}",
            collector.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    b.send("exit");
    assert!(b.child.wait().unwrap().success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert!(agent.wait().unwrap().success(), "{rest}");
    assert!(!rest.contains("export dropped"), "{rest}");
    drop((a, b, docker, pod));

    let exported = decode_all(&collector.stop_and_read());
    let of = |pid: u32| -> Vec<(&ProfilesData, &ResourceProfiles)> {
        exported
            .iter()
            .flat_map(|d| {
                d.resource_profiles
                    .iter()
                    .filter(move |r| is_pid(d, r, pid))
                    .map(move |r| (d, r))
            })
            .collect()
    };
    let (a_exports, b_exports) = (of(a_pid), of(b_pid));
    assert!(
        !a_exports.is_empty() && !b_exports.is_empty(),
        "both exported"
    );
    // Every export, a gone process's final one too: it carries what was
    // read while the process lived.
    for (data, r) in &a_exports {
        assert_eq!(attribute(data, r, ATTR_CONTAINER_ID), string(&docker_id));
        assert_eq!(attribute(data, r, ATTR_POD_UID), None);
        assert_eq!(
            attribute(data, r, ATTR_COMMAND_LINE),
            string(exe.to_str().unwrap())
        );
        assert_eq!(attribute(data, r, ATTR_SERVICE_NAME), string("alloc_sites"));
        assert_eq!(
            attribute(data, r, ATTR_EXECUTABLE_NAME),
            string("alloc_sites")
        );
        assert_eq!(
            attribute(data, r, "deployment.environment"),
            string("ci,test")
        );
    }
    for (data, r) in &b_exports {
        assert_eq!(attribute(data, r, ATTR_CONTAINER_ID), string(&cri_id));
        assert_eq!(attribute(data, r, ATTR_POD_UID), string(pod_uid));
        assert_eq!(
            attribute(data, r, ATTR_EXECUTABLE_NAME),
            string("alloc_sites")
        );
    }
    // a's final export: once, as it was at exit, while b was still live.
    let a_exited: Vec<usize> = exported
        .iter()
        .enumerate()
        .filter(|(_, d)| {
            d.resource_profiles
                .iter()
                .any(|r| is_pid(d, r, a_pid) && attribute(d, r, ATTR_STATE) == string("exited"))
        })
        .map(|(i, _)| i)
        .collect();
    assert_eq!(a_exited.len(), 1, "a's final export, once");
    let final_export = &exported[a_exited[0]];
    assert!(
        final_export
            .resource_profiles
            .iter()
            .any(|r| is_pid(final_export, r, b_pid)
                && attribute(final_export, r, ATTR_STATE).is_none()),
        "a's final export went out while b ran"
    );
    let (data, r) = a_exports.last().unwrap();
    let held: i64 = samples(data, r)["inuse_space"]
        .iter()
        .filter(|(f, _)| f.iter().any(|f| f == "site_large"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(held, LARGE, "what a held at exit");
}

/// A process in its own mount namespace names its program by a path that,
/// in allocprof's namespace, is another file (an impostor with another
/// build id): its mapping carries its own file's build id, read through the
/// file it mapped, not the path's.
#[test]
fn mappings_carry_the_build_id_of_the_file_mapped_not_of_its_path() {
    common::require_bpf();
    let real = common::compile_c("alloc_sites.c", &["-ldl"]);
    // Other symbols, so another build id.
    let impostor = common::compile_c(
        "alloc_sites.c",
        &["-ldl", "-Dsite_small=host_small", "-Dsite_large=host_large"],
    );
    let (real_id, impostor_id) = (readelf_build_id(&real), readelf_build_id(&impostor));
    assert_ne!(real_id, impostor_id, "two builds, two ids");
    let path = common::scratch_dir("otlp-mount-ns").join("program");
    std::fs::copy(&impostor, &path).unwrap();
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind "$1" "$2" && exec "$2""#)
        .arg("sh")
        .arg(&real)
        .arg(&path);
    let mut w = Proc::spawn(cmd);
    let pid = w.pid();
    common::wait_for_mapping(pid, "otlp-mount-ns/program");
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    w.send("exit");
    assert!(w.child.wait().unwrap().success());
    let data = otlp::encode(&profile, SystemTime::now());
    let dict = data.dictionary.as_ref().unwrap();
    let ids: Vec<String> = dict
        .mapping_table
        .iter()
        .filter(|m| dict.string_table[m.filename_strindex as usize] == path.to_str().unwrap())
        .flat_map(|m| &m.attribute_indices)
        .map(|&i| &dict.attribute_table[i as usize])
        .filter(|a| dict.string_table[a.key_strindex as usize] == ATTR_BUILD_ID)
        .map(|a| match a.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(Value::StringValue(s)) => s.clone(),
            v => panic!("a build id string, not {v:?}"),
        })
        .collect();
    assert_eq!(
        ids,
        std::slice::from_ref(&real_id),
        "the mapped file's build id, once"
    );

    // pprof's mappings too.
    let gz = export::render(&profile, Format::Pprof, &export::Options::default()).unwrap();
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
    let pprof = export::pprof::proto::Profile::decode(&raw[..]).unwrap();
    let ids: Vec<&str> = pprof
        .mapping
        .iter()
        .filter(|m| pprof.string_table[m.filename as usize] == path.to_str().unwrap())
        .map(|m| pprof.string_table[m.build_id as usize].as_str())
        .collect();
    assert_eq!(
        ids,
        [real_id.as_str()],
        "pprof: the mapped file's build id, once"
    );
}

/// The virtual address of file offset `offset` of `exe`: in the `PT_LOAD`
/// segment that maps it (from binutils' `readelf -lW`).
fn virtual_address(exe: &std::path::Path, offset: u64) -> u64 {
    let out = Command::new("readelf")
        .arg("-lW")
        .arg(exe)
        .output()
        .unwrap();
    assert!(out.status.success(), "readelf -lW {}", exe.display());
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&"LOAD")).then(|| (hex(f[1]), hex(f[2]), hex(f[4])))
        })
        .find(|&(file_offset, _, size)| (file_offset..file_offset + size).contains(&offset))
        .map(|(file_offset, vaddr, _)| offset - file_offset + vaddr)
        .unwrap_or_else(|| panic!("no LOAD segment of {} maps {offset:#x}", exe.display()))
}

/// The functions binutils' `addr2line` names at `addresses` of `exe`.
fn addr2line(exe: &std::path::Path, addresses: &[u64]) -> Vec<String> {
    let out = Command::new("addr2line")
        .arg("-f")
        .arg("-e")
        .arg(exe)
        .args(addresses.iter().map(|a| format!("{a:#x}")))
        .output()
        .unwrap();
    assert!(out.status.success(), "addr2line on {}", exe.display());
    // Two lines per address: the function, then file:line.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// `allocprof agent --no-symbolize`: the collector gets no function names;
/// each location is an address in a mapping that names its file and build
/// id, and binutils, given the file and that address, names the workload's
/// functions: site_large's stack (found that way alone) holds its 8 MiB.
#[test]
fn unsymbolized_exports_carry_addresses_a_peer_symbolizes() {
    common::require_bpf();
    let collector = Collector::start("no-symbolize");
    let exe = common::compile_c("alloc_sites.c", &["-ldl"]);
    let mut w = Workload::c(&[]);
    let pid = w.pid();
    let mut agent = Command::new(env!("CARGO_BIN_EXE_allocprof"))
        .args(["agent", "--pid", &pid.to_string(), "--push-interval", "1s"])
        .arg("--no-symbolize")
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
    let before = collector.exports_so_far();
    collector.wait_for_exports(before + 1);
    w.exit();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert!(agent.wait().unwrap().success(), "{rest}");

    let exported = decode_all(&collector.stop_and_read());
    let (data, r) = exported
        .iter()
        .rev()
        .find_map(|d| {
            let r = d.resource_profiles.iter().find(|r| is_pid(d, r, pid))?;
            (attribute(d, r, ATTR_STATE) == Some(Value::StringValue("exited".into())))
                .then_some((d, r))
        })
        .expect("the workload's final export");
    let dict = data.dictionary.as_ref().expect("a dictionary");
    assert_eq!(dict.function_table.len(), 1, "no function but the zero one");
    let string = |i: i32| dict.string_table[usize::try_from(i).unwrap()].clone();
    let build_id = readelf_build_id(&exe);
    let exe_name = exe.canonicalize().unwrap().display().to_string();

    let profile = |name: &str| {
        r.scope_profiles[0]
            .profiles
            .iter()
            .find(|p| string(p.sample_type.unwrap().type_strindex) == name)
            .unwrap_or_else(|| panic!("a {name} profile"))
    };
    let mut large = 0;
    let mut resolved_stacks = 0;
    for s in &profile("inuse_space").samples {
        let stack = &dict.stack_table[usize::try_from(s.stack_index).unwrap()];
        assert!(!stack.location_indices.is_empty());
        let mut in_exe = Vec::new();
        for &l in &stack.location_indices {
            let loc = &dict.location_table[usize::try_from(l).unwrap()];
            assert!(loc.lines.is_empty(), "no lines: {loc:?}");
            assert_ne!(loc.address, 0, "an address: {loc:?}");
            assert_ne!(loc.mapping_index, 0, "a mapping: {loc:?}");
            let m = &dict.mapping_table[usize::try_from(loc.mapping_index).unwrap()];
            assert_eq!((m.memory_start, m.file_offset), (0, 0), "{m:?}");
            assert!(loc.address < m.memory_limit, "{loc:?} within {m:?}");
            let ids: Vec<String> = m
                .attribute_indices
                .iter()
                .map(|&a| &dict.attribute_table[usize::try_from(a).unwrap()])
                .filter(|a| string(a.key_strindex) == ATTR_BUILD_ID)
                .map(|a| match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(Value::StringValue(s)) => s.clone(),
                    v => panic!("a build id string: {v:?}"),
                })
                .collect();
            assert_eq!(ids.len(), 1, "a build id on {m:?}");
            let file = string(m.filename_strindex);
            if file == exe_name {
                assert_eq!(ids[0], build_id, "the build id of {file}");
                // The file offset, as the mapping at 0 makes it.
                in_exe.push(virtual_address(
                    &exe,
                    loc.address - m.memory_start + m.file_offset,
                ));
            }
        }
        // The stack's frames in the executable, innermost first, as binutils
        // names them.
        let names = addr2line(&exe, &in_exe);
        if names.iter().any(|n| n == "main") {
            resolved_stacks += 1;
        }
        if names.first().map(String::as_str) == Some("site_large") {
            assert_eq!(names.get(1).map(String::as_str), Some("main"), "{names:?}");
            large += s.values[0];
        }
    }
    assert!(
        resolved_stacks >= 3,
        "{resolved_stacks} stacks resolved to main"
    );
    assert_eq!(
        large, LARGE,
        "site_large's live bytes, found by its address"
    );
}

//! The files of contrib/ for running the agent across a fleet stay true:
//! the flags they pass exist in `allocprof agent --help`, the variables they
//! set are the ones they use, the systemd unit passes `systemd-analyze
//! verify`, the Collector configuration passes the real collector's
//! `validate`, the Kubernetes manifests are well-formed YAML of the shape
//! they claim, and the unit and the DaemonSet grant the same capabilities.

mod common;

use std::{collections::BTreeSet, path::Path, process::Command};

fn contrib(name: &str) -> String {
    let path = common::workspace_root().join("contrib").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn agent_help() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_allocprof"))
        .args(["agent", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success(), "allocprof agent --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// The `--flag` words of `text` (from a space, a quote, a comma or a `=`,
/// up to the next, without closing punctuation).
fn flags(text: &str) -> BTreeSet<String> {
    text.split(|c: char| c.is_whitespace() || "\"',[]=".contains(c))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                .to_owned()
        })
        .collect()
}

fn assert_agent_has_flags(file: &str, text: &str) {
    let help = agent_help();
    let found = flags(text);
    assert!(!found.is_empty(), "{file} passes no flag");
    for flag in found {
        assert!(
            help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
            "{file} uses {flag}, which `allocprof agent --help` does not list"
        );
    }
}

/// `Key=Value` lines of a unit file's `[section]`.
fn unit_values<'a>(unit: &'a str, section: &str, key: &str) -> Vec<&'a str> {
    let mut current = "";
    let mut out = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') && line.ends_with(']') {
            current = &line[1..line.len() - 1];
        } else if current == section
            && let Some(value) = line.strip_prefix(key).and_then(|l| l.strip_prefix('='))
        {
            out.push(value);
        }
    }
    out
}

/// `$VAR` and `${VAR}` names in `text`.
fn referenced_variables(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices('$') {
        let rest = text[i + 1..].trim_start_matches(['{', '(']);
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
    out
}

fn unit_capabilities(unit: &str, key: &str) -> BTreeSet<String> {
    let values = unit_values(unit, "Service", key);
    assert_eq!(values.len(), 1, "one {key}= line");
    values[0].split_whitespace().map(str::to_owned).collect()
}

#[test]
fn the_systemd_unit_runs_the_agent_with_flags_it_has_and_verifies() {
    let unit = contrib("allocprof.service");
    let exec = unit_values(&unit, "Service", "ExecStart");
    assert_eq!(exec.len(), 1, "one ExecStart");
    assert!(
        exec[0].starts_with("/usr/local/bin/allocprof agent "),
        "{}",
        exec[0]
    );
    assert_agent_has_flags("allocprof.service's ExecStart", exec[0]);
    assert_eq!(unit_values(&unit, "Service", "Restart"), ["on-failure"]);
    assert_eq!(
        unit_values(&unit, "Service", "EnvironmentFile"),
        ["-/etc/allocprof/agent.env"]
    );
    // The bounding set holds what the ambient set grants, nothing more.
    assert_eq!(
        unit_capabilities(&unit, "AmbientCapabilities"),
        unit_capabilities(&unit, "CapabilityBoundingSet")
    );

    // systemd's own parser: unknown keys and bad values are reported (and
    // would be ignored by systemd). The binary must exist: the one built.
    let dir = common::scratch_dir(&format!("contrib-{}", std::process::id()));
    let copy = dir.join("allocprof.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/allocprof", env!("CARGO_BIN_EXE_allocprof")),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap_or_else(|e| {
            panic!("this test needs systemd-analyze (Debian package systemd): {e}")
        });
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify on contrib/allocprof.service: {}\n{said}",
        out.status
    );
}

#[test]
fn the_environment_file_sets_what_the_unit_uses() {
    let unit = contrib("allocprof.service");
    let example = contrib("agent.env.example");
    let exec = unit_values(&unit, "Service", "ExecStart")[0];
    let used = referenced_variables(exec);
    // Assigned in the example, active or commented out.
    let assigned: BTreeSet<String> = example
        .lines()
        .map(|l| l.trim().trim_start_matches('#').trim())
        .filter_map(|l| l.split_once('='))
        .map(|(name, _)| name)
        .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .map(str::to_owned)
        .collect();
    assert!(!assigned.is_empty(), "agent.env.example sets nothing");
    for name in &assigned {
        assert!(
            used.contains(name),
            "agent.env.example sets {name}, which the unit's ExecStart does not use"
        );
    }
    let defaults: BTreeSet<String> = unit_values(&unit, "Service", "Environment")
        .iter()
        .filter_map(|v| v.split_once('=').map(|(n, _)| n.to_owned()))
        .collect();
    for name in &used {
        assert!(
            assigned.contains(name) || defaults.contains(name),
            "the unit's ExecStart uses ${name}, set neither by Environment= nor in agent.env.example"
        );
    }
    assert_agent_has_flags("agent.env.example", &example);
}

/// The YAML subset the manifests are written in, checked line by line:
/// spaces only, indents by two, a key on every mapping line, a `---`
/// between documents. Returns the documents.
fn yaml_documents(file: &str, text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    let mut previous_indent = 0;
    for (n, line) in text.lines().enumerate() {
        let at = format!("{file}:{}", n + 1);
        assert!(!line.contains('\t'), "{at}: a tab");
        assert!(!line.ends_with(' '), "{at}: trailing space");
        if line == "---" {
            docs.push(String::new());
            previous_indent = 0;
            continue;
        }
        let content = line.trim_start();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let indent = line.len() - content.len();
        assert_eq!(indent % 2, 0, "{at}: an odd indent");
        assert!(
            indent <= previous_indent + 4,
            "{at}: indented deeper than its parent allows"
        );
        let item = content.strip_prefix("- ").unwrap_or(content);
        assert!(
            item.contains(": ") || item.ends_with(':') || content.starts_with("- "),
            "{at}: neither a key nor a list item: {content}"
        );
        previous_indent = indent + if content.starts_with("- ") { 2 } else { 0 };
        let doc = docs.last_mut().unwrap();
        doc.push_str(line);
        doc.push('\n');
    }
    docs.retain(|d| !d.trim().is_empty());
    for doc in &docs {
        for key in ["apiVersion: ", "kind: ", "metadata:"] {
            assert!(
                doc.lines().any(|l| l.starts_with(key)),
                "{file}: a document without {key}"
            );
        }
    }
    docs
}

/// The value of the first `key: value` line of `doc` (quotes removed).
fn yaml_value<'a>(doc: &'a str, key: &str) -> Option<&'a str> {
    doc.lines().find_map(|l| {
        l.trim_start()
            .strip_prefix(key)
            .and_then(|v| v.strip_prefix(": "))
            .map(|v| v.trim().trim_matches('"'))
    })
}

fn yaml_kind<'a>(docs: &'a [String], kind: &str) -> &'a str {
    docs.iter()
        .find(|d| d.lines().any(|l| l == format!("kind: {kind}")))
        .unwrap_or_else(|| panic!("no {kind}"))
}

#[test]
fn the_kubernetes_manifests_are_well_formed_and_agree() {
    let config = yaml_documents("configmap.yaml", &contrib("kubernetes/configmap.yaml"));
    let daemon = yaml_documents("daemonset.yaml", &contrib("kubernetes/daemonset.yaml"));
    let namespace = yaml_kind(&config, "Namespace");
    let map = yaml_kind(&config, "ConfigMap");
    let ds = yaml_kind(&daemon, "DaemonSet");
    let ns = yaml_value(namespace, "name").unwrap();
    assert_eq!(yaml_value(map, "namespace"), Some(ns));
    assert_eq!(yaml_value(ds, "namespace"), Some(ns));

    assert_eq!(yaml_value(ds, "hostPID"), Some("true"));
    assert_eq!(yaml_value(ds, "drop"), Some(r#"["ALL"]"#));
    // The same capabilities as the systemd unit.
    let added: BTreeSet<String> = yaml_value(ds, "add")
        .expect("capabilities added")
        .trim_matches(['[', ']'])
        .split(',')
        .map(|c| format!("CAP_{}", c.trim().trim_matches('"')))
        .collect();
    let unit = contrib("allocprof.service");
    assert_eq!(added, unit_capabilities(&unit, "AmbientCapabilities"));

    // The container's arguments: flags the agent has, variables the
    // ConfigMap (envFrom) sets.
    let args: String = ds
        .lines()
        .skip_while(|l| l.trim() != "args:")
        .skip(1)
        .take_while(|l| l.trim_start().starts_with("- "))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(args.contains("- agent"), "{args}");
    assert_agent_has_flags("daemonset.yaml's args", &args);
    // `configMapRef:`, then its `name:`.
    let reference = ds.find("configMapRef:").expect("envFrom a ConfigMap");
    assert_eq!(
        yaml_value(&ds[reference..], "name"),
        yaml_value(map, "name")
    );
    let data: BTreeSet<String> = map
        .lines()
        .skip_while(|l| *l != "data:")
        .skip(1)
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.trim().split_once(": ").map(|(k, _)| k.to_owned()))
        .collect();
    assert_eq!(data, referenced_variables(&args), "ConfigMap data vs args");
}

#[test]
fn the_collector_configuration_for_pyroscope_validates() {
    let path = common::workspace_root().join("contrib/otelcol-pyroscope.yaml");
    let out = Command::new(common::otelcol::binary())
        .arg("validate")
        .arg(format!("--config={}", Path::new(&path).display()))
        .arg("--feature-gates=service.profilesSupport")
        .env("PYROSCOPE_URL", "http://pyroscope.example:4040")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the collector refuses contrib/otelcol-pyroscope.yaml (a collector built before \
         xtask/otelcol had the otlp_http exporter and the memory limiter? `cargo xtask \
         otelcol` rebuilds it):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

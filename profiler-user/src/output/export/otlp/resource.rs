//! The resource attributes of each process's export (OTel semantic
//! conventions): the host's (`host.name`, `host.id`), read once; the
//! process's (`process.*`, `container.id`, `k8s.pod.uid`, read once when
//! the session first followed it: [`crate::process::resource`]); and
//! allocprof's own `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME`.
//!
//! Which wins where they name the same key:
//! - a process's own facts (its pid, executable, container...) over
//!   `OTEL_RESOURCE_ATTRIBUTES`, which is one setting for every process;
//!   `OTEL_RESOURCE_ATTRIBUTES` over what allocprof detects of the host;
//! - `service.name`: the target's own `OTEL_SERVICE_NAME` (it names itself
//!   as its SDK would), else allocprof's `OTEL_SERVICE_NAME`, else
//!   `service.name` in allocprof's `OTEL_RESOURCE_ATTRIBUTES` (the spec's
//!   order for one SDK), else the executable's name.

use std::io::Read;

use crate::{
    agent::config::percent_decode,
    model::profile::ProcessProfile,
    output::inert::inert,
    process::resource::{MAX_VALUE_CHARS, parse_machine_id},
};

pub const ATTR_HOST_NAME: &str = "host.name";
pub const ATTR_HOST_ID: &str = "host.id";
pub const ATTR_PID: &str = "process.pid";
pub const ATTR_EXECUTABLE_NAME: &str = "process.executable.name";
pub const ATTR_EXECUTABLE_PATH: &str = "process.executable.path";
pub const ATTR_COMMAND_LINE: &str = "process.command_line";
pub const ATTR_SERVICE_NAME: &str = "service.name";
pub const ATTR_CONTAINER_ID: &str = "container.id";
pub const ATTR_POD_UID: &str = "k8s.pod.uid";

/// A resource attribute's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttrValue {
    Int(i64),
    Str(String),
}

/// What every process's resource shares: the host and allocprof's own
/// environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostResource {
    /// `host.name`, `host.id`, then `OTEL_RESOURCE_ATTRIBUTES`'s (without
    /// `service.name`), each key once.
    pub attributes: Vec<(String, String)>,
    /// allocprof's `OTEL_SERVICE_NAME`, else `service.name` of its
    /// `OTEL_RESOURCE_ATTRIBUTES`.
    pub service_name: Option<String>,
}

/// `OTEL_RESOURCE_ATTRIBUTES` could not be read: the spec has the whole
/// value discarded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("OTEL_RESOURCE_ATTRIBUTES ignored: {0}")]
pub struct BadResourceAttributes(String);

impl HostResource {
    /// The host's and allocprof's environment's; a malformed
    /// `OTEL_RESOURCE_ATTRIBUTES` is left out, and said.
    pub fn detect() -> (HostResource, Option<BadResourceAttributes>) {
        let host_name = host_name();
        let host_id = read_small("/etc/machine-id")
            .as_deref()
            .and_then(parse_machine_id);
        let attributes = std::env::var("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default();
        let service = std::env::var("OTEL_SERVICE_NAME").ok();
        HostResource::from_parts(host_name, host_id, &attributes, service.as_deref())
    }

    /// The resource of given facts (pure: see [`HostResource::detect`]).
    pub fn from_parts(
        host_name: Option<String>,
        host_id: Option<String>,
        resource_attributes: &str,
        service_name: Option<&str>,
    ) -> (HostResource, Option<BadResourceAttributes>) {
        let mut r = HostResource::default();
        if let Some(name) = host_name {
            r.attributes.push((ATTR_HOST_NAME.into(), name));
        }
        if let Some(id) = host_id {
            r.attributes.push((ATTR_HOST_ID.into(), id));
        }
        let (pairs, error) = match parse_resource_attributes(resource_attributes) {
            Ok(pairs) => (pairs, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        for (key, value) in pairs {
            if key == ATTR_SERVICE_NAME {
                r.service_name = Some(value);
                continue;
            }
            // The configured value over the detected one; of two, the last.
            r.attributes.retain(|(k, _)| *k != key);
            r.attributes.push((key, value));
        }
        if let Some(s) = service_name.map(str::trim).filter(|s| !s.is_empty()) {
            r.service_name = Some(s.to_owned());
        }
        (r, error)
    }

    /// The resource attributes of process `p`'s export, each key once.
    pub fn attributes_of(&self, p: &ProcessProfile) -> Vec<(String, AttrValue)> {
        let own = p.resource.as_deref();
        let path = own.and_then(|r| r.executable_path.as_deref());
        // The base name of /proc/PID/exe (the convention), else its comm.
        let exe_name = path
            .and_then(|p| p.rsplit('/').next())
            .filter(|n| !n.is_empty())
            .map_or_else(|| p.name.clone(), |n| inert(n).into_owned());
        let pid = own.and_then(|r| r.host_pid).unwrap_or(p.key.pid.0);
        let service = own
            .and_then(|r| r.service_name.clone())
            .or_else(|| self.service_name.clone())
            .unwrap_or_else(|| exe_name.clone());
        let mut out: Vec<(String, AttrValue)> = vec![
            (ATTR_PID.into(), AttrValue::Int(i64::from(pid))),
            (ATTR_EXECUTABLE_NAME.into(), AttrValue::Str(exe_name)),
            (ATTR_SERVICE_NAME.into(), AttrValue::Str(service)),
        ];
        let strings = [
            (ATTR_EXECUTABLE_PATH, path.map(|p| inert(p).into_owned())),
            (ATTR_COMMAND_LINE, own.and_then(|r| r.command_line.clone())),
            (ATTR_CONTAINER_ID, own.and_then(|r| r.container_id.clone())),
            (ATTR_POD_UID, own.and_then(|r| r.pod_uid.clone())),
        ];
        for (key, value) in strings {
            if let Some(v) = value {
                out.push((key.into(), AttrValue::Str(v)));
            }
        }
        for (key, value) in &self.attributes {
            if !out.iter().any(|(k, _)| k == key) {
                out.push((key.clone(), AttrValue::Str(value.clone())));
            }
        }
        out
    }
}

/// The host's name (`/proc/sys/kernel/hostname`, that of allocprof's UTS
/// namespace: run the agent in the host's).
fn host_name() -> Option<String> {
    let name = read_small("/proc/sys/kernel/hostname")?;
    let name = name.trim();
    (!name.is_empty()).then(|| inert(name).into_owned())
}

/// At most 4 KiB of a small system file.
fn read_small(path: &str) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(4096)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// `OTEL_RESOURCE_ATTRIBUTES`: `key=value` pairs separated by commas, keys
/// and values trimmed, values percent-decoded (the spec's W3C Baggage
/// format without properties). Any malformed pair discards the whole value,
/// as the spec asks; empty pairs are skipped.
pub fn parse_resource_attributes(s: &str) -> Result<Vec<(String, String)>, BadResourceAttributes> {
    let mut out = Vec::new();
    for pair in s.split(',') {
        if pair.trim().is_empty() {
            continue;
        }
        let Some((key, value)) = pair.split_once('=') else {
            return Err(BadResourceAttributes(format!(
                "{:?} has no '='",
                inert(pair)
            )));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(BadResourceAttributes(format!(
                "{:?} has no key",
                inert(pair)
            )));
        }
        let value = percent_decode(value.trim()).ok_or_else(|| {
            BadResourceAttributes(format!(
                "the value of {:?} is not percent-encoded UTF-8",
                inert(key)
            ))
        })?;
        if value.chars().count() > MAX_VALUE_CHARS {
            return Err(BadResourceAttributes(format!(
                "the value of {:?} is too long",
                inert(key)
            )));
        }
        out.push((key.to_owned(), value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        ids::Pid,
        model::profile::{ProcessKey, ProcessState},
        process::resource::ProcessResource,
    };

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
    }

    #[test]
    fn resource_attributes_are_trimmed_and_percent_decoded() {
        assert_eq!(
            parse_resource_attributes(
                " deployment.environment = prod ,team=heap%20team,k=a%2Cb%3Dc"
            )
            .unwrap(),
            pairs(&[
                ("deployment.environment", "prod"),
                ("team", "heap team"),
                ("k", "a,b=c")
            ])
        );
        assert_eq!(parse_resource_attributes("").unwrap(), pairs(&[]));
        assert_eq!(
            parse_resource_attributes("a=1,,b=").unwrap(),
            pairs(&[("a", "1"), ("b", "")])
        );
        assert_eq!(
            parse_resource_attributes("k=%C3%A9").unwrap(),
            pairs(&[("k", "é")])
        );
    }

    #[test]
    fn a_malformed_pair_discards_the_whole_value() {
        for bad in ["a=1,b", "=1", "a=%2", "a=%zz", "a=%ff", "a=1,%"] {
            assert!(parse_resource_attributes(bad).is_err(), "{bad}");
        }
        let long = format!("a={}", "x".repeat(MAX_VALUE_CHARS + 1));
        assert!(parse_resource_attributes(&long).is_err());
        let (r, e) = HostResource::from_parts(Some("h".into()), None, "a=1,b", None);
        assert!(e.is_some());
        assert_eq!(r.attributes, pairs(&[(ATTR_HOST_NAME, "h")]));
    }

    fn process(resource: Option<ProcessResource>) -> ProcessProfile {
        ProcessProfile {
            resource: resource.map(Arc::new),
            ..ProcessProfile::from_stacks(
                ProcessKey {
                    pid: Pid(42),
                    generation: 0,
                },
                "comm-name".into(),
                ProcessState::Live,
                4096,
                Vec::new(),
            )
        }
    }

    fn get(attrs: &[(String, AttrValue)], key: &str) -> Option<AttrValue> {
        let found: Vec<_> = attrs.iter().filter(|(k, _)| k == key).collect();
        assert!(found.len() <= 1, "{key} once: {attrs:?}");
        found.first().map(|(_, v)| v.clone())
    }

    fn s(v: &str) -> Option<AttrValue> {
        Some(AttrValue::Str(v.into()))
    }

    #[test]
    fn a_process_with_nothing_read_is_its_pid_and_name() {
        let (host, _) = HostResource::from_parts(None, None, "", None);
        let attrs = host.attributes_of(&process(None));
        assert_eq!(get(&attrs, ATTR_PID), Some(AttrValue::Int(42)));
        assert_eq!(get(&attrs, ATTR_EXECUTABLE_NAME), s("comm-name"));
        assert_eq!(get(&attrs, ATTR_SERVICE_NAME), s("comm-name"));
        assert_eq!(attrs.len(), 3);
    }

    #[test]
    fn process_facts_and_the_host_and_configured_attributes_each_once() {
        let (host, e) = HostResource::from_parts(
            Some("node-1".into()),
            Some("3d1219c7c4c5404aaa1f6d2a48adfda4".into()),
            "host.name=configured,container.id=nope,team=heap",
            None,
        );
        assert_eq!(e, None);
        let own = ProcessResource {
            host_pid: Some(4242),
            executable_path: Some("/srv/bin/checkout".into()),
            service_name: None,
            container_id: Some("c".repeat(64)),
            pod_uid: Some("2c48913c-b29f-11e7-9350-020968147796".into()),
            command_line: Some("/srv/bin/checkout --port 1".into()),
        };
        let attrs = host.attributes_of(&process(Some(own)));
        assert_eq!(get(&attrs, ATTR_PID), Some(AttrValue::Int(4242)));
        assert_eq!(get(&attrs, ATTR_EXECUTABLE_NAME), s("checkout"));
        assert_eq!(get(&attrs, ATTR_EXECUTABLE_PATH), s("/srv/bin/checkout"));
        assert_eq!(get(&attrs, ATTR_SERVICE_NAME), s("checkout"));
        assert_eq!(
            get(&attrs, ATTR_COMMAND_LINE),
            s("/srv/bin/checkout --port 1")
        );
        assert_eq!(get(&attrs, ATTR_CONTAINER_ID), s(&"c".repeat(64)));
        assert_eq!(
            get(&attrs, ATTR_POD_UID),
            s("2c48913c-b29f-11e7-9350-020968147796")
        );
        assert_eq!(get(&attrs, ATTR_HOST_NAME), s("configured"));
        assert_eq!(
            get(&attrs, ATTR_HOST_ID),
            s("3d1219c7c4c5404aaa1f6d2a48adfda4")
        );
        assert_eq!(get(&attrs, "team"), s("heap"));
        assert_eq!(attrs.len(), 10);
    }

    #[test]
    fn the_targets_own_service_name_wins_then_allocprofs() {
        let own = |name: Option<&str>| ProcessResource {
            service_name: name.map(Into::into),
            ..Default::default()
        };
        let (configured, _) = HostResource::from_parts(None, None, "service.name=from-attrs", None);
        let (named, _) =
            HostResource::from_parts(None, None, "service.name=from-attrs", Some("from-env"));
        let service = |host: &HostResource, p: &ProcessProfile| {
            get(&host.attributes_of(p), ATTR_SERVICE_NAME)
        };
        let target_named = process(Some(own(Some("checkout"))));
        let unnamed = process(Some(own(None)));
        assert_eq!(service(&named, &target_named), s("checkout"));
        assert_eq!(service(&named, &unnamed), s("from-env"));
        assert_eq!(service(&configured, &unnamed), s("from-attrs"));
        assert_eq!(configured.attributes, pairs(&[]), "service.name kept apart");
    }
}

//! Who a process is, for the OTLP export's resource attributes (OTel
//! semantic conventions): its executable's path, its container and pod
//! (from `/proc/PID/cgroup`), its own `OTEL_SERVICE_NAME` (the one variable
//! of its environment kept) and, opted in, its command line. Read once when
//! the process is first followed; every parser here takes what the target
//! controls, so each is pure, bounded and host-tested.

use crate::output::inert::inert;

/// The most of `/proc/PID/cgroup`, `/proc/PID/environ` and
/// `/proc/PID/cmdline` read: a command line or environment can be far
/// longer, and nothing here needs more.
pub const MAX_READ_BYTES: u64 = 64 << 10;
/// The longest value kept (a service name, a command line).
pub const MAX_VALUE_CHARS: usize = 4096;

/// The resource of one process image.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessResource {
    /// Its pid as the host's pid namespace numbers it, where known (the
    /// kernel's pid; allocprof's own pid where allocprof runs on the host).
    pub host_pid: Option<u32>,
    /// `/proc/PID/exe`.
    pub executable_path: Option<String>,
    /// Its own `OTEL_SERVICE_NAME`.
    pub service_name: Option<String>,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    /// Its arguments joined by spaces, made inert (only when asked for:
    /// command lines hold secrets).
    pub command_line: Option<String>,
}

/// What `/proc/PID/cgroup` says of a process's container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupIds {
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
}

/// The container id and Kubernetes pod uid in a `/proc/PID/cgroup`
/// (`hierarchy:controllers:path` lines, cgroup v1 and v2): the innermost
/// path component that names one wins, per line, the first line that has
/// one. Forms:
/// - docker: `/docker/<64 hex>`, `/system.slice/docker-<64 hex>.scope`;
/// - containerd/CRI: `/kubepods/<qos>/pod<uid>/<64 hex>`,
///   `cri-containerd-<64 hex>.scope`, and the systemd driver's
///   `…-pod<uid>.slice:cri-containerd:<64 hex>`;
/// - CRI-O: `crio-<64 hex>.scope` (not `crio-conmon-…`, its monitor);
/// - podman: `libpod-<64 hex>.scope`;
/// - pods: `pod<uid>` (cgroupfs driver) or
///   `kubepods-<qos>-pod<uid with underscores>.slice` (systemd driver), the
///   uid given with dashes.
pub fn parse_cgroup(text: &str) -> CgroupIds {
    let mut ids = CgroupIds::default();
    for line in text.lines() {
        // The path is everything after the second colon (paths may hold
        // colons: the systemd driver's `slice:prefix:id`).
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        let components: Vec<&str> = path.split('/').collect();
        if ids.container_id.is_none() {
            ids.container_id = components.iter().rev().find_map(|c| container_in(c));
        }
        if ids.pod_uid.is_none() {
            ids.pod_uid = components.iter().rev().find_map(|c| pod_uid_in(c));
        }
        if ids.container_id.is_some() && ids.pod_uid.is_some() {
            break;
        }
    }
    ids
}

const CONTAINER_PREFIXES: [&str; 5] = [
    "docker-",
    "cri-containerd-",
    "crio-",
    "libpod-",
    "containerd-",
];

fn container_in(component: &str) -> Option<String> {
    // `kubepods-…-pod….slice:cri-containerd:<id>`: the id is the last field.
    let last = component.rsplit(':').next().unwrap_or(component);
    let name = last.strip_suffix(".scope").unwrap_or(last);
    let id = CONTAINER_PREFIXES
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .unwrap_or(name);
    is_hex(id, 64).then(|| id.to_ascii_lowercase())
}

fn pod_uid_in(component: &str) -> Option<String> {
    // `kubepods-…-pod<uid>.slice:cri-containerd:<id>`: the slice comes first.
    let slice = component.split(':').next().unwrap_or(component);
    let name = slice.strip_suffix(".slice").unwrap_or(slice);
    // cgroupfs: `pod<uid>`; systemd: `kubepods[-<qos>]-pod<uid>`.
    let uid = match name.strip_prefix("pod") {
        Some(uid) => uid,
        None if name.starts_with("kubepods") => name.rsplit_once("-pod")?.1,
        None => return None,
    };
    let uid = uid.replace('_', "-");
    is_uuid(&uid).then(|| uid.to_ascii_lowercase())
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// 8-4-4-4-12 hex digits.
fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| is_hex(g, len))
}

/// The value of variable `name` in a `/proc/PID/environ` (NUL-separated
/// `NAME=value`; a truncated last entry counts as absent), if it is UTF-8,
/// non-empty and at most [`MAX_VALUE_CHARS`]: nothing else of the
/// environment is kept.
pub fn env_value(environ: &[u8], name: &str) -> Option<String> {
    let mut entries = environ.split(|&b| b == 0).peekable();
    let terminated = environ.last() == Some(&0);
    while let Some(entry) = entries.next() {
        // A last entry without its NUL may be cut short by the bound.
        if entries.peek().is_none() && !terminated {
            break;
        }
        let Some(value) = entry
            .strip_prefix(name.as_bytes())
            .and_then(|rest| rest.strip_prefix(b"="))
        else {
            continue;
        };
        let value = std::str::from_utf8(value).ok()?.trim();
        if value.is_empty() || value.chars().count() > MAX_VALUE_CHARS {
            return None;
        }
        return Some(inert(value).into_owned());
    }
    None
}

/// A `/proc/PID/cmdline` (NUL-terminated arguments) as one string, the
/// arguments joined by spaces, made inert and cut to [`MAX_VALUE_CHARS`];
/// none when empty (a kernel thread, a zombie).
pub fn command_line(cmdline: &[u8]) -> Option<String> {
    let args: Vec<String> = cmdline
        .strip_suffix(&[0])
        .unwrap_or(cmdline)
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let joined = args.join(" ");
    if joined.trim().is_empty() {
        return None;
    }
    Some(inert(&joined).chars().take(MAX_VALUE_CHARS).collect())
}

/// A `/etc/machine-id`: 32 lowercase hex digits and a newline
/// (machine-id(5)); anything else (empty at first boot, "uninitialized")
/// is no id.
pub fn parse_machine_id(text: &str) -> Option<String> {
    let id = text.strip_suffix('\n').unwrap_or(text);
    (is_hex(id, 32) && !id.bytes().any(|b| b.is_ascii_uppercase())).then(|| id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "9bca8d63d5fa610783847915bcff0ecac1273e5b4bed3f6fa1b07350e0135961";
    const UID: &str = "2c48913c-b29f-11e7-9350-020968147796";

    fn ids(text: &str) -> (Option<String>, Option<String>) {
        let ids = parse_cgroup(text);
        (ids.container_id, ids.pod_uid)
    }

    fn both(id: &str, uid: Option<&str>) -> (Option<String>, Option<String>) {
        (Some(id.to_owned()), uid.map(str::to_owned))
    }

    #[test]
    fn docker_cgroupfs_and_systemd_forms_cgroup_v1() {
        let cgroupfs = format!("12:memory:/docker/{ID}\n11:cpu,cpuacct:/docker/{ID}\n");
        assert_eq!(ids(&cgroupfs), both(ID, None));
        let systemd = format!(
            "10:devices:/system.slice/docker-{ID}.scope\n1:name=systemd:/system.slice/docker-{ID}.scope\n"
        );
        assert_eq!(ids(&systemd), both(ID, None));
    }

    #[test]
    fn cgroup_v2_forms() {
        assert_eq!(
            ids(&format!("0::/system.slice/docker-{ID}.scope\n")),
            both(ID, None)
        );
        // Docker's cgroupns=private: the container sees its own root, the
        // host sees the path.
        assert_eq!(
            ids(&format!("0::/../../docker-{ID}.scope\n")),
            both(ID, None)
        );
        assert_eq!(
            ids(&format!("0::/machine.slice/libpod-{ID}.scope/container\n")),
            both(ID, None)
        );
    }

    #[test]
    fn kubernetes_cgroupfs_driver() {
        let v1 = format!(
            "11:cpuset:/kubepods/burstable/pod{UID}/{ID}\n10:memory:/kubepods/burstable/pod{UID}/{ID}\n"
        );
        assert_eq!(ids(&v1), both(ID, Some(UID)));
        // Guaranteed pods have no QoS level.
        assert_eq!(
            ids(&format!("0::/kubepods/pod{UID}/{ID}\n")),
            both(ID, Some(UID))
        );
    }

    #[test]
    fn kubernetes_systemd_driver_containerd_and_crio() {
        let u = UID.replace('-', "_");
        let containerd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{ID}.scope\n"
        );
        assert_eq!(ids(&containerd), both(ID, Some(UID)));
        let crio = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/crio-{ID}.scope\n"
        );
        assert_eq!(ids(&crio), both(ID, Some(UID)));
        let guaranteed =
            format!("0::/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{ID}.scope\n");
        assert_eq!(ids(&guaranteed), both(ID, Some(UID)));
        // containerd with the systemd driver on cgroup v1: `slice:prefix:id`.
        let v1 = format!(
            "1:name=systemd:/system.slice/containerd.service/kubepods-burstable-pod{u}.slice:cri-containerd:{ID}\n"
        );
        assert_eq!(ids(&v1), both(ID, Some(UID)));
    }

    #[test]
    fn monitors_hosts_and_near_misses_name_no_container() {
        // CRI-O's conmon runs beside the container, not in it.
        assert_eq!(
            ids(&format!("0::/machine.slice/crio-conmon-{ID}.scope\n")),
            (None, None)
        );
        // This machine's own lines: a 32-digit job id is no container.
        let host = "4:memory:/process_api/a3691fa29815d399e6ccab6bc0ed31c2\n1:cpu:/\n0::/\n";
        assert_eq!(ids(host), (None, None));
        assert_eq!(
            ids("0::/user.slice/user-0.slice/session-1.scope\n"),
            (None, None)
        );
        assert_eq!(ids(&format!("0::/docker/{}\n", &ID[1..])), (None, None));
        assert_eq!(ids(&format!("0::/docker/{}g\n", &ID[1..])), (None, None));
        assert_eq!(
            ids(&format!("0::/kubepods/pod{}/x\n", &UID[1..])),
            (None, None)
        );
        assert_eq!(ids(""), (None, None));
        assert_eq!(ids("garbage\n::\n\0\0\n"), (None, None));
    }

    #[test]
    fn the_innermost_component_and_the_first_line_win() {
        let other = "a".repeat(64);
        assert_eq!(
            ids(&format!("0::/docker/{other}/docker/{ID}\n")),
            both(ID, None)
        );
        assert_eq!(
            ids(&format!("2:memory:/docker/{ID}\n1:cpu:/docker/{other}\n")),
            both(ID, None)
        );
        // Uppercase digits are read as the same id.
        assert_eq!(
            ids(&format!("0::/docker/{}\n", ID.to_uppercase())),
            both(ID, None)
        );
    }

    #[test]
    fn one_variable_of_the_environment_is_kept() {
        let env = b"PATH=/bin\0OTEL_SERVICE_NAME=checkout\0SECRET=x\0";
        assert_eq!(
            env_value(env, "OTEL_SERVICE_NAME").as_deref(),
            Some("checkout")
        );
        assert_eq!(env_value(env, "OTEL_SERVICE"), None);
        assert_eq!(
            env_value(b"XOTEL_SERVICE_NAME=a\0", "OTEL_SERVICE_NAME"),
            None
        );
        assert_eq!(
            env_value(b"OTEL_SERVICE_NAME=\0", "OTEL_SERVICE_NAME"),
            None
        );
        assert_eq!(
            env_value(b"OTEL_SERVICE_NAME=\xff\0", "OTEL_SERVICE_NAME"),
            None
        );
        // The first of two, as getenv.
        assert_eq!(
            env_value(
                b"OTEL_SERVICE_NAME=a\0OTEL_SERVICE_NAME=b\0",
                "OTEL_SERVICE_NAME"
            )
            .as_deref(),
            Some("a")
        );
        // Cut by the read's bound: not trusted.
        assert_eq!(
            env_value(b"A=1\0OTEL_SERVICE_NAME=chec", "OTEL_SERVICE_NAME"),
            None
        );
        // Terminal controls are made visible.
        assert_eq!(
            env_value(b"OTEL_SERVICE_NAME=a\x1b[2Jb\0", "OTEL_SERVICE_NAME").as_deref(),
            Some("a\\x1b[2Jb")
        );
        let long = format!("OTEL_SERVICE_NAME={}\0", "x".repeat(MAX_VALUE_CHARS + 1));
        assert_eq!(env_value(long.as_bytes(), "OTEL_SERVICE_NAME"), None);
        assert_eq!(env_value(b"", "OTEL_SERVICE_NAME"), None);
    }

    #[test]
    fn command_lines_are_joined_inert_and_bounded() {
        assert_eq!(
            command_line(b"/usr/bin/python3\0-c\0print(1)\0").as_deref(),
            Some("/usr/bin/python3 -c print(1)")
        );
        assert_eq!(
            command_line(b"a\x1b]0;x\x07\0").as_deref(),
            Some("a\\x1b]0;x\\x07")
        );
        assert_eq!(command_line(b""), None);
        assert_eq!(command_line(b"\0"), None);
        let long = vec![b'y'; 2 * MAX_VALUE_CHARS];
        assert_eq!(
            command_line(&long).unwrap().chars().count(),
            MAX_VALUE_CHARS
        );
    }

    #[test]
    fn machine_ids_are_32_lowercase_hex_digits() {
        let id = "3d1219c7c4c5404aaa1f6d2a48adfda4";
        assert_eq!(parse_machine_id(&format!("{id}\n")).as_deref(), Some(id));
        assert_eq!(parse_machine_id(id).as_deref(), Some(id));
        assert_eq!(parse_machine_id(""), None);
        assert_eq!(parse_machine_id("uninitialized\n"), None);
        assert_eq!(parse_machine_id(&id.to_uppercase()), None);
        assert_eq!(parse_machine_id(&format!("{id}0\n")), None);
        assert_eq!(parse_machine_id(&format!("{id}\n\n")), None);
    }
}

//! A small Python web service under load, end to end (issue 30's
//! done-when): tests/workloads/python_service.py, an `http.server` whose
//! handlers cache (a dict growing with each distinct key) and leak (a list
//! keeping some request bodies), run by real CPython under liballocprof.so
//! with `PYTHONMALLOC=malloc` and loaded with a few thousand HTTP requests
//! from four client threads, after allocprof attached. What a user sees:
//! - the live view (the real binary in a tmux pane): its top rows name the
//!   Python function and line that hold the heap;
//! - the flamegraph and the collapsed stacks: Python frames between native
//!   ones (the thread's start below, the interpreter's
//!   `PyBytes_FromStringAndSize` above, where the allocator was called);
//! - the live bytes of the cache and the leak, each within 4σ of what the
//!   service says it holds (`GET /truth`: its objects' `sys.getsizeof`).

mod common;

use std::{
    collections::HashMap,
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use allocprof::{
    ids::Pid,
    kernel::Limits,
    model::{
        profile::{ProcessProfile, Profile},
        stats::Quantity,
    },
    output::export::{self, collapsed, svg},
    python::runtime::ObjectAllocator,
    session::{Session, Target},
    symbolize::{Frame, FrameKind},
};
use common::{
    DEBIAN_PYTHON, Proc, RATE, path_python,
    tmux::{Tmux, shell_quote},
    truth_and_sigma,
};

const SCRIPT: &str = "tests/workloads/python_service.py";
/// Requests sent, from this many client threads.
const REQUESTS: usize = 4000;
const CLIENTS: usize = 4;
/// Distinct cache keys among the `GET /cache` requests.
const KEYS: usize = 1500;
/// One request in four is an upload of this many bytes.
const UPLOAD: usize = 32 * 1024;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(SCRIPT)
}

/// The line of the script's `# site: NAME` comment.
fn site_line(name: &str) -> u32 {
    let marker = format!("# site: {name}");
    std::fs::read_to_string(script())
        .unwrap()
        .lines()
        .zip(1..)
        .find_map(|(l, n)| l.trim_end().ends_with(&marker).then_some(n))
        .unwrap_or_else(|| panic!("no `{marker}` in {SCRIPT}"))
}

/// The cache and the leak: the site's name in the script, the Python
/// function that allocates there (qualified), and its name in the views.
struct Site {
    name: &'static str,
    function: &'static str,
    line: u32,
}

impl Site {
    fn shown(&self) -> String {
        format!("{} (python_service.py:{})", self.function, self.line)
    }
}

fn sites() -> [Site; 2] {
    [
        Site {
            name: "cache",
            function: "render_entry",
            line: site_line("cache"),
        },
        Site {
            name: "leak",
            function: "Handler.do_POST",
            line: site_line("leak"),
        },
    ]
}

struct Service {
    proc: Proc,
    port: u16,
}

impl Service {
    fn start(python: &Path) -> Service {
        let mut cmd = Command::new(python);
        cmd.arg(script())
            .env("PYTHONMALLOC", "malloc")
            .env("LD_PRELOAD", common::preload_library())
            .env("ALLOCPROF_RATE", RATE.to_string());
        let mut proc = Proc::spawn(cmd);
        let line = proc.line();
        let port = line
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the service said {line:?}, not its port"));
        Service { proc, port }
    }

    fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// One HTTP/1.0 request (the server closes the connection after it):
    /// the response's body.
    fn request(&self, head: &str, body: &[u8]) -> Vec<u8> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).unwrap();
        let text = String::from_utf8_lossy(&response);
        assert!(
            text.starts_with("HTTP/1.0 200"),
            "{head:?} answered {text:.200}"
        );
        let end = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        response.split_off(end)
    }

    /// The load: `REQUESTS` requests from `CLIENTS` threads at once, three
    /// in four `GET /cache` over `KEYS` keys, one in four an upload.
    fn load(&self) {
        std::thread::scope(|s| {
            for client in 0..CLIENTS {
                s.spawn(move || {
                    for i in (client..REQUESTS).step_by(CLIENTS) {
                        if i % 4 == 3 {
                            let body: Vec<u8> = (0..UPLOAD).map(|b| (b ^ i) as u8).collect();
                            let head = format!(
                                "POST /upload HTTP/1.0\r\nContent-Length: {}\r\n\r\n",
                                body.len()
                            );
                            let reply = self.request(&head, &body);
                            assert_eq!(reply, format!("{UPLOAD}\n").as_bytes());
                        } else {
                            let head = format!("GET /cache?key=user-{} HTTP/1.0\r\n\r\n", i % KEYS);
                            assert_eq!(self.request(&head, &[]).len(), 32 * 1024);
                        }
                    }
                });
            }
        });
    }

    /// What the service holds at each site, by its own count: (objects,
    /// bytes).
    fn truth(&self) -> HashMap<String, (u64, u64)> {
        let body = self.request("GET /truth HTTP/1.0\r\n\r\n", &[]);
        let truth: serde_json::Value = serde_json::from_slice(&body).unwrap();
        truth
            .as_object()
            .unwrap()
            .iter()
            .map(|(site, v)| {
                let n = |k: &str| v[k].as_u64().unwrap();
                (site.clone(), (n("objects"), n("bytes")))
            })
            .collect()
    }
}

fn innermost_python(frames: &[Frame]) -> Option<&Frame> {
    frames.iter().find(|f| f.kind == FrameKind::Python)
}

/// Live bytes by the site name of their stacks' innermost Python frame.
fn by_python_site(p: &ProcessProfile) -> HashMap<String, f64> {
    let mut sites = HashMap::new();
    for s in &p.stacks {
        if let Some(f) = innermost_python(&s.frames) {
            *sites.entry(f.site_name()).or_default() += s.totals.live_bytes;
        }
    }
    sites
}

/// Refreshes until both sites have samples under their Python frame.
fn profile_with_sites(session: &mut Session, pid: u32) -> Profile {
    let mut last = None;
    for _ in 0..100 {
        let profile = session.complete_profile().unwrap();
        let seen = by_python_site(common::process(&profile, pid));
        if sites().iter().all(|s| seen.contains_key(&s.shown())) {
            return profile;
        }
        last = Some(profile);
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the sites never showed with Python frames: {last:#?}");
}

/// Whether a frame of the folded stacks is a Python one: `name (file.py:N)`.
fn is_python(frame: &str) -> bool {
    frame
        .strip_suffix(')')
        .and_then(|f| f.rsplit_once(".py:"))
        .is_some_and(|(_, line)| !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()))
}

fn served_and_profiled(python: &Path) {
    common::require_bpf();
    let service = Service::start(python);
    let pid = service.pid();
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    session.complete_profile().unwrap();
    service.load();
    let truth = service.truth();
    let profile = profile_with_sites(&mut session, pid);
    let p = common::process(&profile, pid);
    let runtime = p.python.expect("recognised as CPython");
    assert_eq!(runtime.objects, Some(ObjectAllocator::Malloc));

    // The held bytes, within 4σ of the service's own count.
    let seen = by_python_site(p);
    for site in sites() {
        let (objects, bytes) = truth[site.name];
        assert!(objects > 100, "{}: {objects} objects", site.name);
        assert_eq!(bytes % objects, 0, "{}: objects of one size", site.name);
        let (expected, sigma) = truth_and_sigma(objects, bytes / objects, RATE);
        assert_eq!(expected, bytes as f64);
        let live = seen[&site.shown()];
        assert!(
            (live - expected).abs() <= 4.0 * sigma,
            "{}: {live} live bytes under {}, the service holds {bytes} (σ {sigma}): {seen:#?}",
            site.name,
            site.shown()
        );
    }

    // Collapsed stacks: each site's stacks run from native frames (the
    // thread's start) through the service's Python frames, in order, to
    // native ones (the interpreter making the bytes object: the stack's
    // leaf, the allocator's own frames left out as in every stack).
    let folded = collapsed::render(&profile, Quantity::InuseBytes);
    for (site, callers, native_above) in [
        (
            &sites()[0],
            &["render_entry", "cached", "Handler.do_GET"][..],
            "PyBytes_FromStringAndSize",
        ),
        (
            &sites()[1],
            &[
                "Handler.do_POST",
                "BaseHTTPRequestHandler.handle_one_request",
            ][..],
            "PyBytes_FromStringAndSize",
        ),
    ] {
        let lines: Vec<&str> = folded
            .lines()
            .filter(|l| {
                l.contains(&format!(";{} ", site.shown()))
                    || l.contains(&format!(";{};", site.shown()))
            })
            .collect();
        assert!(
            !lines.is_empty(),
            "no folded stack through {}:\n{folded}",
            site.shown()
        );
        for line in lines {
            let (stack, _) = line.rsplit_once(' ').unwrap();
            let frames: Vec<&str> = stack.split(';').skip(1).collect();
            let first = frames.iter().position(|f| is_python(f)).unwrap();
            let last = frames.iter().rposition(|f| is_python(f)).unwrap();
            assert!(first > 0, "native frames below the Python ones: {line}");
            assert!(
                frames[..first].iter().any(|f| f.contains("start_thread")),
                "a handler thread's start below: {line}"
            );
            assert_eq!(frames[last], site.shown(), "{line}");
            assert!(
                frames[last + 1..].contains(&native_above)
                    && frames[last + 1..].iter().all(|f| !is_python(f)),
                "native frames above the Python ones, {native_above} among them: {line}"
            );
            // The Python frames, innermost first, start with the site's
            // callers and end in the thread's bootstrap.
            let python: Vec<&str> = frames[first..=last]
                .iter()
                .rev()
                .filter(|f| is_python(f))
                .map(|f| f.split_once(" (").unwrap().0)
                .collect();
            assert!(
                python.starts_with(callers) && python.last() == Some(&"Thread._bootstrap"),
                "{python:?}: {line}"
            );
        }
    }

    // The flamegraph draws the same frames.
    let svg =
        String::from_utf8(svg::render(&profile, &export::Options::default()).unwrap()).unwrap();
    for frame in [
        sites()[0].shown(),
        sites()[1].shown(),
        "cached (python_service.py:".into(),
        "PyBytes_FromStringAndSize".into(),
        "start_thread".into(),
    ] {
        assert!(svg.contains(&frame), "{frame} is not in the flamegraph");
    }
}

#[test]
fn debian_python_service_s_heap_is_shown_by_handler_function_and_line() {
    served_and_profiled(Path::new(DEBIAN_PYTHON));
}

#[test]
fn pyenv_python_service_s_heap_is_shown_by_handler_function_and_line() {
    served_and_profiled(&path_python());
}

/// The table's rows as the pane shows them: the lines between its column
/// header and its bottom border.
fn table_rows(pane: &str) -> Vec<&str> {
    pane.lines()
        .skip_while(|l| !l.contains("ALLOCATED AT"))
        .skip(1)
        .take_while(|l| !l.starts_with('└'))
        .collect()
}

/// The live view (allocprof in a terminal, attached before the load): its
/// two top rows are the cache and the leak, named by the Python function
/// and line that allocate them.
#[test]
fn live_view_s_top_rows_are_the_service_s_cache_and_leak() {
    common::require_bpf();
    let service = Service::start(Path::new(DEBIAN_PYTHON));
    let script = format!(
        "{exe} --pid {pid}; echo TUI-TEST-DONE; exec sleep 600",
        exe = shell_quote(Path::new(env!("CARGO_BIN_EXE_allocprof"))),
        pid = service.pid(),
    );
    let tmux = Tmux::start(200, 40, &script);
    tmux.wait_for("the TUI", |p| {
        p.contains("1 process") && p.contains("events/s")
    });
    service.load();
    let [cache, leak] = sites();
    let (cache, leak) = (cache.shown(), leak.shown());
    let pane = tmux.wait_for("the cache and the leak on top", |p| {
        let rows = table_rows(p);
        rows.len() >= 2 && rows[0].contains(&cache) && rows[1].contains(&leak)
    });
    assert!(pane.contains("python3"), "{pane}");
    tmux.keys(&["q"]);
    tmux.wait_for("allocprof to exit", |p| p.contains("TUI-TEST-DONE"));
}

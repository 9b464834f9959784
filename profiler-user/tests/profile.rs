//! allocprof's pipeline end to end, with real processes and real eBPF:
//! per-site estimates within the statistical bounds, freed memory leaving
//! live bytes, several processes, processes started later, dlopen, exit.

mod common;

use std::{
    ffi::OsStr,
    time::{Duration, Instant},
};

use allocprof::ids::Pid;
use allocprof::{
    kernel::Limits,
    model::profile::{ProcessProfile, ProcessState, Profile},
    model::stats::Totals,
    process::discover::FileId,
    session::{Session, Target},
};

use common::{RATE, Workload, assert_sites_within_bounds, process, site};

fn final_profile(session: &mut Session) -> Profile {
    session.complete_profile().unwrap()
}

#[test]
fn c_program_sites_within_statistical_bounds() {
    common::require_bpf();
    let mut w = Workload::c(&[]);
    let mut session = Session::start(Target::Pids(vec![Pid(w.pid())]), Limits::default()).unwrap();
    w.allocate();
    let profile = final_profile(&mut session);
    assert_sites_within_bounds(process(&profile, w.pid()));
    w.exit();
}

#[test]
fn rust_program_sites_within_statistical_bounds() {
    common::require_bpf();
    let mut w = Workload::rust();
    let mut session = Session::start(Target::Pids(vec![Pid(w.pid())]), Limits::default()).unwrap();
    w.allocate();
    let profile = final_profile(&mut session);
    let p = process(&profile, w.pid());
    // Symbolized Rust names carry their crate path.
    for s in &p.stacks {
        for f in s.frames.iter() {
            assert!(
                !f.function.starts_with("<allocator::"),
                "allocator frames are stripped: {f:?}"
            );
        }
    }
    let renamed: Vec<_> = p
        .stacks
        .iter()
        .flat_map(|s| s.frames.iter())
        .filter(|f| f.function.starts_with("rust_sites::site_"))
        .map(|f| f.function.clone())
        .collect();
    assert!(
        !renamed.is_empty(),
        "no rust_sites::site_* frames in {p:#?}"
    );
    let q = ProcessProfile {
        stacks: p
            .stacks
            .iter()
            .map(|s| {
                let mut s = s.clone();
                s.frames = s
                    .frames
                    .iter()
                    .map(|f| {
                        let mut f = f.clone();
                        f.function = f.function.trim_start_matches("rust_sites::").into();
                        f
                    })
                    .collect();
                s
            })
            .collect(),
        ..p.clone()
    };
    assert_sites_within_bounds(&q);
    w.exit();
}

#[test]
fn two_processes_are_separate_and_merge_by_sum() {
    common::require_bpf();
    let mut a = Workload::c(&[]);
    let mut b = Workload::c(&[]);
    let mut session = Session::start(
        Target::Pids(vec![Pid(a.pid()), Pid(b.pid())]),
        Limits::default(),
    )
    .unwrap();
    a.allocate();
    b.allocate();
    let profile = final_profile(&mut session);
    let (pa, pb) = (process(&profile, a.pid()), process(&profile, b.pid()));
    assert_sites_within_bounds(pa);
    assert_sites_within_bounds(pb);
    let merged = profile.merged_stacks();
    let merged_large: Totals = merged
        .iter()
        .filter(|s| s.frames.iter().any(|f| &*f.function == "site_large"))
        .map(|s| s.totals)
        .sum();
    let separate = site(pa, "site_large").live_bytes + site(pb, "site_large").live_bytes;
    assert_eq!(merged_large.live_bytes, separate, "merging is a plain sum");
    assert_eq!(
        profile.totals().live_bytes,
        pa.totals.live_bytes + pb.totals.live_bytes
    );
    a.exit();
    b.exit();
}

#[test]
fn process_started_later_is_profiled_system_wide() {
    common::require_bpf();
    let mut session = Session::start(Target::All, Limits::default()).unwrap();
    let mut w = Workload::c(&[]);
    // Attachment follows the exec event; wait until the library is attached.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !session.is_attached_to(Pid(w.pid())) {
        assert!(
            Instant::now() < deadline,
            "the new process was never attached"
        );
        session.poll_events();
        std::thread::sleep(Duration::from_millis(10));
    }
    w.allocate();
    let profile = final_profile(&mut session);
    assert_sites_within_bounds(process(&profile, w.pid()));
    w.exit();
}

#[test]
fn dlopened_library_is_seen() {
    common::require_bpf();
    let plugin = common::compile_c_library("plugin.c");
    let mut w = Workload::c(&[plugin.as_os_str()]);
    let mut session = Session::start(Target::Pids(vec![Pid(w.pid())]), Limits::default()).unwrap();
    w.allocate();
    let profile = final_profile(&mut session);
    let p = process(&profile, w.pid());
    let plugin_mallocs: Totals = p
        .stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| &*f.function == "plugin_alloc"))
        .map(|s| s.totals)
        .sum();
    let (truth, sigma) = common::truth_and_sigma(4000, 4096, RATE);
    assert!(
        (plugin_mallocs.live_bytes - truth).abs() <= 5.0 * sigma,
        "mallocs from the dlopen'ed library: {} vs {truth} (sigma {sigma})",
        plugin_mallocs.live_bytes
    );
    assert!(
        session.is_attached(Pid(w.pid()), FileId::of_path(&plugin).unwrap()),
        "the library's own probes are attached"
    );
    w.exit();
}

#[test]
fn exited_process_keeps_its_symbolized_stacks() {
    common::require_bpf();
    let mut w = Workload::c(&[]);
    let pid = w.pid();
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    w.allocate();
    session.refresh().unwrap();
    w.exit();
    let deadline = Instant::now() + Duration::from_secs(10);
    let profile = loop {
        let profile = final_profile(&mut session);
        if process(&profile, pid).state == ProcessState::Exited {
            break profile;
        }
        assert!(Instant::now() < deadline, "the exit was never noticed");
        std::thread::sleep(Duration::from_millis(50));
    };
    let p = process(&profile, pid);
    assert_sites_within_bounds(p);
    assert!(
        !session.kernel_tracks(Pid(pid)),
        "the kernel state of an exited process is freed"
    );
}

#[test]
fn exec_keeps_the_old_image_apart_from_the_new_one() {
    common::require_bpf();
    let mut w = Workload::c(&[OsStr::new("--exec")]);
    let pid = w.pid();
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    w.allocate();
    session.refresh().unwrap();
    // The last line execs a new image under the same pid; wait until
    // allocprof has noticed, then let the new image allocate.
    w.send("exec");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let profile = session.refresh().unwrap();
        let replaced = profile
            .processes
            .iter()
            .any(|p| p.key.pid.0 == pid && p.state == ProcessState::Replaced);
        if replaced && session.is_attached_to(Pid(pid)) {
            break;
        }
        assert!(Instant::now() < deadline, "the exec was never noticed");
        std::thread::sleep(Duration::from_millis(20));
    }
    w.allocate();
    let profile = final_profile(&mut session);
    let images: Vec<&ProcessProfile> = profile
        .processes
        .iter()
        .filter(|p| p.key.pid.0 == pid)
        .collect();
    assert_eq!(images.len(), 2, "{images:#?}");
    let old = images
        .iter()
        .find(|p| p.key.generation == 0)
        .expect("the old image");
    let new = images
        .iter()
        .find(|p| p.key.generation == 1)
        .expect("the new image");
    assert_eq!(old.state, ProcessState::Replaced);
    assert_eq!(new.state, ProcessState::Live);
    assert_sites_within_bounds(old);
    assert_sites_within_bounds(new);
    w.exit();
}

#[test]
fn short_c_names_are_not_demangled_as_cpp_types() {
    common::require_bpf();
    let exe = common::compile_c("short_names.c", &[]);
    let mut w = common::Proc::spawn(std::process::Command::new(exe));
    let pid = w.pid();
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    w.send("go");
    w.expect("ready");
    let profile = session.complete_profile().unwrap();
    let p = process(&profile, pid);
    let names = common::functions(p);
    for site in ["ra", "rb", "rc"] {
        assert!(names.contains(&site), "{site} missing: {names:?}");
    }
    assert!(
        !names
            .iter()
            .any(|n| n.contains("restrict") || n.contains("signed char")),
        "{names:?}"
    );
    w.send("exit");
}

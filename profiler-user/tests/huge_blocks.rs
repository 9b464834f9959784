//! End to end through the real profiler: live blocks larger than the sample
//! region's 128 MiB slots and more live samples of one size than its class
//! has slots are all counted (they used to vanish: never placed, no probe).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::Command;

use allocprof::ids::Pid;
use allocprof::{
    kernel::Limits,
    session::{Session, Target},
};

/// (function, count, size): tests/workloads/huge_blocks.c.
const SITES: [(&str, u64, u64); 3] = [
    ("site_256m", 2, 256 << 20),
    ("site_1g", 1, 1 << 30),
    ("site_3m", 1100, 3 << 20),
];

#[test]
fn huge_and_numerous_live_blocks_within_statistical_bounds() {
    common::require_bpf();
    let exe = common::compile_c("huge_blocks.c", &[]);
    let mut child = common::preloaded(&mut Command::new(exe)).spawn().unwrap();
    let pid = child.id();
    common::wait_for_mapping(pid, "liballocprof.so");
    let mut stdin = child.stdin.take().unwrap();
    let mut session = Session::start(Target::Pids(vec![Pid(pid)]), Limits::default()).unwrap();
    writeln!(stdin, "go").unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "the workload failed");
    let profile = session.complete_profile().unwrap();
    writeln!(stdin, "exit").unwrap();
    let status = child.wait().unwrap();
    let p = profile
        .processes
        .iter()
        .find(|p| p.key.pid.0 == pid)
        .unwrap_or_else(|| panic!("process {pid} is not in the profile: {profile:#?}"));
    let (mut all_truth, mut all_var, mut all_live) = (0.0, 0.0, 0.0);
    for (function, n, size) in SITES {
        let t = common::site(p, function);
        let (truth, sigma) = common::truth_and_sigma(n, size, common::RATE);
        // Blocks this large are sampled almost surely (sigma ~ 0); allow
        // for rounding each sample's weight to whole bytes.
        let slack = 5.0 * sigma + n as f64;
        println!(
            "{function}: live {} vs truth {truth} (sigma {sigma}), {} samples",
            t.live_bytes, t.live_samples
        );
        assert!(
            (t.live_bytes - truth).abs() <= slack,
            "{function}: live {} vs truth {truth} (sigma {sigma}): {} bytes missing",
            t.live_bytes,
            truth - t.live_bytes
        );
        all_truth += truth;
        all_var += sigma * sigma;
        all_live += t.live_bytes;
    }
    let slack = 5.0 * all_var.sqrt() + 1101.0;
    assert!(
        (all_live - all_truth).abs() <= slack,
        "all sites: live {all_live} vs truth {all_truth}"
    );
    assert!(status.success(), "workload exit: {status}");
}

//! Builds the kernel object from `profiler-ebpf` when the eBPF toolchain
//! (the pinned nightly with rust-src, bpf-linker) is present; otherwise uses the object
//! committed in `profiler-ebpf/prebuilt/`, so stable-only users can build.
//! `cargo xtask setup` installs the toolchain; a test checks that the committed
//! object is not stale.
//!
//! Also generates the pprof message types from `proto/profile.proto` and the
//! OTLP profiles ones from `proto/opentelemetry/` (opentelemetry-proto v1.11.0,
//! the wire format OpenTelemetry Collector v0.161.0 speaks) with protox (a
//! protobuf compiler in Rust: no protoc) and prost-build.

use std::{env, fs, path::PathBuf, process::Command};

const PREBUILT: &str = "../profiler-ebpf/prebuilt/profiler.bpf.o";
/// Names the one nightly the eBPF crate builds with.
const NIGHTLY_FILE: &str = "../profiler-ebpf/rust-toolchain.toml";

const PROFILE_PROTO: &str = "proto/profile.proto";
/// Imports the rest of the OTLP profiles messages (common, resource, profiles).
const OTLP_PROTO: &str =
    "proto/opentelemetry/proto/collector/profiles/v1development/profiles_service.proto";

fn main() {
    generate_pprof_types();
    generate_otlp_types();
    println!("cargo:rerun-if-changed={PREBUILT}");
    println!("cargo:rerun-if-changed={NIGHTLY_FILE}");
    // aya-build watches the eBPF crate only; its shared types live here.
    println!("cargo:rerun-if-changed=../profiler-common/src");
    println!("cargo:rerun-if-env-changed=ALLOCPROF_PREBUILT_EBPF");
    println!("cargo:rerun-if-env-changed=PATH");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let force_prebuilt = env::var_os("ALLOCPROF_PREBUILT_EBPF").is_some_and(|v| v == "1");

    let nightly = pinned_nightly();
    match ebpf_toolchain_missing(&nightly) {
        None if !force_prebuilt => {
            let package = aya_build::Package {
                name: "allocprof-ebpf",
                root_dir: "../profiler-ebpf",
                ..Default::default()
            };
            if let Err(e) = aya_build::build_ebpf([package], aya_build::Toolchain::Custom(&nightly))
            {
                panic!("building the eBPF object failed: {e:#}");
            }
        }
        missing => {
            let why = missing.unwrap_or_else(|| "ALLOCPROF_PREBUILT_EBPF=1".into());
            println!(
                "cargo:warning=using the committed eBPF object ({why}); \
                 `cargo xtask setup` installs the eBPF toolchain"
            );
            fs::copy(PREBUILT, out.join("allocprof-ebpf"))
                .unwrap_or_else(|e| panic!("copying {PREBUILT}: {e}"));
        }
    }
}

fn generate_pprof_types() {
    println!("cargo:rerun-if-changed={PROFILE_PROTO}");
    let descriptors = protox::compile([PROFILE_PROTO], ["proto"])
        .unwrap_or_else(|e| panic!("compiling {PROFILE_PROTO}: {e}"));
    prost_build::Config::new()
        .compile_fds(descriptors)
        .unwrap_or_else(|e| panic!("generating the pprof types: {e}"));
}

/// Messages only (no gRPC service code), nested by package in one
/// `opentelemetry.rs` (the packages refer to each other by relative paths).
fn generate_otlp_types() {
    println!("cargo:rerun-if-changed=proto/opentelemetry");
    let descriptors = protox::compile([OTLP_PROTO], ["proto"])
        .unwrap_or_else(|e| panic!("compiling {OTLP_PROTO}: {e}"));
    prost_build::Config::new()
        .include_file("opentelemetry.rs")
        .compile_fds(descriptors)
        .unwrap_or_else(|e| panic!("generating the OTLP types: {e}"));
}

/// The `channel` of the eBPF crate's toolchain file (xtask checks its form).
fn pinned_nightly() -> String {
    let text = fs::read_to_string(NIGHTLY_FILE).unwrap_or_else(|e| panic!("{NIGHTLY_FILE}: {e}"));
    let channel = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel = \""));
    let channel = channel.and_then(|c| c.split('"').next());
    channel
        .unwrap_or_else(|| panic!("{NIGHTLY_FILE} names no channel"))
        .to_owned()
}

/// What of the eBPF toolchain is missing, if anything.
fn ebpf_toolchain_missing(nightly: &str) -> Option<String> {
    let sysroot = Command::new("rustup")
        .args(["run", nightly, "rustc", "--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success());
    let Some(sysroot) = sysroot else {
        return Some(format!("{nightly} is not installed"));
    };
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    if !sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        return Some(format!("{nightly} has no rust-src"));
    }
    let linker = env::var_os("PATH")
        .and_then(|paths| env::split_paths(&paths).find(|dir| dir.join("bpf-linker").is_file()));
    if linker.is_none() {
        return Some("bpf-linker is not installed".into());
    }
    None
}

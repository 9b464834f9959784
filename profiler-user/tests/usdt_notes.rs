//! USDT discovery on real binaries: `tests/fixtures/usdt_*.c` compiled by gcc
//! at test time against <sys/sdt.h>, as a non-PIE executable, a PIE, a
//! shared library and a stripped PIE. `readelf -n` is the oracle for the
//! notes; the file's own bytes are the oracle for the offsets.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use allocprof::process::usdt::{
    ArgError, NoteError, UsdtProbe, parse_args, probes_in_elf, probes_in_file,
};
use profiler_common::{UsdtArgKind, UsdtSpec};
use proptest::prelude::*;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// (variant, gcc flags, link the `main` object).
const VARIANTS: &[(&str, &[&str], bool)] = &[
    ("exec", &["-no-pie"], true),
    ("pie", &["-pie", "-fPIE"], true),
    ("shared", &["-shared", "-fPIC"], false),
    // Text at a vaddr far from its file offset.
    (
        "exec-2m-pages",
        &[
            "-no-pie",
            "-Wl,-z,max-page-size=0x200000",
            "-Wl,-z,separate-code",
        ],
        true,
    ),
];

/// Every fixture binary, built once per test run: (variant, path).
fn binaries() -> &'static [(String, PathBuf)] {
    static BUILT: OnceLock<Vec<(String, PathBuf)>> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("usdt-fixtures");
        std::fs::create_dir_all(&dir).unwrap();
        let mut built = Vec::new();
        for (variant, flags, with_main) in VARIANTS {
            let out = dir.join(variant);
            let mut args: Vec<String> = ["-O2", "-g0", "-o"].map(String::from).to_vec();
            args.push(out.display().to_string());
            args.extend(flags.iter().map(|f| f.to_string()));
            let sources: &[&str] = if *with_main {
                &["usdt_probes.c", "usdt_gated.c", "usdt_main.c"]
            } else {
                &["usdt_probes.c", "usdt_gated.c"]
            };
            args.extend(sources.iter().map(|s| format!("{FIXTURES}/{s}")));
            gcc(&args);
            built.push((variant.to_string(), out));
        }
        // Stripping keeps SHT_NOTE sections, .stapsdt.base included.
        let stripped = dir.join("pie-stripped");
        std::fs::copy(dir.join("pie"), &stripped).unwrap();
        run(
            "strip",
            &["--strip-all".into(), stripped.display().to_string()],
        );
        built.push(("pie-stripped".into(), stripped));
        built
    })
}

fn gcc(args: &[String]) {
    let out = Command::new("gcc").args(args).output().unwrap_or_else(|e| {
        panic!("cannot run gcc ({e}): these tests compile USDT fixtures; install gcc and systemtap-sdt-dev")
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("sys/sdt.h"),
        "<sys/sdt.h> is missing: install the systemtap-sdt-dev package \
         (apt-get install systemtap-sdt-dev)\n{stderr}"
    );
    assert!(out.status.success(), "gcc {args:?} failed:\n{stderr}");
}

fn run(program: &str, args: &[String]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} ({e}): install binutils"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// One probe as `readelf -n` prints it.
#[derive(Debug, Default, PartialEq)]
struct Readelf {
    provider: String,
    name: String,
    pc: u64,
    semaphore: u64,
    args: String,
}

fn readelf_probes(path: &Path) -> Vec<Readelf> {
    let hex = |s: &str| u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).unwrap();
    let mut probes = Vec::new();
    for line in run(
        "readelf",
        &["-n".into(), "-W".into(), path.display().to_string()],
    )
    .lines()
    {
        let line = line.trim();
        // With -W the provider shares the line with the note header.
        if let Some((_, provider)) = line.split_once("Provider: ") {
            probes.push(Readelf {
                provider: provider.into(),
                ..Readelf::default()
            });
        }
        let Some(p) = probes.last_mut() else { continue };
        if let Some(name) = line.strip_prefix("Name: ") {
            p.name = name.into();
        } else if let Some(location) = line.strip_prefix("Location: ") {
            let fields: Vec<&str> = location.split(", ").collect();
            p.pc = hex(fields[0]);
            p.semaphore = hex(fields[2].trim_start_matches("Semaphore: "));
        } else if let Some(args) = line.strip_prefix("Arguments:") {
            p.args = args.trim().into();
        }
    }
    probes
}

fn probes(path: &Path) -> Vec<UsdtProbe> {
    probes_in_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn by_name(probes: &[UsdtProbe]) -> BTreeMap<&str, &UsdtProbe> {
    probes.iter().map(|p| (p.name.as_str(), p)).collect()
}

#[test]
fn probes_match_readelf() {
    for (variant, path) in binaries() {
        let ours: Vec<Readelf> = probes(path)
            .into_iter()
            .map(|p| Readelf {
                provider: p.provider,
                name: p.name,
                pc: p.pc,
                semaphore: p.semaphore,
                args: p.args,
            })
            .collect();
        assert_eq!(ours, readelf_probes(path), "{variant}");
        let mut names: Vec<_> = ours
            .iter()
            .map(|p| format!("{}:{}", p.provider, p.name))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "otel_memory:alloc",
                "otel_memory:constant",
                "otel_memory:free",
                "otel_memory:gated",
                "otel_memory:global",
                "otel_memory:noargs",
                "otel_memory:small",
                "otel_memory:stack",
                "other_provider:four",
            ],
            "{variant}"
        );
    }
}

#[test]
fn file_offsets_point_at_the_probe_nop() {
    for (variant, path) in binaries() {
        let data = std::fs::read(path).unwrap();
        for p in probes(path) {
            let offset = p
                .file_offset
                .unwrap_or_else(|e| panic!("{variant} {}: {e}", p.name));
            assert_eq!(
                data[offset as usize], 0x90,
                "{variant} {}: byte at {offset:#x}",
                p.name
            );
        }
    }
}

#[test]
fn semaphore_offset_points_at_the_semaphore() {
    for (variant, path) in binaries() {
        let data = std::fs::read(path).unwrap();
        for p in probes(path) {
            if p.name != "gated" {
                assert_eq!(
                    (p.semaphore, p.semaphore_offset),
                    (0, None),
                    "{variant} {}",
                    p.name
                );
                continue;
            }
            assert_ne!(p.semaphore, 0, "{variant}");
            let at = p.semaphore_offset.unwrap() as usize;
            // The fixture initialises it to 0x5a5a to be recognisable.
            assert_eq!(data[at..at + 2], [0x5a, 0x5a], "{variant}");
        }
    }
}

#[test]
fn argument_specs_compile() {
    let reg = UsdtArgKind::Reg as u8;
    let kinds_sizes_signs = |s: &UsdtSpec| -> Vec<(u8, u8, u8)> {
        s.args[..s.arg_count as usize]
            .iter()
            .map(|a| (a.kind, a.size, a.signed))
            .collect()
    };
    for (variant, path) in binaries() {
        let probes = probes(path);
        let probes = by_name(&probes);
        let spec = |name: &str| {
            probes[name]
                .spec()
                .unwrap_or_else(|e| panic!("{variant} {name}: {e}"))
        };

        assert_eq!(
            kinds_sizes_signs(&spec("alloc")),
            [(reg, 8, 0), (reg, 8, 0), (reg, 8, 1)],
            "{variant}"
        );
        assert_eq!(kinds_sizes_signs(&spec("free")), [(reg, 8, 0)], "{variant}");
        assert_eq!(
            kinds_sizes_signs(&spec("small")),
            [(reg, 1, 1), (reg, 2, 0), (reg, 4, 1)],
            "{variant}"
        );
        assert_eq!(
            kinds_sizes_signs(&spec("gated")),
            [(reg, 8, 1)],
            "{variant}"
        );
        assert_eq!(spec("noargs").arg_count, 0, "{variant}");

        let constant = spec("constant");
        assert_eq!(constant.arg_count, 2);
        for (arg, value) in constant.args.iter().zip([42, -1]) {
            assert_eq!(
                (arg.kind, arg.value, arg.size, arg.signed),
                (UsdtArgKind::Const as u8, value, 4, 1)
            );
        }

        // -O0: both from the frame, `-8@-8(%rbp) -4@-12(%rbp)` or similar.
        let stack = spec("stack");
        assert_eq!(stack.arg_count, 2, "{variant}");
        for (arg, size) in stack.args.iter().zip([8, 4]) {
            assert_eq!(
                (arg.kind, arg.reg_offset, arg.size, arg.signed),
                (UsdtArgKind::RegDeref as u8, 32, size, 1)
            );
            assert!(arg.value < 0, "{variant}: {arg:?}");
        }

        // Four arguments in the note, three compiled.
        assert_eq!(probes["four"].args.split(' ').count(), 4);
        assert_eq!(spec("four").arg_count, 3, "{variant}");

        // A global: RIP-relative in executables (unsupported, but the note
        // and the other probes are fine), through the GOT in a library.
        match probes["global"].spec() {
            Ok(spec) => assert_eq!(spec.args[0].kind, UsdtArgKind::RegDeref as u8, "{variant}"),
            Err(ArgError::Unsupported { what, .. }) => {
                assert_eq!(what, "RIP-relative", "{variant}")
            }
            Err(e) => panic!("{variant}: {e}"),
        }
    }
}

/// What prelink does: moves the image by `delta` without touching the
/// (unallocated) notes, so they hold stale pc, base and semaphore. The
/// `.stapsdt.base` adjustment must recover the moved addresses. Simulated by
/// shifting the notes' addresses by `-delta` instead.
#[test]
fn stapsdt_base_undoes_a_prelink_shift() {
    let delta = 0x10_0000u64;
    for (variant, path) in binaries() {
        let original = probes(path);
        let mut data = std::fs::read(path).unwrap();
        for p in &original {
            // The descriptor: pc, base, semaphore, provider, name.
            let tail = [p.provider.as_bytes(), b"\0", p.name.as_bytes(), b"\0"].concat();
            let hits: Vec<usize> = (0..data.len().saturating_sub(24 + tail.len()))
                .filter(|&i| {
                    data[i..i + 8] == p.pc.to_le_bytes()
                        && data[i + 16..i + 24] == p.semaphore.to_le_bytes()
                        && data[i + 24..].starts_with(&tail)
                })
                .collect();
            assert_eq!(
                hits.len(),
                1,
                "{variant} {}: descriptor found at {hits:x?}",
                p.name
            );
            for field in [hits[0], hits[0] + 8, hits[0] + 16] {
                let value = u64::from_le_bytes(data[field..field + 8].try_into().unwrap());
                if value != 0 {
                    data[field..field + 8]
                        .copy_from_slice(&value.wrapping_sub(delta).to_le_bytes());
                }
            }
        }
        assert_eq!(probes_in_elf(&data).unwrap(), original, "{variant}");
    }
}

#[test]
fn object_files_and_missing_files_are_errors() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("usdt-fixtures");
    std::fs::create_dir_all(&dir).unwrap();
    let object = dir.join("probes.o");
    gcc(&[
        "-c".into(),
        "-o".into(),
        object.display().to_string(),
        format!("{FIXTURES}/usdt_probes.c"),
    ]);
    // Relocatable: the note addresses are not final.
    assert!(matches!(
        probes_in_file(&object),
        Err(NoteError::Unsupported {
            what: "type",
            value: 1
        })
    ));
    let missing = dir.join("does-not-exist");
    let err = probes_in_file(&missing).unwrap_err();
    assert!(matches!(err, NoteError::Io { .. }), "{err}");
    assert!(err.to_string().contains("does-not-exist"), "{err}");
    assert!(matches!(
        probes_in_file(Path::new(FIXTURES)),
        Err(NoteError::Io { .. })
    ));
}

/// Real-world notes from Debian packages: python3 (probes with semaphores)
/// and libstdc++ (C++ runtime probes) parse, every probe locates, and every
/// argument string compiles or is a form we report as unsupported.
#[test]
fn debian_binaries_with_probes_parse() {
    for (path, package) in [
        ("/usr/bin/python3.11", "python3.11-minimal"),
        ("/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "libstdc++6"),
    ] {
        let path = Path::new(path);
        assert!(
            path.exists(),
            "{} missing: apt-get install {package}",
            path.display()
        );
        let probes = probes_in_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!probes.is_empty(), "{} has USDT probes", path.display());
        for p in &probes {
            assert!(p.file_offset.is_ok(), "{} {p:?}", path.display());
            match parse_args(&p.args) {
                Ok(_) | Err(ArgError::Unsupported { .. }) => {}
                Err(e) => panic!("{} {}:{}: {e}", path.display(), p.provider, p.name),
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn mutated_real_binaries_never_panic(
        // Not the 6 MiB 2 MiB-page variant (index 3): mostly padding, slow.
        which in 0..3usize,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
        words in prop::collection::vec((any::<prop::sample::Index>(), any::<u32>()), 0..4),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let mut data = std::fs::read(&binaries()[which].1).unwrap();
        for (at, byte) in edits {
            let i = at.index(data.len());
            data[i] = byte;
        }
        for (at, word) in words {
            let i = at.index(data.len() - 4);
            data[i..i + 4].copy_from_slice(&word.to_le_bytes());
        }
        if let Some(cut) = cut {
            data.truncate(cut.index(data.len()));
        }
        if let Ok(probes) = probes_in_elf(&data) {
            for p in probes {
                if let Ok(offset) = p.file_offset {
                    prop_assert!(offset < data.len() as u64);
                }
                let _ = p.spec();
            }
        }
    }
}

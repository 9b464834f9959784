//! Builds the mimalloc inside `liballocprof.so` from the source vendored in
//! `libmimalloc-sys` (found through its `links = "mimalloc"` metadata,
//! `DEP_MIMALLOC_INCLUDE_DIR`), with that crate's flags and defines, plus
//! one change: mimalloc's OS primitives (`_mi_prim_*`) and its generic
//! allocation path keep C's errno semantics themselves
//! (`c/mimalloc_errno.c`), so the exported `malloc`/`free` need nothing
//! around mimalloc's fast paths; they are `c/entries.c`, appended to the
//! same unity file so that those fast paths are inlined into them, and
//! exported through `--defsym` (see the end of `main`).
//!
//! The unity file is `static.c` (libmimalloc-sys's single translation
//! unit) with the definitions in `page.c` and `prim/prim.c` renamed to
//! `allocprof_raw_*`; call sites compiled before them keep the original
//! names, which the glue then defines. The build fails if `static.c` no
//! longer includes those files or prim.h declares primitives the glue does
//! not wrap (a mimalloc update must be looked at, not silently built).
//!
//! libmimalloc-sys's own archive is not linked: no Rust code in this crate
//! names the crate (rustc links only crates that are used), so its symbols
//! cannot clash with ours.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;

fn main() {
    let include = PathBuf::from(
        env::var("DEP_MIMALLOC_INCLUDE_DIR").expect("libmimalloc-sys exports its include dir"),
    );
    let src = include.parent().expect("include/ has a parent").join("src");
    let c_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("c");
    let glue = c_dir.join("mimalloc_errno.c");
    let entries = c_dir.join("entries.c");
    println!("cargo:rerun-if-changed={}", glue.display());
    println!("cargo:rerun-if-changed={}", entries.display());
    println!("cargo:rerun-if-changed=build.rs");

    let glue_text = fs::read_to_string(&glue).expect("read c/mimalloc_errno.c");
    let wrapped = wrapped_prims(&glue_text);
    let prim_h = fs::read_to_string(include.join("mimalloc/prim.h")).expect("read prim.h");
    let declared = declared_prims(&prim_h);
    assert!(
        wrapped == declared,
        "mimalloc's prim.h declares the primitives {declared:?} but c/mimalloc_errno.c wraps \
         {wrapped:?}: every primitive must run with errno preserved (see that file)"
    );

    let static_c = fs::read_to_string(src.join("static.c")).expect("read static.c");
    let mut unity = String::new();
    let (mut saw_page, mut saw_prim) = (false, false);
    for line in static_c.lines() {
        let t = line.trim_start();
        if t.starts_with("#include \"page.c\"") {
            saw_page = true;
            unity.push_str("#define _mi_malloc_generic allocprof_raw__mi_malloc_generic\n");
            unity.push_str(line);
            unity.push_str("\n#undef _mi_malloc_generic\n");
        } else if t.starts_with("#include \"prim/prim.c\"") {
            saw_prim = true;
            for p in &declared {
                writeln!(unity, "#define {p} allocprof_raw_{p}").unwrap();
            }
            unity.push_str(line);
            unity.push('\n');
            for p in &declared {
                writeln!(unity, "#undef {p}").unwrap();
            }
        } else {
            unity.push_str(line);
            unity.push('\n');
        }
    }
    assert!(
        saw_page && saw_prim,
        "libmimalloc-sys's static.c no longer includes page.c and prim/prim.c: review build.rs"
    );
    writeln!(unity, "#include \"{}\"", glue.display()).unwrap();
    writeln!(unity, "#include \"{}\"", entries.display()).unwrap();
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("mimalloc_allocprof.c");
    fs::write(&out, unity).expect("write the unity file");

    // The flags and defines of libmimalloc-sys 0.1.49's build.rs for our
    // features (v2; no override, secure, debug or local-dynamic TLS).
    let cargo_debug = env::var("DEBUG").is_ok_and(|v| v == "true" || v == "1");
    let mut build = cc::Build::new();
    build
        .file(&out)
        .include(&include)
        .include(&src)
        .flag("-Wno-error=date-time")
        .flag_if_supported("-ftls-model=initial-exec")
        .define("MI_DEBUG", "0")
        // Commit arena memory as segments need it, not the whole 1 GiB arena
        // at once (mimalloc's default where the kernel overcommits): eager
        // commit made Debian's python3 and sqlite3 7-20% slower here
        // (docs/benchmarks.md, "The backend's arena commit").
        .define("MI_DEFAULT_ARENA_EAGER_COMMIT", "0");
    if !cargo_debug {
        build
            .define("MI_BUILD_RELEASE", None)
            .define("NDEBUG", None);
    }
    build.compile("allocprof_mimalloc");

    // The exported `malloc` and `free` are the C functions of c/entries.c,
    // mimalloc's fast paths inlined: rustc's version script exports only
    // symbols Rust defines, so the Rust entries (`export_c_allocator!`)
    // keep the names exported and these assignments, which take precedence
    // over the Rust definitions, give the names the C functions' addresses.
    for (name, c_fn) in [
        ("malloc", "allocprof_mimalloc_malloc"),
        ("free", "allocprof_mimalloc_free"),
    ] {
        println!("cargo:rustc-cdylib-link-arg=-Wl,--defsym={name}={c_fn}");
    }
}

/// `_mi_prim_*` names wrapped by the glue (`ALLOCPROF_WRAP(type, name, ...`
/// and `ALLOCPROF_WRAP_VOID(name, ...`), sorted.
fn wrapped_prims(glue: &str) -> Vec<String> {
    let mut names: Vec<String> = glue
        .lines()
        .filter_map(|l| {
            // A wrapper written out: `int _mi_prim_alloc(...) {` at the
            // start of a line.
            if let Some(def) = l.strip_prefix("int _mi_prim_") {
                return Some(format!("_mi_prim_{}", def.split('(').next()?.trim()));
            }
            let rest = l.strip_prefix("ALLOCPROF_WRAP_VOID(").or_else(|| {
                l.strip_prefix("ALLOCPROF_WRAP(")?
                    .split_once(',')
                    .map(|x| x.1)
            })?;
            Some(rest.split(',').next()?.trim().to_string())
        })
        .collect();
    names.sort();
    names
}

/// The non-inline `_mi_prim_*` functions prim.h declares, sorted.
fn declared_prims(prim_h: &str) -> Vec<String> {
    let mut names: Vec<String> = prim_h
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            !t.starts_with("static") && !t.starts_with("//") && !t.starts_with('#')
        })
        .filter_map(|l| {
            let at = l.find("_mi_prim_")?;
            let name: String = l[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let after = l[at + name.len()..].trim_start();
            (after.starts_with('(') && l.trim_end().ends_with(';')).then_some(name)
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

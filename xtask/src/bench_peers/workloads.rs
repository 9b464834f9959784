//! The workloads of `cargo xtask bench peers`: two synthetic churns and three
//! real programs. Each waits for its input on stdin before it allocates, so
//! that a profiler can attach to it first; it is timed from the moment its
//! input is written until it exits.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use crate::shell;

/// One way to run a workload: the program, its arguments, what it is fed.
pub struct Invocation {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub input: Vec<u8>,
}

/// The workload of the attached/unattached target.
pub const CHURN_2T: &str = "churn, 2 threads";

pub struct Workload {
    pub name: &'static str,
    /// A synthetic churn (else a real program, which the ≤ 1.02 target is for).
    pub churn: bool,
    /// The program's normal allocator, the baseline of its ratios.
    pub baseline: &'static str,
    /// At full size, for the allocators and allocprof.
    pub full: Invocation,
    /// Scaled down, for the tools that intercept every malloc and free
    /// (heaptrack, bpftrace), measured against the baseline at that size.
    pub small: Invocation,
    /// How much smaller `small` is, in words.
    pub scale: String,
}

/// Sizes: (churn steps per thread, python3 steps, sqlite3 rows, cc1 functions).
struct Sizes {
    churn: u64,
    python: u64,
    rows: u64,
    functions: u64,
}

const FULL: Sizes = Sizes {
    // About 2 s with mimalloc, as long as the real programs: at 0.4 s the
    // attached ratio was mostly allocprof's start-up (symbolizing libc's
    // debug info, ≈ 30 ms of its CPU on the same 2 cores) and the rounds'
    // spread (±6%, the CPU clock's 10 ms ticks), not the per-sample cost.
    churn: 150_000_000,
    python: 300_000,
    rows: 1_000_000,
    functions: 400,
};
const QUICK: Sizes = Sizes {
    churn: 5_000_000,
    python: 60_000,
    rows: 200_000,
    functions: 100,
};
/// The slow tools' sizes are these fractions of the full ones.
const SMALL_DIV: Sizes = Sizes {
    churn: 100,
    python: 10,
    rows: 10,
    functions: 4,
};

/// Builds what the workloads need under `dir` and describes them.
pub fn all(root: &Path, dir: &Path, quick: bool) -> Result<Vec<Workload>> {
    let sizes = if quick { QUICK } else { FULL };
    let churn = dir.join("peers_churn");
    shell::run(
        root,
        "gcc",
        &[
            "-O2",
            "-pthread",
            "-o",
            &churn.to_string_lossy(),
            &root.join("xtask/bench/peers_churn.c").to_string_lossy(),
        ],
    )?;
    let script = root.join("xtask/bench/peers_alloc.py");
    let cc1 = cc1()?;
    let asm = dir.join("generated.s").to_string_lossy().into_owned();
    let churn_run = |threads: &str, steps: u64| Invocation {
        program: churn.clone(),
        args: vec![threads.into(), steps.to_string()],
        input: b"go\n".to_vec(),
    };
    let python = |steps: u64| Invocation {
        program: "/usr/bin/python3".into(),
        args: vec![script.to_string_lossy().into_owned(), steps.to_string()],
        input: b"go\n".to_vec(),
    };
    let sqlite = |rows: u64| Invocation {
        program: "/usr/bin/sqlite3".into(),
        args: vec![":memory:".into()],
        input: sql(rows).into_bytes(),
    };
    let compile = |functions: u64| Invocation {
        program: cc1.clone(),
        args: ["-quiet", "-O2", "-", "-o", &asm]
            .map(String::from)
            .to_vec(),
        input: c_source(functions).into_bytes(),
    };
    let times = |d: u64| format!("1/{d}");
    Ok(vec![
        Workload {
            name: CHURN_2T,
            churn: true,
            baseline: "glibc",
            full: churn_run("2", sizes.churn),
            small: churn_run("2", sizes.churn / SMALL_DIV.churn),
            scale: times(SMALL_DIV.churn),
        },
        Workload {
            name: "churn, 1 thread",
            churn: true,
            baseline: "glibc",
            full: churn_run("1", sizes.churn),
            small: churn_run("1", sizes.churn / SMALL_DIV.churn),
            scale: times(SMALL_DIV.churn),
        },
        Workload {
            name: "python3 script",
            churn: false,
            baseline: "glibc (+ pymalloc)",
            full: python(sizes.python),
            small: python(sizes.python / SMALL_DIV.python),
            scale: times(SMALL_DIV.python),
        },
        Workload {
            name: "sqlite3 insert + query",
            churn: false,
            baseline: "glibc",
            full: sqlite(sizes.rows),
            small: sqlite(sizes.rows / SMALL_DIV.rows),
            scale: times(SMALL_DIV.rows),
        },
        Workload {
            name: "gcc -O2 (cc1)",
            churn: false,
            baseline: "glibc",
            full: compile(sizes.functions),
            small: compile(sizes.functions / SMALL_DIV.functions),
            scale: times(SMALL_DIV.functions),
        },
    ])
}

/// gcc's compiler proper: `gcc -O2 -c` runs it as a child, which per-process
/// tools (`--pid`, heaptrack, bpftrace `-p`) would not see, so it is run
/// directly, reading the source from stdin and writing assembly.
fn cc1() -> Result<PathBuf> {
    let out = std::process::Command::new("gcc")
        .arg("-print-prog-name=cc1")
        .output()
        .context("gcc -print-prog-name=cc1")?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !path.is_absolute() || !path.exists() {
        bail!("gcc names no cc1 ({})", path.display());
    }
    Ok(path)
}

/// Inserts `rows` rows into an in-memory table, indexes them and queries
/// them (aggregates, a grouping, a scan, a sort).
fn sql(rows: u64) -> String {
    format!(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, v REAL);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {rows})
INSERT INTO t SELECT x, printf('row-%08x-%d', (x * 2654435761) % 4294967296, x % 977), x * 0.5 FROM c;
CREATE INDEX t_name ON t(name);
SELECT count(*), sum(length(name)), avg(v) FROM t;
SELECT substr(name, 5, 2) AS p, count(*), max(v) FROM t GROUP BY p ORDER BY 2 DESC LIMIT 3;
SELECT count(*) FROM t WHERE name LIKE '%-42';
SELECT length(group_concat(name)) FROM (SELECT name FROM t ORDER BY v DESC LIMIT 1000);
"
    )
}

/// A C file of `functions` functions with loops, branches and a struct
/// each: enough for -O2 to work at.
fn c_source(functions: u64) -> String {
    let mut s = String::new();
    for i in 0..functions {
        let n = 4 + i % 13;
        let _ = write!(
            s,
            "struct s{i} {{ int a[{n}]; double d; struct s{i} *next; }};
static double f{i}(struct s{i} *p, int n) {{
    double acc = {i}.0;
    for (int k = 0; k < n; k++) {{
        for (int j = 0; j < {n}; j++) acc += p->a[j] * (k ^ j) + p->d / (j + 1);
        if (acc > {lim}) acc = acc / 3 - p->a[k % {n}];
        switch ((k + {i}) % 5) {{
        case 0: acc += 1; break;
        case 1: acc *= 1.01; break;
        case 2: p = p->next ? p->next : p; break;
        default: acc -= k;
        }}
    }}
    return acc;
}}
double g{i}(struct s{i} *p) {{ return f{i}(p, {m}) + f{i}(p, 5); }}
",
            lim = 1000 + i,
            m = i % 17 + 3,
        );
    }
    s
}

/// Where the workloads' files go.
pub fn dir(root: &Path) -> Result<PathBuf> {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("bench-peers");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

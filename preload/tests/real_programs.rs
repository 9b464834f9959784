//! Real programs from Debian packages give identical output with and
//! without the library, at the default rate and at ALLOCPROF_RATE=4k, for
//! both backends.

mod common;

use std::path::Path;
use std::process::Command;

use common::{BACKENDS, BARE, Mode, apply, preloaded, require_tool, run_ok, scratch_dir};

fn modes() -> Vec<Mode> {
    let mut m = Vec::new();
    for b in BACKENDS {
        m.push(preloaded(b, None));
        m.push(preloaded(b, Some("4k")));
    }
    m
}

/// Run `make()` bare and under every mode; all stdout must match.
fn same_output(what: &str, make: impl Fn() -> Command) {
    let reference = run_ok(apply(&mut make(), BARE), what).stdout;
    assert!(!reference.is_empty(), "{what}: empty reference output");
    for mode in modes() {
        let out = run_ok(apply(&mut make(), mode), &format!("{what} {mode:?}")).stdout;
        assert!(
            out == reference,
            "{what}: output differs under {mode:?}\n--- bare\n{}\n--- preloaded\n{}",
            String::from_utf8_lossy(&reference),
            String::from_utf8_lossy(&out)
        );
    }
}

#[test]
fn python3_script() {
    // Debian's interpreter, not a pyenv shim (which would exec a wrapper).
    let python = Path::new("/usr/bin/python3");
    assert!(python.exists(), "install it with `apt-get install python3`");
    let script = r#"
import collections, json, re, hashlib
words = [("w%d" % (i * 7919 % 10007)) * (i % 13 + 1) for i in range(60000)]
counts = collections.Counter(w[:4] for w in words)
blob = json.dumps({"counts": counts.most_common(20), "n": len(words)}, sort_keys=True)
big = [bytes(range(256)) * (i % 50 + 1) for i in range(3000)]
print(blob)
print(hashlib.sha256(b"".join(big)).hexdigest())
print(sum(len(m.group(0)) for m in re.finditer(r"w1\d+", " ".join(words))))
d = {i: list(range(i % 100)) for i in range(20000)}
print(sum(map(len, d.values())))
"#;
    same_output("python3", || {
        let mut c = Command::new(python);
        c.args(["-c", script]);
        c
    });
}

#[test]
fn sqlite3_on_generated_database() {
    require_tool("sqlite3", "sqlite3");
    let dir = scratch_dir("sqlite");
    let db = dir.join("t.db");
    let setup = "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, v REAL);
        WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 50000)
        INSERT INTO t SELECT x, printf('name-%d-%s', x % 977, hex(x * 31)), x * 0.5 FROM c;
        CREATE INDEX t_name ON t(name);";
    run_ok(Command::new("sqlite3").arg(&db).arg(setup), "sqlite3 setup");
    let query =
        "SELECT substr(name, 1, 8), count(*), sum(v) FROM t GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 50;
        SELECT group_concat(name, ',') FROM (SELECT name FROM t ORDER BY name LIMIT 2000);
        SELECT count(*) FROM t a JOIN t b ON a.name = b.name WHERE a.id < 3000;";
    same_output("sqlite3", || {
        let mut c = Command::new("sqlite3");
        c.arg(&db).arg(query);
        c
    });
}

#[test]
fn git_on_a_repository() {
    require_tool("git", "git");
    let dir = scratch_dir("git");
    let git = |args: &[&str]| {
        let mut c = Command::new("git");
        c.current_dir(&dir)
            .args(args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.com")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.com")
            .env("GIT_AUTHOR_DATE", "2024-01-01T00:00:00Z")
            .env("GIT_COMMITTER_DATE", "2024-01-01T00:00:00Z")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", &dir);
        c
    };
    run_ok(&mut git(&["init", "-q", "-b", "main"]), "git init");
    for i in 0..30 {
        let body: String = (0..200)
            .map(|l| format!("line {l} of commit {i}\n"))
            .collect();
        std::fs::write(dir.join(format!("f{}.txt", i % 7)), body).unwrap();
        run_ok(&mut git(&["add", "-A"]), "git add");
        run_ok(
            &mut git(&["commit", "-q", "-m", &format!("commit {i}")]),
            "git commit",
        );
    }
    std::fs::write(dir.join("untracked.txt"), "x").unwrap();
    std::fs::write(dir.join("f1.txt"), "changed").unwrap();
    same_output("git log", || {
        git(&["log", "--stat", "-p", "--format=%H %s"])
    });
    same_output("git status", || {
        git(&["status", "--porcelain=v2", "--untracked-files=all"])
    });
}

#[test]
fn gcc_compiling_a_file() {
    require_tool("gcc", "gcc");
    let dir = scratch_dir("gcc");
    let src = dir.join("prog.c");
    let mut code = String::from("#include <stdio.h>\n#include <stdlib.h>\n");
    for i in 0..300 {
        code += &format!(
            "static int f{i}(int x) {{ int a[{n}]; for (int j = 0; j < {n}; j++) a[j] = x * j + {i}; return a[x % {n}]; }}\n",
            n = i % 17 + 2
        );
    }
    code += "int main(int c, char **v) { (void)v; int s = 0;\n";
    for i in 0..300 {
        code += &format!("s += f{i}(c + {i});\n");
    }
    code += "printf(\"%d\\n\", s); return 0; }\n";
    std::fs::write(&src, code).unwrap();
    // Assembly on stdout: deterministic and covers cc1's allocations.
    same_output("gcc -S", || {
        let mut c = Command::new("gcc");
        c.args(["-O2", "-S", "-o", "-", "-frandom-seed=1"])
            .arg(&src);
        c
    });
}

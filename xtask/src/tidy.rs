//! Docs that cannot drift: every source file of the workspace is named in
//! ARCHITECTURE.md's code map (a module by its file name, a `mod.rs` by its
//! directory), so a new module cannot land undocumented; and a module of
//! one of `profiler-user`'s groups (`process/`, `kernel/`, …) under its
//! group's heading, so the code map shows the architecture `lib.rs` declares.

use std::{fs, path::Path};

use crate::workspace_root;

fn source_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            source_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// How the code map names a file: `name.rs`, or `dir/` for `dir/mod.rs`.
fn code_map_name(file: &Path) -> Option<String> {
    let name = file.file_name()?.to_str()?;
    match name {
        // Crate roots are named by their crate's heading.
        "lib.rs" | "main.rs" => None,
        "mod.rs" => Some(format!("{}/", file.parent()?.file_name()?.to_str()?)),
        _ => Some(name.to_owned()),
    }
}

#[test]
fn every_source_file_is_in_the_code_map() {
    let root = workspace_root();
    let map = fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let mut files = Vec::new();
    for entry in fs::read_dir(&root).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            source_files(&src, &mut files);
        }
    }
    assert!(files.len() > 20, "found only {} source files", files.len());
    let missing: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let name = code_map_name(f)?;
            (!map.contains(&format!("`{name}`")) && !map.contains(&format!("{name}`")))
                .then(|| format!("{} (as `{name}`)", f.strip_prefix(&root).unwrap().display()))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's code map does not name: {missing:#?}"
    );
}

#[test]
fn code_map_names_follow_the_file_layout() {
    assert_eq!(
        code_map_name(Path::new("a/src/x/mod.rs")).as_deref(),
        Some("x/")
    );
    assert_eq!(
        code_map_name(Path::new("a/src/x/y.rs")).as_deref(),
        Some("y.rs")
    );
    assert_eq!(code_map_name(Path::new("a/src/lib.rs")), None);
}

/// The text under each `#### `group/`…` heading of the code map, by group.
fn group_sections(map: &str) -> Vec<(String, String)> {
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in map.lines() {
        if let Some(title) = line.strip_prefix("#### ") {
            let group = title.split('`').nth(1).unwrap_or_default().to_owned();
            sections.push((group, String::new()));
        } else if line.starts_with("#") || line.starts_with("The binary") {
            sections.push((String::new(), String::new()));
        } else if let Some((_, text)) = sections.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    sections.retain(|(group, _)| group.ends_with('/'));
    sections
}

#[test]
fn each_profiler_user_group_s_modules_are_under_its_heading() {
    let root = workspace_root();
    let map = fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let sections = group_sections(&map);
    let src = root.join("profiler-user/src");
    let mut checked = 0;
    let mut missing = Vec::new();
    for entry in fs::read_dir(&src).unwrap() {
        let dir = entry.unwrap().path();
        let group = format!("{}/", dir.file_name().unwrap().to_str().unwrap());
        let Some((_, text)) = sections.iter().find(|(g, _)| *g == group) else {
            continue;
        };
        let mut files = Vec::new();
        source_files(&dir, &mut files);
        for file in files {
            let Some(name) = code_map_name(&file) else {
                continue;
            };
            checked += 1;
            if !text.contains(&format!("`{name}`")) && !text.contains(&format!("{name}`")) {
                missing.push(format!("{} (as `{name}`, under {group})", file.display()));
            }
        }
    }
    assert!(
        checked > 20,
        "checked only {checked} files of grouped modules"
    );
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names these outside their group's heading: {missing:#?}"
    );
}

use super::*;

#[test]
fn durations() {
    assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert!(parse_duration("0").is_err());
    assert!(parse_duration("soon").unwrap_err().contains("examples"));
}

#[test]
fn sizes_parse_with_binary_units() {
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("64MiB"), Ok(64 << 20));
    assert_eq!(parse_size("512M"), Ok(512 << 20));
    assert_eq!(parse_size("1g"), Ok(1 << 30));
    assert_eq!(parse_size("8 KiB"), Ok(8 << 10));
    for bad in ["", "0", "-1", "1T", "MiB", "99999999999999999999G"] {
        assert!(parse_size(bad).unwrap_err().contains("examples"), "{bad}");
    }
    let cli = Cli::try_parse_from(["allocprof", "diff", "a", "b"]).unwrap();
    let Some(Command::Diff(d)) = cli.command else {
        panic!("diff")
    };
    assert_eq!(d.max_profile_bytes, export::pprof::MAX_PROFILE_BYTES);
    let cli = Cli::try_parse_from(["allocprof", "-v"]).unwrap();
    assert!(cli.targets.limits().diagnostics);
    let cli = Cli::try_parse_from(["allocprof"]).unwrap();
    assert!(!cli.targets.limits().diagnostics);
    assert_eq!(
        cli.targets.max_gone_memory,
        allocprof::session::MAX_GONE_MEMORY
    );
}

#[test]
fn durations_out_of_range_are_usage_errors_not_panics() {
    use clap::error::ErrorKind;
    for s in [
        "1e30",
        "1e-10",
        "NaN",
        "inf",
        "-5",
        "0ns",
        "500us",
        "1000000000y",
    ] {
        assert!(parse_duration(s).is_err(), "{s}");
    }
    assert_eq!(parse_duration("1ms"), Ok(Duration::from_millis(1)));
    for caps in [
        ["--max-live-samples", "0"],
        ["--max-live-per-process", "0"],
        ["--max-new-stacks-per-second", "0"],
        ["--new-stacks-burst", "0"],
    ] {
        let err = Cli::try_parse_from(["allocprof", caps[0], caps[1]]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ValueValidation, "{caps:?}");
    }
    let huge = Cli::try_parse_from(["allocprof", "--max-live-samples", "4000000000"]);
    assert!(huge.is_err());
    assert_eq!(parse_duration("100y").map(|d| d <= MAX_DURATION), Ok(true));
}

#[test]
fn snapshot_names() {
    let n = |p: &str, i| numbered(std::path::Path::new(p), i);
    assert_eq!(
        n("/tmp/heap.pb.gz", 1),
        PathBuf::from("/tmp/heap.0001.pb.gz")
    );
    assert_eq!(n("heap.pprof", 12), PathBuf::from("heap.0012.pprof"));
    assert_eq!(n("heap", 3), PathBuf::from("heap.0003"));
    assert_eq!(n(".hidden", 3), PathBuf::from(".hidden.0003"));
    assert_eq!(n("h.pb.gz", 12345), PathBuf::from("h.12345.pb.gz"));
}

#[test]
fn subcommands_and_the_plain_form_parse() {
    let cli = Cli::try_parse_from(["allocprof", "--pid", "1", "-f", "svg"]).unwrap();
    assert!(cli.command.is_none());
    assert_eq!(cli.format, Format::Svg);
    let cli = Cli::try_parse_from([
        "allocprof",
        "record",
        "--pid",
        "1",
        "-d",
        "30s",
        "--interval",
        "10s",
        "-o",
        "h.pb.gz",
    ])
    .unwrap();
    let Some(Command::Record(r)) = cli.command else {
        panic!("not record")
    };
    assert_eq!(r.interval, Some(Duration::from_secs(10)));
    let cli = Cli::try_parse_from(["allocprof", "diff", "a", "b", "-f", "collapsed"]).unwrap();
    assert!(matches!(cli.command, Some(Command::Diff(d)) if d.format == DiffFormat::Collapsed));
    // Top-level options do not mix with subcommands; diff has no json.
    assert!(Cli::try_parse_from(["allocprof", "--pid", "1", "record", "-o", "x"]).is_err());
    assert!(Cli::try_parse_from(["allocprof", "diff", "a", "b", "-f", "json"]).is_err());
    assert!(Cli::try_parse_from(["allocprof", "record", "--pid", "1"]).is_err());
}

#[test]
fn agent_takes_an_endpoint_its_transport_flags_and_pushes_every_15s_by_default() {
    let agent = |args: &[&str]| {
        let mut all = vec!["allocprof", "agent"];
        all.extend(args);
        Cli::try_parse_from(all).map(|cli| match cli.command {
            Some(Command::Agent(a)) => a,
            _ => panic!("not agent"),
        })
    };
    let a = agent(&["--otlp-endpoint", "http://127.0.0.1:4318"]).unwrap();
    assert_eq!(a.push_interval, Duration::from_secs(15));
    assert_eq!(a.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4318"));
    assert_eq!(a.otlp.otlp_queue_bytes, 64 << 20);
    assert!(a.otlp.otlp_protocol.is_none() && a.otlp.otlp_header.is_empty());
    assert!(a.targets.pids.is_empty());
    let a = agent(&[
        "--otlp-endpoint",
        "http://c:4318",
        "-p",
        "7",
        "--push-interval",
        "1m",
        "--otlp-protocol",
        "grpc",
        "--otlp-header",
        "a=1",
        "--otlp-header",
        "b=2",
    ])
    .unwrap();
    assert_eq!(a.push_interval, Duration::from_secs(60));
    assert_eq!(a.otlp.otlp_protocol.as_deref(), Some("grpc"));
    assert_eq!(a.otlp.otlp_header, ["a=1", "b=2"]);
    // No endpoint: the variables', or the spec's default.
    assert!(agent(&[]).unwrap().otlp_endpoint.is_none());
    assert!(agent(&["--otlp-endpoint", "https://c:4318"]).is_ok());
    for refused in [
        &["--otlp-endpoint", "c:4318"][..],
        &["--otlp-protocol", "http/json"],
        &["--otlp-queue-bytes", "0"],
    ] {
        assert!(agent(refused).is_err(), "{refused:?}");
    }
}

#[test]
fn cli_is_consistent() {
    use clap::CommandFactory;
    Cli::command().debug_assert();
}

/// One row of an option table in docs/usage.md, or one clap argument
/// written as such a row: `-f, --format report|collapsed` | `report`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct OptionRow {
    /// The long name, or for a positional argument its value name.
    name: String,
    short: Option<char>,
    /// The value's name, or its possible values joined by `|`.
    value: String,
    /// Default values joined by `,`; empty when there is none.
    default: String,
}

/// A table's cells: split at `|` but not at `\|`, which is unescaped.
fn cells(line: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut chars = line.trim().chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cells.last_mut().unwrap().push('|');
                chars.next();
            }
            '|' => cells.push(String::new()),
            c => cells.last_mut().unwrap().push(c),
        }
    }
    // The empty text before the first and after the last `|`.
    cells.remove(0);
    cells.pop();
    cells.iter().map(|c| c.trim().to_string()).collect()
}

fn code(cell: &str) -> Option<&str> {
    cell.strip_prefix('`')?
        .strip_suffix('`')
        .filter(|c| !c.contains('`'))
}

/// `-f, --format A|B` `report` → its row; panics with the line otherwise.
fn parse_row(line: &str) -> OptionRow {
    let cells = cells(line);
    assert_eq!(cells.len(), 3, "not an option row: {line}");
    let option =
        code(&cells[0]).unwrap_or_else(|| panic!("the option is not one code span: {line}"));
    let default = if cells[1].is_empty() {
        ""
    } else {
        code(&cells[1]).unwrap_or_else(|| panic!("the default is not code: {line}"))
    };
    let (mut long, mut short, mut value) = (None, None, vec![]);
    for token in option.split_whitespace() {
        let token = token.trim_end_matches(',');
        if let Some(l) = token.strip_prefix("--") {
            assert!(long.replace(l.to_string()).is_none(), "two longs: {line}");
        } else if let Some(s) = token.strip_prefix('-') {
            let mut s = s.chars();
            let (Some(c), None) = (s.next(), s.next()) else {
                panic!("a short option is one character: {line}");
            };
            assert!(short.replace(c).is_none(), "two shorts: {line}");
        } else {
            value.push(token);
        }
    }
    let value = value.join(" ");
    OptionRow {
        name: long.unwrap_or_else(|| value.clone()),
        short,
        value,
        default: default.to_string(),
    }
}

/// The rows of docs/usage.md's option tables, by command: a table
/// belongs to every command its heading names (`allocprof`,
/// `allocprof record`). Tables under other headings are not options.
fn documented_options(doc: &str) -> std::collections::BTreeMap<String, Vec<OptionRow>> {
    let mut tables = std::collections::BTreeMap::<String, Vec<OptionRow>>::new();
    let mut commands: Vec<String> = vec![];
    for line in doc.lines() {
        if line.starts_with('#') {
            commands = line
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|c| *c == "allocprof" || c.starts_with("allocprof "))
                .map(String::from)
                .collect();
            for c in &commands {
                tables.entry(c.clone()).or_default();
            }
        } else if line.starts_with('|') && !commands.is_empty() {
            let first = cells(line).into_iter().next().unwrap_or_default();
            if first == "option" || first.starts_with("---") {
                continue;
            }
            let row = parse_row(line);
            for c in &commands {
                tables.get_mut(c).unwrap().push(row.clone());
            }
        }
    }
    tables
}

/// clap's arguments of `cmd`, written as the table writes them.
fn clap_options(cmd: &clap::Command) -> Vec<OptionRow> {
    use clap::ArgAction;
    cmd.get_arguments()
        .filter(|a| {
            !matches!(
                a.get_action(),
                ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version
            )
        })
        .map(|a| {
            let takes_values = a.get_action().takes_values();
            let possible: Vec<_> = a
                .get_possible_values()
                .iter()
                .map(|v| v.get_name().to_string())
                .collect();
            let value = if !takes_values {
                String::new()
            } else if !possible.is_empty() {
                possible.join("|")
            } else {
                let names = a.get_value_names().unwrap_or_default();
                names
                    .iter()
                    .map(|n| n.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let default = if takes_values {
                let d: Vec<_> = a
                    .get_default_values()
                    .iter()
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect();
                d.join(",")
            } else {
                String::new()
            };
            OptionRow {
                name: a.get_long().map_or_else(|| value.clone(), String::from),
                short: a.get_short(),
                value,
                default,
            }
        })
        .collect()
}

/// What differs between the documented rows and clap's, as a message.
fn table_differences(
    documented: &std::collections::BTreeMap<String, Vec<OptionRow>>,
) -> Vec<String> {
    let mut root = Cli::command();
    root.build();
    let mut commands = vec![("allocprof".to_string(), clap_options(&root))];
    for sub in root.get_subcommands().filter(|s| s.get_name() != "help") {
        commands.push((format!("allocprof {}", sub.get_name()), clap_options(sub)));
    }
    let mut problems = vec![];
    for name in documented.keys() {
        if !commands.iter().any(|(c, _)| c == name) {
            problems.push(format!(
                "docs/usage.md has options of `{name}`, no such command"
            ));
        }
    }
    for (name, clap_rows) in commands {
        let Some(doc_rows) = documented.get(&name) else {
            problems.push(format!("docs/usage.md has no option table of `{name}`"));
            continue;
        };
        for row in &clap_rows {
            match doc_rows.iter().find(|d| d.name == row.name) {
                None => problems.push(format!("`{name}`: {row:?} is not in the table")),
                Some(d) if d != row => {
                    problems.push(format!("`{name}`: the table has {d:?}, clap {row:?}"));
                }
                Some(_) => {}
            }
        }
        for d in doc_rows {
            if !clap_rows.iter().any(|r| r.name == d.name) {
                problems.push(format!("`{name}`: {d:?} in the table is no option of it"));
            }
        }
        let mut names: Vec<_> = doc_rows.iter().map(|d| &d.name).collect();
        names.sort();
        names.dedup();
        if names.len() != doc_rows.len() {
            problems.push(format!("`{name}`: an option is in the table twice"));
        }
    }
    problems
}

const USAGE: &str = include_str!("../../../docs/usage.md");

#[test]
fn the_option_tables_of_docs_usage_are_clap_s_options() {
    let documented = documented_options(USAGE);
    let problems = table_differences(&documented);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The check itself: a row taken out, a bogus row, or a wrong default
/// is found.
#[test]
fn the_option_table_check_finds_missing_bogus_and_wrong_rows() {
    let doc = USAGE;
    let without_top = doc.replace(
        "| `--top N` | `10` | stacks shown per process in the report |\n",
        "",
    );
    assert_ne!(without_top, doc, "the --top row moved: update this test");
    let problems = table_differences(&documented_options(&without_top));
    assert!(
        problems.len() == 1
            && problems[0].contains("\"top\"")
            && problems[0].contains("not in the table"),
        "{problems:?}"
    );

    let bogus = doc.replace(
        "| `--top N` |",
        "| `--bogus` | | no such option |\n| `--top N` |",
    );
    let problems = table_differences(&documented_options(&bogus));
    assert!(
        problems.len() == 1 && problems[0].contains("bogus") && problems[0].contains("no option"),
        "{problems:?}"
    );

    let wrong = doc.replace("| `--top N` | `10` |", "| `--top N` | `20` |");
    let problems = table_differences(&documented_options(&wrong));
    assert!(
        problems.len() == 1 && problems[0].contains("\"20\""),
        "{problems:?}"
    );
}

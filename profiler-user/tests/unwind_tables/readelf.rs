//! Every CFI row readelf prints is the rule our table gives at that pc (an independent decoder as the oracle).

use super::*;

/// A rule as `readelf --debug-dump=frames-interp` prints it, as our row
/// must say: (CFA rule, offset or None = any, rbp rule, rbp offset), or a
/// set of acceptable rules for the cases readelf cannot tell apart.
fn expected_rules(
    cfa: &str,
    rbp: Option<&str>,
    ra: Option<&str>,
) -> Vec<(u8, Option<i32>, u8, i16)> {
    use profiler_common::unwind::{cfa as c, rbp as b};
    let unknown = vec![(c::UNKNOWN, None, b::SAME, 0)];
    match ra {
        Some("c-8") => {}
        Some("u") => return vec![(c::END, None, b::SAME, 0)],
        _ => return unknown,
    }
    let offset_of = |s: &str, prefix: &str| s.strip_prefix(prefix)?.parse::<i64>().ok();
    let (cfa_rule, cfa_offset) = if let Some(n) = offset_of(cfa, "rsp+") {
        (c::RSP, Some(n))
    } else if let Some(n) = offset_of(cfa, "rbp+") {
        (c::RBP, Some(n))
    } else if cfa == "exp" {
        // The PLT expression, or any other: PLT or UNKNOWN (checked by the unit tests).
        (c::PLT, None)
    } else {
        return unknown;
    };
    let Some(cfa_offset) = cfa_offset.map_or(Some(None), |n| i32::try_from(n).ok().map(Some))
    else {
        return unknown;
    };
    let rbp_rules: Vec<(u8, i16)> = match rbp {
        None | Some("s") => vec![(b::SAME, 0)],
        // Unspecified (SAME) or DW_CFA_undefined (UNKNOWN): readelf prints both as "u".
        Some("u") => vec![(b::SAME, 0), (u8::MAX, 0)],
        Some(v) => match v.strip_prefix('c').and_then(|n| n.parse::<i64>().ok()) {
            Some(n) => match i16::try_from(n) {
                Ok(n) => vec![(b::AT_CFA, n)],
                Err(_) => return unknown,
            },
            None => return unknown,
        },
    };
    let mut out = Vec::new();
    for (rule, offset) in rbp_rules {
        if rule == u8::MAX {
            out.extend(unknown.iter().copied());
        } else {
            out.push((cfa_rule, cfa_offset, rule, offset));
            if cfa_rule == c::PLT {
                out.extend(unknown.iter().copied());
            }
        }
    }
    out
}

/// A CIE as readelf prints it: signal trampoline, and its initial row
/// (CFA, rbp, ra).
type Cie = (bool, Option<(String, Option<String>, Option<String>)>);

/// Every CFI row readelf prints for `path`, looked up in our table: the
/// same rule (mismatches listed). Returns the rows checked.
fn check_against_readelf(path: &Path) -> usize {
    let out = Command::new("readelf")
        .arg("--debug-dump=frames-interp")
        .arg(path)
        .output()
        .expect("readelf is needed (apt-get install binutils)");
    // readelf exits 1 on libc (a debug link it cannot follow) yet prints
    // the frames: judge it by its output.
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Contents of the .eh_frame section"),
        "readelf printed no CFI for {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let table = compile_file(path, &Limits::default()).unwrap();
    let matches = |pc: u64, cfa: &str, rbp: Option<&str>, ra: Option<&str>, signal: bool| {
        let Some(i) = profiler_common::unwind::find_row(&table.rows, pc) else {
            return Err(format!("{pc:#x}: no row"));
        };
        let row = table.rows[i];
        let ok = if signal {
            row.cfa_rule == profiler_common::unwind::cfa::UNKNOWN
        } else {
            expected_rules(cfa, rbp, ra)
                .iter()
                .any(|&(rule, offset, rbp_rule, rbp_offset)| {
                    row.cfa_rule == rule
                        && (rule == profiler_common::unwind::cfa::UNKNOWN
                            || rule == profiler_common::unwind::cfa::END
                            || (offset.is_none_or(|o| o == row.cfa_offset)
                                && row.rbp_rule == rbp_rule
                                && row.rbp_offset == rbp_offset))
                })
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{pc:#x}: readelf CFA {cfa} rbp {rbp:?} ra {ra:?} signal {signal}; ours {row:?}"
            ))
        }
    };
    // CIE offset → (signal trampoline, initial row); the FDE being read.
    let mut cies: HashMap<String, Cie> = HashMap::new();
    let mut in_cie: Option<String> = None;
    let mut fde: Option<(String, u64, u64, bool)> = None; // (cie, start, end, had rows)
    let mut columns: Vec<String> = Vec::new();
    let (mut checked, mut mismatches) = (0, Vec::new());
    let finish = |fde: &mut Option<(String, u64, u64, bool)>,
                  cies: &HashMap<String, Cie>,
                  checked: &mut usize,
                  mismatches: &mut Vec<String>| {
        // An FDE with no instructions has its CIE's initial row.
        if let Some((cie, start, end, false)) = fde.take()
            && end > start
            && let Some((signal, Some((cfa, rbp, ra)))) = cies.get(&cie)
        {
            *checked += 1;
            if let Err(e) = matches(start, cfa, rbp.as_deref(), ra.as_deref(), *signal) {
                mismatches.push(e);
            }
        }
    };
    for line in text.lines() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if tokens.len() >= 4 && tokens[3] == "CIE" {
            finish(&mut fde, &cies, &mut checked, &mut mismatches);
            let signal = tokens.get(4).is_some_and(|a| a.contains('S'));
            cies.insert(tokens[0].to_owned(), (signal, None));
            in_cie = Some(tokens[0].to_owned());
            columns.clear();
        } else if tokens.len() >= 5 && tokens[3] == "FDE" {
            finish(&mut fde, &cies, &mut checked, &mut mismatches);
            in_cie = None;
            columns.clear();
            let cie = tokens[4].trim_start_matches("cie=").to_owned();
            let (start, end) = tokens[5]
                .trim_start_matches("pc=")
                .split_once("..")
                .unwrap();
            fde = Some((
                cie,
                u64::from_str_radix(start, 16).unwrap(),
                u64::from_str_radix(end, 16).unwrap(),
                false,
            ));
        } else if tokens.first() == Some(&"LOC") {
            columns = tokens[1..].iter().map(|s| (*s).to_owned()).collect();
        } else if tokens.len() == columns.len() + 1
            && !columns.is_empty()
            && tokens[0].len() == 16
            && u64::from_str_radix(tokens[0], 16).is_ok()
        {
            let value = |name: &str| {
                columns
                    .iter()
                    .position(|c| c == name)
                    .map(|i| tokens[i + 1].to_owned())
            };
            let (cfa, rbp, ra) = (tokens[1].to_owned(), value("rbp"), value("ra"));
            if let Some(cie) = &in_cie {
                let entry = cies.get_mut(cie).unwrap();
                entry.1 = Some((cfa, rbp, ra));
            } else if let Some((cie, start, end, had_rows)) = &mut fde {
                *had_rows = true;
                let pc = u64::from_str_radix(tokens[0], 16).unwrap();
                if pc >= *start && pc < *end {
                    let signal = cies.get(cie.as_str()).is_some_and(|c| c.0);
                    checked += 1;
                    if let Err(e) = matches(pc, &cfa, rbp.as_deref(), ra.as_deref(), signal) {
                        mismatches.push(e);
                    }
                }
            }
        }
    }
    finish(&mut fde, &cies, &mut checked, &mut mismatches);
    println!(
        "{}: {checked} readelf rows checked, {} mismatches",
        path.display(),
        mismatches.len()
    );
    assert!(
        mismatches.is_empty(),
        "{}: {} of {checked} rows differ from readelf, e.g. {:#?}",
        path.display(),
        mismatches.len(),
        &mismatches[..mismatches.len().min(10)]
    );
    assert!(checked > 0);
    checked
}

#[test]
fn every_cfi_row_matches_readelf() {
    let (exe, _) = run_workload("readelf", NOFP);
    check_against_readelf(&exe);
    check_against_readelf(&fs::canonicalize("/usr/bin/python3").unwrap());
    for lib in ["libc.so.6", "libstdc++.so.6"] {
        let path = Path::new("/usr/lib/x86_64-linux-gnu").join(lib);
        check_against_readelf(&fs::canonicalize(path).unwrap());
    }
}

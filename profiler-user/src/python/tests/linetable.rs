//! The location-table decoder against the interpreter's own
//! `co_positions()` and `co_lines()`, on every instruction of many code
//! objects (nested functions, generators, comprehensions, try/except, a
//! long function, standard-library modules).

use super::{interpreters, run_script, unhex};
use crate::python::linetable::line_of;

#[test]
fn every_instruction_gets_the_interpreters_line() {
    for python in interpreters() {
        let dump: serde_json::Value =
            serde_json::from_str(&run_script(&python, "linetables.py")).expect("json");
        let codes = dump.as_array().expect("a list of code objects");
        assert!(
            codes.len() > 100,
            "{}: too few code objects",
            python.display()
        );
        let mut checked = 0;
        for code in codes {
            let name = code["name"].as_str().unwrap();
            let first = code["first"].as_i64().unwrap() as i32;
            let table = unhex(code["table"].as_str().unwrap());
            let positions = code["positions"].as_array().unwrap();
            let lines = code["lines"].as_array().unwrap();
            for (i, (position, line)) in positions.iter().zip(lines).enumerate() {
                let want = position.as_i64().map(|l| l as i32);
                assert_eq!(
                    line.as_i64().map(|l| l as i32),
                    want,
                    "the interpreter disagrees with itself"
                );
                assert_eq!(
                    line_of(&table, first, i as u32),
                    want,
                    "{}: {name}, instruction {i}",
                    python.display()
                );
                checked += 1;
            }
        }
        eprintln!(
            "{}: {} code objects, {checked} instructions",
            python.display(),
            codes.len()
        );
    }
}

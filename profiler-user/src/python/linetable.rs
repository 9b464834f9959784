//! The location table of a code object (`co_linetable`, CPython 3.11 and
//! later; the format of CPython's `Objects/locations.md`): which source
//! line each instruction comes from. Pure: the bytes come from the
//! target, so any input is decoded without panicking, in one bounded pass.
//!
//! Each entry covers 1–8 code units: its first byte has bit 7 set, the
//! entry's code in bits 3–6 and its length minus one in bits 0–2. Codes
//! 0–9 are the short form (same line, one column byte), 10–12 the one-line
//! forms (the line moves by 0, 1 or 2; two column bytes), 13 has no
//! columns (a signed varint line delta), 14 the long form (line delta,
//! end line delta, columns), 15 no location at all (the line counter stays
//! where it was).

/// The line of the instruction at `index` (in code units), for a code object
/// whose first line is `first_line`: `None` where the table says the
/// instruction has no line, or does not reach it (or is malformed before
/// it).
pub fn line_of(table: &[u8], first_line: i32, index: u32) -> Option<i32> {
    let mut line = i64::from(first_line);
    let mut at = 0usize;
    let mut unit = 0u64;
    let index = u64::from(index);
    while at < table.len() {
        let head = table[at];
        if head & 0x80 == 0 {
            return None; // not at an entry's first byte: malformed
        }
        at += 1;
        let code = (head >> 3) & 15;
        let length = u64::from(head & 7) + 1;
        let (delta, has_line) = match code {
            0..=9 => {
                at += 1;
                (0, true)
            }
            10..=12 => {
                at += 2;
                (i64::from(code) - 10, true)
            }
            13 => (signed_varint(table, &mut at)?, true),
            14 => {
                let delta = signed_varint(table, &mut at)?;
                for _ in 0..3 {
                    varint(table, &mut at)?; // end line, start and end column
                }
                (delta, true)
            }
            _ => (0, false),
        };
        line = line.checked_add(delta)?;
        if index < unit + length {
            return if has_line {
                i32::try_from(line).ok()
            } else {
                None
            };
        }
        unit += length;
    }
    None
}

/// An unsigned varint: 6 bits a byte, low first, bit 6 set on all but the
/// last (bit 7 would start an entry).
fn varint(table: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    let mut shift = 0u32;
    loop {
        let byte = *table.get(*at)?;
        if byte & 0x80 != 0 {
            return None; // the next entry began inside this varint
        }
        *at += 1;
        value |= u64::from(byte & 63).checked_shl(shift)?;
        if byte & 64 == 0 {
            return Some(value);
        }
        shift += 6;
        if shift > 60 {
            return None;
        }
    }
}

/// A signed varint: the unsigned one's low bit is the sign.
fn signed_varint(table: &[u8], at: &mut usize) -> Option<i64> {
    let raw = varint(table, at)?;
    let magnitude = (raw >> 1) as i64;
    Some(if raw & 1 != 0 { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_made_entries_of_every_form() {
        // firstlineno 10:
        let table = [
            0x80 | (14 << 3) | 1, // long form, 2 units: line +2 → 12
            4,                    // +2
            0,                    // end line delta
            5,                    // start column
            9,                    // end column
            0x80 | (11 << 3),     // one-line form, line +1 → 13, 1 unit
            1,
            4,
            0x80 | (3 << 3) | 2, // short form, same line, 3 units
            0x12,
            0x80 | (15 << 3), // no location, 1 unit
            0x80 | (13 << 3), // no columns: line -3 → 10
            7,                // -3
            0x80 | (13 << 3), // no columns: line +100 → 110
            64 | 8,           // low 6 bits 8, more
            3,                // 3 << 6 = 192: 200 → +100
        ];
        let lines: Vec<_> = (0..10).map(|i| line_of(&table, 10, i)).collect();
        assert_eq!(
            lines,
            [
                Some(12),
                Some(12),
                Some(13),
                Some(13),
                Some(13),
                Some(13),
                None,
                Some(10),
                Some(110),
                None // past the table
            ]
        );
    }

    #[test]
    fn malformed_tables_give_no_line_and_never_panic() {
        assert_eq!(line_of(&[], 1, 0), None);
        // A byte that does not start an entry.
        assert_eq!(line_of(&[0x10], 1, 0), None);
        // A varint cut short, and one that never ends.
        assert_eq!(line_of(&[0x80 | (13 << 3), 64], 1, 0), None);
        let endless: Vec<u8> = std::iter::once(0x80 | (14 << 3))
            .chain(std::iter::repeat_n(64 | 63, 100))
            .collect();
        assert_eq!(line_of(&endless, 1, 0), None);
        // Arbitrary bytes: any answer, no panic.
        let mut x = 0x1234_5678_u32;
        for _ in 0..2000 {
            let table: Vec<u8> = (0..64)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            for i in 0..40 {
                let _ = line_of(&table, i32::MAX - 3, i);
            }
        }
    }
}

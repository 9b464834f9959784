//! The kernel's stack walk over compiled tables, on the host.
//!
//! Per frame: find the mapping of `pc`, look up the row of
//! `pc − bias` (minus 1 past the first frame: a return address points after
//! its call, which may be the last instruction of a function), then
//! `cfa = (rsp | rbp) + offset` (a PLT row adds 8 once `(pc & 15) >= 11`),
//! `ra = [cfa − 8]`, `rbp = [cfa + rbp_offset]` if saved, `rsp = cfa`, `pc = ra`.
//!
//! The walk stops at an `END` row (complete), an `UNKNOWN` row or an
//! unreadable word (truncated: [`TRUNCATED_FRAME`] is appended), a return
//! address of 0 (complete), or [`MAX_STACK_DEPTH`] frames. A pc in no mapping
//! with a table gets one step by frame pointers (`ra = [rbp + 8]`,
//! `cfa = rbp + 16`, `rbp = [rbp]`), only if rbp is 8-aligned and within
//! `[rsp, rsp + 8 MiB)`, and never two such steps in a row; otherwise the
//! walk is truncated.

use profiler_common::MAX_STACK_DEPTH;
use profiler_common::unwind::{TRUNCATED_FRAME, UnwindRow, cfa, find_row, rbp};

/// The registers a walk starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regs {
    pub pc: u64,
    pub rsp: u64,
    pub rbp: u64,
}

/// An executable mapping `[start, end)` and its file's table.
#[derive(Clone, Copy, Debug)]
pub struct Mapping<'a> {
    pub start: u64,
    pub end: u64,
    /// Address − bias = the file's virtual address.
    pub bias: u64,
    pub rows: &'a [UnwindRow],
}

/// Why a walk stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// An `END` row: the outermost frame.
    End,
    /// A return address of 0.
    ZeroReturn,
    /// No rule for a pc (`UNKNOWN`, no row, a failed frame-pointer step) or
    /// an unreadable word; [`TRUNCATED_FRAME`] was appended.
    Truncated,
    /// [`MAX_STACK_DEPTH`] frames.
    MaxDepth,
}

/// The frames of a walk, innermost first, and why it stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Walk {
    pub frames: Vec<u64>,
    pub stop: Stop,
}

/// Largest distance from rsp to a frame pointer the fallback trusts.
const FP_WINDOW: u64 = 8 << 20;

/// Walks the stack from `regs`; `mappings` sorted by start, not overlapping;
/// `read_u64` reads the target's memory.
pub fn unwind(regs: Regs, mappings: &[Mapping<'_>], read_u64: impl Fn(u64) -> Option<u64>) -> Walk {
    let Regs {
        mut pc,
        mut rsp,
        mut rbp,
    } = regs;
    let mut frames = Vec::new();
    let mut fp_step_before = false;
    let stop = loop {
        if frames.len() == MAX_STACK_DEPTH {
            break Stop::MaxDepth;
        }
        frames.push(pc);
        let i = mappings.partition_point(|m| m.start <= pc);
        let mapping = i
            .checked_sub(1)
            .map(|i| &mappings[i])
            .filter(|m| pc < m.end);
        let step = match mapping {
            Some(m) => {
                fp_step_before = false;
                let lookup = pc
                    .wrapping_sub(m.bias)
                    .wrapping_sub(u64::from(frames.len() > 1));
                match find_row(m.rows, lookup).map(|r| m.rows[r]) {
                    None => None,
                    Some(row) => match row.cfa_rule {
                        cfa::END => break Stop::End,
                        cfa::RSP | cfa::RBP | cfa::PLT => table_step(row, pc, rsp, rbp, &read_u64),
                        _ => None,
                    },
                }
            }
            None if !fp_step_before => {
                fp_step_before = true;
                fp_step(rsp, rbp, &read_u64)
            }
            None => None,
        };
        let Some((ra, cfa, new_rbp)) = step else {
            if frames.len() < MAX_STACK_DEPTH {
                frames.push(TRUNCATED_FRAME);
            }
            break Stop::Truncated;
        };
        if ra == 0 {
            break Stop::ZeroReturn;
        }
        (pc, rsp, rbp) = (ra, cfa, new_rbp);
    };
    Walk { frames, stop }
}

/// (return address, CFA, caller's rbp) by a table row.
fn table_step(
    row: UnwindRow,
    pc: u64,
    rsp: u64,
    rbp_value: u64,
    read_u64: &impl Fn(u64) -> Option<u64>,
) -> Option<(u64, u64, u64)> {
    let base = if row.cfa_rule == cfa::RBP {
        rbp_value
    } else {
        rsp
    };
    let mut cfa = base.wrapping_add_signed(i64::from(row.cfa_offset));
    if row.cfa_rule == cfa::PLT && (pc & 15) >= 11 {
        cfa = cfa.wrapping_add(8);
    }
    let ra = read_u64(cfa.wrapping_sub(8))?;
    let rbp_value = match row.rbp_rule {
        rbp::AT_CFA => read_u64(cfa.wrapping_add_signed(i64::from(row.rbp_offset)))?,
        _ => rbp_value,
    };
    Some((ra, cfa, rbp_value))
}

/// (return address, CFA, caller's rbp) by frame pointers, if rbp is plausible.
fn fp_step(rsp: u64, rbp: u64, read_u64: &impl Fn(u64) -> Option<u64>) -> Option<(u64, u64, u64)> {
    if !rbp.is_multiple_of(8) || rbp < rsp || rbp - rsp >= FP_WINDOW {
        return None;
    }
    let ra = read_u64(rbp.checked_add(8)?)?;
    let caller_rbp = read_u64(rbp)?;
    Some((ra, rbp.checked_add(16)?, caller_rbp))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn row(pc: u64, cfa_rule: u8, cfa_offset: i32, rbp_rule: u8, rbp_offset: i16) -> UnwindRow {
        UnwindRow {
            pc,
            cfa_offset,
            rbp_offset,
            cfa_rule,
            rbp_rule,
        }
    }

    /// A fake stack: word at `base + 8 * i` is `words[i]`.
    fn memory(base: u64, words: &[u64]) -> impl Fn(u64) -> Option<u64> + '_ {
        move |addr| {
            let i = addr.checked_sub(base)?;
            if i % 8 != 0 {
                return None;
            }
            words.get(usize::try_from(i / 8).ok()?).copied()
        }
    }

    #[test]
    fn walks_rsp_and_rbp_rules_to_the_end() {
        // File vaddrs: f at 0x1000 (CFA = rsp + 16), g at 0x2000 (CFA = rbp + 16,
        // rbp saved at CFA − 16), start at 0x3000 (END).
        let rows = [
            row(0x1000, cfa::RSP, 16, rbp::SAME, 0),
            row(0x1100, cfa::UNKNOWN, 0, rbp::SAME, 0),
            row(0x2000, cfa::RBP, 16, rbp::AT_CFA, -16),
            row(0x2100, cfa::UNKNOWN, 0, rbp::SAME, 0),
            row(0x3000, cfa::END, 0, rbp::SAME, 0),
        ];
        let bias = 0x7000_0000;
        let maps = [Mapping {
            start: bias + 0x1000,
            end: bias + 0x4000,
            bias,
            rows: &rows,
        }];
        let base = 0x10_000;
        // f's frame: [pad][ra into g]; g's frame: [saved rbp][ra into start].
        let words = [0, bias + 0x2010, 0, 0, 0xdead_0000, bias + 0x3010];
        let walk = unwind(
            Regs {
                pc: bias + 0x1008,
                rsp: base,
                rbp: base + 32,
            },
            &maps,
            memory(base, &words),
        );
        assert_eq!(walk.frames, [bias + 0x1008, bias + 0x2010, bias + 0x3010]);
        assert_eq!(walk.stop, Stop::End);
    }

    #[test]
    fn return_addresses_look_up_the_call_instruction() {
        // g's call is the last instruction of g: its return address is the
        // first byte past g, where another rule starts.
        let rows = [
            row(0x1000, cfa::RSP, 8, rbp::SAME, 0),
            row(0x2000, cfa::RSP, 8, rbp::SAME, 0),
            row(0x2010, cfa::END, 0, rbp::SAME, 0),
        ];
        let maps = [Mapping {
            start: 0x1000,
            end: 0x3000,
            bias: 0,
            rows: &rows,
        }];
        let words = [0x2010, 0];
        let walk = unwind(
            Regs {
                pc: 0x1000,
                rsp: 0x100,
                rbp: 0,
            },
            &maps,
            memory(0x100, &words),
        );
        assert_eq!(walk.frames, [0x1000, 0x2010]);
        assert_eq!(walk.stop, Stop::ZeroReturn);
    }

    #[test]
    fn plt_rows_add_8_after_the_push() {
        let rows = [row(0x1000, cfa::PLT, 8, rbp::SAME, 0)];
        let maps = [Mapping {
            start: 0x1000,
            end: 0x2000,
            bias: 0,
            rows: &rows,
        }];
        let words = [0x5555, 0x7777, 0];
        let at = |pc| {
            unwind(
                Regs {
                    pc,
                    rsp: 0x100,
                    rbp: 0,
                },
                &maps,
                memory(0x100, &words),
            )
            .frames[1]
        };
        assert_eq!(at(0x1010), 0x5555);
        assert_eq!(at(0x101a), 0x5555);
        assert_eq!(at(0x101b), 0x7777);
    }

    #[test]
    fn unknown_rules_and_unreadable_words_truncate() {
        let rows = [row(0x1000, cfa::UNKNOWN, 0, rbp::SAME, 0)];
        let maps = [Mapping {
            start: 0x1000,
            end: 0x2000,
            bias: 0,
            rows: &rows,
        }];
        let regs = Regs {
            pc: 0x1000,
            rsp: 0x100,
            rbp: 0,
        };
        let walk = unwind(regs, &maps, |_| Some(1));
        assert_eq!(walk.frames, [0x1000, TRUNCATED_FRAME]);
        assert_eq!(walk.stop, Stop::Truncated);
        let rows = [row(0x1000, cfa::RSP, 8, rbp::SAME, 0)];
        let maps = [Mapping {
            rows: &rows,
            ..maps[0]
        }];
        let walk = unwind(regs, &maps, |_| None);
        assert_eq!(walk.frames, [0x1000, TRUNCATED_FRAME]);
    }

    #[test]
    fn one_frame_pointer_step_outside_tables() {
        // pc in no mapping; rbp chain: [rbp] = next rbp, [rbp+8] = ra (in a table).
        let rows = [row(0x1000, cfa::END, 0, rbp::SAME, 0)];
        let maps = [Mapping {
            start: 0x1000,
            end: 0x2000,
            bias: 0,
            rows: &rows,
        }];
        let base = 0x1_0000;
        let words = [0, 0, base + 32, 0x1004, 0, 0];
        let walk = unwind(
            Regs {
                pc: 0x9000,
                rsp: base,
                rbp: base + 16,
            },
            &maps,
            memory(base, &words),
        );
        assert_eq!(walk.frames, [0x9000, 0x1004]);
        assert_eq!(walk.stop, Stop::End);
        // Twice in a row: truncated after one step.
        let words = [0, 0, base + 32, 0x9100, 0, 0x1004];
        let walk = unwind(
            Regs {
                pc: 0x9000,
                rsp: base,
                rbp: base + 16,
            },
            &maps,
            memory(base, &words),
        );
        assert_eq!(walk.frames, [0x9000, 0x9100, TRUNCATED_FRAME]);
        // An implausible rbp (below rsp, misaligned, too far): truncated at once.
        for rbp in [base - 8, base + 4, base + (8 << 20)] {
            let walk = unwind(
                Regs {
                    pc: 0x9000,
                    rsp: base,
                    rbp,
                },
                &maps,
                |_| Some(0x1004),
            );
            assert_eq!(walk.frames, [0x9000, TRUNCATED_FRAME], "rbp {rbp:#x}");
        }
    }

    #[test]
    fn depth_is_bounded() {
        // A frame that returns to itself forever.
        let rows = [row(0x1000, cfa::RSP, 0, rbp::SAME, 0)];
        let maps = [Mapping {
            start: 0x1000,
            end: 0x2000,
            bias: 0,
            rows: &rows,
        }];
        let walk = unwind(
            Regs {
                pc: 0x1001,
                rsp: 0x100,
                rbp: 0,
            },
            &maps,
            |_| Some(0x1001),
        );
        assert_eq!(walk.frames.len(), MAX_STACK_DEPTH);
        assert_eq!(walk.stop, Stop::MaxDepth);
    }

    proptest! {
        /// Any table and any memory: no panic, at most MAX_STACK_DEPTH frames,
        /// a truncation marker only last.
        #[test]
        fn any_table_any_memory(
            rows in prop::collection::vec(
                (0u64..0x400, any::<i32>(), any::<i16>(), 0u8..6, 0u8..3), 0..32),
            words in prop::collection::vec(any::<u64>(), 0..64),
            pc in 0u64..0x2000,
            rsp in 0u64..0x400,
            rbp in any::<u64>(),
        ) {
            let mut rows: Vec<UnwindRow> = rows
                .into_iter()
                .map(|(pc, cfa_offset, rbp_offset, cfa_rule, rbp_rule)| UnwindRow {
                    pc: pc * 4,
                    cfa_offset,
                    rbp_offset,
                    cfa_rule,
                    rbp_rule,
                })
                .collect();
            rows.sort_by_key(|r| r.pc);
            rows.dedup_by_key(|r| r.pc);
            let maps = [Mapping { start: 0x1000, end: 0x2000, bias: 0x1000, rows: &rows }];
            let walk = unwind(Regs { pc, rsp, rbp }, &maps, memory(0, &words));
            prop_assert!(walk.frames.len() <= MAX_STACK_DEPTH);
            let marker = walk.frames.iter().position(|&f| f == TRUNCATED_FRAME);
            prop_assert!(marker.is_none_or(|i| i == walk.frames.len() - 1));
        }
    }
}

//! CIEs and FDEs: each FDE's rows, from gimli, charged to the work budget
//! before gimli evaluates them; a malformed one skipped and counted.

use std::collections::HashMap;

use gimli::{BaseAddresses, CieOrFde, EndianSlice, LittleEndian, UnwindContext, UnwindSection};
use profiler_common::unwind::{cfa, rbp};

use super::rules::{Rule, UNKNOWN, rule_of};
use super::work::{Steps, Work};
use super::{ErrorKind, Limits, TableStats};

pub(super) struct Fde {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) rows: Vec<(u64, Rule)>,
}

impl Fde {
    pub(super) fn keeps_frame_pointer(&self) -> bool {
        let frame_pointer = |r: &Rule| {
            r.cfa_rule == cfa::RBP
                && r.cfa_offset == 16
                && r.rbp_rule == rbp::AT_CFA
                && r.rbp_offset == -16
        };
        // No return address is ever in these: outermost frames (`_start`:
        // the walk ends there, and its rbp of 0 fails a frame-pointer step)
        // and code that never moves the stack (PLT stubs, `.plt.got`
        // entries: a call needs an aligned stack, so they make none).
        let outermost_or_plt = |r: &Rule| r.cfa_rule == cfa::END || r.cfa_rule == cfa::PLT;
        let still = |r: &Rule| r.cfa_rule == cfa::RSP && r.cfa_offset == 8;
        self.rows
            .iter()
            .any(|(_, r)| frame_pointer(r) || outermost_or_plt(r))
            || self.rows.iter().all(|(_, r)| still(r))
    }
}

pub(super) type R<'a> = EndianSlice<'a, LittleEndian>;

#[allow(clippy::too_many_arguments)]
pub(super) fn collect_fdes<'a, S: UnwindSection<R<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    out: &mut Vec<Fde>,
    stats: &mut TableStats,
    budget: &mut usize,
    work: &mut Work,
    limits: &Limits,
) -> Result<(), ErrorKind> {
    let mut ctx = Box::new(UnwindContext::new());
    // Each CIE parsed once (its header, e.g. a long augmentation string,
    // would otherwise be scanned again for every FDE).
    let mut cies: HashMap<usize, gimli::Result<gimli::CommonInformationEntry<R<'a>>>> =
        HashMap::new();
    // Each CIE's steps and the rules it leaves, counted once.
    let mut cie_steps: HashMap<usize, Steps> = HashMap::new();
    let mut entries = section.entries(bases);
    loop {
        let partial = match entries.next() {
            Ok(Some(CieOrFde::Fde(partial))) => partial,
            Ok(Some(CieOrFde::Cie(_))) => continue,
            Ok(None) => break,
            // A broken entry header: its length is unknown, nothing after
            // it can be found.
            Err(_) => {
                stats.skipped_fdes += 1;
                break;
            }
        };
        let Ok(fde) = partial.parse(|s, b, o| {
            cies.entry(gimli::UnwindOffset::into(o))
                .or_insert_with(|| s.cie_from_offset(b, o))
                .clone()
        }) else {
            stats.skipped_fdes += 1;
            continue;
        };
        let start = fde.initial_address();
        let Some(end) = start.checked_add(fde.len()) else {
            stats.skipped_fdes += 1;
            continue;
        };
        if start == end {
            continue;
        }
        let mut rows = Vec::new();
        if fde.is_signal_trampoline() {
            if *budget == 0 {
                return Err(over_budget(out, 0, limits));
            }
            *budget -= 1;
            rows.push((start, UNKNOWN));
        } else {
            // Before gimli runs the CIE's instructions again.
            let cie = *cie_steps
                .entry(fde.cie().offset())
                .or_insert_with(|| Steps::default().of(fde.cie().instructions(section, bases)));
            // And the initial rules saved, and the last row.
            let fde_steps = Steps {
                steps: 2 * (1 + cie.rules()),
                ..cie
            }
            .of(fde.instructions(section, bases));
            work.charge(cie.steps.saturating_add(fde_steps.steps))?;
            let Ok(mut table) = fde.rows(section, bases, &mut ctx) else {
                stats.skipped_fdes += 1;
                continue;
            };
            let mut failed = false;
            loop {
                match table.next_row() {
                    Ok(Some(row)) => {
                        if *budget == 0 {
                            return Err(over_budget(out, rows.len(), limits));
                        }
                        *budget -= 1;
                        rows.push((row.start_address(), rule_of(row, section)));
                    }
                    Ok(None) => break,
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            if failed {
                stats.skipped_fdes += 1;
                continue;
            }
        }
        out.push(Fde { start, end, rows });
    }
    Ok(())
}

fn over_budget(fdes: &[Fde], more: usize, limits: &Limits) -> ErrorKind {
    ErrorKind::TooManyRows {
        rows: fdes.iter().map(|f| f.rows.len()).sum::<usize>() + more,
        at_least: true,
        limit: limits.max_rows,
    }
}

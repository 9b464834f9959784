//! The work budget (see the module docs of `compile`): what evaluating the
//! CFI costs gimli, counted before it runs.

use super::ErrorKind;
use super::fdes::R;

/// The CFI evaluated so far and what the file may cost (module docs).
pub(super) struct Work {
    pub(super) done: u64,
    pub(super) limit: u64,
    /// Bytes of CFI in the file, for the error.
    pub(super) cfi: u64,
}

impl Work {
    pub(super) fn charge(&mut self, bytes: u64) -> Result<(), ErrorKind> {
        self.done = self.done.saturating_add(bytes);
        if self.done > self.limit {
            return Err(ErrorKind::TooMuchWork {
                limit: self.limit,
                cfi: self.cfi,
            });
        }
        Ok(())
    }
}

/// What a CFI program costs gimli to run, from the rules held before it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Steps {
    pub(super) steps: u64,
    /// Registers 0–127 with a rule (x86-64's are 0–16 and a few more).
    pub(super) low: u128,
    /// Rules of higher registers: over-estimated (never taken away).
    pub(super) high: u64,
}

impl Steps {
    /// Rules held (gimli holds at most 192).
    pub(super) fn rules(&self) -> u64 {
        (u64::from(self.low.count_ones()) + self.high).min(192)
    }

    /// Counts `program` on (a malformed instruction ends it, as it ends
    /// gimli's run).
    pub(super) fn of(mut self, mut program: gimli::CallFrameInstructionIter<'_, R<'_>>) -> Steps {
        use gimli::CallFrameInstruction as I;
        // States remembered in this program (gimli keeps at most 4 rows).
        let mut saved: Vec<(u128, u64)> = Vec::new();
        while let Ok(Some(instruction)) = program.next() {
            self.steps += match instruction {
                I::Nop
                | I::DefCfa { .. }
                | I::DefCfaSf { .. }
                | I::DefCfaRegister { .. }
                | I::DefCfaOffset { .. }
                | I::DefCfaOffsetSf { .. }
                | I::DefCfaExpression { .. }
                | I::ArgsSize { .. } => 1,
                // The rules are looked up (a new row), copied (a state
                // remembered), dropped (restored) or searched (set).
                _ => 1 + self.rules(),
            };
            match instruction {
                I::RememberState if saved.len() < 4 => saved.push((self.low, self.high)),
                I::RestoreState => {
                    if let Some((low, high)) = saved.pop() {
                        (self.low, self.high) = (low, high);
                    }
                }
                I::Undefined { register } if register.0 < 128 => {
                    self.low &= !(1 << register.0);
                }
                I::SameValue { register }
                | I::Offset { register, .. }
                | I::OffsetExtendedSf { register, .. }
                | I::ValOffset { register, .. }
                | I::ValOffsetSf { register, .. }
                | I::Register {
                    dest_register: register,
                    ..
                }
                | I::Expression { register, .. }
                | I::ValExpression { register, .. }
                | I::Restore { register } => {
                    if register.0 < 128 {
                        self.low |= 1 << register.0;
                    } else {
                        self.high += 1;
                    }
                }
                _ => {}
            }
        }
        self
    }
}

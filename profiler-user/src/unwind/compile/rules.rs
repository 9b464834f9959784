//! A CFI row's rules as the kernel's: the CFA, the return address and rbp
//! (see the module docs of `compile` for the mapping).

use gimli::{
    CfaRule, EndianSlice, LittleEndian, Reader, Register, RegisterRule, UnwindSection,
    UnwindTableRow, X86_64,
};
use profiler_common::unwind::{cfa, rbp};

use super::fdes::R;

/// The rule part of a row (everything but the pc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Rule {
    pub(super) cfa_rule: u8,
    pub(super) cfa_offset: i32,
    pub(super) rbp_rule: u8,
    pub(super) rbp_offset: i16,
}

pub(super) const UNKNOWN: Rule = Rule {
    cfa_rule: cfa::UNKNOWN,
    cfa_offset: 0,
    rbp_rule: rbp::SAME,
    rbp_offset: 0,
};

const END: Rule = Rule {
    cfa_rule: cfa::END,
    cfa_offset: 0,
    rbp_rule: rbp::SAME,
    rbp_offset: 0,
};

/// `DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_lit11; DW_OP_ge;
/// DW_OP_lit3; DW_OP_shl; DW_OP_plus`: what follows `DW_OP_breg7 off` in the
/// PLT's CFA expression (GNU ld's `.plt`, as the OpenTelemetry profiler and
/// the Parca agent recognise it).
const PLT_TAIL: [u8; 9] = [0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
const DW_OP_BREG7: u8 = 0x77;

/// The offset of a PLT CFA expression, `None` for any other expression.
fn plt_offset(expr: &[u8]) -> Option<i32> {
    let (&op, rest) = expr.split_first()?;
    if op != DW_OP_BREG7 {
        return None;
    }
    let mut input = EndianSlice::new(rest, LittleEndian);
    let offset = input.read_sleb128().ok()?;
    (input.slice() == PLT_TAIL)
        .then(|| i32::try_from(offset).ok())
        .flatten()
}

pub(super) fn rule_of<'a, S: UnwindSection<R<'a>>>(
    row: &UnwindTableRow<usize>,
    section: &S,
) -> Rule {
    match row.register(X86_64::RA) {
        Some(RegisterRule::Offset(-8)) => {}
        Some(RegisterRule::Undefined) => return END,
        _ => return UNKNOWN,
    }
    let (cfa_rule, cfa_offset) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let Ok(offset) = i32::try_from(*offset) else {
                return UNKNOWN;
            };
            match *register {
                X86_64::RSP => (cfa::RSP, offset),
                X86_64::RBP => (cfa::RBP, offset),
                Register(_) => return UNKNOWN,
            }
        }
        CfaRule::Expression(e) => {
            let Some(offset) = e.get(section).ok().and_then(|e| plt_offset(e.0.slice())) else {
                return UNKNOWN;
            };
            (cfa::PLT, offset)
        }
    };
    let (rbp_rule, rbp_offset) = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) => (rbp::SAME, 0),
        Some(RegisterRule::Offset(n)) => match i16::try_from(n) {
            Ok(n) => (rbp::AT_CFA, n),
            Err(_) => return UNKNOWN,
        },
        Some(_) => return UNKNOWN,
    };
    Rule {
        cfa_rule,
        cfa_offset,
        rbp_rule,
        rbp_offset,
    }
}

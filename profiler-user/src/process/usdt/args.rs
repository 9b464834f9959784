//! x86_64 USDT argument strings (`8@%rdi -4@-16(%rbp) -8@$5`) compiled into
//! the [`UsdtSpec`] the kernel program evaluates against `struct pt_regs`.
//!
//! Each space-separated argument is `SIZE@LOCATION` in GNU as (AT&T) operand
//! syntax; `SIZE` is 1, 2, 4 or 8 bytes, negative for signed, and absent in
//! old notes. Supported locations: `%reg` (any 64/32/16/8-bit name of a
//! general-purpose register), `disp(%reg64)` with an optional numeric
//! displacement, and `$imm`. RIP-relative, indexed, segment-prefixed and
//! symbolic operands and the `%ah`-style high-byte registers are rejected
//! with [`ArgError::Unsupported`]: they need symbol resolution or a shift the
//! kernel side does not implement.

use profiler_common::{MAX_USDT_ARGS, UsdtArg, UsdtArgKind, UsdtSpec};
use thiserror::Error;

/// Why an argument string could not be compiled. `index` is the 0-based
/// argument position, `token` its text.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ArgError {
    #[error("USDT argument {index} `{token}`: size must be 1, 2, 4 or 8, optionally negative")]
    InvalidSize { index: usize, token: String },
    #[error("USDT argument {index} `{token}`: unknown register")]
    UnknownRegister { index: usize, token: String },
    /// Valid x86_64 operand syntax that the kernel side cannot evaluate.
    #[error("USDT argument {index} `{token}`: {what} operands are not supported")]
    Unsupported {
        index: usize,
        token: String,
        what: &'static str,
    },
    #[error("USDT argument {index} `{token}`: {reason}")]
    Invalid {
        index: usize,
        token: String,
        reason: &'static str,
    },
}

/// Compiles a probe's argument string.
///
/// Only the first [`MAX_USDT_ARGS`] arguments are compiled; any further ones
/// are ignored without being validated (the kernel could not read them), so
/// `arg_count` is `min(n, MAX_USDT_ARGS)`. An empty string yields
/// `arg_count == 0`. Without a `SIZE@` prefix a register argument takes the
/// register's width (`%edi` → 4 bytes) and any other 8 bytes, unsigned.
pub fn parse_args(args: &str) -> Result<UsdtSpec, ArgError> {
    let mut spec = UsdtSpec::default();
    for (index, token) in args
        .split_ascii_whitespace()
        .take(MAX_USDT_ARGS)
        .enumerate()
    {
        spec.args[index] = parse_arg(token).map_err(|e| e.at(index, token))?;
        spec.arg_count += 1;
    }
    Ok(spec)
}

/// An [`ArgError`] before it knows which argument it is about.
enum Fault {
    Size,
    Register,
    Unsupported(&'static str),
    Invalid(&'static str),
}

impl Fault {
    fn at(self, index: usize, token: &str) -> ArgError {
        let token = token.to_owned();
        match self {
            Fault::Size => ArgError::InvalidSize { index, token },
            Fault::Register => ArgError::UnknownRegister { index, token },
            Fault::Unsupported(what) => ArgError::Unsupported { index, token, what },
            Fault::Invalid(reason) => ArgError::Invalid {
                index,
                token,
                reason,
            },
        }
    }
}

fn parse_arg(token: &str) -> Result<UsdtArg, Fault> {
    // `SIZE@` only if what precedes the first `@` is a number: in a sizeless
    // `sym@GOTPCREL(%rip)` the `@` belongs to the operand.
    let (size, location) = match token.split_once('@') {
        Some((size, location))
            if size.starts_with(['-', '+']) || size.starts_with(|c: char| c.is_ascii_digit()) =>
        {
            let size: i8 = size.parse().map_err(|_| Fault::Size)?;
            if !matches!(size.unsigned_abs(), 1 | 2 | 4 | 8) {
                return Err(Fault::Size);
            }
            (Some((size.unsigned_abs(), u8::from(size < 0))), location)
        }
        _ => (None, token),
    };

    let mut arg = if let Some(imm) = location.strip_prefix('$') {
        UsdtArg {
            kind: UsdtArgKind::Const as u8,
            value: parse_int(imm)
                .ok_or_else(|| symbolic_or(imm, "symbolic constant", "invalid constant"))?,
            size: 8,
            ..UsdtArg::default()
        }
    } else if let Some(name) = location.strip_prefix('%') {
        if name.contains(':') {
            return Err(Fault::Unsupported("segment-prefixed"));
        }
        let (reg_offset, width) = register(name)?;
        UsdtArg {
            kind: UsdtArgKind::Reg as u8,
            reg_offset,
            size: width,
            ..UsdtArg::default()
        }
    } else {
        parse_memory(location)?
    };
    if let Some((size, signed)) = size {
        arg.size = size;
        arg.signed = signed;
    }
    Ok(arg)
}

/// `disp(%reg)`, `(%reg)`.
fn parse_memory(location: &str) -> Result<UsdtArg, Fault> {
    if location.contains(':') {
        return Err(Fault::Unsupported("segment-prefixed"));
    }
    let (disp, rest) = location
        .split_once('(')
        .ok_or(Fault::Invalid("expected `$imm`, `%reg` or `disp(%reg)`"))?;
    let inner = rest
        .strip_suffix(')')
        .ok_or(Fault::Invalid("expected `)` at the end"))?;
    if inner.contains(',') {
        return Err(Fault::Unsupported("indexed memory"));
    }
    let base = inner
        .strip_prefix('%')
        .ok_or(Fault::Invalid("expected `%reg` inside parentheses"))?;
    let (reg_offset, width) = register(base)?;
    if width != 8 {
        // `(%eax)` addresses with the 32-bit register zero-extended; the
        // kernel would add the full 64-bit one.
        return Err(Fault::Unsupported("non-64-bit base register"));
    }
    let value = if disp.is_empty() {
        0
    } else {
        parse_int(disp)
            .ok_or_else(|| symbolic_or(disp, "symbolic displacement", "invalid displacement"))?
    };
    Ok(UsdtArg {
        kind: UsdtArgKind::RegDeref as u8,
        reg_offset,
        value,
        size: 8,
        ..UsdtArg::default()
    })
}

/// `Unsupported(symbolic)` when `text` mentions a symbol, else `Invalid`.
fn symbolic_or(text: &str, symbolic: &'static str, invalid: &'static str) -> Fault {
    let is_symbol_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == '.';
    // A symbol starts the text or follows an operator: `sym`, `sym+8`, `8+sym`.
    let mentions_symbol = text
        .split(['+', '-'])
        .any(|part| part.starts_with(is_symbol_start));
    if mentions_symbol {
        Fault::Unsupported(symbolic)
    } else {
        Fault::Invalid(invalid)
    }
}

/// `5`, `-1`, `0x10`, `-0x10`, as GCC prints them. Values above `i64::MAX`
/// (unsigned constants) keep their bit pattern. Leading zeros are decimal,
/// not octal as in GNU as: compilers do not emit octal here.
fn parse_int(text: &str) -> Option<i64> {
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    // `from_str_radix` would accept a second sign.
    if digits.starts_with(['+', '-']) {
        return None;
    }
    let magnitude = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) if !hex.starts_with(['+', '-']) => u64::from_str_radix(hex, 16).ok()?,
        Some(_) => return None,
        None => digits.parse::<u64>().ok()?,
    };
    if negative {
        // -2^63 is the most negative representable value.
        (magnitude <= 1 << 63).then(|| (magnitude as i64).wrapping_neg())
    } else {
        Some(magnitude as i64)
    }
}

/// Every general-purpose register: the x86_64 `struct pt_regs` offset of the
/// full register and its 64-, 32-, 16- and 8-bit names.
const REGISTERS: &[(u16, [&str; 4])] = &[
    (0, ["r15", "r15d", "r15w", "r15b"]),
    (8, ["r14", "r14d", "r14w", "r14b"]),
    (16, ["r13", "r13d", "r13w", "r13b"]),
    (24, ["r12", "r12d", "r12w", "r12b"]),
    (32, ["rbp", "ebp", "bp", "bpl"]),
    (40, ["rbx", "ebx", "bx", "bl"]),
    (48, ["r11", "r11d", "r11w", "r11b"]),
    (56, ["r10", "r10d", "r10w", "r10b"]),
    (64, ["r9", "r9d", "r9w", "r9b"]),
    (72, ["r8", "r8d", "r8w", "r8b"]),
    (80, ["rax", "eax", "ax", "al"]),
    (88, ["rcx", "ecx", "cx", "cl"]),
    (96, ["rdx", "edx", "dx", "dl"]),
    (104, ["rsi", "esi", "si", "sil"]),
    (112, ["rdi", "edi", "di", "dil"]),
    (152, ["rsp", "esp", "sp", "spl"]),
];

/// The names in [`REGISTERS`] have these widths, in order.
const WIDTHS: [u8; 4] = [8, 4, 2, 1];

/// `pt_regs` offset and width of a register name (without `%`).
fn register(name: &str) -> Result<(u16, u8), Fault> {
    for (offset, names) in REGISTERS {
        if let Some(i) = names.iter().position(|n| *n == name) {
            return Ok((*offset, WIDTHS[i]));
        }
    }
    match name {
        // Bits 8..16 of a register: would need a shift the kernel lacks.
        "ah" | "bh" | "ch" | "dh" => Err(Fault::Unsupported("high-byte register")),
        "rip" | "eip" => Err(Fault::Unsupported("RIP-relative")),
        _ => Err(Fault::Register),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reg(offset: u16, size: u8, signed: bool) -> UsdtArg {
        UsdtArg {
            kind: UsdtArgKind::Reg as u8,
            reg_offset: offset,
            size,
            signed: u8::from(signed),
            ..UsdtArg::default()
        }
    }

    fn mem(offset: u16, disp: i64, size: u8, signed: bool) -> UsdtArg {
        UsdtArg {
            kind: UsdtArgKind::RegDeref as u8,
            reg_offset: offset,
            value: disp,
            size,
            signed: u8::from(signed),
            ..UsdtArg::default()
        }
    }

    fn imm(value: i64, size: u8, signed: bool) -> UsdtArg {
        UsdtArg {
            kind: UsdtArgKind::Const as u8,
            value,
            size,
            signed: u8::from(signed),
            ..UsdtArg::default()
        }
    }

    fn one(token: &str) -> Result<UsdtArg, ArgError> {
        let spec = parse_args(token)?;
        assert_eq!(spec.arg_count, 1, "{token}");
        Ok(spec.args[0])
    }

    #[test]
    fn every_register_name_maps_to_its_pt_regs_offset() {
        // Independent of REGISTERS: the kernel's x86_64 struct pt_regs.
        let pt_regs = [
            ("r15", 0),
            ("r14", 8),
            ("r13", 16),
            ("r12", 24),
            ("rbp", 32),
            ("rbx", 40),
            ("r11", 48),
            ("r10", 56),
            ("r9", 64),
            ("r8", 72),
            ("rax", 80),
            ("rcx", 88),
            ("rdx", 96),
            ("rsi", 104),
            ("rdi", 112),
            ("rsp", 152),
        ];
        let aliases = |full: &str| -> [String; 4] {
            match full.strip_prefix('r').and_then(|n| n.parse::<u8>().ok()) {
                Some(n) => [
                    full.into(),
                    format!("r{n}d"),
                    format!("r{n}w"),
                    format!("r{n}b"),
                ],
                None => {
                    let base = &full[1..];
                    let low = match base {
                        "ax" | "bx" | "cx" | "dx" => format!("{}l", &base[..1]),
                        _ => format!("{base}l"),
                    };
                    [full.into(), format!("e{base}"), base.into(), low]
                }
            }
        };
        let mut checked = 0;
        for (full, offset) in pt_regs {
            for (name, width) in aliases(full).iter().zip([8, 4, 2, 1]) {
                assert_eq!(
                    one(&format!("%{name}")),
                    Ok(reg(offset, width, false)),
                    "%{name}"
                );
                assert_eq!(
                    one(&format!("-{width}@%{name}")),
                    Ok(reg(offset, width, true)),
                    "%{name}"
                );
                // The note's size wins over the register's width.
                assert_eq!(
                    one(&format!("8@%{name}")),
                    Ok(reg(offset, 8, false)),
                    "%{name}"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 64);
        assert_eq!(one("%sil"), Ok(reg(104, 1, false)));
        assert_eq!(one("%dil"), Ok(reg(112, 1, false)));
        assert_eq!(one("%bpl"), Ok(reg(32, 1, false)));
        assert_eq!(one("%spl"), Ok(reg(152, 1, false)));
        assert_eq!(one("%al"), Ok(reg(80, 1, false)));
    }

    #[test]
    fn valid_arguments() {
        let cases: &[(&str, UsdtArg)] = &[
            ("8@%rdi", reg(112, 8, false)),
            ("-8@%rax", reg(80, 8, true)),
            ("-4@%esi", reg(104, 4, true)),
            ("4@%edx", reg(96, 4, false)),
            ("2@%r9w", reg(64, 2, false)),
            ("-1@%bl", reg(40, 1, true)),
            ("%rdi", reg(112, 8, false)),
            ("+8@%rdi", reg(112, 8, false)),
            ("8@-16(%rbp)", mem(32, -16, 8, false)),
            ("-16(%rbp)", mem(32, -16, 8, false)),
            ("-4@(%rax)", mem(80, 0, 4, true)),
            ("(%rax)", mem(80, 0, 8, false)),
            ("8@0x10(%rsp)", mem(152, 16, 8, false)),
            ("1@-0x10(%r12)", mem(24, -16, 1, false)),
            ("4@+8(%rbx)", mem(40, 8, 4, false)),
            ("-8@$5", imm(5, 8, true)),
            ("4@$-1", imm(-1, 4, false)),
            ("$-1", imm(-1, 8, false)),
            ("8@$0x10", imm(16, 8, false)),
            ("8@$0XfF", imm(255, 8, false)),
            ("8@$-0x10", imm(-16, 8, false)),
            ("8@$18446744073709551615", imm(-1, 8, false)),
            ("8@$-9223372036854775808", imm(i64::MIN, 8, false)),
            ("8@$0x8000000000000000", imm(i64::MIN, 8, false)),
            ("8@$007", imm(7, 8, false)),
        ];
        for (token, want) in cases {
            assert_eq!(one(token).as_ref(), Ok(want), "{token}");
        }
    }

    #[test]
    fn argument_lists() {
        assert_eq!(parse_args(""), Ok(UsdtSpec::default()));
        assert_eq!(parse_args("   "), Ok(UsdtSpec::default()));
        let spec = parse_args("8@%rdi -8@%rax -4@%edx").unwrap();
        assert_eq!(spec.arg_count, 3);
        assert_eq!(
            spec.args,
            [reg(112, 8, false), reg(80, 8, true), reg(96, 4, true)]
        );
        let spec = parse_args("  -1@%bl\t-2@%bx ").unwrap();
        assert_eq!(spec.arg_count, 2);
        assert_eq!(spec.args[2], UsdtArg::default());
        // Past MAX_USDT_ARGS arguments are ignored, even invalid ones.
        let spec = parse_args("8@%rdi 8@%rsi 8@%rdx 8@%rcx 8@%fs:0x28 junk").unwrap();
        assert_eq!(spec.arg_count, 3);
        assert_eq!(spec.args[2], reg(96, 8, false));
        // An error names the argument it is about.
        assert_eq!(
            parse_args("8@%rdi 8@%xyz"),
            Err(ArgError::UnknownRegister {
                index: 1,
                token: "8@%xyz".into()
            })
        );
    }

    #[test]
    fn rejected_arguments() {
        enum Want {
            Size,
            Register,
            Unsupported(&'static str),
            Invalid,
        }
        use Want::*;
        let cases: &[(&str, Want)] = &[
            ("3@%rdi", Size),
            ("0@%rdi", Size),
            ("16@%rdi", Size),
            ("-16@%rdi", Size),
            ("1000@%rdi", Size),
            ("--8@%rdi", Size),
            ("8x@%rdi", Size),
            ("@%rdi", Invalid),
            ("8@%xmm0", Register),
            ("8@%RDI", Register),
            ("8@%", Register),
            ("8@%r16", Register),
            ("8@%r8l", Register),
            ("8@(%r99)", Register),
            ("1@%ah", Unsupported("high-byte register")),
            ("1@%bh", Unsupported("high-byte register")),
            ("1@%ch", Unsupported("high-byte register")),
            ("-1@%dh", Unsupported("high-byte register")),
            ("8@%rip", Unsupported("RIP-relative")),
            ("8@foo(%rip)", Unsupported("RIP-relative")),
            ("8@sym+8(%rip)", Unsupported("RIP-relative")),
            ("8@16(%rip)", Unsupported("RIP-relative")),
            ("foo@GOTPCREL(%rip)", Unsupported("RIP-relative")),
            ("8@(%rax,%rbx,4)", Unsupported("indexed memory")),
            ("8@8(%rax,%rbx)", Unsupported("indexed memory")),
            ("8@(,%rbx,8)", Unsupported("indexed memory")),
            ("8@%fs:0x28", Unsupported("segment-prefixed")),
            ("8@%fs:(%rax)", Unsupported("segment-prefixed")),
            ("8@(%eax)", Unsupported("non-64-bit base register")),
            ("8@4(%r9d)", Unsupported("non-64-bit base register")),
            ("8@sym(%rax)", Unsupported("symbolic displacement")),
            ("8@8+sym(%rax)", Unsupported("symbolic displacement")),
            ("8@$sym", Unsupported("symbolic constant")),
            ("8@$_x+4", Unsupported("symbolic constant")),
            ("8@$", Invalid),
            ("8@$--1", Invalid),
            ("8@$-+1", Invalid),
            ("8@$0x", Invalid),
            ("8@$0x-1", Invalid),
            ("8@$18446744073709551616", Invalid),
            ("8@$-9223372036854775809", Invalid),
            ("8@$1.5", Invalid),
            ("8@rdi", Invalid),
            ("8@16", Invalid),
            ("8@-16(%rbp", Invalid),
            ("8@-16(rbp)", Invalid),
            ("8@-16(%rbp)x", Invalid),
            ("8@0q(%rax)", Invalid),
            ("8@", Invalid),
        ];
        for (token, want) in cases {
            let got = one(token);
            let ok = match (&got, want) {
                (Err(ArgError::InvalidSize { .. }), Size) => true,
                (Err(ArgError::UnknownRegister { .. }), Register) => true,
                (Err(ArgError::Unsupported { what, .. }), Unsupported(w)) => what == w,
                (Err(ArgError::Invalid { .. }), Invalid) => true,
                _ => false,
            };
            assert!(ok, "{token}: got {got:?}");
            if let Err(e) = got {
                assert!(e.to_string().contains(token), "{e} names {token}");
            }
        }
    }

    /// Formats an argument the way GCC does (one of several spellings).
    fn format_arg(arg: &UsdtArg, reg_name: &str, hex: bool, sized: bool) -> String {
        let size = if arg.signed != 0 {
            format!("-{}@", arg.size)
        } else if sized {
            format!("{}@", arg.size)
        } else {
            String::new()
        };
        let num = |v: i64| match (hex, v < 0) {
            (false, _) => v.to_string(),
            (true, false) => format!("{v:#x}"),
            (true, true) => format!("-{:#x}", v.unsigned_abs()),
        };
        let location = match arg.kind {
            k if k == UsdtArgKind::Const as u8 => format!("${}", num(arg.value)),
            k if k == UsdtArgKind::Reg as u8 => format!("%{reg_name}"),
            _ if arg.value == 0 && !hex => format!("(%{reg_name})"),
            _ => format!("{}(%{reg_name})", num(arg.value)),
        };
        format!("{size}{location}")
    }

    /// A valid argument, one of its register's names, and spelling choices.
    fn valid_arg() -> impl Strategy<Value = (UsdtArg, String)> {
        (
            0..3u8,
            0..REGISTERS.len(),
            0..4usize,
            prop::sample::select(vec![1u8, 2, 4, 8]),
            any::<bool>(),
            any::<i64>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(kind, r, alias, size, signed, value, hex, sized)| {
                let (offset, names) = REGISTERS[r];
                // Memory bases must be 64-bit; sizeless registers take their width.
                let alias = if kind == 2 { 0 } else { alias };
                let sized = sized
                    || signed
                    || (kind == 1 && size != WIDTHS[alias])
                    || (kind != 1 && size != 8);
                let arg = UsdtArg {
                    kind: [UsdtArgKind::Const, UsdtArgKind::Reg, UsdtArgKind::RegDeref]
                        [usize::from(kind)] as u8,
                    reg_offset: if kind == 0 { 0 } else { offset },
                    value: if kind == 1 { 0 } else { value },
                    size,
                    signed: u8::from(signed),
                    _pad: [0; 3],
                };
                (arg, format_arg(&arg, names[alias], hex, sized))
            })
    }

    proptest! {
        #[test]
        fn parse_args_never_panics(s in "\\PC*") {
            let _ = parse_args(&s);
        }

        #[test]
        fn parse_args_never_panics_on_near_misses(s in "([-+]?[0-9]{0,3}@)?[$%]?[-+]?(0x)?[0-9a-fx]{0,20}(\\(%?[a-z0-9]{0,4}(,%[a-z]{0,3})?\\)?)? ?.{0,8}") {
            let _ = parse_args(&s);
        }

        #[test]
        fn valid_specs_round_trip(args in prop::collection::vec(valid_arg(), 0..6), sep in "[ \t]{1,3}") {
            let text = args.iter().map(|(_, s)| s.as_str()).collect::<Vec<_>>().join(&sep);
            let spec = parse_args(&text).unwrap();
            let n = args.len().min(MAX_USDT_ARGS);
            prop_assert_eq!(spec.arg_count as usize, n);
            for (i, (want, _)) in args.iter().take(n).enumerate() {
                prop_assert_eq!(&spec.args[i], want, "{}", text);
            }
        }
    }
}

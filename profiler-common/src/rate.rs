//! `ALLOCPROF_RATE`, the mean sampling interval R in bytes: its grammar is
//! part of the contract between the allocator (which reads it) and allocprof
//! (which reports the rate a process runs with).

/// Default mean sampling interval (512 KiB, as tcmalloc/jemalloc).
pub const DEFAULT_RATE: u64 = 524_288;

/// Why a rate string was rejected.
#[derive(Debug, PartialEq, Eq)]
pub enum RateError {
    Empty,
    BadDigit,
    BadSuffix,
    Overflow,
}

/// Parse `123`, `512k`, `4m`, `1g` (binary multiples, case-insensitive;
/// `4kb`/`4KiB` are rejected: keep the grammar small and strict).
pub fn parse_rate(s: &[u8]) -> Result<u64, RateError> {
    let rate = parse_scaled(s, &[(b'k', 1 << 10), (b'm', 1 << 20), (b'g', 1 << 30)])?;
    if rate > i64::MAX as u64 {
        return Err(RateError::Overflow);
    }
    Ok(rate)
}

/// A decimal count, surrounding whitespace allowed, followed by at most
/// one of `units`' letters (case-insensitive) that multiplies it: the
/// grammar of every `ALLOCPROF_*` number.
pub fn parse_scaled(s: &[u8], units: &[(u8, u64)]) -> Result<u64, RateError> {
    let s = trim(s);
    if s.is_empty() {
        return Err(RateError::Empty);
    }
    let digits_end = s
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(s.len());
    if digits_end == 0 {
        return Err(RateError::BadDigit);
    }
    let mut value: u64 = 0;
    for &b in &s[..digits_end] {
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(b - b'0')))
            .ok_or(RateError::Overflow)?;
    }
    let multiplier = match &s[digits_end..] {
        [] => 1,
        [unit] => units
            .iter()
            .find(|(u, _)| u.eq_ignore_ascii_case(unit))
            .map(|&(_, m)| m)
            .ok_or(RateError::BadSuffix)?,
        _ => return Err(RateError::BadSuffix),
    };
    value.checked_mul(multiplier).ok_or(RateError::Overflow)
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if !first.is_ascii_whitespace() {
            break;
        }
        s = rest;
    }
    while let [rest @ .., last] = s {
        if !last.is_ascii_whitespace() {
            break;
        }
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_rate(b"524288"), Ok(524_288));
        assert_eq!(parse_rate(b"512k"), Ok(524_288));
        assert_eq!(parse_rate(b"512K"), Ok(524_288));
        assert_eq!(parse_rate(b"4m"), Ok(4 << 20));
        assert_eq!(parse_rate(b"1G"), Ok(1 << 30));
        assert_eq!(parse_rate(b" 64k\n"), Ok(65_536));
        assert_eq!(parse_rate(b"0"), Ok(0));
        assert_eq!(parse_rate(b"1"), Ok(1));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse_rate(b""), Err(RateError::Empty));
        assert_eq!(parse_rate(b"k"), Err(RateError::BadDigit));
        assert_eq!(parse_rate(b"-1"), Err(RateError::BadDigit));
        assert_eq!(parse_rate(b"12x"), Err(RateError::BadSuffix));
        assert_eq!(parse_rate(b"4kb"), Err(RateError::BadSuffix));
        assert_eq!(parse_rate(b"1.5m"), Err(RateError::BadSuffix));
        assert_eq!(
            parse_rate(b"99999999999999999999999"),
            Err(RateError::Overflow)
        );
        assert_eq!(parse_rate(b"9999999999999g"), Err(RateError::Overflow));
    }
}

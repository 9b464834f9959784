//! `ALLOCPROF_RATE`: the mean sampling interval R in bytes.
//!
//! Read once, lazily, from the first allocation slow path, possibly before
//! `main` and from inside malloc: so no allocation, no std, no panics.

use core::sync::atomic::{AtomicU64, Ordering};

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
    let shift = match &s[digits_end..] {
        [] => 0,
        [b'k' | b'K'] => 10,
        [b'm' | b'M'] => 20,
        [b'g' | b'G'] => 30,
        _ => return Err(RateError::BadSuffix),
    };
    let scaled = value << shift;
    if scaled >> shift != value || scaled > i64::MAX as u64 {
        return Err(RateError::Overflow);
    }
    Ok(scaled)
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

const UNREAD: u64 = u64::MAX;
static RATE: AtomicU64 = AtomicU64::new(UNREAD);

/// The process-wide rate, reading the environment on first use.
pub fn current() -> u64 {
    let r = RATE.load(Ordering::Relaxed);
    if r != UNREAD {
        return r;
    }
    let (rate, bad) = from_env();
    // Only the thread that publishes first warns, so the warning is printed
    // once even when several threads start together.
    match RATE.compare_exchange(UNREAD, rate, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => {
            if bad {
                warn_malformed();
            }
            rate
        }
        Err(published) => published,
    }
}

fn from_env() -> (u64, bool) {
    // SAFETY: getenv reads `environ` without allocating; the key is a valid
    // NUL-terminated string.
    let value = unsafe { libc::getenv(c"ALLOCPROF_RATE".as_ptr()) };
    if value.is_null() {
        return (DEFAULT_RATE, false);
    }
    // SAFETY: getenv returned a NUL-terminated string that lives in environ.
    let bytes = unsafe { core::ffi::CStr::from_ptr(value) }.to_bytes();
    match parse_rate(bytes) {
        Ok(r) => (r, false),
        // `ALLOCPROF_RATE= cmd` means "unset", not a typo.
        Err(RateError::Empty) => (DEFAULT_RATE, false),
        Err(_) => (DEFAULT_RATE, true),
    }
}

fn warn_malformed() {
    const MSG: &[u8] =
        b"allocprof: malformed ALLOCPROF_RATE (expected bytes, e.g. 524288, 512k, 4m; 0 disables); using 524288\n";
    // SAFETY: plain write(2) of a static buffer; the result is ignored on
    // purpose (nowhere to report a failed warning).
    unsafe {
        libc::write(2, MSG.as_ptr().cast(), MSG.len());
    }
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

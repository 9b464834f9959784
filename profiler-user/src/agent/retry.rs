//! When to try again: exponential backoff with jitter, unless the collector
//! said when (HTTP `Retry-After`, gRPC `RetryInfo` in
//! `grpc-status-details-bin`), which is then honoured as given (capped).

use std::{
    hash::{BuildHasher, Hasher},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// The first retry's delay, doubled at each further one up to [`MAX_DELAY`].
pub const FIRST_DELAY: Duration = Duration::from_secs(1);
pub const MAX_DELAY: Duration = Duration::from_secs(30);
/// A server's own delay is honoured up to this (a broken one cannot park
/// the agent for a day).
pub const MAX_SERVER_DELAY: Duration = Duration::from_secs(300);

/// The delay before retry number `attempt` (0 for the first retry): a
/// uniform draw in [half, whole] of `FIRST_DELAY × 2^attempt` capped at
/// `MAX_DELAY` ("equal jitter": never zero, never in step with other
/// agents). `random` is any u64.
pub fn backoff(attempt: u32, random: u64) -> Duration {
    let whole = FIRST_DELAY
        .checked_mul(1 << attempt.min(16))
        .unwrap_or(MAX_DELAY)
        .min(MAX_DELAY);
    let half = whole / 2;
    let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
    half + Duration::from_nanos(random % (nanos + 1))
}

/// The delay to wait: the server's if it gave one, else the backoff's.
pub fn delay(attempt: u32, server: Option<Duration>) -> Duration {
    server.map_or_else(|| backoff(attempt, random()), |d| d.min(MAX_SERVER_DELAY))
}

/// A random u64 from the standard library's per-process hash keys (no
/// dependency for a jitter).
fn random() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    h.finish()
}

/// `Retry-After` (RFC 9110 §10.2.3): delta-seconds (what collectors
/// send), or an HTTP-date as IMF-fixdate (`Wed, 21 Oct 2015 07:28:00 GMT`):
/// the time from `now` until then (none if it has passed). Anything else,
/// the obsolete date forms included, is none: the backoff applies. Capped
/// like any server delay by [`delay`].
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = parse_imf_fixdate(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// An IMF-fixdate (RFC 9110 §5.6.7: `day-name, DD Mon YYYY HH:MM:SS GMT`,
/// case-sensitive, fixed widths) as a time; none where malformed or not a
/// real date. Read as bytes: any input is safe.
fn parse_imf_fixdate(s: &str) -> Option<SystemTime> {
    const DAY_NAMES: [&[u8]; 7] = [b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun"];
    const MONTHS: [&[u8]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let b = s.as_bytes();
    let shape = b.len() == 29
        && &b[3..5] == b", "
        && [7, 11, 16].iter().all(|&i| b[i] == b' ')
        && b[19] == b':'
        && b[22] == b':'
        && &b[25..] == b" GMT";
    if !shape || !DAY_NAMES.contains(&&b[..3]) {
        return None;
    }
    let number = |from: usize, to: usize| -> Option<i64> {
        let digits = &b[from..to];
        digits
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| digits.iter().fold(0, |n, &d| n * 10 + i64::from(d - b'0')))
    };
    let day = number(5, 7)?;
    let month = MONTHS.iter().position(|&m| m == &b[8..11])? as i64 + 1;
    let year = number(12, 16)?;
    let (hour, minute, second) = (number(17, 19)?, number(20, 22)?, number(23, 25)?);
    // 60: a leap second.
    if !(1..=days_in_month(year, month)).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let seconds = days_since_epoch(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    // Before 1970: long past.
    Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).unwrap_or(0)))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar
/// (Howard Hinnant's `days_from_civil`: years counted from March, so the
/// leap day ends one).
fn days_since_epoch(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The `google.rpc` messages that carry a `RetryInfo`, written out here
/// (three small messages, not worth a generated crate).
mod rpc {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Status {
        #[prost(int32, tag = "1")]
        pub code: i32,
        #[prost(string, tag = "2")]
        pub message: String,
        #[prost(message, repeated, tag = "3")]
        pub details: Vec<Any>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Any {
        #[prost(string, tag = "1")]
        pub type_url: String,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RetryInfo {
        #[prost(message, optional, tag = "1")]
        pub retry_delay: Option<ProtoDuration>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProtoDuration {
        #[prost(int64, tag = "1")]
        pub seconds: i64,
        #[prost(int32, tag = "2")]
        pub nanos: i32,
    }
}

pub const RETRY_INFO_TYPE: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The `RetryInfo` delay of a `google.rpc.Status` (the decoded
/// `grpc-status-details-bin`), if it carries one that makes sense.
pub fn parse_retry_info(status_details: &[u8]) -> Option<Duration> {
    use prost::Message;
    let status = rpc::Status::decode(status_details).ok()?;
    status
        .details
        .iter()
        .filter(|a| a.type_url == RETRY_INFO_TYPE)
        .find_map(|a| {
            let d = rpc::RetryInfo::decode(&a.value[..]).ok()?.retry_delay?;
            let secs = u64::try_from(d.seconds).ok()?;
            let nanos = u32::try_from(d.nanos).ok().filter(|&n| n < 1_000_000_000)?;
            Some(Duration::new(secs, nanos))
        })
}

/// A `google.rpc.Status` carrying a `RetryInfo` of `delay` (for tests'
/// servers).
pub fn retry_info_details(code: i32, delay: Duration) -> Vec<u8> {
    use prost::Message;
    let info = rpc::RetryInfo {
        retry_delay: Some(rpc::ProtoDuration {
            seconds: i64::try_from(delay.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(delay.subsec_nanos()).unwrap_or(0),
        }),
    };
    rpc::Status {
        code,
        message: String::new(),
        details: vec![rpc::Any {
            type_url: RETRY_INFO_TYPE.into(),
            value: info.encode_to_vec(),
        }],
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_jitter_and_is_capped() {
        for attempt in 0..40 {
            let whole = (FIRST_DELAY * 2u32.pow(attempt.min(16))).min(MAX_DELAY);
            for random in [0, 1, 12345, u64::MAX / 3, u64::MAX] {
                let d = backoff(attempt, random);
                assert!(d >= whole / 2 && d <= whole, "{attempt}: {d:?}");
            }
        }
        assert_eq!(backoff(0, 0), FIRST_DELAY / 2);
        assert_eq!(backoff(3, 0), FIRST_DELAY * 4);
        // Jitter: different draws, different delays.
        assert_ne!(backoff(2, 1), backoff(2, 1_000_000_007));
        let server = Some(Duration::from_secs(7));
        assert_eq!(delay(5, server), Duration::from_secs(7));
        assert_eq!(delay(0, Some(Duration::from_secs(86400))), MAX_SERVER_DELAY);
    }

    #[test]
    fn retry_after_is_read_as_seconds() {
        let now = SystemTime::now();
        assert_eq!(parse_retry_after(" 3 ", now), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("0", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("-1", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn retry_after_is_read_as_an_imf_fixdate() {
        // RFC 9110's example is 1445412480 s after the epoch.
        let at = UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let date = "Wed, 21 Oct 2015 07:28:00 GMT";
        let before = |s: u64| at - Duration::from_secs(s);
        assert_eq!(
            parse_retry_after(date, before(90)),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            parse_retry_after(&format!(" {date} "), before(1)),
            Some(Duration::from_secs(1))
        );
        // Passed: at once.
        let after = at + Duration::from_secs(5);
        assert_eq!(parse_retry_after(date, after), Some(Duration::ZERO));
        // Far off: the delay is capped like any server's.
        let far = parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", at);
        assert!(far.is_some_and(|d| d > MAX_SERVER_DELAY));
        assert_eq!(delay(0, far), MAX_SERVER_DELAY);
        // Dates across leap days and the epoch.
        let epoch = parse_imf_fixdate("Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(epoch, Some(UNIX_EPOCH));
        let leap = parse_imf_fixdate("Thu, 29 Feb 2024 12:00:00 GMT").unwrap();
        assert_eq!(leap, UNIX_EPOCH + Duration::from_secs(1_709_208_000));
        let march = parse_imf_fixdate("Fri, 01 Mar 2024 00:00:00 GMT").unwrap();
        assert_eq!(march, UNIX_EPOCH + Duration::from_secs(1_709_251_200));
    }

    #[test]
    fn malformed_dates_are_not_delays() {
        let now = SystemTime::now();
        for garbage in [
            "Wed, 21 Oct 2015 07:28:00 UTC",
            "Wed, 21 Oct 2015 07:28:00 gmt",
            "Wed, 21 oct 2015 07:28:00 GMT",
            "Xyz, 21 Oct 2015 07:28:00 GMT",
            "Wed, 32 Oct 2015 07:28:00 GMT",
            "Wed, 00 Oct 2015 07:28:00 GMT",
            "Sun, 29 Feb 2015 07:28:00 GMT",
            "Wed, 21 Oct 2015 24:28:00 GMT",
            "Wed, 21 Oct 2015 07:60:00 GMT",
            "Wed, 21 Oct 2015 07:28:61 GMT",
            "Wed, 21 Oct +015 07:28:00 GMT",
            "Wed,21 Oct 2015 07:28:00 GMT ",
            // The obsolete forms (RFC 850, asctime).
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
            // Multi-byte characters where digits belong, 29 bytes long.
            "Wed, 2é Oct 2015 07:28:0 GMT",
            "",
        ] {
            assert_eq!(parse_retry_after(garbage, now), None, "{garbage:?}");
        }
    }

    #[test]
    fn retry_info_is_read_from_the_status_details() {
        let d = Duration::from_millis(2500);
        assert_eq!(parse_retry_info(&retry_info_details(8, d)), Some(d));
        assert_eq!(parse_retry_info(b""), None);
        assert_eq!(parse_retry_info(b"\xff\xff garbage"), None);
        // Another detail type is not a RetryInfo.
        use prost::Message;
        let other = rpc::Status {
            code: 8,
            message: "x".into(),
            details: vec![rpc::Any {
                type_url: "type.googleapis.com/google.rpc.DebugInfo".into(),
                value: vec![10, 0],
            }],
        };
        assert_eq!(parse_retry_info(&other.encode_to_vec()), None);
        // A negative delay is nonsense.
        let negative = rpc::Status {
            code: 8,
            message: String::new(),
            details: vec![rpc::Any {
                type_url: RETRY_INFO_TYPE.into(),
                value: rpc::RetryInfo {
                    retry_delay: Some(rpc::ProtoDuration {
                        seconds: -5,
                        nanos: 0,
                    }),
                }
                .encode_to_vec(),
            }],
        };
        assert_eq!(parse_retry_info(&negative.encode_to_vec()), None);
    }
}

//! When to try again: exponential backoff with jitter, unless the collector
//! said when (HTTP `Retry-After`, gRPC `RetryInfo` in
//! `grpc-status-details-bin`), which is then honoured as given (capped).

use std::{
    hash::{BuildHasher, Hasher},
    time::Duration,
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
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    h.finish()
}

/// `Retry-After` as delta-seconds (what collectors send). An HTTP-date
/// form is not read: the backoff applies then.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
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
        assert_eq!(parse_retry_after(" 3 "), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("0"), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
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

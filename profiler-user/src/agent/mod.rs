//! Delivery of `allocprof agent`'s exports to an OTLP collector, apart from
//! profiling: the driver encodes an export and enqueues it ([`deliver`]),
//! a sender thread sends it over OTLP/HTTP ([`http`]) or OTLP/gRPC
//! ([`grpc`]), retrying only what the collector says is worth retrying
//! ([`retry`]); the queue is bounded in bytes ([`queue`]); [`stats`] counts
//! it all for the periodic log line; [`config`] reads the `OTEL_EXPORTER_OTLP_*`
//! variables and the flags.

pub mod config;
pub mod deliver;
pub mod grpc;
pub mod http;
pub mod queue;
pub mod retry;
pub mod stats;
pub mod tls;

use std::{sync::Arc, time::Duration};

use thiserror::Error;

use crate::output::{export::otlp::proto::collector::ExportProfilesServiceRequest, inert::inert};
use config::{Config, Protocol};

/// What the collector accepted: all of it unless it reports a partial
/// success (profiles it rejected, and why).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Accepted {
    pub rejected_profiles: i64,
    pub error_message: String,
}

/// What to do with an export whose attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Retryable (the collector refused for now, or could not be reached):
    /// after the collector's delay if it gave one, else the backoff's.
    Retry(Option<Duration>),
    /// Not retryable, or not safely (the request may have been taken):
    /// dropped and counted.
    Drop,
}

/// A failed attempt: `kind` is short and stable (`HTTP 503`, `connect`,
/// `gRPC UNAVAILABLE`) and says which failures are the same for the log
/// (one line per kind); `detail` is the peer's or the system's words.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{kind}: {}", inert(detail))]
pub struct Failure {
    pub kind: String,
    pub detail: String,
    pub verdict: Verdict,
}

impl Failure {
    pub fn new(kind: impl Into<String>, detail: impl Into<String>, verdict: Verdict) -> Failure {
        Failure {
            kind: kind.into(),
            detail: detail.into(),
            verdict,
        }
    }
}

/// One way of sending an encoded `ExportProfilesServiceRequest`.
pub trait Transport: Send {
    fn export(&mut self, request: &Arc<Vec<u8>>, timeout: Duration) -> Result<Accepted, Failure>;
}

/// A transport for `config`: certificates are read here, so a missing or
/// bad file is an error at start, not at the first export.
pub fn transport(config: &Config) -> anyhow::Result<Box<dyn Transport>> {
    Ok(match config.protocol {
        Protocol::HttpProtobuf => Box::new(http::Http::new(config)?),
        Protocol::Grpc => Box::new(grpc::Grpc::new(config)?),
    })
}

/// The request an export sends: the same fields as `ProfilesData`.
pub fn request(
    data: crate::output::export::otlp::proto::profiles::ProfilesData,
) -> ExportProfilesServiceRequest {
    ExportProfilesServiceRequest {
        resource_profiles: data.resource_profiles,
        dictionary: data.dictionary,
    }
}

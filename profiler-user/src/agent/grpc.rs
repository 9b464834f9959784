//! OTLP/gRPC: one unary `ProfilesService/Export` call per attempt through
//! tonic (its channel reconnects by itself), TLS by rustls with ring, gzip
//! if asked. The export is queued already encoded; [`Encoded`] hands those
//! bytes to tonic's prost codec as they are. It runs on the sender's thread,
//! on a small runtime of its own, made there at the first export (a runtime
//! must not be dropped, or made and dropped, within the driver's).
//!
//! Outcomes: UNAVAILABLE is retried, and RESOURCE_EXHAUSTED when the
//! collector says when (RetryInfo; the spec retries it only then), after
//! the RetryInfo's delay if given; anything else, a deadline included, is
//! dropped (the collector may have taken it: nothing is sent twice).

use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result};
use prost::{
    DecodeError, Message,
    bytes::{Buf, BufMut},
    encoding::{DecodeContext, WireType},
};
use tonic::{
    Code, Status,
    codec::CompressionEncoding,
    metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
};
use tonic_prost::ProstCodec;

use super::{Accepted, Failure, Transport, Verdict, config::Compression, config::Config, retry};
use crate::output::export::otlp::proto::collector::ExportProfilesServiceResponse;

pub const EXPORT_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// What a response may take (a count and an error message), and its
/// headers and trailers.
const MAX_RESPONSE_BYTES: usize = 64 << 10;

pub struct Grpc {
    endpoint: Endpoint,
    /// Made at the first export, on the sender's thread.
    live: Option<(tokio::runtime::Runtime, Channel)>,
    metadata: MetadataMap,
    gzip: bool,
}

impl Grpc {
    pub fn new(config: &Config) -> Result<Grpc> {
        let scheme = if config.url.tls { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", config.url.authority))
            .with_context(|| format!("{}: not a gRPC endpoint", config.url))?
            .connect_timeout(config.timeout)
            .http2_max_header_list_size(MAX_RESPONSE_BYTES as u32)
            .user_agent(format!("allocprof/{}", env!("CARGO_PKG_VERSION")))
            .context("the user agent")?;
        if config.url.tls {
            let pems = super::tls::Pems::read(config)?;
            let mut tls = ClientTlsConfig::new().domain_name(config.url.host.clone());
            tls = match pems.ca {
                Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
                None => tls.with_native_roots(),
            };
            if let Some((cert, key)) = pems.client {
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            endpoint = endpoint.tls_config(tls).context("the TLS configuration")?;
        }
        let mut metadata = MetadataMap::new();
        for (k, v) in &config.headers {
            let key = AsciiMetadataKey::from_bytes(k.as_bytes())
                .with_context(|| format!("{k}: not a gRPC metadata key"))?;
            let value = AsciiMetadataValue::try_from(v.as_str())
                .with_context(|| format!("the value of {k}: not gRPC metadata"))?;
            metadata.insert(key, value);
        }
        Ok(Grpc {
            endpoint,
            live: None,
            metadata,
            gzip: config.compression == Compression::Gzip,
        })
    }
}

impl Transport for Grpc {
    fn export(&mut self, request: &Arc<Vec<u8>>, timeout: Duration) -> Result<Accepted, Failure> {
        if self.live.is_none() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Failure::new("gRPC runtime", e.to_string(), Verdict::Drop))?;
            // The channel's worker runs on this runtime, while we block on it;
            // the channel connects (and reconnects) by itself.
            let channel = {
                let _entered = runtime.enter();
                self.endpoint.connect_lazy()
            };
            self.live = Some((runtime, channel));
        }
        let (runtime, channel) = self.live.as_ref().expect("made above");
        let mut client =
            tonic::client::Grpc::new(channel.clone()).max_decoding_message_size(MAX_RESPONSE_BYTES);
        if self.gzip {
            // The collector answers in the request's encoding.
            client = client
                .send_compressed(CompressionEncoding::Gzip)
                .accept_compressed(CompressionEncoding::Gzip);
        }
        let mut call = tonic::Request::new(Encoded(request.clone()));
        call.set_timeout(timeout);
        *call.metadata_mut() = self.metadata.clone();
        let path = ::http::uri::PathAndQuery::from_static(EXPORT_PATH);
        let result = runtime.block_on(async {
            let call = async {
                client
                    .ready()
                    .await
                    .map_err(|e| Status::unavailable(format!("connecting: {e}")))?;
                client
                    .unary(
                        call,
                        path,
                        ProstCodec::<Encoded, ExportProfilesServiceResponse>::default(),
                    )
                    .await
            };
            match tokio::time::timeout(timeout, call).await {
                Ok(r) => r,
                Err(_) => Err(Status::deadline_exceeded(format!(
                    "no answer within {timeout:?}"
                ))),
            }
        });
        match result {
            Ok(response) => Ok(response
                .into_inner()
                .partial_success
                .map(|p| Accepted {
                    rejected_profiles: p.rejected_profiles,
                    error_message: p.error_message,
                })
                .unwrap_or_default()),
            Err(status) => Err(failure(&status)),
        }
    }
}

/// A status as a failure: its code, its message and its sources' (where a
/// transport or TLS error says what went wrong).
pub fn failure(status: &Status) -> Failure {
    let mut detail = status.message().to_owned();
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        let text = e.to_string();
        if !detail.contains(&text) {
            detail.push_str(": ");
            detail.push_str(&text);
        }
        source = e.source();
    }
    let retry_info = retry::parse_retry_info(status.details());
    let verdict = match status.code() {
        // A certificate the CA does not vouch for will not get better.
        Code::Unavailable if detail.contains("certificate") => Verdict::Drop,
        Code::Unavailable => Verdict::Retry(retry_info),
        Code::ResourceExhausted if retry_info.is_some() => Verdict::Retry(retry_info),
        _ => Verdict::Drop,
    };
    Failure::new(
        format!("gRPC {}", code_name(status.code())),
        detail,
        verdict,
    )
}

fn code_name(code: Code) -> String {
    // `Code`'s Debug is CamelCase; the spec's names are SCREAMING_SNAKE.
    let camel = format!("{code:?}");
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// An `ExportProfilesServiceRequest` encoded already: its bytes, written
/// as they are (nothing decodes one here).
#[derive(Clone, Debug, Default)]
pub struct Encoded(pub Arc<Vec<u8>>);

impl Message for Encoded {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0 = Arc::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_verdicts() {
        let f = failure(&Status::unavailable("down"));
        assert_eq!(
            (f.kind.as_str(), f.verdict),
            ("gRPC UNAVAILABLE", Verdict::Retry(None))
        );
        let d = Duration::from_secs(3);
        let details = retry::retry_info_details(8, d);
        let exhausted =
            Status::with_details(Code::ResourceExhausted, "slow down", details.clone().into());
        let f = failure(&exhausted);
        assert_eq!(
            (f.kind.as_str(), f.verdict),
            ("gRPC RESOURCE_EXHAUSTED", Verdict::Retry(Some(d)))
        );
        // Without RetryInfo, the spec does not retry it.
        assert_eq!(
            failure(&Status::resource_exhausted("x")).verdict,
            Verdict::Drop
        );
        let f = failure(&Status::with_details(
            Code::Unavailable,
            "u",
            details.into(),
        ));
        assert_eq!(f.verdict, Verdict::Retry(Some(d)));
        for s in [
            Status::invalid_argument("bad"),
            Status::deadline_exceeded("late"),
            Status::internal("oops"),
            Status::unavailable("invalid peer certificate: UnknownIssuer"),
        ] {
            assert_eq!(failure(&s).verdict, Verdict::Drop, "{s:?}");
        }
        assert_eq!(
            failure(&Status::invalid_argument("")).kind,
            "gRPC INVALID_ARGUMENT"
        );
    }

    #[test]
    fn encoded_bytes_are_written_as_they_are() {
        let bytes = Arc::new(vec![10, 2, 8, 1]);
        assert_eq!(Encoded(bytes.clone()).encode_to_vec(), *bytes);
    }
}

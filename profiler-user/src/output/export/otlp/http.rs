//! OTLP/HTTP with protobuf bodies, plain HTTP/1.1 over TCP: one POST per
//! export, every step under a timeout, the response read within a bound.
//! No TLS, gzip, retries or queue yet (issue 28): an `https` endpoint is
//! refused with an error saying so.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpStream, ToSocketAddrs},
    time::Duration,
};

use prost::Message;
use thiserror::Error;

use super::proto::{
    collector::{ExportProfilesServiceRequest, ExportProfilesServiceResponse},
    profiles::ProfilesData,
};

/// The collector's path for profiles, after the endpoint's base
/// (`OTEL_EXPORTER_OTLP_ENDPOINT` semantics).
pub const PROFILES_PATH: &str = "/v1development/profiles";

/// What a response may take: a status line, headers and an
/// `ExportProfilesServiceResponse` (a count and an error message).
const MAX_RESPONSE_BYTES: u64 = 64 << 10;

#[derive(Debug, Error)]
pub enum PushError {
    #[error("{0}: not an http:// endpoint (OTLP over TLS is not supported yet)")]
    Endpoint(String),
    #[error("connecting to {0}: {1}")]
    Connect(String, #[source] std::io::Error),
    #[error("sending to {0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("{0} answered HTTP {1}: {2}")]
    Status(String, u16, String),
    #[error("{0} sent a malformed response: {1}")]
    Response(String, String),
}

/// What the collector accepted: all of it unless it reports a partial
/// success (profiles it rejected, and why).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Accepted {
    pub rejected_profiles: i64,
    pub error_message: String,
}

/// The request an export sends: the same fields as `ProfilesData`.
pub fn request(data: ProfilesData) -> ExportProfilesServiceRequest {
    ExportProfilesServiceRequest {
        resource_profiles: data.resource_profiles,
        dictionary: data.dictionary,
    }
}

/// POSTs `request` to `endpoint` (`http://host:port`, optionally with a
/// base path) + [`PROFILES_PATH`]; `timeout` bounds the connection and
/// each read and write.
pub fn push(
    endpoint: &str,
    request: &ExportProfilesServiceRequest,
    timeout: Duration,
) -> Result<Accepted, PushError> {
    let rest = endpoint
        .strip_prefix("http://")
        .ok_or_else(|| PushError::Endpoint(endpoint.into()))?;
    let (authority, base) = rest.split_once('/').unwrap_or((rest, ""));
    let path = match base.trim_matches('/') {
        "" => PROFILES_PATH.to_owned(),
        base => format!("/{base}{PROFILES_PATH}"),
    };
    let io = |e| PushError::Io(endpoint.into(), e);
    let connect = |e| PushError::Connect(endpoint.into(), e);
    let address = authority
        .to_socket_addrs()
        .map_err(connect)?
        .next()
        .ok_or_else(|| PushError::Endpoint(endpoint.into()))?;
    let mut stream = TcpStream::connect_timeout(&address, timeout).map_err(connect)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let body = request.encode_to_vec();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/x-protobuf\r\n\
         Content-Length: {}\r\nUser-Agent: allocprof/{}\r\nConnection: close\r\n\r\n",
        body.len(),
        env!("CARGO_PKG_VERSION")
    );
    stream.write_all(head.as_bytes()).map_err(io)?;
    stream.write_all(&body).map_err(io)?;
    stream.flush().map_err(io)?;

    let mut reader = BufReader::new(stream.take(MAX_RESPONSE_BYTES));
    let malformed = |what: &str| PushError::Response(endpoint.into(), what.into());
    let mut status_line = String::new();
    reader.read_line(&mut status_line).map_err(io)?;
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| malformed("no status line"))?;
    let mut length = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).map_err(io)? == 0 {
            return Err(malformed("headers cut short"));
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse::<u64>().ok();
        }
    }
    // Connection: close: the body ends with the stream, or at its length.
    let mut body = Vec::new();
    match length {
        Some(n) => reader.take(n).read_to_end(&mut body),
        None => reader.read_to_end(&mut body),
    }
    .map_err(io)?;
    if !(200..300).contains(&status) {
        let text = String::from_utf8_lossy(&body);
        return Err(PushError::Status(
            endpoint.into(),
            status,
            text.chars().take(200).collect(),
        ));
    }
    let response = ExportProfilesServiceResponse::decode(&body[..])
        .map_err(|e| malformed(&format!("not an ExportProfilesServiceResponse: {e}")))?;
    Ok(response
        .partial_success
        .map(|p| Accepted {
            rejected_profiles: p.rejected_profiles,
            error_message: p.error_message,
        })
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use std::{net::TcpListener, thread};

    use super::{super::proto::collector::ExportProfilesPartialSuccess, *};

    /// A one-request server: answers `response` (head and body), returns
    /// the request it read (head and body).
    fn serve(response: Vec<u8>) -> (String, thread::JoinHandle<(String, Vec<u8>)>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let server = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream);
            let mut head = String::new();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                head.push_str(&line);
                if line == "\r\n" {
                    break;
                }
            }
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .unwrap()
                .parse()
                .unwrap();
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            reader.get_mut().write_all(&response).unwrap();
            (head, body)
        });
        (endpoint, server)
    }

    fn response(status: &str, body: &[u8]) -> Vec<u8> {
        let mut r = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    }

    fn a_request() -> ExportProfilesServiceRequest {
        request(crate::output::export::otlp::encode(
            &crate::output::export::tests::hand_made(),
            std::time::UNIX_EPOCH + Duration::from_secs(1),
        ))
    }

    #[test]
    fn posts_protobuf_to_the_profiles_path_and_reads_a_partial_success() {
        let partial = ExportProfilesServiceResponse {
            partial_success: Some(ExportProfilesPartialSuccess {
                rejected_profiles: 2,
                error_message: "too old".into(),
            }),
        };
        let (endpoint, server) = serve(response("200 OK", &partial.encode_to_vec()));
        let sent = a_request();
        let accepted = push(&format!("{endpoint}/base/"), &sent, Duration::from_secs(30));
        let (head, body) = server.join().unwrap();
        assert_eq!(
            accepted.unwrap(),
            Accepted {
                rejected_profiles: 2,
                error_message: "too old".into()
            }
        );
        assert!(
            head.starts_with("POST /base/v1development/profiles HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(
            head.contains("\r\nContent-Type: application/x-protobuf\r\n"),
            "{head}"
        );
        assert_eq!(
            ExportProfilesServiceRequest::decode(&body[..]).unwrap(),
            sent
        );
    }

    #[test]
    fn an_error_status_and_a_wrong_scheme_are_errors() {
        let (endpoint, server) = serve(response("503 Service Unavailable", b"busy"));
        let err = push(&endpoint, &a_request(), Duration::from_secs(30)).unwrap_err();
        let (head, _) = server.join().unwrap();
        assert!(head.starts_with("POST /v1development/profiles "), "{head}");
        assert!(
            matches!(&err, PushError::Status(_, 503, text) if text == "busy"),
            "{err}"
        );
        let err = push("https://127.0.0.1:1", &a_request(), Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, PushError::Endpoint(_)), "{err}");
    }
}

//! OTLP/HTTP with protobuf bodies, HTTP/1.1 written by hand (one POST per
//! attempt, `Connection: close`): over TCP or rustls, gzip'd if asked, the
//! configured headers; every step under the timeout, the response read
//! within a bound. Plain blocking I/O: it runs on the sender's thread.
//!
//! Outcomes: 2xx is accepted (a partial success read from the body); 429,
//! 502, 503 and 504 are retried, after `Retry-After` if given; a connection
//! that could not be made, or broke before the request was written whole,
//! is retried (the collector cannot have taken it); anything else, a
//! response that never came included, is dropped: the collector may have
//! taken it, and nothing is sent twice.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpStream, ToSocketAddrs},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Result;
use flate2::{Compression as Level, write::GzEncoder};
use prost::Message;
use rustls::{ClientConfig, ClientConnection, StreamOwned, pki_types::ServerName};

use super::{
    Accepted, Failure, Transport, Verdict,
    config::{Compression, Config, Url},
    retry::parse_retry_after,
};
use crate::output::export::otlp::proto::collector::ExportProfilesServiceResponse;

/// What a response may take: a status line, headers and an
/// `ExportProfilesServiceResponse` (a count and an error message).
pub const MAX_RESPONSE_BYTES: u64 = 64 << 10;

pub struct Http {
    url: Url,
    headers: Vec<(String, String)>,
    gzip: bool,
    tls: Option<Arc<ClientConfig>>,
}

impl Http {
    pub fn new(config: &Config) -> Result<Http> {
        let tls = if config.url.tls {
            Some(super::tls::client_config(config, &[b"http/1.1"])?)
        } else {
            None
        };
        Ok(Http {
            url: config.url.clone(),
            headers: config.headers.clone(),
            gzip: config.compression == Compression::Gzip,
            tls,
        })
    }
}

impl Transport for Http {
    fn export(&mut self, request: &Arc<Vec<u8>>, timeout: Duration) -> Result<Accepted, Failure> {
        post(self, request, timeout)
    }
}

/// Failures of the connection, by when they happened.
fn connect_failure(e: impl std::fmt::Display) -> Failure {
    Failure::new("connect", e.to_string(), Verdict::Retry(None))
}

fn post(http: &Http, request: &[u8], timeout: Duration) -> Result<Accepted, Failure> {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let address = (http.url.host.as_str(), http.url.port)
        .to_socket_addrs()
        .map_err(connect_failure)?
        .next()
        .ok_or_else(|| connect_failure("no address"))?;
    let tcp = TcpStream::connect_timeout(&address, left()).map_err(connect_failure)?;
    tcp.set_read_timeout(Some(left()))
        .map_err(connect_failure)?;
    tcp.set_write_timeout(Some(left()))
        .map_err(connect_failure)?;
    let _ = tcp.set_nodelay(true);

    let compressed;
    let body = if http.gzip {
        let mut gz = GzEncoder::new(Vec::new(), Level::fast());
        compressed = gz
            .write_all(request)
            .and_then(|()| gz.finish())
            .map_err(|e| Failure::new("gzip", e.to_string(), Verdict::Drop))?;
        &compressed[..]
    } else {
        request
    };
    let mut head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-protobuf\r\n\
         Content-Length: {}\r\nUser-Agent: allocprof/{}\r\nConnection: close\r\n",
        http.url.path,
        http.url.authority,
        body.len(),
        env!("CARGO_PKG_VERSION")
    );
    if http.gzip {
        head.push_str("Content-Encoding: gzip\r\n");
    }
    // Checked at configuration (tokens and visible ASCII): no CR or LF.
    for (k, v) in &http.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");

    match &http.tls {
        None => exchange(tcp, head.as_bytes(), body),
        Some(tls) => {
            let name = ServerName::try_from(http.url.host.clone())
                .map_err(|e| Failure::new("TLS", e.to_string(), Verdict::Drop))?;
            let mut conn = ClientConnection::new(tls.clone(), name)
                .map_err(|e| Failure::new("TLS", e.to_string(), Verdict::Drop))?;
            let mut tcp = tcp;
            // The handshake first, on its own: a certificate the CA does not
            // vouch for is one clear error, not retried.
            while conn.is_handshaking() {
                conn.complete_io(&mut tcp).map_err(|e| {
                    let verdict = match e.kind() {
                        std::io::ErrorKind::InvalidData => Verdict::Drop,
                        // Cut or timed out mid-handshake: nothing was sent.
                        _ => Verdict::Retry(None),
                    };
                    Failure::new("TLS handshake", e.to_string(), verdict)
                })?;
            }
            exchange(StreamOwned::new(conn, tcp), head.as_bytes(), body)
        }
    }
}

fn exchange<S: Read + Write>(mut stream: S, head: &[u8], body: &[u8]) -> Result<Accepted, Failure> {
    // Broken before the request is written whole: the collector cannot
    // have taken it.
    let unsent = |e: std::io::Error| Failure::new("send", e.to_string(), Verdict::Retry(None));
    stream.write_all(head).map_err(unsent)?;
    stream.write_all(body).map_err(unsent)?;
    stream.flush().map_err(unsent)?;

    let no_answer = |e: std::io::Error| {
        Failure::new(
            "no response",
            format!("{e} (not resent: the collector may have it)"),
            Verdict::Drop,
        )
    };
    let malformed = |what: &str| Failure::new("malformed response", what, Verdict::Drop);
    let mut reader = BufReader::new(stream.take(MAX_RESPONSE_BYTES));
    let mut status_line = String::new();
    reader.read_line(&mut status_line).map_err(no_answer)?;
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| malformed("no status line"))?;
    let mut length = None;
    let mut chunked = false;
    let mut retry_after = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).map_err(no_answer)? == 0 {
            return Err(malformed("headers cut short"));
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.trim().parse::<u64>().ok();
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.trim().eq_ignore_ascii_case("chunked");
        } else if name.eq_ignore_ascii_case("retry-after") {
            retry_after = parse_retry_after(value, std::time::SystemTime::now());
        }
    }
    let mut body = Vec::new();
    let read = if chunked {
        read_chunked(&mut reader, &mut body)
    } else {
        // Connection: close: the body ends with the stream, or at its length.
        match length {
            Some(n) => (&mut reader).take(n).read_to_end(&mut body).map(drop),
            None => reader.read_to_end(&mut body).map(drop),
        }
    };
    // A status is an answer even if its body is cut short.
    let text = || {
        String::from_utf8_lossy(&body)
            .chars()
            .take(200)
            .collect::<String>()
    };
    match status {
        200..=299 => {
            read.map_err(no_answer)?;
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
        429 | 502 | 503 | 504 => Err(Failure::new(
            format!("HTTP {status}"),
            text(),
            Verdict::Retry(retry_after),
        )),
        _ => Err(Failure::new(
            format!("HTTP {status}"),
            text(),
            Verdict::Drop,
        )),
    }
}

/// A chunked body, into `out` (the reader is bounded already).
fn read_chunked(reader: &mut impl BufRead, out: &mut Vec<u8>) -> std::io::Result<()> {
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "bad chunk");
    loop {
        let mut size = String::new();
        reader.read_line(&mut size)?;
        let hex = size.trim().split(';').next().unwrap_or("");
        let n = u64::from_str_radix(hex, 16).map_err(|_| bad())?;
        if n == 0 {
            return Ok(());
        }
        let before = out.len();
        reader.take(n).read_to_end(out)?;
        if (out.len() - before) as u64 != n {
            return Err(bad());
        }
        let mut crlf = String::new();
        reader.read_line(&mut crlf)?;
    }
}

#[cfg(test)]
mod tests {
    use std::{net::TcpListener, thread};

    use flate2::read::GzDecoder;

    use super::{
        super::config::{Flags, Protocol},
        *,
    };
    use crate::output::export::otlp::proto::collector::{
        ExportProfilesPartialSuccess, ExportProfilesServiceRequest,
    };

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

    fn response(status: &str, extra: &str, body: &[u8]) -> Vec<u8> {
        let mut r = format!(
            "HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    }

    fn a_request() -> Arc<Vec<u8>> {
        Arc::new(
            super::super::request(crate::output::export::otlp::encode(
                &crate::output::export::tests::hand_made(),
                std::time::UNIX_EPOCH + Duration::from_secs(1),
            ))
            .encode_to_vec(),
        )
    }

    fn http(endpoint: &str, vars: &[(&str, &str)], headers: &[&str]) -> Http {
        let flags = Flags {
            endpoint: Some(endpoint.into()),
            protocol: Some(Protocol::HttpProtobuf),
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
        };
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let env = |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        Http::new(&Config::new(&env, &flags).unwrap()).unwrap()
    }

    #[test]
    fn posts_protobuf_to_the_profiles_path_and_reads_a_partial_success() {
        let partial = ExportProfilesServiceResponse {
            partial_success: Some(ExportProfilesPartialSuccess {
                rejected_profiles: 2,
                error_message: "too old".into(),
            }),
        };
        let (endpoint, server) = serve(response("200 OK", "", &partial.encode_to_vec()));
        let sent = a_request();
        let mut h = http(&format!("{endpoint}/base/"), &[], &["x-tenant=a b"]);
        let accepted = h.export(&sent, Duration::from_secs(30));
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
        assert!(head.contains("\r\nx-tenant: a b\r\n"), "{head}");
        assert!(!head.contains("Content-Encoding"), "{head}");
        assert_eq!(body, *sent);
    }

    #[test]
    fn gzip_compresses_the_body() {
        let (endpoint, server) = serve(response("200 OK", "", b""));
        let sent = a_request();
        let mut h = http(
            &endpoint,
            &[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")],
            &[],
        );
        assert_eq!(
            h.export(&sent, Duration::from_secs(30)).unwrap(),
            Accepted::default()
        );
        let (head, body) = server.join().unwrap();
        assert!(head.contains("\r\nContent-Encoding: gzip\r\n"), "{head}");
        let mut plain = Vec::new();
        GzDecoder::new(&body[..]).read_to_end(&mut plain).unwrap();
        assert_eq!(
            ExportProfilesServiceRequest::decode(&plain[..])
                .unwrap()
                .encode_to_vec(),
            *sent
        );
    }

    #[test]
    fn retryable_statuses_carry_retry_after_and_others_are_dropped() {
        for (status, extra, verdict) in [
            (
                "503 Service Unavailable",
                "Retry-After: 7\r\n",
                Verdict::Retry(Some(Duration::from_secs(7))),
            ),
            ("429 Too Many Requests", "", Verdict::Retry(None)),
            ("502 Bad Gateway", "", Verdict::Retry(None)),
            (
                "504 Gateway Timeout",
                "Retry-After: soon\r\n",
                Verdict::Retry(None),
            ),
            (
                "503 Service Unavailable",
                "Retry-After: Wed, 21 Oct 2015 07:28:00 GMT\r\n",
                Verdict::Retry(Some(Duration::ZERO)),
            ),
            ("400 Bad Request", "Retry-After: 7\r\n", Verdict::Drop),
            ("500 Internal Server Error", "", Verdict::Drop),
        ] {
            let (endpoint, server) = serve(response(status, extra, b"busy"));
            let err = http(&endpoint, &[], &[])
                .export(&a_request(), Duration::from_secs(30))
                .unwrap_err();
            server.join().unwrap();
            assert_eq!(err.verdict, verdict, "{status}");
            assert_eq!(err.kind, format!("HTTP {}", &status[..3]));
            assert_eq!(err.detail, "busy");
        }
    }

    #[test]
    fn no_listener_is_retried_and_no_answer_is_dropped() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = http(&format!("http://127.0.0.1:{port}"), &[], &[])
            .export(&a_request(), Duration::from_secs(5))
            .unwrap_err();
        assert_eq!(
            (err.kind.as_str(), err.verdict),
            ("connect", Verdict::Retry(None))
        );
        // Accepts, reads, never answers: the timeout ends it, not resent.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let silent = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut sink = [0; 4096];
            let _ = s.read(&mut sink);
            let _ = rx.recv();
        });
        let err = http(&endpoint, &[], &[])
            .export(&a_request(), Duration::from_millis(300))
            .unwrap_err();
        tx.send(()).unwrap();
        silent.join().unwrap();
        assert_eq!(
            (err.kind.as_str(), err.verdict),
            ("no response", Verdict::Drop)
        );
    }

    #[test]
    fn a_chunked_response_is_read() {
        let partial = ExportProfilesServiceResponse {
            partial_success: Some(ExportProfilesPartialSuccess {
                rejected_profiles: 1,
                error_message: "x".into(),
            }),
        }
        .encode_to_vec();
        let mut r = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
            partial.len()
        )
        .into_bytes();
        r.extend_from_slice(&partial);
        r.extend_from_slice(b"\r\n0\r\n\r\n");
        let (endpoint, server) = serve(r);
        let accepted = http(&endpoint, &[], &[]).export(&a_request(), Duration::from_secs(30));
        server.join().unwrap();
        assert_eq!(accepted.unwrap().rejected_profiles, 1);
    }
}

//! Where and how exports go: the OTLP exporter specification's variables
//! (`OTEL_EXPORTER_OTLP_*`, each with its `_PROFILES_` variant, which wins)
//! and the command line's flags, which override both. A pure function of
//! the two, so every rule is unit tested.

use std::{path::PathBuf, time::Duration};

use thiserror::Error;

/// The collector's path for profiles under a base endpoint
/// (`OTEL_EXPORTER_OTLP_ENDPOINT`, `--otlp-endpoint`).
pub const PROFILES_PATH: &str = "/v1development/profiles";

/// The spec's default export timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

impl Protocol {
    pub fn parse(s: &str) -> Option<Protocol> {
        match s.trim() {
            "grpc" => Some(Protocol::Grpc),
            "http/protobuf" => Some(Protocol::HttpProtobuf),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
}

/// What the command line says (each overrides its variables).
#[derive(Clone, Debug, Default)]
pub struct Flags {
    /// A base endpoint, as `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: Option<String>,
    pub protocol: Option<Protocol>,
    /// `K=V`, added to (and replacing the same keys of) the variables'.
    pub headers: Vec<String>,
}

/// Everything the transports need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub protocol: Protocol,
    /// The URL to send to: for OTLP/HTTP the full one (path included), for
    /// gRPC `scheme://host:port`.
    pub url: Url,
    pub headers: Vec<(String, String)>,
    pub compression: Compression,
    pub timeout: Duration,
    /// PEM files: the CA to trust instead of the system's, and a client
    /// certificate and key for mutual TLS.
    pub certificate: Option<PathBuf>,
    pub client_certificate: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

/// An endpoint, split: `https` means TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    pub tls: bool,
    /// `host` or `host:port` as written (the `Host` header, the TLS name).
    pub authority: String,
    pub host: String,
    pub port: u16,
    /// Starts with `/`.
    pub path: String,
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority, self.path)
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{0}={1:?}: {2}")]
    Variable(&'static str, String, &'static str),
    #[error("{0} {1:?}: {2}")]
    Flag(&'static str, String, &'static str),
    #[error("{0} is set without {1}: a client certificate needs its key and the reverse")]
    ClientPair(&'static str, &'static str),
}

/// The variables, each with its `_PROFILES_` variant read first.
struct Var {
    general: &'static str,
    profiles: &'static str,
}

const ENDPOINT: Var = Var {
    general: "OTEL_EXPORTER_OTLP_ENDPOINT",
    profiles: "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
};
const PROTOCOL: Var = Var {
    general: "OTEL_EXPORTER_OTLP_PROTOCOL",
    profiles: "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL",
};
const HEADERS: Var = Var {
    general: "OTEL_EXPORTER_OTLP_HEADERS",
    profiles: "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
};
const COMPRESSION: Var = Var {
    general: "OTEL_EXPORTER_OTLP_COMPRESSION",
    profiles: "OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION",
};
const TIMEOUT: Var = Var {
    general: "OTEL_EXPORTER_OTLP_TIMEOUT",
    profiles: "OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT",
};
const CERTIFICATE: Var = Var {
    general: "OTEL_EXPORTER_OTLP_CERTIFICATE",
    profiles: "OTEL_EXPORTER_OTLP_PROFILES_CERTIFICATE",
};
const CLIENT_CERTIFICATE: Var = Var {
    general: "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    profiles: "OTEL_EXPORTER_OTLP_PROFILES_CLIENT_CERTIFICATE",
};
const CLIENT_KEY: Var = Var {
    general: "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    profiles: "OTEL_EXPORTER_OTLP_PROFILES_CLIENT_KEY",
};

impl Var {
    /// The profiles variable if set (and not empty), else the general one:
    /// its name and value.
    fn get(&self, env: &dyn Fn(&str) -> Option<String>) -> Option<(&'static str, String)> {
        [self.profiles, self.general].into_iter().find_map(|name| {
            env(name)
                .filter(|v| !v.trim().is_empty())
                .map(|v| (name, v))
        })
    }
}

impl Config {
    /// From allocprof's own environment and the flags.
    pub fn from_env(flags: &Flags) -> Result<Config, ConfigError> {
        Config::new(&|name| std::env::var(name).ok(), flags)
    }

    /// `env` reads a variable. The spec's defaults: OTLP/HTTP, the local
    /// collector's port for the protocol, no compression, 10 s.
    pub fn new(env: &dyn Fn(&str) -> Option<String>, flags: &Flags) -> Result<Config, ConfigError> {
        let protocol = match (flags.protocol, PROTOCOL.get(env)) {
            (Some(p), _) => p,
            (None, Some((name, v))) => Protocol::parse(&v).ok_or(ConfigError::Variable(
                name,
                v,
                "not grpc or http/protobuf",
            ))?,
            (None, None) => Protocol::HttpProtobuf,
        };
        // The base endpoints get the signal's path (OTLP/HTTP only); the
        // profiles variable is the URL as is.
        let (url, base) = match (&flags.endpoint, env(ENDPOINT.profiles)) {
            (Some(e), _) => (
                parse_url(e).map_err(|why| ConfigError::Flag("--otlp-endpoint", e.clone(), why))?,
                true,
            ),
            (None, Some(e)) if !e.trim().is_empty() => (
                parse_url(e.trim())
                    .map_err(|why| ConfigError::Variable(ENDPOINT.profiles, e.clone(), why))?,
                false,
            ),
            _ => match env(ENDPOINT.general).filter(|e| !e.trim().is_empty()) {
                Some(e) => (
                    parse_url(e.trim())
                        .map_err(|why| ConfigError::Variable(ENDPOINT.general, e.clone(), why))?,
                    true,
                ),
                None => {
                    let default = match protocol {
                        Protocol::Grpc => "http://localhost:4317",
                        Protocol::HttpProtobuf => "http://localhost:4318",
                    };
                    (parse_url(default).expect("a valid default"), true)
                }
            },
        };
        let url = match (protocol, base) {
            (Protocol::HttpProtobuf, true) => Url {
                path: format!("{}{PROFILES_PATH}", url.path.trim_end_matches('/')),
                ..url
            },
            // gRPC names its method itself: the path is not used.
            _ => url,
        };

        let mut headers = match HEADERS.get(env) {
            Some((name, v)) => {
                parse_headers(&v).map_err(|why| ConfigError::Variable(name, v, why))?
            }
            None => Vec::new(),
        };
        for h in &flags.headers {
            let mut parsed = parse_headers(h)
                .ok()
                .filter(|p| p.len() == 1)
                .ok_or_else(|| {
                    ConfigError::Flag("--otlp-header", h.clone(), "not one KEY=VALUE")
                })?;
            let (key, value) = parsed.pop().expect("one");
            headers.retain(|(k, _)| !k.eq_ignore_ascii_case(&key));
            headers.push((key, value));
        }

        let compression = match COMPRESSION.get(env) {
            None => Compression::None,
            Some((name, v)) => match v.trim() {
                "gzip" => Compression::Gzip,
                "none" => Compression::None,
                _ => return Err(ConfigError::Variable(name, v, "not gzip or none")),
            },
        };
        let timeout = match TIMEOUT.get(env) {
            None => DEFAULT_TIMEOUT,
            Some((name, v)) => match v.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => {
                    return Err(ConfigError::Variable(
                        name,
                        v,
                        "not a timeout in milliseconds (e.g. 10000)",
                    ));
                }
            },
        };
        let path = |var: &Var| var.get(env).map(|(_, v)| PathBuf::from(v.trim()));
        let client_certificate = path(&CLIENT_CERTIFICATE);
        let client_key = path(&CLIENT_KEY);
        match (&client_certificate, &client_key) {
            (Some(_), None) => {
                return Err(ConfigError::ClientPair(
                    CLIENT_CERTIFICATE.general,
                    CLIENT_KEY.general,
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError::ClientPair(
                    CLIENT_KEY.general,
                    CLIENT_CERTIFICATE.general,
                ));
            }
            _ => {}
        }
        Ok(Config {
            protocol,
            url,
            headers,
            compression,
            timeout,
            certificate: path(&CERTIFICATE),
            client_certificate,
            client_key,
        })
    }
}

/// `http://host[:port][/path]` or `https://…`; the port defaults to the
/// scheme's.
pub fn parse_url(s: &str) -> Result<Url, &'static str> {
    let (tls, rest) = if let Some(rest) = s.strip_prefix("http://") {
        (false, rest)
    } else if let Some(rest) = s.strip_prefix("https://") {
        (true, rest)
    } else {
        return Err("not an http:// or https:// URL");
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err("no host (and no user info) expected after the scheme");
    }
    if path.contains(['?', '#']) || !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("a path of printable characters, with no query or fragment, expected");
    }
    // `[v6]:port`, `host:port`, or no port.
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => (h, Some(p)),
        _ => (authority, None),
    };
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| "not a port number after the host")?,
        None if tls => 443,
        None => 80,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-_:".contains(&b))
    {
        return Err("not a host name or address");
    }
    Ok(Url {
        tls,
        authority: authority.to_owned(),
        host: host.to_owned(),
        port,
        path: if path.is_empty() {
            "/".into()
        } else {
            path.into()
        },
    })
}

/// `k=v,k2=v2` (the W3C baggage form the spec names): values
/// percent-decoded, both trimmed. Names are HTTP tokens and values visible
/// ASCII or spaces, so that neither can break the request's head.
pub fn parse_headers(s: &str) -> Result<Vec<(String, String)>, &'static str> {
    let mut out = Vec::new();
    for pair in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or("not KEY=VALUE pairs separated by commas")?;
        let key = k.trim();
        if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        {
            return Err("a header name is not an HTTP token");
        }
        let value =
            percent_decode(v.trim()).ok_or("a header value is not valid percent-encoded UTF-8")?;
        if !value
            .bytes()
            .all(|b| b == b' ' || b == b'\t' || b.is_ascii_graphic())
        {
            return Err("a header value holds control or non-ASCII characters");
        }
        out.push((key.to_ascii_lowercase(), value));
    }
    Ok(out)
}

/// `%XX` escapes decoded (the OTLP variables' and `OTEL_RESOURCE_ATTRIBUTES`'
/// values); none for a broken escape or bytes that are not UTF-8.
pub(crate) fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(vars: &[(&str, &str)], flags: &Flags) -> Result<Config, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Config::new(&|name| vars.get(name).cloned(), flags)
    }

    #[test]
    fn the_defaults_are_the_spec_s() {
        let c = config(&[], &Flags::default()).unwrap();
        assert_eq!(c.protocol, Protocol::HttpProtobuf);
        assert_eq!(
            c.url.to_string(),
            "http://localhost:4318/v1development/profiles"
        );
        assert_eq!(c.compression, Compression::None);
        assert_eq!(c.timeout, Duration::from_secs(10));
        assert!(c.headers.is_empty() && c.certificate.is_none());
        let grpc = Flags {
            protocol: Some(Protocol::Grpc),
            ..Default::default()
        };
        let c = config(&[], &grpc).unwrap();
        assert_eq!((c.url.host.as_str(), c.url.port), ("localhost", 4317));
    }

    #[test]
    fn a_base_endpoint_gets_the_path_and_the_profiles_endpoint_is_used_as_is() {
        let c = config(
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c.example/base/")],
            &Flags::default(),
        )
        .unwrap();
        assert_eq!(
            c.url.to_string(),
            "https://c.example/base/v1development/profiles"
        );
        assert_eq!((c.url.tls, c.url.port), (true, 443));
        let c = config(
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:1"),
                (
                    "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
                    "http://c:4318/custom",
                ),
            ],
            &Flags::default(),
        )
        .unwrap();
        assert_eq!(c.url.to_string(), "http://c:4318/custom");
        // The flag is a base endpoint and overrides both.
        let flags = Flags {
            endpoint: Some("http://127.0.0.1:9".into()),
            ..Default::default()
        };
        let c = config(
            &[("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "http://c:4318/x")],
            &flags,
        )
        .unwrap();
        assert_eq!(
            c.url.to_string(),
            "http://127.0.0.1:9/v1development/profiles"
        );
        // gRPC takes no path.
        let c = config(
            &[
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ],
            &Flags::default(),
        )
        .unwrap();
        assert_eq!(
            (c.protocol, c.url.to_string()),
            (Protocol::Grpc, "http://c:4317/".into())
        );
    }

    #[test]
    fn profiles_variables_win_over_general_ones_and_flags_over_both() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
            ("OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT", "2500"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=1"),
            (
                "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
                "Authorization=Bearer%20t0k,x-b = 2 ",
            ),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca.pem"),
            ("OTEL_EXPORTER_OTLP_PROFILES_CLIENT_CERTIFICATE", "/c.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/k.pem"),
        ];
        let c = config(&vars, &Flags::default()).unwrap();
        assert_eq!(c.protocol, Protocol::Grpc);
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.compression, Compression::Gzip);
        assert_eq!(
            c.headers,
            [
                ("authorization".into(), "Bearer t0k".into()),
                ("x-b".into(), "2".into())
            ]
        );
        assert_eq!(c.certificate, Some("/ca.pem".into()));
        assert_eq!(c.client_certificate, Some("/c.pem".into()));
        assert_eq!(c.client_key, Some("/k.pem".into()));
        let flags = Flags {
            protocol: Some(Protocol::HttpProtobuf),
            headers: vec!["X-B=3".into(), "c=%2C".into()],
            ..Default::default()
        };
        let c = config(&vars, &flags).unwrap();
        assert_eq!(c.protocol, Protocol::HttpProtobuf);
        assert_eq!(
            c.headers,
            [
                ("authorization".into(), "Bearer t0k".into()),
                ("x-b".into(), "3".into()),
                ("c".into(), ",".into())
            ]
        );
    }

    #[test]
    fn garbage_is_an_error_naming_its_variable() {
        for (var, value) in [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION", "zstd"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "0"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4317"),
            ("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "ftp://c"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:99999"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=b%0D%0AHost: evil"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "bad name=1"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=%zz"),
        ] {
            let err = config(&[(var, value)], &Flags::default()).unwrap_err();
            let text = err.to_string();
            assert!(text.starts_with(var), "{var}={value}: {text}");
        }
        let err = config(
            &[("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/k")],
            &Flags::default(),
        )
        .unwrap_err();
        assert!(matches!(err, ConfigError::ClientPair(..)), "{err}");
        for flags in [
            Flags {
                headers: vec!["a=1,b=2".into()],
                ..Default::default()
            },
            Flags {
                endpoint: Some("127.0.0.1:4318".into()),
                ..Default::default()
            },
        ] {
            let err = config(&[], &flags).unwrap_err();
            assert!(matches!(err, ConfigError::Flag(..)), "{err}");
        }
    }

    #[test]
    fn urls_split_into_host_port_and_path() {
        let u = parse_url("http://[::1]:4318/p").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("::1", 4318, "/p")
        );
        assert_eq!(u.authority, "[::1]:4318");
        let u = parse_url("https://collector").unwrap();
        assert_eq!((u.port, u.path.as_str()), (443, "/"));
        for bad in [
            "http://",
            "http://u@h",
            "http://h/p?q",
            "http://h:x",
            "http://h h",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }
}

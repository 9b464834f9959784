//! TLS for the transports, through rustls with the ring provider: the CA
//! of `OTEL_EXPORTER_OTLP_CERTIFICATE` if set, else the system's roots; a
//! client certificate and key for mutual TLS if set. Files are read at
//! start, so a missing or malformed one is an error naming it then.

use std::{io::Read, path::Path, sync::Arc};

use anyhow::{Context, Result, bail};
use rustls::{
    ClientConfig, RootCertStore,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
};

use super::config::Config;

/// More than any certificate chain or key file.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// The PEM files of a configuration, read.
pub struct Pems {
    pub ca: Option<Vec<u8>>,
    /// Certificate and key.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

pub fn read_pem(path: &Path) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_PEM_BYTES).read_to_end(&mut bytes))
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(bytes)
}

impl Pems {
    pub fn read(config: &Config) -> Result<Pems> {
        let ca = config.certificate.as_deref().map(read_pem).transpose()?;
        let client = match (&config.client_certificate, &config.client_key) {
            (Some(c), Some(k)) => Some((read_pem(c)?, read_pem(k)?)),
            _ => None,
        };
        Ok(Pems { ca, client })
    }
}

/// The client configuration for `config`'s endpoint, with `alpn` protocols.
pub fn client_config(config: &Config, alpn: &[&[u8]]) -> Result<Arc<ClientConfig>> {
    let pems = Pems::read(config)?;
    let mut roots = RootCertStore::empty();
    match &pems.ca {
        Some(pem) => {
            let path = config.certificate.as_deref().unwrap_or(Path::new(""));
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.with_context(|| format!("reading {}", path.display()))?;
                roots
                    .add(cert)
                    .with_context(|| format!("{}: not a CA certificate", path.display()))?;
            }
            if roots.is_empty() {
                bail!("{}: no PEM certificate in it", path.display());
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
        }
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .context("the TLS provider")?
            .with_root_certificates(roots);
    let mut tls = match &pems.client {
        Some((cert, key)) => {
            let certs = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .context("reading the client certificate")?;
            let key = PrivateKeyDer::from_pem_slice(key).context("reading the client key")?;
            builder
                .with_client_auth_cert(certs, key)
                .context("the client certificate and key")?
        }
        None => builder.with_no_client_auth(),
    };
    tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(tls))
}

//! TLS (docs/tls.md): the listening port's acceptor, for both protocols, and the client side this
//! server uses to reach its peers (repair copies in `peer.rs`, the metadata group in
//! `meta/transport.rs`).
//!
//! Files are read once at start; a missing file, one that holds no PEM object of the right kind,
//! or a key that does not match its certificate is an error that stops the server from starting.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::config::Config;

/// A server's TLS: how it accepts connections and how it connects to its peers.
pub struct Tls {
    /// Handshakes the listening port's connections.
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// Connects to peers, verifying them against `--tls-ca` (or `--tls-client-ca`) and, when the
    /// cluster requires client certificates, presenting this server's own; `None` when neither
    /// CA was given (a peer connection then fails saying so).
    pub peer: Option<Arc<ClientConfig>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("peer", &self.peer.is_some())
            .finish_non_exhaustive()
    }
}

/// Builds the server's TLS from its flags; `None` without `--tls-cert`.
pub fn load(config: &Config) -> anyhow::Result<Option<Arc<Tls>>> {
    let (cert_path, key_path) = match (&config.tls_cert, &config.tls_key) {
        (None, None) => {
            if config.tls_client_ca.is_some() || config.tls_ca.is_some() {
                bail!("--tls-client-ca and --tls-ca need --tls-cert and --tls-key");
            }
            return Ok(None);
        }
        (Some(c), Some(k)) => (c, k),
        _ => bail!("--tls-cert and --tls-key go together: give both or neither"),
    };
    let certs = read_certs(cert_path, "--tls-cert")?;
    let key = read_key(key_path)?;
    let provider = Arc::new(default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match &config.tls_client_ca {
        Some(ca) => {
            let roots = read_roots(ca, "--tls-client-ca")?;
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| anyhow!("--tls-client-ca {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    // with_single_cert checks that the key matches the certificate's public key.
    let server = builder
        .with_single_cert(certs.clone(), key.clone_key())
        .map_err(|e| {
            anyhow!(
                "--tls-cert {} / --tls-key {}: {e}",
                cert_path.display(),
                key_path.display()
            )
        })?;

    let peer = match config.tls_ca.as_ref().or(config.tls_client_ca.as_ref()) {
        None => None,
        Some(ca) => {
            let flag = if config.tls_ca.is_some() {
                "--tls-ca"
            } else {
                "--tls-client-ca"
            };
            let roots = Arc::new(read_roots(ca, flag)?);
            let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| anyhow!("{flag} {}: {e}", ca.display()))?;
            let builder = ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .context("TLS protocol versions")?
                .with_webpki_verifier(verifier);
            // Where clients must show a certificate, so must peers: a server shows its own.
            let client = if config.tls_client_ca.is_some() {
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| anyhow!("--tls-cert as a client certificate: {e}"))?
            } else {
                builder.with_no_client_auth()
            };
            Some(Arc::new(client))
        }
    };
    Ok(Some(Arc::new(Tls {
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
        peer,
    })))
}

impl Tls {
    /// The peer client configuration, or why there is none.
    pub fn peer_config(&self) -> Result<Arc<ClientConfig>, String> {
        self.peer.clone().ok_or_else(|| {
            "this server has TLS but no --tls-ca to verify its peers' certificates".to_string()
        })
    }
}

/// The name a peer's certificate must carry for `addr` (`host:port`): its IP address when the
/// host is one (clusters are addressed by IP), else the host name.
pub fn server_name(addr: &str) -> Result<ServerName<'static>, String> {
    let host = match addr.rsplit_once(':') {
        Some((h, _)) => h,
        None => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ServerName::IpAddress(ip.into()));
    }
    ServerName::try_from(host.to_owned()).map_err(|e| format!("{addr}: not a TLS server name: {e}"))
}

fn read_certs(path: &Path, flag: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let bytes = std::fs::read(path).with_context(|| format!("{flag} {}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{flag} {}: {e}", path.display()))?;
    if certs.is_empty() {
        bail!(
            "{flag} {}: no PEM certificate (-----BEGIN CERTIFICATE-----) in the file",
            path.display()
        );
    }
    Ok(certs)
}

fn read_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let bytes = std::fs::read(path).with_context(|| format!("--tls-key {}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        anyhow!(
            "--tls-key {}: no PEM private key (PKCS#8, PKCS#1 or SEC1) in the file: {e}",
            path.display()
        )
    })
}

fn read_roots(path: &Path, flag: &str) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path, flag)? {
        roots
            .add(cert)
            .map_err(|e| anyhow!("{flag} {}: {e}", path.display()))?;
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_from_addresses() {
        assert!(matches!(
            server_name("127.0.0.1:7000"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(
            server_name("[::1]:7000"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(
            server_name("grid-1.example:7000"),
            Ok(ServerName::DnsName(_))
        ));
        assert!(server_name("bad name:7000").is_err());
    }
}

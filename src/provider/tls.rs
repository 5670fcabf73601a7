//! TLS for provider connections (rustls, ring).
//!
//! Whether TLS is used follows the connection URL's `sslmode` (`disable`,
//! `prefer` — the default —, `require`). With a CA file the server's
//! certificate chain and host name are verified; without one, as libpq does
//! for `sslmode=require`, the connection is encrypted but the server is not
//! authenticated (the docs say so and recommend a CA file).

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The most a CA bundle may hold (the system bundle is ~220 KiB).
const MAX_CA_BYTES: u64 = 16 * 1024 * 1024;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

/// An HTTP client builder (reqwest), with ring as the process's TLS
/// provider (reqwest takes it from the process; installed once) and the
/// system's trusted roots.
pub(crate) fn http_client() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}

/// An HTTP client builder for one endpoint. For a plain `http://` URL no
/// trusted roots are loaded: reading the system's store costs a one-shot
/// command tens of milliseconds of its start, and a client that follows
/// no redirects to another scheme never makes a TLS connection (one that
/// is asked to fails, for want of a trusted root).
pub fn http_client_for(url: &str) -> reqwest::ClientBuilder {
    let plain = url
        .get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"));
    if plain {
        http_client().tls_certs_only(Vec::new())
    } else {
        http_client()
    }
}

/// Why a TLS connector cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rustls refused the protocol versions (a build without them).
    #[error("TLS setup: {0}")]
    Setup(#[source] rustls::Error),
    /// The CA file cannot be read.
    #[error("cannot read tls_ca_file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The CA file is not PEM.
    #[error("tls_ca_file {}: {source}", path.display())]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// A certificate in the CA file is refused as a root.
    #[error("tls_ca_file {}: {source}", path.display())]
    Root {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    /// The CA file holds no certificate.
    #[error("tls_ca_file {} holds no certificate", path.display())]
    Empty { path: PathBuf },
}

/// The connector for a provider: verifying against `ca_file` when given.
pub(crate) fn connector(ca_file: Option<&Path>) -> Result<MakeRustlsConnect, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?;
    let config = match ca_file {
        Some(file) => {
            let path = || file.to_path_buf();
            let mut roots = RootCertStore::empty();
            let bytes = match crate::config::secret::preloaded(file) {
                Some(bytes) => bytes.to_vec(),
                None => crate::files::read_regular(file, MAX_CA_BYTES).map_err(|source| {
                    TlsError::Read {
                        path: path(),
                        source,
                    }
                })?,
            };
            for cert in CertificateDer::pem_slice_iter(&bytes) {
                let cert = cert.map_err(|source| TlsError::Pem {
                    path: path(),
                    source,
                })?;
                roots.add(cert).map_err(|source| TlsError::Root {
                    path: path(),
                    source,
                })?;
            }
            if roots.is_empty() {
                return Err(TlsError::Empty { path: path() });
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider)))
            .with_no_client_auth(),
    };
    Ok(MakeRustlsConnect::new(config))
}

/// Encrypts without authenticating the server (libpq's `sslmode=require`);
/// signatures are still checked, so the session key is the server's.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

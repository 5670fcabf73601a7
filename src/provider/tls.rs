//! TLS for provider connections (rustls, ring).
//!
//! Whether TLS is used follows the connection URL's `sslmode` (`disable`,
//! `prefer` — the default —, `require`). With a CA file the server's
//! certificate chain and host name are verified; without one, as libpq does
//! for `sslmode=require`, the connection is encrypted but the server is not
//! authenticated (the docs say so and recommend a CA file).

use std::path::Path;
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

/// The connector for a provider: verifying against `ca_file` when given.
pub(crate) fn connector(ca_file: Option<&Path>) -> Result<MakeRustlsConnect, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?;
    let config = match ca_file {
        Some(file) => {
            let mut roots = RootCertStore::empty();
            let bytes = match crate::config::secret::preloaded(file) {
                Some(bytes) => bytes.to_vec(),
                None => crate::files::read_regular(file, MAX_CA_BYTES)
                    .map_err(|e| format!("cannot read tls_ca_file {}: {e}", file.display()))?,
            };
            for cert in CertificateDer::pem_slice_iter(&bytes) {
                let cert = cert.map_err(|e| format!("tls_ca_file {}: {e}", file.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("tls_ca_file {}: {e}", file.display()))?;
            }
            if roots.is_empty() {
                return Err(format!(
                    "tls_ca_file {} holds no certificate",
                    file.display()
                ));
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

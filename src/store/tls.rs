//! TLS toward the shared stores, with rustls: whom to trust (the system's roots, or
//! `tls.ca_file`), who the proxy is (`tls.cert_file` and `key_file`), and how much of the
//! server's certificate PostgreSQL's `sslmode` checks. Redis is given the same files and
//! checks certificates and names itself.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use super::StoreError;
use crate::store::settings::{SslMode, TlsConfig};

fn failed(what: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("tls: {what}"))
}

/// The one crypto provider the build has (ring).
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The Redis client's certificates: a CA in place of the system's roots, and a client
/// certificate.
pub(crate) fn redis_certificates(tls: Option<&TlsConfig>) -> redis::TlsCertificates {
    let tls = tls.cloned().unwrap_or_default();
    redis::TlsCertificates {
        client_tls: tls
            .cert_file
            .zip(tls.key_file)
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.pem,
                client_key: key.pem,
            }),
        root_cert: tls.ca_file.map(|ca| ca.pem),
    }
}

/// The rustls configuration of PostgreSQL connections in `mode` (not `Disable`).
pub fn postgres_config(mode: SslMode, tls: Option<&TlsConfig>) -> Result<ClientConfig, StoreError> {
    let tls = tls.cloned().unwrap_or_default();
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        SslMode::Require if tls.ca_file.is_none() => Arc::new(Lenient {
            chain: None,
            provider: provider(),
        }),
        SslMode::Require | SslMode::VerifyCa => Arc::new(Lenient {
            chain: Some(web_pki(roots(&tls)?)?),
            provider: provider(),
        }),
        SslMode::VerifyFull | SslMode::Disable => web_pki(roots(&tls)?)?,
    };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(failed)?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match tls.cert_file.zip(tls.key_file) {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(&cert.pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|error| failed(format!("{}: {error}", cert.path.display())))?;
            let key = PrivateKeyDer::from_pem_slice(&key.pem)
                .map_err(|error| failed(format!("{}: {error}", key.path.display())))?;
            builder.with_client_auth_cert(chain, key).map_err(failed)
        }
        None => Ok(builder.with_no_client_auth()),
    }
}

/// `tls.ca_file`'s certificates, or the system's roots.
fn roots(tls: &TlsConfig) -> Result<RootCertStore, StoreError> {
    let mut roots = RootCertStore::empty();
    match &tls.ca_file {
        Some(ca) => {
            for certificate in CertificateDer::pem_slice_iter(&ca.pem) {
                let certificate = certificate
                    .map_err(|error| failed(format!("{}: {error}", ca.path.display())))?;
                roots
                    .add(certificate)
                    .map_err(|error| failed(format!("{}: {error}", ca.path.display())))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    if roots.is_empty() {
        return Err(failed(
            "no root certificate to check the server with: set tls.ca_file",
        ));
    }
    Ok(roots)
}

fn web_pki(roots: RootCertStore) -> Result<Arc<WebPkiServerVerifier>, StoreError> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(failed)
}

/// The checks `sslmode` asks for below `verify-full`: `verify-ca` (and `require` with a CA
/// file, as libpq does it) wants a certificate that chains to the roots, whatever names it
/// holds; `require` without a CA encrypts and takes whoever answers. The handshake's
/// signatures are checked either way.
#[derive(Debug)]
struct Lenient {
    /// The roots' verifier, whose verdict on the names is ignored; `None`: no check.
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

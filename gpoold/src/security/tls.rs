//! TLS for the TCP listener: the rustls server config (the controller's
//! certificate, and client certificates verified against the cluster CA),
//! what a verified agent certificate says, and the revocation list.

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

/// The server side of TLS: the controller's certificate chain and key;
/// client certificates are optional (users come with tokens) but, when
/// given, must chain to the CA and be valid now.
pub fn server_config(files: &crate::config::TlsFiles) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = read_certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .with_context(|| format!("tls.key {}: no PEM private key read", files.key.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in read_certs(&files.ca)? {
        roots
            .add(ca)
            .with_context(|| format!("tls.ca {}: not a CA certificate", files.ca.display()))?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .with_context(|| format!("tls.ca {}", files.ca.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .with_context(|| {
            format!(
                "tls.cert {} and tls.key {} do not match",
                files.cert.display(),
                files.key.display()
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("{}: cannot read", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: not PEM certificates", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{}: no certificate in it", path.display());
    }
    Ok(certs)
}

/// What an agent's (already verified) client certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertIdentity {
    /// The subject's common name: the node name it was issued for.
    pub common_name: String,
    /// Lower-case hex, no leading zeros: what the revocation list holds.
    pub serial: String,
}

/// Reads the subject's common name and the serial number of a DER
/// certificate; any malformed input is an error, never a panic.
pub fn cert_identity(der: &[u8]) -> Result<CertIdentity, String> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|err| format!("not an X.509 certificate: {err}"))?;
    let mut names = cert.subject().iter_common_name();
    let common_name = names
        .next()
        .ok_or("the certificate has no common name")?
        .as_str()
        .map_err(|_| "the certificate's common name is not text".to_string())?
        .to_string();
    if names.next().is_some() {
        return Err("the certificate has more than one common name".into());
    }
    Ok(CertIdentity {
        common_name,
        serial: normalise_serial(&cert.raw_serial_as_string().replace(':', "")),
    })
}

/// Lower case, leading zeros dropped ("0" for zero).
pub fn normalise_serial(hex: &str) -> String {
    let trimmed = hex.trim().trim_start_matches("0x").to_ascii_lowercase();
    let trimmed = trimmed.trim_start_matches('0');
    if trimmed.is_empty() {
        "0".to_string()
    } else {
        trimmed.to_string()
    }
}

/// The revocation list: one hex serial per line; `#` starts a comment.
pub fn parse_revoked(text: &str) -> Result<HashSet<String>, String> {
    let mut serials = HashSet::new();
    for (line_idx, line) in text.lines().enumerate() {
        let serial = line.split('#').next().unwrap_or("").trim();
        if serial.is_empty() {
            continue;
        }
        let hex = serial.trim_start_matches("0x").replace(':', "");
        if hex.is_empty() || hex.len() > 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!("line {}: {serial:?} is not a hex serial number", line_idx + 1));
        }
        serials.insert(normalise_serial(&hex));
    }
    Ok(serials)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A CA, and a node certificate `name` with `serial` that it signed.
    fn ca_and_node_cert(name: &str, serial: u64) -> (Vec<u8>, Vec<u8>) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.serial_number = Some(rcgen::SerialNumber::from(serial.to_be_bytes().to_vec()));
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        (ca_cert.der().to_vec(), cert.der().to_vec())
    }

    fn node_cert(name: &str, serial: u64) -> Vec<u8> {
        ca_and_node_cert(name, serial).1
    }

    /// Whether the verifier gpoold uses accepts `cert` as a client of `ca`.
    fn verifies(ca: &[u8], cert: &[u8]) -> bool {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from(ca.to_vec())).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
        verifier
            .verify_client_cert(
                &CertificateDer::from(cert.to_vec()),
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .is_ok()
    }

    #[test]
    fn a_certificate_names_its_node_and_serial() {
        let identity = cert_identity(&node_cert("gpu-07", 0x1f2e)).unwrap();
        assert_eq!(
            identity,
            CertIdentity {
                common_name: "gpu-07".into(),
                serial: "1f2e".into()
            }
        );
    }

    #[test]
    fn the_revocation_list_is_hex_serials_with_comments() {
        let revoked = parse_revoked("# revoked\n00:1F:2E  # gpu-07, stolen\n\n0xabc\n").unwrap();
        assert_eq!(revoked, ["1f2e".to_string(), "abc".to_string()].into_iter().collect());
        assert_eq!(
            parse_revoked("abc\nnot-hex\n").unwrap_err(),
            "line 2: \"not-hex\" is not a hex serial number"
        );
    }

    proptest! {
        #[test]
        fn no_bytes_make_cert_identity_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = cert_identity(&bytes);
        }

        #[test]
        fn a_certificate_changed_in_any_byte_is_refused(position in 0usize..4000, byte in any::<u8>()) {
            let (ca, mut cert) = ca_and_node_cert("gpu-07", 77);
            prop_assert!(verifies(&ca, &cert));
            let position = position % cert.len();
            prop_assume!(cert[position] != byte);
            cert[position] = byte;
            prop_assert!(!verifies(&ca, &cert), "byte {position} set to {byte} still verifies");
        }
    }
}

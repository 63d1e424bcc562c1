//! `gpool admin ca init`, `gpool admin cert issue` and `gpool admin cert
//! revoke`: the cluster CA in `<state_dir>/ca/`, run on the controller host
//! by whoever may read its key. Nothing here talks to gpoold; a revocation
//! takes effect at the next `gpool admin reload` (or SIGHUP).
//!
//! Files: `ca.pem` and `ca.key` (0600), `issued` (one line per certificate:
//! serial, kind, name, expiry) and `revoked` (one serial per line).

use crate::CliError;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Who a certificate is for.
pub enum Subject {
    /// An agent: the common name is the node name; client auth only.
    Node(String),
    /// gpoold: the names (DNS or IP) clients dial; server auth only.
    Controller(Vec<String>),
}

pub fn ca_init(state_dir: &Path, validity_secs: u64, json: bool) -> Result<(), CliError> {
    let dir = state_dir.join("ca");
    let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
    if key_path.exists() {
        return Err(CliError::Refused(format!(
            "{} exists: the cluster already has a CA (remove it only to start over, which invalidates every certificate)",
            key_path.display()
        )));
    }
    std::fs::create_dir_all(&dir).map_err(|err| file_error(&dir, err))?;
    let key = rcgen::KeyPair::generate().map_err(pki_error)?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(pki_error)?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "gpool cluster CA");
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    set_validity(&mut params, validity_secs)?;
    params.serial_number = Some(random_serial()?);
    let cert = params.self_signed(&key).map_err(pki_error)?;
    write_private(&key_path, &key.serialize_pem())?;
    std::fs::write(&cert_path, cert.pem()).map_err(|err| file_error(&cert_path, err))?;
    if json {
        crate::output::print_json(&serde_json::json!({ "ca": cert_path, "key": key_path }));
    } else {
        outln!("CA certificate: {} (give it to agents and users)", cert_path.display());
        outln!(
            "CA key:         {} (keep it on this host, mode 0600)",
            key_path.display()
        );
    }
    Ok(())
}

pub fn cert_issue(
    state_dir: &Path,
    subject: Subject,
    out_dir: &Path,
    validity_secs: u64,
    json: bool,
) -> Result<(), CliError> {
    let dir = state_dir.join("ca");
    let ca_pem = std::fs::read_to_string(dir.join("ca.pem")).map_err(|err| file_error(&dir.join("ca.pem"), err))?;
    let ca_key_pem = std::fs::read_to_string(dir.join("ca.key")).map_err(|err| file_error(&dir.join("ca.key"), err))?;
    let ca_key = rcgen::KeyPair::from_pem(&ca_key_pem).map_err(pki_error)?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(pki_error)?;
    let (kind, name, names, usage) = match &subject {
        Subject::Node(node) => {
            check_name("--node", node)?;
            (
                "node",
                node.clone(),
                vec![node.clone()],
                rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            )
        }
        Subject::Controller(names) => {
            for name in names {
                check_name("--controller", name)?;
            }
            let first = names.first().cloned().ok_or_else(|| {
                CliError::Usage("--controller: give the host names and addresses clients dial".into())
            })?;
            (
                "controller",
                first,
                names.clone(),
                rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            )
        }
    };
    let mut params = rcgen::CertificateParams::new(names).map_err(pki_error)?;
    params.distinguished_name.push(rcgen::DnType::CommonName, name.as_str());
    params.extended_key_usages = vec![usage];
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    set_validity(&mut params, validity_secs)?;
    let serial = random_serial()?;
    params.serial_number = Some(serial.clone());
    let key = rcgen::KeyPair::generate().map_err(pki_error)?;
    let cert = params.signed_by(&key, &issuer).map_err(pki_error)?;
    std::fs::create_dir_all(out_dir).map_err(|err| file_error(out_dir, err))?;
    let (cert_path, key_path) = (out_dir.join(format!("{name}.pem")), out_dir.join(format!("{name}.key")));
    std::fs::write(&cert_path, cert.pem()).map_err(|err| file_error(&cert_path, err))?;
    write_private(&key_path, &key.serialize_pem())?;
    let serial_hex = serial_hex(&serial);
    let issued = dir.join("issued");
    append_line(&issued, &format!("{serial_hex} {kind} {name} {}", params.not_after))?;
    if json {
        crate::output::print_json(&serde_json::json!({
            "serial": serial_hex, "kind": kind, "name": name, "cert": cert_path, "key": key_path,
        }));
    } else {
        outln!("{kind} certificate for {name}, serial {serial_hex}");
        outln!("certificate: {}", cert_path.display());
        outln!("key:         {} (mode 0600)", key_path.display());
    }
    Ok(())
}

/// Adds serials to the revocation list: the one given, or every
/// certificate issued to `node`.
pub fn cert_revoke(state_dir: &Path, serial: Option<String>, node: Option<String>, json: bool) -> Result<(), CliError> {
    let dir = state_dir.join("ca");
    let serials: Vec<String> = match (serial, node) {
        (Some(serial), None) => {
            let hex = serial
                .trim()
                .trim_start_matches("0x")
                .replace(':', "")
                .to_ascii_lowercase();
            if hex.is_empty() || hex.len() > 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(CliError::Usage(format!(
                    "serial: {serial:?} is not a hex serial number"
                )));
            }
            vec![hex]
        }
        (None, Some(node)) => {
            let issued_path = dir.join("issued");
            let issued = std::fs::read_to_string(&issued_path).map_err(|err| file_error(&issued_path, err))?;
            let serials: Vec<String> = issued
                .lines()
                .filter_map(|line| {
                    let mut words = line.split_whitespace();
                    let (serial, kind, name) = (words.next()?, words.next()?, words.next()?);
                    (kind == "node" && name == node).then(|| serial.to_string())
                })
                .collect();
            if serials.is_empty() {
                return Err(CliError::Refused(format!(
                    "no certificate for node {node} in {}",
                    issued_path.display()
                )));
            }
            serials
        }
        _ => return Err(CliError::Usage("give a SERIAL or --node NAME".into())),
    };
    for serial in &serials {
        append_line(&dir.join("revoked"), serial)?;
    }
    if json {
        crate::output::print_json(&serde_json::json!({ "revoked": serials }));
    } else {
        outln!("revoked: {}", serials.join(" "));
        outln!("run `gpool admin reload` (or send gpoold SIGHUP) to apply it; live links with it end then");
    }
    Ok(())
}

/// Where `--state-dir` points by default: the example config's.
pub fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/gpool")
}

fn check_name(flag: &str, name: &str) -> Result<(), CliError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':'));
    if ok {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "{flag}: {name:?} is not a host name or address"
        )))
    }
}

fn set_validity(params: &mut rcgen::CertificateParams, validity_secs: u64) -> Result<(), CliError> {
    let now = time::OffsetDateTime::now_utc();
    let seconds = i64::try_from(validity_secs).map_err(|_| CliError::Usage("--expires: too long".into()))?;
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now
        .checked_add(time::Duration::seconds(seconds))
        .ok_or_else(|| CliError::Usage("--expires: too long".into()))?;
    Ok(())
}

/// 16 random bytes, the top bit clear (serials are positive).
fn random_serial() -> Result<rcgen::SerialNumber, CliError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|err| CliError::Refused(format!("no random bytes: {err}")))?;
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    Ok(rcgen::SerialNumber::from(bytes.to_vec()))
}

fn serial_hex(serial: &rcgen::SerialNumber) -> String {
    serial.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn write_private(path: &Path, text: &str) -> Result<(), CliError> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|err| file_error(path, err))?;
    file.write_all(text.as_bytes()).map_err(|err| file_error(path, err))
}

fn append_line(path: &Path, line: &str) -> Result<(), CliError> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|err| file_error(path, err))?;
    writeln!(file, "{line}").map_err(|err| file_error(path, err))
}

fn file_error(path: &Path, err: std::io::Error) -> CliError {
    CliError::Refused(format!("{}: {err}", path.display()))
}

fn pki_error(err: rcgen::Error) -> CliError {
    CliError::Refused(format!("certificate: {err}"))
}

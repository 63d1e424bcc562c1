//! What gpoold needs to know who calls: the key its tokens are hashed and
//! job tokens signed with, the revoked certificate serials, and the audit
//! log. The decisions themselves are gpool-core's (`gpool_core::auth`).

pub mod listen;
pub mod loopback;
pub mod tls;

use anyhow::Context;
use gpool_core::auth::token::Key;
use std::collections::HashSet;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

/// The file in the state dir holding the token key (32 random bytes, 0600).
pub const TOKEN_KEY_FILE: &str = "token.key";

pub struct Security {
    pub dev: bool,
    /// Plaintext from other hosts was allowed (insecure_plaintext): their
    /// agents are taken at their word.
    pub insecure_plaintext: bool,
    pub token_key: Key,
    /// Serial numbers (lower-case hex) of revoked certificates.
    pub revoked: RwLock<HashSet<String>>,
    revoked_file: PathBuf,
    audit: Audit,
}

impl Security {
    pub fn open(config: &crate::config::Config) -> anyhow::Result<Security> {
        let security = Security {
            dev: config.dev,
            insecure_plaintext: config.insecure_plaintext,
            token_key: load_or_create_key(&config.state_dir.join(TOKEN_KEY_FILE))?,
            revoked: RwLock::new(HashSet::new()),
            revoked_file: config.revoked_certs(),
            audit: Audit::open(&config.audit_log())?,
        };
        security.reload_revoked()?;
        Ok(security)
    }

    /// Re-reads the revocation list; returns the serials now revoked.
    pub fn reload_revoked(&self) -> anyhow::Result<HashSet<String>> {
        let revoked = match std::fs::read_to_string(&self.revoked_file) {
            Ok(text) => tls::parse_revoked(&text)
                .map_err(|reason| anyhow::anyhow!("{}: {reason}", self.revoked_file.display()))?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => HashSet::new(),
            Err(err) => return Err(err).with_context(|| format!("{}: cannot read", self.revoked_file.display())),
        };
        *self.revoked.write().unwrap_or_else(|p| p.into_inner()) = revoked.clone();
        Ok(revoked)
    }

    pub fn is_revoked(&self, serial: &str) -> bool {
        self.revoked.read().unwrap_or_else(|p| p.into_inner()).contains(serial)
    }

    pub fn audit(&self, entry: &AuditEntry) {
        self.audit.write(entry);
    }
}

/// One line of the audit log.
#[derive(Debug, serde::Serialize)]
pub struct AuditEntry<'a> {
    /// RFC 3339, UTC.
    pub at: String,
    /// The caller, or "" where none could be established.
    pub caller: &'a str,
    /// How the caller was identified ("unix socket", "token 3", ...).
    pub via: &'a str,
    pub peer: &'a str,
    pub action: &'a str,
    pub object: &'a str,
    /// "allowed", or "refused: <reason>".
    pub outcome: String,
}

/// Appends JSON lines to the audit log (mode 0600), one write per entry.
struct Audit {
    file: Mutex<std::fs::File>,
    path: PathBuf,
}

impl Audit {
    fn open(path: &Path) -> anyhow::Result<Audit> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("audit log {}: cannot open", path.display()))?;
        Ok(Audit {
            file: Mutex::new(file),
            path: path.to_path_buf(),
        })
    }

    fn write(&self, entry: &AuditEntry) {
        let Ok(mut line) = serde_json::to_vec(entry) else {
            return;
        };
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(err) = file.write_all(&line) {
            tracing::error!("audit log {}: cannot write: {err}", self.path.display());
        }
    }
}

/// Reads the 32-byte key at `path`, or creates it (0600) from the OS's
/// random source.
fn load_or_create_key(path: &Path) -> anyhow::Result<Key> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let mode = std::fs::metadata(path)?.permissions().mode();
            if mode & 0o077 != 0 {
                anyhow::bail!(
                    "{}: mode {:o} lets others read the token key; chmod 600 it",
                    path.display(),
                    mode & 0o777
                );
            }
            bytes
                .try_into()
                .map_err(|bytes: Vec<u8>| anyhow::anyhow!("{}: {} bytes, expected 32", path.display(), bytes.len()))
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            let mut key = [0u8; 32];
            getrandom::fill(&mut key).map_err(|err| anyhow::anyhow!("no random bytes for the token key: {err}"))?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("{}: cannot create", path.display()))?;
            file.write_all(&key)?;
            file.sync_all()?;
            Ok(key)
        }
        Err(err) => Err(err).with_context(|| format!("{}: cannot read", path.display())),
    }
}

/// Random bytes for a new token's secret.
pub fn random_secret() -> Result<[u8; 32], crate::error::Error> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|err| crate::error::Error::Storage(format!("no random bytes: {err}")))?;
    Ok(secret)
}

/// Now, RFC 3339.
pub fn now_text() -> String {
    crate::wall_clock().to_string()
}

//! High availability (`[ha]`): every controller campaigns through etcd's
//! election API with a lease; the one elected serves, the others wait as
//! standbys that answer every call with the leader's address
//! (`crate::standby`), so agents and users reach the leader from any
//! controller they name.
//!
//! The rule that keeps one leader acting: the leader renews its lease every
//! third of its TTL, and with no renewal confirmed for two thirds of the
//! TTL it exits at once (systemd restarts it as a standby). It is silent
//! before its lease can expire, so before any standby can be elected. Its
//! acknowledged writes were flushed before they were acknowledged, so the
//! next leader loads them from the shared state dir as after a restart.
//! It also reads its own leader key every second at most: once the key is
//! gone from etcd or is no longer this term's, etcd names another leader
//! (or none), and it exits the same way.

use crate::config::Ha;
use etcd_client::{Client, ConnectOptions, LeaderKey, ResignOptions};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The exit status of a leader that lost its lease (EX_TEMPFAIL).
pub const LOST_LEADERSHIP_EXIT: i32 = 75;

/// This process's term as leader, set once when it is elected: a process
/// leads at most one term (it exits when it loses its lease).
static TERM: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// The term every message to agents carries: 0 without `[ha]`.
pub fn term() -> u64 {
    TERM.get().copied().unwrap_or(0)
}

/// This controller leads: its term, and the lease that keeps it leading.
pub struct Leadership {
    client: Client,
    leader: LeaderKey,
    /// The etcd revision of its leader key: it only grows from one leader
    /// to the next.
    pub term: u64,
    keeping: tokio::task::JoinHandle<()>,
    /// Reads the leader key until it is not this term's any more.
    watching: tokio::task::JoinHandle<()>,
    role: Arc<AtomicU8>,
    /// The election it won, whose candidates `candidates` lists.
    election: String,
    /// This controller's `ha.name`.
    pub name: String,
    /// Whether `resign` ran (it runs once).
    resigned: std::sync::atomic::AtomicBool,
}

/// How to reach etcd: within 3 s, and over TLS with `ha.ca` (the files are
/// read once, at start: one that cannot be read is named).
fn connect_options(ha: &Ha) -> anyhow::Result<ConnectOptions> {
    use anyhow::Context;
    let options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(3));
    let Some(tls) = &ha.tls else {
        return Ok(options);
    };
    let read = |path: &std::path::Path, field: &str| {
        std::fs::read(path).with_context(|| format!("ha.{field}: cannot read {}", path.display()))
    };
    let mut config =
        etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(read(&tls.ca, "ca")?));
    if let Some((cert, key)) = &tls.cert_key {
        config = config.identity(etcd_client::Identity::from_pem(read(cert, "cert")?, read(key, "key")?));
    }
    Ok(options.with_tls(config))
}

async fn connect(ha: &Ha, options: &ConnectOptions) -> Result<Client, etcd_client::Error> {
    Client::connect(ha.etcd.clone(), Some(options.clone())).await
}

/// Waits until this controller is elected: a standby until then. Retries
/// while etcd cannot be reached; fails only on TLS files it cannot read.
pub async fn campaign(ha: &Ha) -> anyhow::Result<Leadership> {
    let options = connect_options(ha)?;
    let mut backoff = Duration::from_millis(200);
    loop {
        match try_campaign(ha, &options).await {
            Ok(leadership) => return Ok(leadership),
            Err(err) => {
                let why = etcd_error_words(&err.to_string());
                tracing::warn!("ha: campaign through etcd {:?}: {why}; again in {backoff:?}", ha.etcd);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ha.lease_ttl / 3);
            }
        }
    }
}

/// An etcd client error in words an operator acts on: a refused client
/// certificate (etcd runs with --client-cert-auth) names the fields.
fn etcd_error_words(err: &str) -> String {
    if err.contains("BadCertificate") || err.contains("CertificateRequired") || err.contains("UnknownCA") {
        format!(
            "etcd refused this controller's TLS client certificate: give ha.cert and ha.key, a certificate from \
             the CA etcd trusts (--trusted-ca-file), where etcd runs with --client-cert-auth ({err})"
        )
    } else {
        err.to_string()
    }
}

async fn try_campaign(ha: &Ha, options: &ConnectOptions) -> Result<Leadership, etcd_client::Error> {
    let mut client = connect(ha, options).await?;
    let ttl = ha.lease_ttl.as_secs() as i64;
    // The lease runs from no sooner than this.
    let asked = Instant::now();
    let lease = client.lease_grant(ttl, None).await?.id();
    // The lease is kept while the campaign waits (a standby's candidacy
    // lives as long as its lease), and from then on by the leader.
    let role = Arc::new(AtomicU8::new(STANDBY));
    let keeping = tokio::spawn(keep_lease(client.clone(), lease, (asked, ha.lease_ttl), role.clone()));
    match elect(&mut client, ha, lease, &role, keeping).await {
        Ok(leadership) => Ok(leadership),
        Err(err) => {
            // Its candidacy goes now rather than a TTL from now.
            let _ = tokio::time::timeout(Duration::from_secs(1), client.lease_revoke(lease)).await;
            Err(err)
        }
    }
}

/// Campaigns with `lease` until elected, and makes sure the lease still
/// holds the leader key then.
async fn elect(
    client: &mut Client,
    ha: &Ha,
    lease: i64,
    role: &Arc<AtomicU8>,
    mut keeping: tokio::task::JoinHandle<()>,
) -> Result<Leadership, etcd_client::Error> {
    tracing::info!(
        "ha: {} campaigning in election {:?} (lease ttl {:?}); standby until elected",
        ha.name,
        ha.election,
        ha.lease_ttl
    );
    let value = format!("{} {}", ha.name, ha.advertise);
    let campaigned = tokio::select! {
        campaigned = client.campaign(ha.election.as_str(), value, lease) => campaigned,
        _ = &mut keeping => {
            return Err(etcd_client::Error::LeaseKeepAliveError("the lease was lost while campaigning".into()));
        }
    };
    let elected = match campaigned.map(|response| response.leader().cloned()) {
        Ok(Some(leader)) => confirm(client, ha, &leader, role).await.map(|()| leader),
        Ok(None) => Err(etcd_client::Error::InvalidArgs("etcd elected no leader key".into())),
        Err(err) => Err(err),
    };
    let leader = match elected {
        Ok(leader) => leader,
        Err(err) => {
            keeping.abort();
            return Err(err);
        }
    };
    let term = leader.rev().max(0) as u64;
    let _ = TERM.set(term);
    tracing::info!("ha: {} elected leader, term {term}", ha.name);
    let ours = KeySeen {
        create_revision: leader.rev(),
        lease: leader.lease(),
        value: format!("{} {}", ha.name, ha.advertise),
    };
    let every = gpool_core::fencing::leader_lease_terms(ha.lease_ttl).0.min(KEY_CHECK);
    let watching = tokio::spawn(watch_own_key(
        client.clone(),
        leader.key().to_vec(),
        ours,
        every,
        role.clone(),
    ));
    Ok(Leadership {
        client: client.clone(),
        leader,
        term,
        keeping,
        watching,
        role: role.clone(),
        election: ha.election.clone(),
        name: ha.name.clone(),
        resigned: std::sync::atomic::AtomicBool::new(false),
    })
}

/// Elected: only if the lease was not lost meanwhile (then the leader key
/// may be gone), and the election's leader is still this key.
async fn confirm(
    client: &mut Client,
    ha: &Ha,
    leader: &LeaderKey,
    role: &Arc<AtomicU8>,
) -> Result<(), etcd_client::Error> {
    let now = client.leader(ha.election.as_str()).await?;
    let ours = now
        .kv()
        .is_some_and(|kv| kv.key() == leader.key() && kv.lease() == leader.lease());
    if !ours {
        return Err(etcd_client::Error::InvalidArgs(
            "elected, but the leader key is no longer this one's".into(),
        ));
    }
    role.compare_exchange(STANDBY, LEADING, Ordering::SeqCst, Ordering::SeqCst)
        .map(|_| ())
        .map_err(|_| etcd_client::Error::LeaseKeepAliveError("the lease was lost as it was elected".into()))
}

/// What the lease is for: a standby's candidacy, a leader's term, or
/// nothing any more (lost while a standby).
const STANDBY: u8 = 0;
const LEADING: u8 = 1;
const LOST: u8 = 2;

/// Renews lease `lease` every third of `ttl`. A broken keepalive stream is
/// opened again. With no renewal confirmed for two thirds of the TTL, a
/// leader's process exits: whatever it was doing, it must be silent before
/// the lease runs out and another controller is elected. A standby's lease
/// is marked lost instead (its campaign ends and starts again).
async fn keep_lease(mut client: Client, lease: i64, (granted, ttl): (Instant, Duration), role: Arc<AtomicU8>) {
    let (renew_every, give_up_after) = gpool_core::fencing::leader_lease_terms(ttl);
    // When the lease last ran from, at the latest: a renewal counts from
    // when it was sent, not answered.
    let mut confirmed = granted;
    let mut stream = None;
    loop {
        let sent = Instant::now();
        let renewal = async {
            if stream.is_none() {
                stream = Some(client.lease_keep_alive(lease).await?);
            }
            let (keeper, answers) = stream.as_mut().expect("opened above");
            keeper.keep_alive().await?;
            answers.message().await
        };
        let why = match tokio::time::timeout_at(confirmed + give_up_after, renewal).await {
            Ok(Ok(Some(answer))) if answer.ttl() > 0 => {
                confirmed = sent;
                tokio::time::sleep_until(sent + renew_every).await;
                continue;
            }
            Ok(Ok(Some(_))) => "etcd says the lease expired".to_string(),
            // The stream broke (an etcd member restarted): open it again
            // while the lease may still hold.
            Ok(Ok(None)) | Ok(Err(_)) => {
                if stream.is_some() {
                    tracing::warn!("ha: the lease's keepalive stream broke; opening it again");
                }
                stream = None;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(_) => format!("no renewal confirmed for {give_up_after:?}"),
        };
        if role
            .compare_exchange(STANDBY, LOST, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            lost(&why);
        }
        tracing::warn!("ha: standby's lease lost ({why})");
        return;
    }
}

fn lost(why: &str) -> ! {
    tracing::error!("ha: lease lost ({why}): exiting before another controller can be elected");
    std::process::exit(LOST_LEADERSHIP_EXIT)
}

/// How often a leader reads its own key, at most (a third of the lease
/// where that is shorter).
const KEY_CHECK: Duration = Duration::from_secs(1);

/// The leader key as etcd holds it: the revision that created it (the
/// term), the lease it is attached to, and its value (`name advertise`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySeen {
    pub create_revision: i64,
    pub lease: i64,
    pub value: String,
}

/// Why a leader whose key was `ours` when elected and is `seen` now must
/// step down, or `None` while it is still this term's key. A key deleted
/// (by hand, or by a tool that cleans up) lets the next candidate lead; a
/// key written again (another value, lease or creation) is no longer the
/// one that made this controller leader, and etcd's election no longer
/// counts it as such. Either way another controller may now be elected or
/// be named as the leader, so this one must be silent.
pub fn deposed(ours: &KeySeen, seen: Option<&KeySeen>) -> Option<String> {
    let seen = match seen {
        None => return Some("its leader key is gone from etcd".to_string()),
        Some(seen) if seen == ours => return None,
        Some(seen) => seen,
    };
    if seen.value != ours.value {
        return Some(format!(
            "its leader key names {:?} now, not {:?}",
            seen.value, ours.value
        ));
    }
    Some(format!(
        "its leader key was written again (created at revision {}, lease {:x}; this term's: {}, {:x})",
        seen.create_revision, seen.lease, ours.create_revision, ours.lease
    ))
}

/// Reads the leader key `key` every `every` while this controller leads,
/// and exits (as when its lease is lost) once it is not `ours` any more.
/// A read etcd does not answer decides nothing: the lease's keeper
/// (`keep_lease`) stops a leader cut off from etcd.
async fn watch_own_key(mut client: Client, key: Vec<u8>, ours: KeySeen, every: Duration, role: Arc<AtomicU8>) {
    loop {
        tokio::time::sleep(every).await;
        let Ok(Ok(answer)) = tokio::time::timeout(every, client.get(key.clone(), None)).await else {
            continue;
        };
        let seen = answer.kvs().first().map(|kv| KeySeen {
            create_revision: kv.create_revision(),
            lease: kv.lease(),
            value: kv.value_str().unwrap_or_default().to_string(),
        });
        let Some(why) = deposed(&ours, seen.as_ref()) else {
            continue;
        };
        // A leader that resigned deleted its key itself.
        if role.load(Ordering::SeqCst) != LEADING {
            return;
        }
        tracing::error!("ha: {why}: another controller may lead; exiting");
        std::process::exit(LOST_LEADERSHIP_EXIT)
    }
}

impl Leadership {
    /// Steps down at once (a planned switch): a standby is elected and
    /// waits for this controller's lock on the state dir, which it lets go
    /// once its shutdown is over.
    pub async fn resign(&self) {
        if self.resigned.swap(true, Ordering::SeqCst) {
            return;
        }
        self.watching.abort();
        self.keeping.abort();
        self.role.store(LOST, Ordering::SeqCst);
        let mut client = self.client.clone();
        let options = ResignOptions::new().with_leader(self.leader.clone());
        match tokio::time::timeout(Duration::from_secs(2), client.resign(Some(options))).await {
            Ok(Ok(_)) => tracing::info!("ha: resigned term {}", self.term),
            Ok(Err(err)) => tracing::warn!("ha: resign: {err}"),
            Err(_) => tracing::warn!("ha: resign: etcd did not answer within 2 s"),
        }
        let lease = self.leader.lease();
        let _ = tokio::time::timeout(Duration::from_secs(1), client.lease_revoke(lease)).await;
    }
}

/// A controller campaigning in the election, as etcd knows it.
pub struct Candidate {
    pub name: String,
    pub advertise: String,
    pub leader: bool,
    /// Seconds left on its lease; `None` where etcd did not say.
    pub lease_left_secs: Option<i64>,
}

impl Leadership {
    /// Every controller campaigning in the election: this leader first
    /// (the oldest candidacy leads), then the standbys in the order they
    /// would be elected.
    pub async fn candidates(&self) -> Result<Vec<Candidate>, etcd_client::Error> {
        let mut client = self.client.clone();
        let prefix = format!("{}/", self.election);
        let listed = client
            .get(prefix.as_str(), Some(etcd_client::GetOptions::new().with_prefix()))
            .await?;
        let mut found: Vec<(i64, i64, String)> = listed
            .kvs()
            .iter()
            .map(|kv| {
                (
                    kv.create_revision(),
                    kv.lease(),
                    kv.value_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        found.sort_unstable();
        let mut candidates = Vec::with_capacity(found.len());
        for (index, (_, lease, value)) in found.into_iter().enumerate() {
            let (name, advertise) = value.split_once(' ').unwrap_or((value.as_str(), ""));
            let lease_left_secs = match client.lease_time_to_live(lease, None).await {
                Ok(answer) if answer.ttl() >= 0 => Some(answer.ttl()),
                _ => None,
            };
            candidates.push(Candidate {
                name: name.to_string(),
                advertise: advertise.to_string(),
                leader: index == 0,
                lease_left_secs,
            });
        }
        Ok(candidates)
    }
}

/// The leader a standby sends callers to: its `ha.name` and `advertise`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderAddress {
    pub name: String,
    pub advertise: String,
}

/// How often a standby asks etcd who leads.
const LEADER_POLL: Duration = Duration::from_millis(500);

/// The election's leader as etcd says, asked every `LEADER_POLL` while the
/// receiver is held: `None` while there is none (or etcd cannot be
/// reached).
pub fn watch_leader(ha: &Ha) -> anyhow::Result<tokio::sync::watch::Receiver<Option<LeaderAddress>>> {
    let options = connect_options(ha)?;
    let (sender, receiver) = tokio::sync::watch::channel(None);
    let (endpoints, election) = (ha.etcd.clone(), ha.election.clone());
    tokio::spawn(async move {
        let mut client = None;
        while !sender.is_closed() {
            if client.is_none() {
                client = Client::connect(endpoints.clone(), Some(options.clone())).await.ok();
            }
            let asked = match client.as_mut() {
                Some(client) => tokio::time::timeout(LEADER_POLL * 4, client.leader(election.as_str())).await,
                None => Ok(Err(etcd_client::Error::InvalidArgs("not connected".into()))),
            };
            let leader = match asked {
                Ok(Ok(answer)) => answer.kv().and_then(|kv| kv.value_str().ok()).map(|value| {
                    let (name, advertise) = value.split_once(' ').unwrap_or((value, ""));
                    LeaderAddress {
                        name: name.to_string(),
                        advertise: advertise.to_string(),
                    }
                }),
                // No leader elected (etcd answers "election: no leader").
                Ok(Err(etcd_client::Error::GRpcStatus(status))) if status.message().contains("no leader") => None,
                _ => {
                    client = None;
                    None
                }
            };
            sender.send_if_modified(|known| {
                let changed = *known != leader;
                *known = leader;
                changed
            });
            tokio::time::sleep(LEADER_POLL).await;
        }
    });
    Ok(receiver)
}

#[cfg(test)]
mod tests;

//! `failover`: two controllers on one state dir, elected through three etcd
//! members on loopback. Time from kill -9 of the leader, and from SIGTERM
//! on it (a planned switch), to the first answer from the other, over
//! `rounds` of each: the time until the other controller answers.

use super::*;

/// A process this benchmark started, ended by its pid when dropped.
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn start_etcd(dir: &Path) -> anyhow::Result<(Vec<Owned>, String)> {
    let ports: Vec<(u16, u16)> = (0..3)
        .map(|_| Ok((free_port()?, free_port()?)))
        .collect::<anyhow::Result<_>>()?;
    let cluster: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(member, (_, peer))| format!("e{member}=http://127.0.0.1:{peer}"))
        .collect();
    let mut members = Vec::new();
    for (member, (client, peer)) in ports.iter().enumerate() {
        let child = Command::new("etcd")
            .arg(format!("--name=e{member}"))
            .arg(format!("--data-dir={}", dir.join(format!("etcd-{member}")).display()))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!("--initial-cluster={}", cluster.join(",")))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("etcd (Debian's etcd-server) must be installed for this benchmark")?;
        members.push(Owned(child));
    }
    let endpoints: Vec<String> = ports
        .iter()
        .map(|(client, _)| format!("\"http://127.0.0.1:{client}\""))
        .collect();
    Ok((members, endpoints.join(", ")))
}

/// Controller `name` of the pair, listening at `listen`.
fn start_controller(dir: &Path, endpoints: &str, name: &str, listen: &str) -> anyhow::Result<Owned> {
    let config = dir.join(format!("gpoold-{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "listen = \"{listen}\"\nstate_dir = \"{}\"\nsocket = \"{}\"\n\n[ha]\netcd = [{endpoints}]\nname = \"{name}\"\nadvertise = \"{listen}\"\ninsecure_etcd = true\n",
            dir.join("state").display(),
            dir.join(format!("{name}.sock")).display(),
        ),
    )?;
    let child = Command::new(binary("gpoold")?)
        .arg("--config")
        .arg(&config)
        .env("GPOOL_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(Owned(child))
}

/// How long until `server` answers as the leader: `gpool controllers`
/// through it names `name` leading (a standby would send the call on to
/// the leader it knows, which may be the one stopping).
fn until_leading(server: &str, name: &str, since: Instant) -> anyhow::Result<Duration> {
    while since.elapsed() < Duration::from_secs(120) {
        let leading = gpool(server, &["controllers", "--output", "json"])
            .ok()
            .and_then(|output| serde_json::from_slice::<serde_json::Value>(&output.stdout).ok())
            .is_some_and(|listed| {
                listed["controllers"][0]["name"] == name && listed["controllers"][0]["leader"] == true
            });
        if leading {
            return Ok(since.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("{name} did not lead within 120 s")
}

fn median_and_max(mut times: Vec<Duration>) -> String {
    times.sort();
    let median = times[times.len() / 2];
    let max = times.last().copied().unwrap_or_default();
    format!("median {:.2} s, max {:.2} s", median.as_secs_f64(), max.as_secs_f64())
}

pub(crate) fn failover(rounds: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("state"))?;
    let (_etcd, endpoints) = start_etcd(dir.path())?;
    let listen = [
        format!("127.0.0.1:{}", free_port()?),
        format!("127.0.0.1:{}", free_port()?),
    ];
    let servers = listen.join(",");
    let mut controllers = [Some(start_controller(dir.path(), &endpoints, "c0", &listen[0])?), None];
    until_leading(&servers, "c0", Instant::now())?;
    controllers[1] = Some(start_controller(dir.path(), &endpoints, "c1", &listen[1])?);
    // The standby campaigns.
    std::thread::sleep(Duration::from_secs(2));
    let mut leader = 0;
    let mut killed = Vec::new();
    let mut switched = Vec::new();
    for round in 0..2 * rounds {
        let planned = round >= rounds;
        let mut old = controllers[leader].take().context("the leader runs")?;
        let since = Instant::now();
        if planned {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(old.0.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            )?;
        } else {
            let _ = old.0.kill();
        }
        // The other one's first answer as the leader.
        let took = until_leading(&listen[1 - leader], &format!("c{}", 1 - leader), since)?;
        let _ = old.0.wait();
        if planned { &mut switched } else { &mut killed }.push(took);
        // The old leader comes back as the standby.
        let name = format!("c{leader}");
        controllers[leader] = Some(start_controller(dir.path(), &endpoints, &name, &listen[leader])?);
        leader = 1 - leader;
        std::thread::sleep(Duration::from_secs(2));
    }
    report(
        &format!("kill -9 of the leader to the standby's first answer ({rounds}, lease ttl 15 s)"),
        median_and_max(killed),
    );
    report(
        &format!("SIGTERM on the leader to the standby's first answer ({rounds})"),
        median_and_max(switched),
    );
    Ok(())
}

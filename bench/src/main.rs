//! gpool-bench: starts release gpoold binaries in temp dirs and prints plain
//! figures (with the load average) for submit rates and where a submit's
//! time goes, API throughput, listing, memory (queued, and as history
//! grows), restart and scheduling. Run through `bench/run.sh`.

use anyhow::{bail, Context};
use gpool_core::sched::{schedule, schedule_starts, ClusterView, Plan, Policy};
use gpool_core::testing::cluster_view;
use gpool_core::Timestamp;
use gpool_proto::pb;
use gpool_proto::pb::pool_client::PoolClient;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

mod breakdown;
mod failover;
mod fleet;
mod harness;
mod scheduler;
use fleet::*;
use harness::*;
use scheduler::*;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let wants = |phase: &str| args.is_empty() || args.iter().any(|a| a == phase);
    println!(
        "gpool benchmarks on {} CPUs",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if wants("submit-seq") {
        submit_sequential(500)?;
    }
    if wants("submit-par") {
        submit_parallel(8, 1000)?;
    }
    if wants("api") {
        api_throughput(32, 1, 20_000)?;
        api_throughput(32, 100, 2_000)?;
    }
    if wants("submit-phases") {
        submit_phases(50)?;
    }
    if wants("list") {
        list_memory_restart(10_000)?;
    }
    if wants("schedule") {
        schedule_cycles();
    }
    if wants("unchanged") {
        unchanged_cycles(10_000)?;
    }
    if wants("sharing") {
        for (n_nodes, n_pending) in [(1_000, 10_000), (1_000, 100_000), (10_000, 10_000), (10_000, 100_000)] {
            sharing_cycle(n_nodes, n_pending);
        }
    }
    if wants("agents") {
        with_agents(4, 8)?;
    }
    if wants("history") {
        memory_with_history(4, 8, 5, 2_000)?;
    }
    // Not in the default run: about five minutes.
    if args.iter().any(|a| a == "history-100k") {
        memory_with_history(4, 8, 25, 4_000)?;
    }
    // Not in the default run: about two minutes each.
    if args.iter().any(|a| a == "queue-100k") {
        long_queue(4, 8, 100_000, 5_000, "")?;
    }
    if args.iter().any(|a| a == "queue-100k-kept") {
        long_queue(4, 8, 100_000, 5_000, KEPT_FOR_HIGH)?;
    }
    // Not in the default run: about 40 seconds, 1,200 CLI processes.
    if args.iter().any(|a| a == "followers") {
        followers_and_watchers(200, 1_000)?;
    }
    if wants("nodes-down") {
        nodes_down_together(2_000, 8)?;
    }
    // Not in the default run: about a minute.
    if args.iter().any(|a| a == "breakdown") {
        breakdown::breakdown(4, 8, 10_000)?;
    }
    // Not in the default run: about three minutes, with etcd installed.
    if args.iter().any(|a| a == "failover") {
        failover::failover(10)?;
    }
    Ok(())
}

fn submit_sequential(n_jobs: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let controller = Controller::start(dir.path())?;
    let started = Instant::now();
    for _ in 0..n_jobs {
        gpool(&controller.addr, &["submit", "--", "true"])?;
    }
    let rate = n_jobs as f64 / started.elapsed().as_secs_f64();
    report(
        &format!("gpool submit, one process per job, sequential ({n_jobs})"),
        format!("{rate:.0} jobs/s"),
    );
    controller.stop();
    Ok(())
}

fn submit_parallel(n_workers: usize, n_jobs: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let controller = Controller::start(dir.path())?;
    let started = Instant::now();
    let workers: Vec<_> = (0..n_workers)
        .map(|_| {
            let addr = controller.addr.clone();
            std::thread::spawn(move || -> anyhow::Result<()> {
                for _ in 0..n_jobs / n_workers {
                    gpool(&addr, &["submit", "--", "true"])?;
                }
                Ok(())
            })
        })
        .collect();
    for worker in workers {
        worker.join().map_err(|_| anyhow::anyhow!("submitter panicked"))??;
    }
    let rate = n_jobs as f64 / started.elapsed().as_secs_f64();
    report(
        &format!("gpool submit, one process per job, {n_workers} parallel ({n_jobs})"),
        format!("{rate:.0} jobs/s"),
    );
    controller.stop();
    Ok(())
}

/// Where one `gpool submit` spends its time, as medians of `n` each: the
/// process alone (`gpool --version`: exec, dynamic loading, runtime, exit),
/// a connection (TCP, HTTP/2 handshake, gpoold finding the caller's uid),
/// the submit RPC on it (gpoold's checks, the state task, the sled flush),
/// and the whole command; the rest is the CLI's own work (arguments, the
/// environment, the job spec, printing).
fn submit_phases(n: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let controller = Controller::start(dir.path())?;
    let gpool_bin = binary("gpool")?;
    let timed = |run: &mut dyn FnMut() -> anyhow::Result<()>| -> anyhow::Result<Duration> {
        let samples = (0..n)
            .map(|_| {
                let started = Instant::now();
                run().map(|()| started.elapsed())
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(median(samples))
    };
    let process = timed(&mut || {
        let status = Command::new(&gpool_bin)
            .arg("--version")
            .stdout(Stdio::null())
            .status()?;
        anyhow::ensure!(status.success(), "gpool --version failed");
        Ok(())
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let submit_one = |client: &mut PoolClient<Channel>| {
        runtime.block_on(async {
            let reply = client
                .submit_jobs(with_user(pb::SubmitJobsRequest::new(&[one_spec()])))
                .await?;
            anyhow::ensure!(reply.get_ref().ids.len() == 1, "no id");
            Ok(())
        })
    };
    // A connection's cost shows in its first request (the handshake
    // finishes there): a new one per submit, less a submit on an open one.
    let fresh = timed(&mut || submit_one(&mut runtime.block_on(client(&controller.addr))?))?;
    let mut connected = runtime.block_on(client(&controller.addr))?;
    let rpc = timed(&mut || submit_one(&mut connected))?;
    let connect = fresh.saturating_sub(rpc);
    let whole = timed(&mut || gpool(&controller.addr, &["submit", "--discard-output", "--", "true"]).map(drop))?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let rest = whole.saturating_sub(process + connect + rpc);
    report(
        &format!("one gpool submit, median of {n}: whole command"),
        format!("{:.2} ms", ms(whole)),
    );
    for (phase, took) in [
        ("process start and exit (gpool --version)", process),
        ("connect (TCP, HTTP/2, caller's uid)", connect),
        ("submit RPC, durable (checks, state task, sled flush)", rpc),
        ("the CLI's own work (the rest)", rest),
    ] {
        report(&format!("  {phase}"), format!("{:.2} ms", ms(took)));
    }
    controller.stop();
    Ok(())
}

/// gpoold's resident memory as history grows: `rounds` batches of
/// `per_round` one-GPU `true` jobs run to the end through `n_agents` agents,
/// with the memory after each (and after the 6 s in which gpoold hands
/// freed memory back), then how long listing all of them takes.
fn memory_with_history(n_agents: usize, n_gpus: u32, rounds: usize, per_round: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let controller = Controller::start(dir.path())?;
    let agents = start_agents(&controller, n_agents, n_gpus)?;
    std::thread::sleep(Duration::from_secs(6));
    let mib = |controller: &Controller| controller.rss_kib() as f64 / 1024.0;
    report(
        "gpoold resident memory, no job yet",
        format!("{:.1} MiB", mib(&controller)),
    );
    let batch = dir.path().join("batch.toml");
    write_true_batch(&batch, per_round)?;
    // The first round's batch, all pending at once, sets the high-water
    // mark; what follows shows whether memory grows with the history.
    let mut after_first = 0.0;
    for round in 1..=rounds {
        gpool(
            &controller.addr,
            &["submit", "-f", &batch.display().to_string(), "--wait"],
        )?;
        std::thread::sleep(Duration::from_secs(6));
        let now = mib(&controller);
        if round == 1 {
            after_first = now;
        }
        // Every fifth round once the rounds are many.
        if rounds <= 5 || round % 5 == 0 || round == 1 {
            report(
                &format!("gpoold resident memory, {} jobs ended", round * per_round),
                format!("{now:.1} MiB ({:.2}x the first round's)", now / after_first),
            );
        }
    }
    let samples = (0..5)
        .map(|_| {
            let started = Instant::now();
            gpool(&controller.addr, &["jobs", "--all", "--output", "json"]).map(|_| started.elapsed())
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    report(
        &format!(
            "gpool jobs --all --output json, {} ended (median of 5)",
            rounds * per_round
        ),
        format!("{:.1} ms", median(samples).as_secs_f64() * 1e3),
    );
    drop(agents);
    controller.stop();
    Ok(())
}

fn api_throughput(n_clients: usize, jobs_per_request: usize, n_requests: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let controller = Controller::start(dir.path())?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let elapsed = runtime.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..n_clients {
            clients.push(client(&controller.addr).await?);
        }
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for mut client in clients {
            let n_mine = n_requests / n_clients;
            tasks.spawn(async move {
                for _ in 0..n_mine {
                    let specs = vec![one_spec(); jobs_per_request];
                    let reply = client
                        .submit_jobs(with_user(pb::SubmitJobsRequest::new(&specs)))
                        .await?;
                    anyhow::ensure!(reply.get_ref().ids.len() == jobs_per_request, "short reply");
                }
                anyhow::Ok(())
            });
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
        anyhow::Ok(started.elapsed())
    })?;
    let n_jobs = (n_requests / n_clients) * n_clients * jobs_per_request;
    let rate = n_jobs as f64 / elapsed.as_secs_f64();
    report(
        &format!("API, {n_clients} clients, {jobs_per_request} job(s)/request ({n_jobs} jobs)"),
        format!("{rate:.0} durable jobs/s"),
    );
    controller.stop();
    Ok(())
}

fn list_memory_restart(n_jobs: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let controller = Controller::start(dir.path())?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let mut client = client(&controller.addr).await?;
        for _ in 0..n_jobs / 1000 {
            client
                .submit_jobs(with_user(pb::SubmitJobsRequest::new(&vec![one_spec(); 1000])))
                .await?;
        }
        anyhow::Ok(())
    })?;
    std::thread::sleep(Duration::from_millis(300));
    let samples: Vec<Duration> = (0..11)
        .map(|_| {
            let started = Instant::now();
            gpool(&controller.addr, &["jobs", "--output", "json"]).map(|out| (started.elapsed(), out.stdout.len()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .map(|(elapsed, _)| elapsed)
        .collect();
    report(
        &format!("gpool jobs --output json, {n_jobs} queued (median of 11)"),
        format!("{:.1} ms", median(samples).as_secs_f64() * 1e3),
    );
    report(
        &format!("gpoold resident memory, {n_jobs} queued"),
        format!("{:.1} MiB", controller.rss_kib() as f64 / 1024.0),
    );
    let state_dir = controller.state_dir.clone();
    controller.stop();
    let mut restarts = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let controller = Controller::start(&state_dir)?;
        runtime.block_on(async {
            let mut client = client(&controller.addr).await?;
            client
                .get_job(with_user(pb::GetJobRequest { id: n_jobs as u64 }))
                .await?;
            anyhow::Ok(())
        })?;
        restarts.push(started.elapsed());
        if restarts.len() == 5 {
            let rss_mib = controller.rss_kib() as f64 / 1024.0;
            report(
                &format!("gpoold resident memory, {n_jobs} queued, after a restart"),
                format!("{rss_mib:.1} MiB"),
            );
        }
        controller.stop();
    }
    report(
        &format!("gpoold restart on {n_jobs} jobs to first answer (median of 5)"),
        format!("{:.1} ms", median(restarts).as_secs_f64() * 1e3),
    );
    Ok(())
}

/// What `n_followers` `gpool logs --follow` and `n_watchers` `gpool wait`
/// processes on one job writing about 200 KB/s cost gpoold and the agent:
/// attached, 20 s later (it must not grow), and once they left.
fn followers_and_watchers(n_followers: usize, n_watchers: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let controller = Controller::start(dir.path())?;
    let agents = start_agents(&controller, 1, 8)?;
    let agent = agents.0[0].id();
    let chatty = r#"line=$(printf '%0199d' 0); end=$((SECONDS + 120)); while ((SECONDS < end)); do for ((i = 0; i < 100; i++)); do echo "$line"; done; sleep 0.1; done"#;
    let submitted = gpool(&controller.addr, &["submit", "--", "bash", "-c", chatty])?;
    let id = String::from_utf8_lossy(&submitted.stdout).trim().to_string();
    std::thread::sleep(Duration::from_secs(2));
    let figures = |what: &str| {
        report(
            &format!("{what}: gpoold, agent RSS"),
            format!("{:.1}, {:.1} MiB", rss_mib(controller.child.id()), rss_mib(agent)),
        )
    };
    figures("one job writing 200 KB/s, nobody attached");
    let mut attached = Vec::new();
    let follow = ["logs", "--follow", id.as_str()];
    let wait = ["wait", id.as_str()];
    for args in std::iter::repeat_n(&follow[..], n_followers).chain(std::iter::repeat_n(&wait[..], n_watchers)) {
        attached.push(
            Command::new(binary("gpool")?)
                .args(args)
                .env("GPOOL_SERVER", &controller.addr)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        );
    }
    std::thread::sleep(Duration::from_secs(3));
    let shape = format!("{n_followers} followers, {n_watchers} watchers");
    figures(&format!("{shape} attached"));
    std::thread::sleep(Duration::from_secs(20));
    figures(&format!("{shape}, 20 s later"));
    for mut child in attached {
        let _ = child.kill();
        let _ = child.wait();
    }
    std::thread::sleep(Duration::from_secs(2));
    figures("all of them gone 2 s");
    gpool(&controller.addr, &["cancel", &id])?;
    drop(agents);
    controller.stop();
    Ok(())
}

fn with_agents(n_agents: usize, n_gpus: u32) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let controller = Controller::start_with(dir.path(), &["--metrics-listen", "127.0.0.1:0"])?;
    let agents = start_agents(&controller, n_agents, n_gpus)?;
    let shape = format!("{n_agents} agents x {n_gpus} GPUs");
    submit_to_start(&controller, n_agents, &shape)?;
    let n_jobs = 2000;
    parallel_submits(&controller, n_jobs, &shape)?;
    batch_file_wait(&controller, dir.path(), n_jobs, &shape)?;
    drop(agents);
    controller.stop();
    Ok(())
}

/// `n_nodes` nodes (fake agents on AgentLink streams: they register,
/// heartbeat and take Launches without running anything) fill up with
/// running jobs, then all fall silent at once. Prints the submit latency
/// (one job per request, back to back) before and while gpoold marks them
/// down and requeues their jobs.
fn nodes_down_together(n_nodes: usize, gpus_per_node: u32) -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const NODE_TIMEOUT_SECS: u64 = 5;
    let dir = tempfile::tempdir()?;
    let timeout = format!("{NODE_TIMEOUT_SECS}s");
    let controller = Controller::start_with(dir.path(), &["--node-timeout", &timeout])?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (before, during, n_running) = runtime.block_on(async {
        let silent = Arc::new(AtomicBool::new(false));
        start_fake_nodes(&controller.addr, n_nodes, gpus_per_node, &silent).await?;
        let mut api = client(&controller.addr).await?;
        // Every GPU busy, and as many jobs again waiting.
        let n_jobs = n_nodes * gpus_per_node as usize * 2;
        for _ in 0..n_jobs / 1000 {
            api.submit_jobs(with_user(pb::SubmitJobsRequest::new(&vec![one_spec(); 1000])))
                .await?;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let before = submit_latencies(api.clone(), 3).await?;
        let n_running = full_nodes(&mut api).await?;
        silent.store(true, Ordering::Relaxed);
        let during = submit_latencies(api.clone(), NODE_TIMEOUT_SECS + 10).await?;
        anyhow::Ok((before, during, n_running))
    })?;
    let max = |samples: &[Duration]| samples.iter().max().copied().unwrap_or_default();
    report(
        &format!("submit latency, {n_nodes} nodes x {gpus_per_node} GPUs up ({n_running} full)"),
        format!("median {:.1?} max {:.1?}", median(before.clone()), max(&before)),
    );
    report(
        &format!("submit latency while all {n_nodes} go down and their jobs requeue"),
        format!("median {:.1?} max {:.1?}", median(during.clone()), max(&during)),
    );
    controller.stop();
    Ok(())
}

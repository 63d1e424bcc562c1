//! The steps of the benchmarks with agents: submit-to-start latency and
//! end-to-end rates behind real agents, and fake nodes on AgentLink
//! streams that fall silent together.

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Submit-to-start latency on an idle pool, 50 jobs: prints its median
/// and p90, then what it is made of: the `gpool submit` process itself,
/// a call that changes nothing (`gpool nodes`: the CLI's start and one
/// round trip), and the job's own start (`date +%s%N` spawned here
/// directly), and gpoold's mean durable flush over the 50 jobs (its
/// `gpool_store_flush_seconds`; a submit's answer waits for one, and so
/// does its start). What the submit's process adds to the call that
/// changes nothing is mostly that flush; what the start adds to the
/// submit's process and the job's own start is scheduling, the start's
/// flush and launching. The controller serves /metrics.
pub(crate) fn submit_to_start(controller: &Controller, n_agents: usize, shape: &str) -> anyhow::Result<()> {
    let flushes_before = histogram(&controller.state_dir, "gpool_store_flush_seconds")?;
    let (mut latencies, mut submits) = (Vec::new(), Vec::new());
    for sample_idx in 0..50 {
        let (latency, submit) = one_submit_to_start(controller, n_agents, sample_idx)?;
        latencies.push(latency);
        submits.push(submit);
    }
    let flushes = histogram(&controller.state_dir, "gpool_store_flush_seconds")?;
    let (flush_sum, n_flushes) = (flushes.0 - flushes_before.0, flushes.1 - flushes_before.1);
    let mut calls = Vec::new();
    let mut own_starts = Vec::new();
    for _ in 0..50 {
        let before = Instant::now();
        gpool(&controller.addr, &["nodes"])?;
        calls.push(before.elapsed());
        own_starts.push(own_start()?);
    }
    let median = |samples: &mut Vec<Duration>| {
        samples.sort();
        samples[samples.len() / 2].as_secs_f64() * 1e3
    };
    latencies.sort();
    report(
        &format!("submit-to-start latency, idle pool, {shape} (50 jobs)"),
        format!(
            "median {:.1} ms, p90 {:.1} ms",
            latencies[latencies.len() / 2].as_secs_f64() * 1e3,
            latencies[latencies.len() * 9 / 10].as_secs_f64() * 1e3
        ),
    );
    report(
        "  the gpool submit process, spawn to exit",
        format!("median {:.1} ms", median(&mut submits)),
    );
    report(
        "  gpool nodes (the CLI's start, one round trip)",
        format!("median {:.1} ms", median(&mut calls)),
    );
    report(
        "  the job's own start: date +%s%N spawned directly",
        format!("median {:.1} ms", median(&mut own_starts)),
    );
    report(
        "  a durable flush in gpoold (a submit waits for one, its start for one)",
        format!("mean {:.2} ms of {n_flushes}", flush_sum / n_flushes.max(1.0) * 1e3),
    );
    Ok(())
}

/// From just before `date +%s%N` is spawned to the clock it prints.
fn own_start() -> anyhow::Result<Duration> {
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let output = Command::new("date").arg("+%s%N").output()?;
    let printed: u128 = String::from_utf8_lossy(&output.stdout).trim().parse()?;
    Ok(Duration::from_nanos(printed.saturating_sub(before.as_nanos()) as u64))
}

/// Submits one `date +%s%N` job and waits (10 s at most) for the time it
/// printed: how long after the submit it started, and how long the
/// submit's process took.
fn one_submit_to_start(
    controller: &Controller,
    n_agents: usize,
    sample_idx: usize,
) -> anyhow::Result<(Duration, Duration)> {
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let spawned = Instant::now();
    let output = gpool(&controller.addr, &["submit", "--", "date", "+%s%N"])?;
    let submit = spawned.elapsed();
    let id = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    let started_ns: u128 = loop {
        let printed = (0..n_agents).find_map(|agent_idx| {
            let out = controller.state_dir.join(format!("spool-{agent_idx}/jobs/{id}.1.out"));
            std::fs::read_to_string(out)
                .ok()
                .and_then(|text| text.trim().parse().ok())
        });
        if let Some(ns) = printed {
            break ns;
        }
        if Instant::now() > deadline {
            bail!("job {sample_idx} did not start within 10 s");
        }
        std::thread::sleep(Duration::from_micros(200));
    };
    let latency = Duration::from_nanos((started_ns.saturating_sub(before.as_nanos())) as u64);
    Ok((latency, submit))
}

/// `n_jobs` `true` jobs, one `gpool submit` each from 8 threads: prints
/// the end-to-end rate.
pub(crate) fn parallel_submits(controller: &Controller, n_jobs: usize, shape: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let addr = controller.addr.clone();
            std::thread::spawn(move || -> anyhow::Result<()> {
                for _ in 0..n_jobs / 8 {
                    gpool(&addr, &["submit", "--discard-output", "--", "true"])?;
                }
                Ok(())
            })
        })
        .collect();
    for worker in workers {
        worker.join().map_err(|_| anyhow::anyhow!("submitter panicked"))??;
    }
    let finished = wait_all_finished(&controller.addr, Duration::from_secs(300))?;
    let rate = n_jobs as f64 / finished.duration_since(started).as_secs_f64();
    report(
        &format!("{n_jobs} one-GPU `true` jobs end to end, one gpool submit each (8 parallel), {shape}"),
        format!("{rate:.0} jobs/s"),
    );
    Ok(())
}

/// `n_jobs` `true` jobs in one batch file, `submit -f --wait`: prints the
/// end-to-end rate.
pub(crate) fn batch_file_wait(controller: &Controller, dir: &Path, n_jobs: usize, shape: &str) -> anyhow::Result<()> {
    let batch = dir.join("batch.toml");
    write_true_batch(&batch, n_jobs)?;
    // As a CI script would: submit the file and wait for every job to end.
    let started = Instant::now();
    let run = gpool(
        &controller.addr,
        &["submit", "-f", &batch.display().to_string(), "--wait"],
    )?;
    let rate = n_jobs as f64 / started.elapsed().as_secs_f64();
    if count_lines(&run.stdout) != n_jobs {
        bail!("submit -f --wait printed {} ids", count_lines(&run.stdout));
    }
    report(
        &format!("{n_jobs} one-GPU `true` jobs end to end, one batch file (submit -f --wait), {shape}"),
        format!("{rate:.0} jobs/s"),
    );
    Ok(())
}

/// Registers `n_nodes` fake nodes of `gpus_per_node` GPUs with gpoold at
/// `addr`; each heartbeats every 500 ms until `silent`.
pub(crate) async fn start_fake_nodes(
    addr: &str,
    n_nodes: usize,
    gpus_per_node: u32,
    silent: &Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?;
    // 100 streams per connection, under HTTP/2's stream limits.
    let mut channel = endpoint.connect().await?;
    for node_idx in 0..n_nodes {
        if node_idx % 100 == 0 {
            channel = endpoint.connect().await?;
        }
        start_fake_node(channel.clone(), node_idx, gpus_per_node, silent.clone()).await?;
    }
    Ok(())
}

/// One fake node: its Register on a new AgentLink stream, then a task
/// that heartbeats until `silent` and reads what gpoold sends.
async fn start_fake_node(
    channel: Channel,
    node_idx: usize,
    gpus_per_node: u32,
    silent: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    use gpool_proto::pb::agent_link_client::AgentLinkClient;
    let (outbound, receiver) = tokio::sync::mpsc::channel(16);
    let register = pb::Register {
        node: format!("fake{node_idx:05}"),
        gpus: (0..gpus_per_node)
            .map(|index| pb::Gpu {
                index,
                model: "h100".into(),
                memory_mib: 81_559,
                uuid: format!("FAKE-{node_idx}-{index}"),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    outbound
        .send(pb::AgentMessage {
            msg: Some(pb::agent_message::Msg::Register(register)),
        })
        .await?;
    let mut inbound = AgentLinkClient::new(channel)
        .connect(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await?
        .into_inner();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let mut seq = 0;
        loop {
            tokio::select! {
                message = inbound.message() => if !matches!(message, Ok(Some(_))) { return },
                _ = tick.tick(), if !silent.load(Ordering::Relaxed) => {
                    seq += 1;
                    let heartbeat = pb::Heartbeat { seq, ..Default::default() };
                    let message = pb::AgentMessage { msg: Some(pb::agent_message::Msg::Heartbeat(heartbeat)) };
                    if outbound.send(message).await.is_err() { return }
                }
            }
        }
    });
    Ok(())
}

/// One-job submits back to back for `seconds`: each one's latency.
pub(crate) async fn submit_latencies(mut api: PoolClient<Channel>, seconds: u64) -> anyhow::Result<Vec<Duration>> {
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut samples = Vec::new();
    while Instant::now() < until {
        let started = Instant::now();
        api.submit_jobs(with_user(pb::SubmitJobsRequest::new(&[one_spec()])))
            .await?;
        samples.push(started.elapsed());
    }
    anyhow::Ok(samples)
}

/// How many nodes have every GPU running a job.
pub(crate) async fn full_nodes(api: &mut PoolClient<Channel>) -> anyhow::Result<usize> {
    Ok(api
        .list_nodes(with_user(pb::ListNodesRequest {}))
        .await?
        .into_inner()
        .nodes
        .iter()
        .filter(|node| !node.gpus.is_empty() && node.gpus.iter().all(|gpu| gpu.job_id != 0))
        .count())
}

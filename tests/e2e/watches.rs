//! Watches of jobs (`gpool wait`, `gpool logs -f`) are bounded per user:
//! another user who opens many watches of many ended jobs slows nobody.

use crate::harness::cluster::Cluster;
use crate::harness::process::wait_until;
use gpool_proto::pb;
use std::time::{Duration, Instant};

/// A client of the Pool API that says it is `user` (a dev controller on
/// loopback knows the caller by the connection's uid where it can).
async fn client_as(
    addr: &str,
    user: &str,
) -> pb::pool_client::PoolClient<
    tonic::service::interceptor::InterceptedService<
        tonic::transport::Channel,
        impl tonic::service::Interceptor + Clone,
    >,
> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("an endpoint")
        .connect()
        .await
        .expect("gpoold answers");
    let user: tonic::metadata::MetadataValue<_> = user.parse().expect("a user name");
    pb::pool_client::PoolClient::with_interceptor(channel, move |mut request: tonic::Request<()>| {
        request
            .metadata_mut()
            .insert(gpool_proto::USER_METADATA_KEY, user.clone());
        Ok(request)
    })
}

/// A user opens 48 watches at once, each of the 2,000 ended tasks of
/// another user's array, again and again for 10 s: 16 at a time are served and the rest
/// refused with the reason, and `gpool nodes` answers within a second
/// throughout.
#[test]
fn many_watches_of_ended_jobs_slow_nobody() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 8);
    // Another user's array (nobody's, known by its uid).
    let nobody = nix::unistd::User::from_name("nobody").unwrap().expect("user nobody");
    let submitted = cluster.gpool_as(
        &nobody,
        &cluster.addr,
        &["submit", "--output", "json", "-a", "0-1999", "--", "true"],
    );
    submitted.ok();
    let array = submitted.json()["ids"][0].as_u64().expect("the array's id");
    let tasks = wait_until("the array's 2,000 tasks to end", Duration::from_secs(240), || {
        let listed = cluster.gpool(&["jobs", "-r", "--all", "--output", "json"]).json();
        let ids: Vec<u64> = listed
            .as_array()?
            .iter()
            .filter(|task| task["array_job_id"] == array && task["state"] == "completed")
            .filter_map(|task| task["id"].as_u64())
            .collect();
        (ids.len() == 2000).then_some(ids)
    });
    let addr = cluster.addr.clone();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let watching = runtime.spawn(async move {
        let client = client_as(&addr, "mallory").await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut watchers = tokio::task::JoinSet::new();
        for _ in 0..48 {
            let (mut client, ids) = (client.clone(), tasks.clone());
            watchers.spawn(async move {
                let (mut served, mut refused) = (0u64, 0u64);
                while Instant::now() < deadline {
                    match client.watch_jobs(pb::WatchJobsRequest { ids: ids.clone() }).await {
                        Ok(stream) => {
                            let mut stream = stream.into_inner();
                            while let Ok(Some(_)) = stream.message().await {}
                            served += 1;
                        }
                        Err(status) => {
                            assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
                            assert!(status.message().contains("has 16 watches of jobs open"), "{status}");
                            refused += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                (served, refused)
            });
        }
        let (mut served, mut refused) = (0, 0);
        while let Some(counts) = watchers.join_next().await {
            let (s, r) = counts.expect("a watcher");
            served += s;
            refused += r;
        }
        (served, refused)
    });
    let mut slowest = Duration::ZERO;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(9) {
        let asked = Instant::now();
        cluster.gpool(&["nodes"]).ok();
        slowest = slowest.max(asked.elapsed());
        std::thread::sleep(Duration::from_millis(200));
    }
    let (served, refused) = runtime.block_on(watching).expect("the watchers");
    println!("48 watchers of 2,000 ended jobs for 10 s: {served} watches served, {refused} refused; slowest gpool nodes {slowest:?}");
    assert!(served > 0 && refused > 0, "{served} served, {refused} refused");
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
}

//! `payments bench` and its helper `payments bench-endpoint`: the flags, turned into a
//! [`bench::Plan`]. The benchmark itself is in [`payments_lab::bench`].
//!
//! The flags live here rather than in `config.rs`: they configure a run of the benchmark, not the
//! service, and none of them is read from the environment.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use payments_lab::bench::{self, Deployment, Plan, Scenario};
use reqwest::Url;

use super::parse_duration;

/// Concurrent requests in flight, as in the reference workloads (`pgbench -c 32`, `wrk -c32`).
pub const DEFAULT_CLIENTS: u32 = 32;

/// As many keys as a busy client's retries might touch; making them takes a second or two.
pub const DEFAULT_REPLAY_KEYS: u32 = 1_000;

/// `payments bench`.
#[derive(Clone, Args)]
pub struct BenchArgs {
    /// Requests in flight at once, in every scenario and reference.
    #[arg(long, default_value_t = DEFAULT_CLIENTS, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub clients: u32,
    /// How long each scenario (and each reference) runs: `10s`, `1500ms`, `1m`.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// The scenarios to run, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "new,replay,duplicates,refund,capture")]
    pub scenarios: Vec<Scenario>,
    /// Finished payments the `replay` scenario replays, picked at random; made before it starts.
    #[arg(long, default_value_t = DEFAULT_REPLAY_KEYS, value_parser = clap::value_parser!(u32).range(1..))]
    pub replay_keys: u32,
    /// Also run the references: the protocol's SQL under pgbench, and a bare actix-web endpoint
    /// driven by the same load generator; then print the ratios.
    #[arg(long)]
    pub references: bool,
    /// Also write the results to this file, as one JSON object.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also draw what the run saw, as SVG charts in this directory (made if need be):
    /// bench-latency.svg, each scenario's and reference's latency by percentile, and
    /// bench-throughput.svg, their throughput and the outbox backlog over time. With --references,
    /// pgbench then logs each transaction's latency.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Measure a running deployment at this base URL instead of starting one.
    #[arg(long, requires = "api_key")]
    pub url: Option<Url>,
    /// The API key to pay with at --url.
    #[arg(long, requires = "url")]
    pub api_key: Option<String>,
    /// The deployment's database (needs `pg_stat_statements` preloaded for statement counts):
    /// statements, WAL and outbox backlog are measured there, and the pgbench references run in a
    /// database the benchmark creates beside it. Without it, those figures are left out.
    #[arg(long, requires = "url")]
    pub database_url: Option<String>,
    /// With --url: the API process, whose CPU time to report.
    #[arg(long, requires = "url")]
    pub api_pid: Option<u32>,
    /// With --url: the gateway process, whose CPU time to report.
    #[arg(long, requires = "url")]
    pub gateway_pid: Option<u32>,
    /// With --url: the postmaster, whose CPU time (with all its children's) to report.
    #[arg(long, requires = "url")]
    pub postgres_pid: Option<u32>,
    /// Then run the same scenarios on a Citus cluster of a coordinator and this many workers on
    /// this machine (Citus must be installed), and report them beside one PostgreSQL's: requests
    /// per second as ratios, statements and distributed executions per request.
    #[arg(long, conflicts_with = "url", value_parser = clap::value_parser!(u16).range(1..=8))]
    pub citus_workers: Option<u16>,
    /// Explain one statement in this many as it runs, for the plans the report shows (own
    /// PostgreSQL only): 1 explains every statement.
    #[arg(long, default_value_t = bench::DEFAULT_EXPLAIN_EVERY, value_parser = clap::value_parser!(u32).range(1..))]
    pub explain_every: u32,
}

/// `payments bench-endpoint`: the bare reference endpoint, as a process of its own.
#[derive(Clone, Args)]
pub struct BenchEndpointArgs {
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: String,
    /// Worker threads, as the reference runs it.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let deployment = match args.url {
        None => Deployment::Own,
        Some(url) => Deployment::Existing {
            url,
            api_key: args.api_key.unwrap_or_default(),
            database_url: args.database_url,
            pids: bench::Pids { api: args.api_pid, gateway: args.gateway_pid, postgres: args.postgres_pid },
        },
    };
    let mut scenarios = args.scenarios;
    scenarios.dedup();
    let plan = Plan {
        clients: args.clients as usize,
        duration: args.duration,
        scenarios,
        replay_keys: args.replay_keys as usize,
        references: args.references,
        json: args.json,
        plot: args.plot,
        deployment,
        citus_workers: args.citus_workers,
        explain_every: args.explain_every,
    };
    bench::run(plan).await
}

pub async fn endpoint(args: BenchEndpointArgs) -> anyhow::Result<()> {
    bench::endpoint::serve(&args.bind, args.workers).await
}

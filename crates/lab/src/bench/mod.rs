//! `payments bench`: the service under load, measured as a user would run it.
//!
//! It starts a deployment of its own (see [`world`]: durable PostgreSQL, `payments gateway`,
//! `payments serve`), or is pointed at one, and runs each scenario for the same duration with the
//! same number of requests in flight:
//!
//! - `new`: a new payment per request;
//! - `replay`: replays of payments made beforehand, each checked to be the stored answer;
//! - `duplicates`: groups of concurrent requests with one key, each checked to make one payment;
//! - `refund`: a new refund per request, of part of a payment made beforehand, each client
//!   refunding payments of its own.
//!
//! For each it reports throughput and latency percentiles (an HDR histogram per client task,
//! merged), the answers by status, and what a request cost: CPU time of each process (from
//! `/proc`), statements run (`pg_stat_statements`) and WAL written, all taken as differences from
//! just before the load to the end of the outbox's drain after it, so that delivering a payment's
//! event is counted with the payment. The outbox backlog is sampled during the load, and the
//! time it takes to empty after it is measured. With `--references` it then measures the
//! references (see [`reference`]) in the same run and prints the ratios.
//!
//! It prints its results as tables on stdout and, with `--json`, writes them as one object; with
//! `--plot DIR`, it draws what it saw as charts (see [`charts`]).

mod charts;
mod database;
pub mod endpoint;
mod load;
mod plans;
mod procfs;
mod reference;
mod report;
mod sampler;
mod world;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anyhow::Context;
use reqwest::Url;

use crate::progress::Progress;
use charts::Charts;
use database::{Counters, Probe, StatementTotals, drain};
use load::{Driver, Finished};
use plans::{PLANS_SHOWN, ServerLog};
use procfs::{Watched, rss_kib};
use reference::{BareEndpoint, Pgbench};
use report::{
    BareCpu, BareReport, Before, CitusRatios, CitusReport, Cost, LoadReport, Machine, NodeCpu, Outbox, Projected,
    Ratios, References, Report, ScenarioReport, Scenarios, ServiceCpu, Settings, StatementCost,
};
use sampler::{Sampler, Seen};
use world::World;

pub use load::Scenario;
pub use world::Pids;

/// Payments each client makes before the first scenario, so that connections are open and
/// statements prepared when the measurement starts.
const WARM_UP_PAYMENTS_PER_CLIENT: usize = 4;

/// Payments made for each client to refund before the `refund` scenario: each takes a thousand
/// refunds of [`load::REFUND_AMOUNT`], more than a client sends in minutes.
const REFUND_PAYMENTS_PER_CLIENT: usize = 8;

/// How long refunds are sent before the `refund` scenario, as the payments' warm-up does for
/// them: connections open, statements prepared, and, once analyzed, the refunds table's
/// statistics no longer those of an empty table.
const REFUND_WARM_UP: Duration = Duration::from_millis(500);

/// What to run.
pub struct Plan {
    pub clients: usize,
    pub duration: Duration,
    pub scenarios: Vec<Scenario>,
    /// Finished payments the `replay` scenario picks from.
    pub replay_keys: usize,
    pub references: bool,
    pub json: Option<PathBuf>,
    /// Where to write the charts, if anywhere.
    pub plot: Option<PathBuf>,
    pub deployment: Deployment,
    /// Also run the scenarios on a Citus cluster of a coordinator and this many workers, after
    /// one PostgreSQL (own deployment only).
    pub citus_workers: Option<u16>,
    /// One statement in this many is explained as it runs (see [`plans`]).
    pub explain_every: u32,
}

/// See [`Plan::explain_every`].
pub const DEFAULT_EXPLAIN_EVERY: u32 = 200;

/// What to measure.
pub enum Deployment {
    /// A deployment the benchmark starts, and stops at the end.
    Own,
    /// A running one.
    Existing { url: Url, api_key: String, database_url: Option<String>, pids: Pids },
}

/// Runs the benchmark, prints the report, and writes it as JSON if asked.
pub async fn run(plan: Plan) -> anyhow::Result<()> {
    let progress = Progress::new();
    let starting = progress.step("starting the service");
    let world = match &plan.deployment {
        Deployment::Own => World::start(None, plan.explain_every).await?,
        Deployment::Existing { url, api_key, database_url, pids } => {
            World::existing(url.clone(), api_key.clone(), database_url.clone(), *pids)?
        }
    };
    starting.finish(&format!("at {}", world.api_url));
    let measured = measure(&plan, &world, plan.references, &progress).await;
    // Whatever happened, what was started is stopped.
    let stopping = progress.step("stopping");
    let stopped = world.stop().await;
    drop(stopping);
    let (mut report, charts) = measured?;
    stopped?;
    if let Some(workers) = plan.citus_workers {
        report.citus = Some(on_citus(&plan, workers, &report.scenarios, &progress).await?);
    }
    println!("{}", report.table());
    if let Some(path) = &plan.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(dir) = &plan.plot {
        let settings = format!("{} clients, {:.0} s each", plan.clients, plan.duration.as_secs_f64());
        for written in charts.write(dir, &settings)? {
            progress.note(&format!("wrote {}", written.display()));
        }
    }
    Ok(())
}

/// The same scenarios on a Citus cluster of the benchmark's own, beside `single`'s figures.
async fn on_citus(plan: &Plan, workers: u16, single: &Scenarios, progress: &Progress) -> anyhow::Result<CitusReport> {
    let starting = progress.step(&format!("starting the service on Citus ({workers} workers)"));
    let world = World::start(Some(workers), plan.explain_every).await?;
    starting.finish(&format!("at {}", world.api_url));
    let measured = measure(plan, &world, false, progress).await;
    let stopping = progress.step("stopping");
    let stopped = world.stop().await;
    drop(stopping);
    let (report, _) = measured?;
    stopped?;
    let vs_single_node = CitusRatios::of(&report.scenarios, single);
    let projected = Projected::of(report.scenarios.new.as_ref(), report.machine.cores);
    Ok(CitusReport { workers, scenarios: report.scenarios, vs_single_node, projected })
}

/// The processes whose CPU time is reported.
struct Processes {
    api: Option<Watched>,
    gateway: Option<Watched>,
    postgres: Option<Watched>,
    bench: Watched,
    /// On Citus, each node's postmaster with its children, by name.
    nodes: Vec<(String, Watched)>,
}

/// Each process's CPU time so far: the four of [`Processes`], then each node's.
struct CpuSample {
    processes: [Option<u64>; 4],
    nodes: Vec<Option<u64>>,
}

impl Processes {
    fn of(world: &World) -> Processes {
        Processes {
            api: world.pids.api.map(Watched::process),
            gateway: world.pids.gateway.map(Watched::process),
            postgres: world.pids.postgres.map(Watched::tree),
            bench: Watched::this_process(),
            nodes: world.nodes.iter().map(|(name, pid)| (name.clone(), Watched::tree(*pid))).collect(),
        }
    }

    fn sample(&self) -> CpuSample {
        let processes = [self.api, self.gateway, self.postgres, Some(self.bench)];
        CpuSample {
            processes: processes.map(|watched| watched.and_then(|w| w.cpu_us())),
            nodes: self.nodes.iter().map(|(_, watched)| watched.cpu_us()).collect(),
        }
    }

    /// CPU time per request between two samples. On Citus, PostgreSQL's is every node's together.
    fn per_request(&self, before: &CpuSample, after: &CpuSample, requests: u64) -> ServiceCpu {
        let spent = |b: Option<u64>, a: Option<u64>| b.zip(a).map(|(b, a)| a.saturating_sub(b));
        let per = |i: usize| per_request(spent(before.processes[i], after.processes[i]), requests);
        let nodes: Vec<NodeCpu> = self
            .nodes
            .iter()
            .zip(before.nodes.iter().zip(&after.nodes))
            .map(|((node, _), (b, a))| NodeCpu { node: node.clone(), cpu_us: per_request(spent(*b, *a), requests) })
            .collect();
        let all_nodes = nodes.iter().map(|n| n.cpu_us).sum::<Option<f64>>().filter(|_| !nodes.is_empty());
        ServiceCpu { api: per(0), gateway: per(1), postgres: per(2).or(all_nodes), bench: per(3), nodes }
    }
}

fn per_request(total: Option<u64>, requests: u64) -> Option<f64> {
    total.filter(|_| requests > 0).map(|total| total as f64 / requests as f64)
}

/// The scenarios against `world`, and the references if `references`.
async fn measure(
    plan: &Plan,
    world: &World,
    references: bool,
    progress: &Progress,
) -> anyhow::Result<(Report, Charts)> {
    let probe = match &world.database_url {
        Some(url) => Some(Arc::new(Probe::connect(url).await.context("connecting to the service's database")?)),
        None => None,
    };
    let driver = Driver::new(&world.api_url, &world.api_key, plan.clients)?;
    let processes = Processes::of(world);

    let warming = progress.step("warming up");
    driver.finished_payments(plan.clients * WARM_UP_PAYMENTS_PER_CLIENT, plan.clients).await?;
    drain(probe.as_deref()).await?;
    // Measured as a deployment runs after its first minute, not as a fresh database plans.
    if let Some(probe) = &probe {
        probe.analyze().await?;
    }
    drop(warming);

    let rss_before = world.pids.api.and_then(rss_kib);
    let mut scenarios = Scenarios::default();
    let mut charts = Charts::default();
    for &scenario in &plan.scenarios {
        let finished = match scenario {
            Scenario::Replay => {
                let making = progress.step("making payments to replay");
                let finished = driver.finished_payments(plan.replay_keys, plan.clients).await?;
                drain(probe.as_deref()).await?;
                drop(making);
                Some(finished)
            }
            Scenario::Refund => {
                let making = progress.step("making payments to refund");
                let finished =
                    driver.finished_payments(plan.clients * REFUND_PAYMENTS_PER_CLIENT, plan.clients).await?;
                let warm_up = Some(finished.clone());
                driver.run(Scenario::Refund, warm_up, plan.clients, REFUND_WARM_UP, Arc::default()).await;
                drain(probe.as_deref()).await?;
                if let Some(probe) = &probe {
                    probe.analyze().await?;
                }
                drop(making);
                Some(finished)
            }
            _ => None,
        };
        let ran = Run { plan, world, probe: probe.clone(), driver: &driver, processes: &processes, progress };
        let (report, seen) = ran.scenario(scenario, finished).await?;
        charts.scenarios.push((scenario, seen));
        match scenario {
            Scenario::New => scenarios.new = Some(report),
            Scenario::Replay => scenarios.replay = Some(report),
            Scenario::Duplicates => scenarios.duplicates = Some(report),
            Scenario::Refund => scenarios.refund = Some(report),
            Scenario::Capture => scenarios.capture = Some(report),
        }
    }
    let rss_after = world.pids.api.and_then(rss_kib);

    let measured_references = match references {
        true => self::references(plan, world, probe.as_deref(), progress, &mut charts).await?,
        false => References::default(),
    };
    let postgresql = match &probe {
        Some(probe) => Some(probe.server_version().await?),
        None => None,
    };
    let report = Report {
        machine: machine(postgresql),
        settings: Settings {
            clients: plan.clients,
            duration_s: plan.duration.as_secs_f64(),
            scenarios: plan.scenarios.clone(),
            replay_keys: plan.replay_keys,
            references,
            deployment: match plan.deployment {
                Deployment::Own => "own",
                Deployment::Existing { .. } => "existing",
            },
        },
        ratios: Ratios::of(&scenarios, &measured_references),
        scenarios,
        api_rss_kib: Before { before: rss_before, after: rss_after },
        references: measured_references,
        citus: None,
    };
    Ok((report, charts))
}

/// One scenario's run, with everything it reads.
struct Run<'a> {
    plan: &'a Plan,
    world: &'a World,
    probe: Option<Arc<Probe>>,
    driver: &'a Driver,
    processes: &'a Processes,
    progress: &'a Progress,
}

impl Run<'_> {
    async fn scenario(&self, scenario: Scenario, finished: Option<Finished>) -> anyhow::Result<(ScenarioReport, Seen)> {
        let name = format!("{scenario:?}").to_lowercase();
        let statements_before = self.statement_totals().await?;
        let server_log = self.world.server_log.clone().map(ServerLog::new);
        let log_from = server_log.as_ref().map(ServerLog::position);
        let counters_before = self.counters().await?;
        let deliveries_before = self.world.deliveries();
        let cpu_before = self.processes.sample();

        let sent = Arc::new(AtomicU64::new(0));
        let phase = self.progress.timed(&name, self.plan.duration, Some(sent.clone()));
        let sampler = Sampler::start(self.probe.clone(), sent.clone());
        let load = self.driver.run(scenario, finished, self.plan.clients, self.plan.duration, sent).await;
        let cpu_at_end = self.processes.sample();
        let samples = sampler.stop().await?;
        let counters_at_end = self.counters().await?;
        phase.finish(&format!("{:.0} req/s", load.requests as f64 / load.elapsed.as_secs_f64()));

        let draining = self.progress.step("outbox draining");
        let drained_in = drain(self.probe.as_deref()).await?;
        drop(draining);
        let cpu_after = self.processes.sample();
        let counters_after = self.counters().await?;
        let statements_after = self.statement_totals().await?;
        let deliveries_after = self.world.deliveries();

        let statements = statement_costs(&statements_before, &statements_after, load.requests);
        let plans = match server_log.zip(log_from) {
            Some((log, from)) => {
                let costliest: Vec<&str> = statements.iter().take(PLANS_SHOWN).map(|s| s.statement.as_str()).collect();
                log.plans_since(from, &costliest)?
            }
            None => Vec::new(),
        };

        let mut load_report = LoadReport::of(&load);
        let cost = |counters_after: Option<Counters>, cpu_after: &CpuSample| {
            let delta = |f: fn(&Counters) -> Option<u64>| {
                let (before, after) = (counters_before.as_ref().and_then(f), counters_after.as_ref().and_then(f));
                before.zip(after).map(|(before, after)| after.saturating_sub(before))
            };
            Cost {
                cpu_us_per_request: self.processes.per_request(&cpu_before, cpu_after, load.requests),
                statements_per_request: per_request(delta(|c| c.statements), load.requests),
                wal_bytes_per_request: per_request(delta(|c| Some(c.wal_bytes)), load.requests),
                single_shard_executions_per_request: per_request(delta(|c| c.single_shard), load.requests),
                multi_shard_executions_per_request: per_request(delta(|c| c.multi_shard), load.requests),
            }
        };
        let created = |made: fn(&Counters) -> u64| {
            counters_before.zip(counters_after).map(|(before, after)| made(&after) - made(&before))
        };
        let (payments_created, refunds_created) = (created(|c| c.payments), created(|c| c.refunds));
        if scenario == Scenario::Duplicates
            && let Some(created) = payments_created
        {
            // Each group must have made exactly one payment (nothing else pays meanwhile).
            load_report.violations += created.abs_diff(load.groups);
        }
        let report = ScenarioReport {
            load: load_report,
            groups: (scenario == Scenario::Duplicates).then_some(load.groups),
            cost: cost(counters_after, &cpu_after),
            during_load: cost(counters_at_end, &cpu_at_end),
            payments_created,
            refunds_created,
            outbox: Outbox {
                backlog_max: samples.backlog_max(),
                drain_ms: drained_in.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                deliveries: deliveries_before.zip(deliveries_after).map(|(before, after)| after - before),
            },
            statements,
            plans,
        };
        Ok((report, Seen { latency_us: Some(load.latency_us), samples }))
    }

    async fn statement_totals(&self) -> anyhow::Result<Vec<StatementTotals>> {
        match &self.probe {
            Some(probe) => probe.statement_totals().await,
            None => Ok(Vec::new()),
        }
    }

    async fn counters(&self) -> anyhow::Result<Option<Counters>> {
        match &self.probe {
            Some(probe) => Ok(Some(probe.counters().await?)),
            None => Ok(None),
        }
    }
}

/// The references, one after another, with the same clients and duration; what they were seen
/// doing goes into `charts` (pgbench's latencies only if they are drawn: logging each
/// transaction is work pgbench does not do otherwise).
async fn references(
    plan: &Plan,
    world: &World,
    probe: Option<&Probe>,
    progress: &Progress,
    charts: &mut Charts,
) -> anyhow::Result<References> {
    let mut references = References::default();
    match world.database_url {
        Some(_) => {
            let preparing = progress.step("preparing pgbench");
            let pgbench = Pgbench::prepare(world).await?;
            drop(preparing);
            let (clients, duration, latencies) = (plan.clients, plan.duration, plan.plot.is_some());
            let scripts = [
                (reference::NEW_PAYMENT, &mut references.pgbench_new_payment),
                (reference::REPLAY, &mut references.pgbench_replay),
                (reference::REFUND, &mut references.pgbench_refund),
            ];
            for (script, report) in scripts {
                let (run, seen) = pgbench.run(script, clients, duration, probe, progress, latencies).await?;
                *report = Some(run);
                charts.pgbench.push((script, seen));
            }
        }
        None => progress.note("pgbench references skipped: they need the database (--database-url)"),
    }

    let bare = BareEndpoint::start(world, plan.clients).await?;
    // As for the service: connections open before the measurement starts.
    bare.load(plan.clients, Duration::from_millis(200), Arc::default()).await;
    let watched = [bare.watched(), Some(Watched::this_process())];
    let before = watched.map(|w| w.and_then(|w| w.cpu_us()));
    let sent = Arc::new(AtomicU64::new(0));
    let phase = progress.timed("bare endpoint", plan.duration, Some(sent.clone()));
    let sampler = Sampler::start(None, sent.clone());
    let load = bare.load(plan.clients, plan.duration, sent).await;
    let after = watched.map(|w| w.and_then(|w| w.cpu_us()));
    let samples = sampler.stop().await?;
    phase.finish(&format!("{:.0} req/s", load.requests as f64 / load.elapsed.as_secs_f64()));
    bare.stop().await?;
    let per = |i: usize| per_request(before[i].zip(after[i]).map(|(b, a)| a.saturating_sub(b)), load.requests);
    references.bare_endpoint = Some(BareReport {
        load: LoadReport::of(&load),
        cpu_us_per_request: BareCpu { endpoint: per(0), bench: per(1) },
    });
    charts.bare_endpoint = Some(Seen { latency_us: Some(load.latency_us), samples });
    Ok(references)
}

/// The machine the figures were taken on.
fn machine(postgresql: Option<String>) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name").and_then(|rest| rest.split_once(':')).map(|(_, m)| m.trim()));
    Machine {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|k| k.trim().to_owned()),
        cpu_model: cpu_model.map(str::to_owned),
        postgresql,
    }
}

/// How many statements the per-statement table shows, those that took the most execution time.
const STATEMENTS_SHOWN: usize = 10;

/// What each statement cost per request between two readings of `pg_stat_statements`: the
/// [`STATEMENTS_SHOWN`] that took the most execution time, most first.
fn statement_costs(before: &[StatementTotals], after: &[StatementTotals], requests: u64) -> Vec<StatementCost> {
    if requests == 0 {
        return Vec::new();
    }
    let earlier: HashMap<i64, &StatementTotals> = before.iter().map(|s| (s.queryid, s)).collect();
    let per_request = |n: f64| n / requests as f64;
    let mut costs: Vec<StatementCost> = after
        .iter()
        .filter_map(|now| {
            let then = earlier.get(&now.queryid);
            let calls = now.calls - then.map_or(0, |t| t.calls);
            (calls > 0).then(|| StatementCost {
                statement: statement_name(&now.query),
                calls_per_request: per_request(calls as f64),
                exec_us_per_request: per_request((now.exec_ms - then.map_or(0.0, |t| t.exec_ms)) * 1000.0),
                rows_per_request: per_request((now.rows - then.map_or(0, |t| t.rows)) as f64),
            })
        })
        .collect();
    costs.sort_by(|a, b| b.exec_us_per_request.total_cmp(&a.exec_us_per_request));
    costs.truncate(STATEMENTS_SHOWN);
    costs
}

/// A statement's name for the table: a statement of CTEs by their names (`WITH fence, staged,
/// audited`), else its first words, on one line and at most 90 characters.
fn statement_name(query: &str) -> String {
    let words: Vec<&str> = query.split_whitespace().collect();
    let text = match words.first() {
        Some(first) if first.eq_ignore_ascii_case("WITH") => {
            // Each CTE's name is the word before its `AS (` (or `AS MATERIALIZED (`).
            let opens = |word: &str| word.starts_with('(') || word.eq_ignore_ascii_case("MATERIALIZED");
            let names: Vec<&str> = words
                .windows(3)
                .filter(|w| w[1].eq_ignore_ascii_case("AS") && opens(w[2]))
                .map(|w| w[0].trim_start_matches(['(', ',', ')']))
                .filter(|name| !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
                .collect();
            match names.is_empty() {
                true => words.join(" "),
                false => format!("WITH {}", names.join(", ")),
            }
        }
        _ => words.join(" "),
    };
    let mut name: String = text.chars().take(90).collect();
    if text.chars().count() > 90 {
        name.push('…');
    }
    name.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_is_named_by_its_ctes_or_its_first_words() {
        let phase = "WITH fence AS (\n    UPDATE t SET a = 1\n), staged AS (INSERT INTO s SELECT 1 FROM fence), \
                     audited AS (SELECT 1)\nSELECT id FROM fence";
        assert_eq!(statement_name(phase), "WITH fence, staged, audited");
        assert_eq!(statement_name("WITH due AS MATERIALIZED (SELECT 1) SELECT 2"), "WITH due");
        assert_eq!(statement_name("SELECT  a\n FROM t WHERE b = $1"), "SELECT a FROM t WHERE b = $1");
        assert_eq!(statement_name("SELECT a || b"), "SELECT a \\|\\| b");
        assert_eq!(statement_name(&"x ".repeat(100)).chars().count(), 91);
    }

    #[test]
    fn each_statement_costs_what_ran_between_the_readings_per_request() {
        let totals = |queryid, calls, exec_ms, rows| StatementTotals {
            queryid,
            query: format!("SELECT {queryid}"),
            calls,
            exec_ms,
            rows,
        };
        let before = [totals(1, 10, 5.0, 10), totals(2, 4, 1.0, 0)];
        let after = [totals(1, 110, 105.0, 110), totals(2, 4, 1.0, 0), totals(3, 50, 200.0, 25)];
        let costs = statement_costs(&before, &after, 100);
        let shown: Vec<(&str, f64, f64, f64)> = costs
            .iter()
            .map(|c| (c.statement.as_str(), c.calls_per_request, c.exec_us_per_request, c.rows_per_request))
            .collect();
        // Statement 2 did not run in between; 3 is new, and took the most time.
        assert_eq!(shown, [("SELECT 3", 0.5, 2000.0, 0.25), ("SELECT 1", 1.0, 1000.0, 1.0)]);
        assert!(statement_costs(&before, &after, 0).is_empty());
    }
}

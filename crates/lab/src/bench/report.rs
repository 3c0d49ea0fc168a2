//! The results: one object, written as JSON with stable field names (every field is always
//! there, `null` where it was not measured), and printed as tables.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use super::load::{Load, Scenario};
use super::plans::StatementPlan;
use super::reference::PgbenchRun;

#[derive(Serialize)]
pub struct Report {
    pub machine: Machine,
    pub settings: Settings,
    pub scenarios: Scenarios,
    /// The API process's resident memory before the first scenario and after the last, in KiB.
    pub api_rss_kib: Before<Option<u64>>,
    pub references: References,
    pub ratios: Ratios,
    /// The same scenarios on a Citus cluster, after the single node's, in the same run.
    pub citus: Option<CitusReport>,
}

/// The scenarios on Citus (a coordinator and `workers` workers on this machine), beside one
/// PostgreSQL's.
#[derive(Serialize)]
pub struct CitusReport {
    pub workers: u16,
    pub scenarios: Scenarios,
    /// Each scenario's requests per second on Citus over the same on one PostgreSQL.
    pub vs_single_node: CitusRatios,
    /// New payments a cluster of more workers could take, from what each node spent per payment
    /// here: a projection (see [`Projected`]).
    pub projected: Vec<Projected>,
}

/// The workers a projection is made for.
pub const PROJECTED_WORKERS: [u32; 4] = [2, 4, 8, 16];

/// New payments per second a cluster of `workers` workers could take, projected from the CPU
/// each node spent per payment in the `new` scenario, on these assumptions: each node a machine
/// of its own with as many cores as this one, all of them for PostgreSQL; the accounts spread
/// evenly over the workers, so that each takes its share of the payments at the cost per payment
/// measured here; the coordinator's cost per payment the same whatever the number of workers; the
/// API's processes on machines of their own (they share nothing, so they are added as needed);
/// and nothing limited by the network. The cluster takes what its busiest part takes.
#[derive(Serialize)]
pub struct Projected {
    pub workers: u32,
    /// What the workers together could take: `workers × cores × 1 s ÷ their CPU per payment`.
    pub workers_limit_per_s: f64,
    /// What the coordinator could take, the same at any size: `cores × 1 s ÷ its CPU per payment`.
    pub coordinator_limit_per_s: Option<f64>,
    pub payments_per_s: f64,
}

impl Projected {
    /// The projections for [`PROJECTED_WORKERS`], from `new`'s CPU per payment on each node on a
    /// machine of `cores`; none without those figures.
    pub fn of(new: Option<&ScenarioReport>, cores: usize) -> Vec<Projected> {
        let Some(cpu) = new.map(|new| &new.cost.cpu_us_per_request) else { return Vec::new() };
        let per_node = |worker: bool| {
            let nodes = cpu.nodes.iter().filter(|n| n.node.starts_with("worker") == worker);
            nodes.map(|n| n.cpu_us).sum::<Option<f64>>()
        };
        let (Some(workers_us), coordinator_us) = (per_node(true).filter(|us| *us > 0.0), per_node(false)) else {
            return Vec::new();
        };
        let capacity = |us: f64| cores as f64 * 1_000_000.0 / us;
        let coordinator_limit_per_s = coordinator_us.filter(|us| *us > 0.0).map(capacity);
        PROJECTED_WORKERS
            .into_iter()
            .map(|workers| {
                let workers_limit_per_s = f64::from(workers) * capacity(workers_us);
                let payments_per_s =
                    coordinator_limit_per_s.map_or(workers_limit_per_s, |c| c.min(workers_limit_per_s));
                Projected { workers, workers_limit_per_s, coordinator_limit_per_s, payments_per_s }
            })
            .collect()
    }
}

#[derive(Serialize)]
pub struct CitusRatios {
    pub new: Option<f64>,
    pub replay: Option<f64>,
    pub duplicates: Option<f64>,
    pub refund: Option<f64>,
    pub capture: Option<f64>,
}

impl CitusRatios {
    pub fn of(citus: &Scenarios, single: &Scenarios) -> CitusRatios {
        let ratio = |pick: fn(&Scenarios) -> &Option<ScenarioReport>| {
            let (citus, single) = (pick(citus).as_ref()?, pick(single).as_ref()?);
            (single.load.throughput_per_s > 0.0).then(|| citus.load.throughput_per_s / single.load.throughput_per_s)
        };
        CitusRatios {
            new: ratio(|s| &s.new),
            replay: ratio(|s| &s.replay),
            duplicates: ratio(|s| &s.duplicates),
            refund: ratio(|s| &s.refund),
            capture: ratio(|s| &s.capture),
        }
    }
}

#[derive(Serialize)]
pub struct Machine {
    pub cores: usize,
    pub kernel: Option<String>,
    pub cpu_model: Option<String>,
    pub postgresql: Option<String>,
}

#[derive(Serialize)]
pub struct Settings {
    pub clients: usize,
    pub duration_s: f64,
    pub scenarios: Vec<Scenario>,
    pub replay_keys: usize,
    pub references: bool,
    /// `own` (started by the benchmark) or `existing` (`--url`).
    pub deployment: &'static str,
}

#[derive(Serialize, Default)]
pub struct Scenarios {
    pub new: Option<ScenarioReport>,
    pub replay: Option<ScenarioReport>,
    pub duplicates: Option<ScenarioReport>,
    pub refund: Option<ScenarioReport>,
    pub capture: Option<ScenarioReport>,
}

#[derive(Serialize)]
pub struct Before<T> {
    pub before: T,
    pub after: T,
}

/// What the load generator saw.
#[derive(Serialize)]
pub struct LoadReport {
    pub requests: u64,
    pub duration_s: f64,
    pub throughput_per_s: f64,
    pub latency_ms: Latency,
    pub statuses: BTreeMap<String, u64>,
    pub errors: u64,
    pub violations: u64,
}

#[derive(Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

/// One scenario against the service.
#[derive(Serialize)]
pub struct ScenarioReport {
    #[serde(flatten)]
    pub load: LoadReport,
    /// `duplicates`: key groups sent (each must make exactly one payment).
    pub groups: Option<u64>,
    /// What a request cost, from just before the load to the end of the outbox's drain after it.
    #[serde(flatten)]
    pub cost: Cost,
    /// What a request cost during the load alone: the difference from the above is mostly the
    /// outbox catching up.
    pub during_load: Cost,
    pub payments_created: Option<u64>,
    /// Refunds made during the scenario and the drain after it.
    pub refunds_created: Option<u64>,
    pub outbox: Outbox,
    /// The statements that took the most of PostgreSQL's execution time, per request, from just
    /// before the load to the end of the drain (`pg_stat_statements`; empty without it).
    pub statements: Vec<StatementCost>,
    /// The plans of the costliest three, each the sampled run of median duration (own
    /// PostgreSQL only; see [`super::plans`]).
    pub plans: Vec<StatementPlan>,
}

/// The scenarios whose plans the tables show (the JSON has every scenario's): a new payment's and
/// a refund's statements; the others run the same ones.
const SCENARIOS_WITH_PLANS: &[&str] = &["new", "refund"];

/// One statement's cost, per request of its scenario.
#[derive(Serialize)]
pub struct StatementCost {
    /// The statement, named by its CTEs (`WITH existing, expired, ...`) or its first words.
    pub statement: String,
    pub calls_per_request: f64,
    pub exec_us_per_request: f64,
    pub rows_per_request: f64,
}

/// What a request cost, per request.
#[derive(Serialize)]
pub struct Cost {
    pub cpu_us_per_request: ServiceCpu,
    pub statements_per_request: Option<f64>,
    pub wal_bytes_per_request: Option<f64>,
    /// On Citus: distributed executions per request that ran on one shard (each a round trip
    /// from the coordinator to one node), and on several (the workers' and the benchmark's
    /// scans of every shard).
    pub single_shard_executions_per_request: Option<f64>,
    pub multi_shard_executions_per_request: Option<f64>,
}

/// CPU time per request, in µs, of each process.
#[derive(Serialize)]
pub struct ServiceCpu {
    pub api: Option<f64>,
    pub gateway: Option<f64>,
    /// The postmaster and all its children.
    pub postgres: Option<f64>,
    /// The load generator (and the webhook receiver, which runs inside it).
    pub bench: Option<f64>,
    /// On Citus, each node's (its postmaster and all its children); `postgres` is theirs together.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeCpu>,
}

/// One Citus node's CPU time per request, in µs.
#[derive(Serialize)]
pub struct NodeCpu {
    /// `coordinator`, `worker 1`, ...
    pub node: String,
    pub cpu_us: Option<f64>,
}

#[derive(Serialize)]
pub struct Outbox {
    /// The most events staged and not yet delivered, sampled during the load.
    pub backlog_max: Option<u64>,
    /// From the end of the load until the backlog was empty; `null` if it did not empty in time.
    pub drain_ms: Option<u64>,
    /// Events delivered to the benchmark's webhook during the scenario and the drain.
    pub deliveries: Option<u64>,
}

#[derive(Serialize, Default)]
pub struct References {
    pub pgbench_new_payment: Option<PgbenchRun>,
    pub pgbench_replay: Option<PgbenchRun>,
    pub pgbench_refund: Option<PgbenchRun>,
    pub bare_endpoint: Option<BareReport>,
}

#[derive(Serialize)]
pub struct BareReport {
    #[serde(flatten)]
    pub load: LoadReport,
    pub cpu_us_per_request: BareCpu,
}

#[derive(Serialize)]
pub struct BareCpu {
    pub endpoint: Option<f64>,
    pub bench: Option<f64>,
}

#[derive(Serialize, Default)]
pub struct Ratios {
    /// New payments per second over pgbench's new-payment transactions per second.
    pub new_vs_pgbench_new_payment: Option<f64>,
    /// Replays per second over the bare endpoint's requests per second.
    pub replay_vs_bare_endpoint: Option<f64>,
    /// Replays per second over pgbench's replay look-ups per second.
    pub replay_vs_pgbench_replay: Option<f64>,
    /// Replay p99 latency over the bare endpoint's p99.
    pub replay_p99_vs_bare_endpoint_p99: Option<f64>,
    /// New payments' p99 latency over their mean: how long the tail is.
    pub new_p99_vs_new_mean: Option<f64>,
    /// Refunds per second over pgbench's refund transactions per second.
    pub refund_vs_pgbench_refund: Option<f64>,
    /// Refunds per second over new payments per second: what a refund costs beside a payment.
    pub refund_vs_new: Option<f64>,
    /// Authorizations captured per second (each an authorization and its capture) over new
    /// payments per second.
    pub capture_vs_new: Option<f64>,
}

impl LoadReport {
    pub fn of(load: &Load) -> LoadReport {
        let ms = |us: u64| us as f64 / 1000.0;
        let latency = &load.latency_us;
        LoadReport {
            requests: load.requests,
            duration_s: load.elapsed.as_secs_f64(),
            throughput_per_s: load.requests as f64 / load.elapsed.as_secs_f64(),
            latency_ms: Latency {
                p50: ms(latency.value_at_quantile(0.50)),
                p90: ms(latency.value_at_quantile(0.90)),
                p99: ms(latency.value_at_quantile(0.99)),
                max: ms(latency.max()),
                mean: latency.mean() / 1000.0,
            },
            statuses: load.statuses.clone(),
            errors: load.errors,
            violations: load.violations,
        }
    }
}

impl Ratios {
    pub fn of(scenarios: &Scenarios, references: &References) -> Ratios {
        let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).filter(|(_, b)| *b > 0.0).map(|(a, b)| a / b);
        let (new, replay) = (scenarios.new.as_ref().map(|s| &s.load), scenarios.replay.as_ref().map(|s| &s.load));
        let refund = scenarios.refund.as_ref().map(|s| &s.load);
        let capture = scenarios.capture.as_ref().map(|s| &s.load);
        let bare = references.bare_endpoint.as_ref().map(|b| &b.load);
        Ratios {
            new_vs_pgbench_new_payment: ratio(
                new.map(|n| n.throughput_per_s),
                references.pgbench_new_payment.as_ref().map(|p| p.tps),
            ),
            replay_vs_bare_endpoint: ratio(replay.map(|r| r.throughput_per_s), bare.map(|b| b.throughput_per_s)),
            replay_vs_pgbench_replay: ratio(
                replay.map(|r| r.throughput_per_s),
                references.pgbench_replay.as_ref().map(|p| p.tps),
            ),
            replay_p99_vs_bare_endpoint_p99: ratio(replay.map(|r| r.latency_ms.p99), bare.map(|b| b.latency_ms.p99)),
            new_p99_vs_new_mean: ratio(new.map(|n| n.latency_ms.p99), new.map(|n| n.latency_ms.mean)),
            refund_vs_pgbench_refund: ratio(
                refund.map(|r| r.throughput_per_s),
                references.pgbench_refund.as_ref().map(|p| p.tps),
            ),
            refund_vs_new: ratio(refund.map(|r| r.throughput_per_s), new.map(|n| n.throughput_per_s)),
            capture_vs_new: ratio(capture.map(|c| c.throughput_per_s), new.map(|n| n.throughput_per_s)),
        }
    }
}

impl Report {
    /// The tables, in Markdown, as the guide's performance chapter shows them.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let m = &self.machine;
        let _ = writeln!(
            out,
            "{} cores ({}), Linux {}, PostgreSQL {}; {} clients, {:.0} s per scenario\n",
            m.cores,
            m.cpu_model.as_deref().unwrap_or("unknown CPU"),
            m.kernel.as_deref().unwrap_or("?"),
            m.postgresql.as_deref().unwrap_or("?"),
            self.settings.clients,
            self.settings.duration_s
        );
        let scenarios = [
            ("new", &self.scenarios.new),
            ("replay", &self.scenarios.replay),
            ("duplicates", &self.scenarios.duplicates),
            ("refund", &self.scenarios.refund),
        ];
        let scenarios: Vec<(&str, &ScenarioReport)> =
            scenarios.iter().filter_map(|(n, s)| Some((*n, s.as_ref()?))).collect();
        let bare = self.references.bare_endpoint.as_ref();

        out.push_str("| scenario | requests | req/s | p50 ms | p90 ms | p99 ms | max ms | mean ms | statuses | errors | violations |\n");
        out.push_str("|---|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|\n");
        let loads = scenarios.iter().map(|(name, s)| (*name, &s.load)).chain(bare.map(|b| ("bare endpoint", &b.load)));
        for (name, load) in loads {
            let l = &load.latency_ms;
            let statuses: Vec<String> = load.statuses.iter().map(|(status, n)| format!("{status}: {n}")).collect();
            let _ = writeln!(
                out,
                "| {name} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} |",
                load.requests,
                load.throughput_per_s,
                l.p50,
                l.p90,
                l.p99,
                l.max,
                l.mean,
                statuses.join(", "),
                load.errors,
                load.violations
            );
        }

        out.push_str("\n| per request, to the end of the drain | CPU µs API | gateway | PostgreSQL | bench | statements | WAL bytes | payments made | refunds made | outbox max backlog | drain ms | deliveries |\n");
        out.push_str("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
        for (name, s) in &scenarios {
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {} | {} | {} | {} |",
                cost(&s.cost),
                int(s.payments_created),
                int(s.refunds_created),
                int(s.outbox.backlog_max),
                s.outbox.drain_ms.map_or_else(|| "not drained".to_owned(), |ms| ms.to_string()),
                int(s.outbox.deliveries)
            );
            let _ = writeln!(out, "| {name}, during the load | {} | | | | | |", cost(&s.during_load));
        }
        if let Some(b) = bare {
            let c = &b.cpu_us_per_request;
            let _ =
                writeln!(out, "| bare endpoint | {} | | | {} | | | | | | | |", float(c.endpoint, 0), float(c.bench, 0));
        }
        for (name, s) in &scenarios {
            if s.statements.is_empty() {
                continue;
            }
            let _ = writeln!(out, "\n| statements of `{name}`, per request | calls | execution µs | rows |");
            out.push_str("|---|--:|--:|--:|\n");
            for statement in &s.statements {
                let _ = writeln!(
                    out,
                    "| `{}` | {:.2} | {:.0} | {:.2} |",
                    statement.statement,
                    statement.calls_per_request,
                    statement.exec_us_per_request,
                    statement.rows_per_request
                );
            }
        }
        for (name, s) in &scenarios {
            if s.plans.is_empty() || !SCENARIOS_WITH_PLANS.contains(name) {
                continue;
            }
            let _ = writeln!(
                out,
                "\nplans of `{name}`'s costliest statements, as they ran (auto_explain: the sampled run of median duration)"
            );
            for plan in &s.plans {
                let _ = writeln!(
                    out,
                    "\n`{}`: {:.3} ms, of {} sampled\n```",
                    plan.statement, plan.duration_ms, plan.sampled
                );
                for line in &plan.plan {
                    let _ = writeln!(out, "{line}");
                }
                out.push_str("```\n");
            }
        }
        let rss = &self.api_rss_kib;
        let _ = writeln!(out, "\nAPI resident memory: {} KiB before, {} KiB after", int(rss.before), int(rss.after));

        let pgbench =
            [&self.references.pgbench_new_payment, &self.references.pgbench_replay, &self.references.pgbench_refund];
        if pgbench.iter().any(|p| p.is_some()) {
            out.push_str(
                "\n| pgbench | transactions | tps | latency average ms | failed | CPU µs/tx PostgreSQL | pgbench | WAL bytes/tx |\n",
            );
            out.push_str("|---|--:|--:|--:|--:|--:|--:|--:|\n");
            for run in pgbench.into_iter().flatten() {
                let _ = writeln!(
                    out,
                    "| {} | {} | {:.0} | {:.3} | {} | {} | {:.0} | {} |",
                    run.script,
                    run.transactions,
                    run.tps,
                    run.latency_average_ms,
                    run.failed,
                    float(run.postgres_cpu_us_per_transaction, 0),
                    run.pgbench_cpu_us_per_transaction,
                    float(run.wal_bytes_per_transaction, 0)
                );
            }
        }

        let r = &self.ratios;
        out.push_str("\n| ratio | value |\n|---|--:|\n");
        let ratios = [
            ("new payments / pgbench new payment tps", r.new_vs_pgbench_new_payment),
            ("replays / bare endpoint req/s", r.replay_vs_bare_endpoint),
            ("replays / pgbench replay tps", r.replay_vs_pgbench_replay),
            ("replay p99 / bare endpoint p99", r.replay_p99_vs_bare_endpoint_p99),
            ("new p99 / new mean", r.new_p99_vs_new_mean),
            ("refunds / pgbench refund tps", r.refund_vs_pgbench_refund),
            ("refunds / new payments", r.refund_vs_new),
            ("authorized and captured / new payments", r.capture_vs_new),
        ];
        for (name, value) in ratios {
            let _ = writeln!(out, "| {name} | {} |", float(value, 3));
        }
        if let Some(citus) = &self.citus {
            citus.table(&mut out);
        }
        out
    }
}

impl CitusReport {
    fn table(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\nOn Citus, a coordinator and {} workers on this machine, measured after one PostgreSQL:\n",
            self.workers
        );
        out.push_str("| scenario | req/s | ÷ one PostgreSQL | p99 ms | statements/request | one-shard executions/request | multi-shard executions/request |\n");
        out.push_str("|---|--:|--:|--:|--:|--:|--:|\n");
        let r = &self.vs_single_node;
        let scenarios = [
            ("new", &self.scenarios.new, r.new),
            ("replay", &self.scenarios.replay, r.replay),
            ("duplicates", &self.scenarios.duplicates, r.duplicates),
            ("refund", &self.scenarios.refund, r.refund),
            ("capture", &self.scenarios.capture, r.capture),
        ];
        for (name, scenario, ratio) in &scenarios {
            let Some(s) = scenario else { continue };
            let _ = writeln!(
                out,
                "| {name} | {:.0} | {} | {:.2} | {} | {} | {} |",
                s.load.throughput_per_s,
                float(*ratio, 3),
                s.load.latency_ms.p99,
                float(s.cost.statements_per_request, 2),
                float(s.cost.single_shard_executions_per_request, 2),
                float(s.cost.multi_shard_executions_per_request, 2)
            );
        }

        // CPU per request on each node, named as the first scenario names them.
        let Some(first) = scenarios.iter().find_map(|(_, s, _)| s.as_ref()) else { return };
        let names: Vec<&str> = first.cost.cpu_us_per_request.nodes.iter().map(|n| n.node.as_str()).collect();
        out.push_str(
            "\nCPU µs per request on each node (its postmaster and all its children), to the end of the drain:\n\n",
        );
        let _ = writeln!(out, "| scenario | API | {} | all nodes |", names.join(" | "));
        let _ = writeln!(out, "|---|--:|{}--:|", "--:|".repeat(names.len()));
        for (name, scenario, _) in &scenarios {
            let Some(s) = scenario else { continue };
            let cpu = &s.cost.cpu_us_per_request;
            let nodes: Vec<String> = cpu.nodes.iter().map(|n| float(n.cpu_us, 0)).collect();
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {} |",
                float(cpu.api, 0),
                nodes.join(" | "),
                float(cpu.postgres, 0)
            );
        }

        if self.projected.is_empty() {
            return;
        }
        out.push_str(
            "\nProjected new payments/s for more workers, from the CPU each node spent per payment above: a \
             projection, not a measurement. Assumed: each node a machine of its own with as many cores as this \
             one; accounts spread evenly over the workers, each payment costing a worker and the coordinator \
             what it did here; the API on machines of its own; no limit from the network.\n\n",
        );
        out.push_str("| workers | the workers' limit | the coordinator's limit | projected |\n|--:|--:|--:|--:|\n");
        for p in &self.projected {
            let _ = writeln!(
                out,
                "| {} | {:.0} | {} | {:.0} |",
                p.workers,
                p.workers_limit_per_s,
                float(p.coordinator_limit_per_s, 0),
                p.payments_per_s
            );
        }
    }
}

/// The cost columns: CPU of each process, statements, WAL.
fn cost(cost: &Cost) -> String {
    let c = &cost.cpu_us_per_request;
    let columns = [
        float(c.api, 0),
        float(c.gateway, 0),
        float(c.postgres, 0),
        float(c.bench, 0),
        float(cost.statements_per_request, 2),
        float(cost.wal_bytes_per_request, 0),
    ];
    columns.join(" | ")
}

fn float(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.decimals$}"))
}

fn int(value: Option<u64>) -> String {
    value.map_or_else(|| "n/a".to_owned(), |v| v.to_string())
}

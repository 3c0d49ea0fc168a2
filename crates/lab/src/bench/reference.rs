//! The references: the least work the same jobs can be done with, measured in the same run on
//! the same machine, so that the service's figures can be read as ratios.
//!
//! - The protocol's SQL under pgbench, in a database of its own beside the service's (a schema
//!   with no foreign keys and no secondary indexes): a new payment as its three durable
//!   transactions, the one indexed look-up a replay needs, and a refund as its three durable
//!   transactions (the first taking the payment's row lock and reserving the amount on it).
//! - A bare actix-web endpoint that parses a JSON payment and answers JSON (`payments
//!   bench-endpoint`), driven by the same load generator as the service, so that the client's
//!   own cost cancels out in the ratio.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use payments_service::postgres::cluster::server_binaries;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use super::database::Probe;
use super::load::{Driver, Load, MAX_LATENCY_US, Scenario};
use super::procfs::{Watched, reaped_children_cpu_us};
use super::sampler::Seen;
use super::world::World;
use crate::child::{self, Child};
use crate::execute;
use crate::progress::Progress;

/// The reference database, beside the service's.
const DATABASE: &str = "payments_reference";

const SCHEMA: &str = include_str!("reference/schema.sql");
/// 100,000 finished keys for `replay.sql` to look up.
const SEED_REPLAY: &str = include_str!("reference/seed_replay.sql");
/// 100,000 succeeded payments for `refund.sql` to refund.
const SEED_REFUND: &str = include_str!("reference/seed_refund.sql");
pub const NEW_PAYMENT: Script = Script {
    name: "new_payment.sql",
    sql: include_str!("reference/new_payment.sql"),
    seed: None,
    reference_of: Scenario::New,
};
pub const REPLAY: Script = Script {
    name: "replay.sql",
    sql: include_str!("reference/replay.sql"),
    seed: None,
    reference_of: Scenario::Replay,
};
/// Its payments are loaded just before it runs, so that the runs before it find the tables as
/// they always have.
pub const REFUND: Script = Script {
    name: "refund.sql",
    sql: include_str!("reference/refund.sql"),
    seed: Some(("seed_refund.sql", SEED_REFUND)),
    reference_of: Scenario::Refund,
};

/// A pgbench script.
#[derive(Clone, Copy)]
pub struct Script {
    pub name: &'static str,
    sql: &'static str,
    /// What to load before it runs (a name for the file, and its SQL), if anything.
    seed: Option<(&'static str, &'static str)>,
    /// The scenario it is the floor of.
    pub reference_of: Scenario,
}

/// What one pgbench run reported.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PgbenchRun {
    pub script: &'static str,
    pub transactions: u64,
    pub failed: u64,
    /// Transactions per second (a transaction is a whole script: one payment, one look-up, or one
    /// refund).
    pub tps: f64,
    pub latency_average_ms: f64,
    pub duration_s: u64,
    /// PostgreSQL's CPU time per transaction (the postmaster and all its children), in µs.
    pub postgres_cpu_us_per_transaction: Option<f64>,
    /// pgbench's own, in µs.
    pub pgbench_cpu_us_per_transaction: f64,
    /// WAL written per transaction, in bytes.
    pub wal_bytes_per_transaction: Option<f64>,
}

/// pgbench, ready to run against the reference database.
pub struct Pgbench {
    bin: PathBuf,
    database_url: String,
    scratch: PathBuf,
    postgres: Option<Watched>,
}

impl Pgbench {
    /// Creates the reference database (anew) and loads its schema and the keys to replay.
    pub async fn prepare(world: &World) -> anyhow::Result<Pgbench> {
        let service_url = world.database_url.as_ref().context("the pgbench references need --database-url")?;
        let database_url = world.sibling_database_url(DATABASE).context("no database URL")?;
        let bin = client_binaries()?;
        execute(service_url, &format!("DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")).await?;
        execute(service_url, &format!("CREATE DATABASE {DATABASE}")).await?;
        let pgbench = Pgbench {
            bin,
            database_url,
            scratch: world.scratch.clone(),
            postgres: world.pids.postgres.map(Watched::tree),
        };
        pgbench.psql("schema.sql", SCHEMA).await?;
        pgbench.psql("seed_replay.sql", SEED_REPLAY).await?;
        Ok(pgbench)
    }

    async fn psql(&self, name: &str, sql: &str) -> anyhow::Result<()> {
        let file = self.scratch.join(name);
        std::fs::write(&file, sql)?;
        let mut psql = Command::new(self.bin.join("psql"));
        psql.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-f"]).arg(&file).arg(&self.database_url);
        child::output(&format!("psql -f {name}"), psql).await?;
        Ok(())
    }

    /// Runs `script` as the reference workloads do: `pgbench -n -M prepared -c <clients> -j 2
    /// -T <seconds>`, with a progress line a second for the display (and the throughput over
    /// time); with `latencies`, also `-l`, a line per transaction with its latency, for the
    /// distribution.
    pub async fn run(
        &self,
        script: Script,
        clients: usize,
        duration: Duration,
        probe: Option<&Probe>,
        progress: &Progress,
        latencies: bool,
    ) -> anyhow::Result<(PgbenchRun, Seen)> {
        if let Some((name, sql)) = script.seed {
            self.psql(name, sql).await?;
        }
        let file = self.scratch.join(script.name);
        std::fs::write(&file, script.sql)?;
        let seconds = duration.as_secs_f64().ceil().max(1.0) as u64;
        let mut pgbench = Command::new(self.bin.join("pgbench"));
        pgbench.args(["-n", "-M", "prepared", "-P", "1"]);
        pgbench.args(["-c", &clients.to_string(), "-j", &clients.min(2).to_string(), "-T", &seconds.to_string()]);
        let log_prefix = self.scratch.join(format!("pgbench-log-{}", script.name));
        if latencies {
            pgbench.arg("-l").arg(format!("--log-prefix={}", log_prefix.display()));
        }
        pgbench.arg("-f").arg(&file).arg(&self.database_url);
        pgbench.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null()).kill_on_drop(true);

        let phase = progress.timed(&format!("pgbench {}", script.name), Duration::from_secs(seconds), None);
        let wal_before = wal_bytes(probe).await?;
        let (postgres_before, pgbench_before) = (self.postgres.and_then(|p| p.cpu_us()), reaped_children_cpu_us());
        let mut running = pgbench.spawn().context("starting pgbench")?;
        let mut stderr = BufReader::new(running.stderr.take().context("no stderr")?).lines();
        let (mut errors, mut seen) = (Vec::new(), Seen::default());
        // "progress: 3.0 s, 2312.9 tps, lat 13.8 ms stddev 4.2, 0 failed"
        while let Some(line) = stderr.next_line().await? {
            match line.strip_prefix("progress: ") {
                Some(rest) => {
                    seen.samples.throughput.extend(progress_tps(rest));
                    phase.set_message(rest.to_owned());
                }
                None => errors.push(line),
            }
        }
        let output = running.wait_with_output().await?;
        let postgres_after = self.postgres.and_then(|p| p.cpu_us());
        let pgbench_cpu = reaped_children_cpu_us() - pgbench_before;
        let wal_after = wal_bytes(probe).await?;
        if !output.status.success() {
            bail!("pgbench -f {} failed ({}):\n{}", script.name, output.status, errors.join("\n"));
        }
        let report = String::from_utf8_lossy(&output.stdout);
        let transactions = field(&report, "number of transactions actually processed: ")?;
        let run = PgbenchRun {
            script: script.name,
            transactions: transactions as u64,
            failed: field(&report, "number of failed transactions: ").unwrap_or(0.0) as u64,
            tps: field(&report, "tps = ")?,
            latency_average_ms: field(&report, "latency average = ")?,
            duration_s: seconds,
            postgres_cpu_us_per_transaction: postgres_before
                .zip(postgres_after)
                .map(|(before, after)| (after - before) as f64 / transactions.max(1.0)),
            pgbench_cpu_us_per_transaction: pgbench_cpu as f64 / transactions.max(1.0),
            wal_bytes_per_transaction: wal_before
                .zip(wal_after)
                .map(|(before, after)| (after - before) as f64 / transactions.max(1.0)),
        };
        phase.finish(&format!("{:.0} tps, latency average {:.3} ms", run.tps, run.latency_average_ms));
        if latencies {
            seen.latency_us = Some(logged_latencies(&log_prefix)?);
        }
        Ok((run, seen))
    }
}

/// The time and rate of a progress line's rest (`3.0 s, 2312.9 tps, lat ...`).
fn progress_tps(rest: &str) -> Option<(f64, f64)> {
    let (seconds, rest) = rest.split_once(" s, ")?;
    let (tps, _) = rest.split_once(" tps")?;
    Some((seconds.parse().ok()?, tps.parse().ok()?))
}

/// The latencies pgbench logged with `-l` into `<prefix>.<pid>` (and `.<thread>` for each
/// further thread): the third field of each line, in µs (`failed` or `skipped` for transactions
/// that did not complete, left out). The files are removed once read.
fn logged_latencies(prefix: &Path) -> anyhow::Result<Histogram<u64>> {
    let (dir, name) = (prefix.parent().context("a log directory")?, prefix.file_name().context("a log name")?);
    let mut latency_us = Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let ours = path.file_name().and_then(|file| file.to_str()).is_some_and(|file| {
            file.strip_prefix(name.to_str().unwrap_or_default()).is_some_and(|rest| rest.starts_with('.'))
        });
        if !ours {
            continue;
        }
        let log = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        for us in log.lines().filter_map(|line| line.split_whitespace().nth(2)?.parse::<u64>().ok()) {
            latency_us.saturating_record(us.clamp(1, MAX_LATENCY_US));
        }
        std::fs::remove_file(&path)?;
    }
    Ok(latency_us)
}

/// The cluster's WAL position, in bytes.
async fn wal_bytes(probe: Option<&Probe>) -> anyhow::Result<Option<u64>> {
    match probe {
        Some(probe) => Ok(Some(probe.counters().await?.wal_bytes)),
        None => Ok(None),
    }
}

/// The directory of `pgbench` and `psql` of the server's own version: beside the real `postgres`
/// (a link to it on `PATH` is followed), else wherever `PATH` has both.
fn client_binaries() -> anyhow::Result<PathBuf> {
    let has_both = |dir: &Path| dir.join("pgbench").is_file() && dir.join("psql").is_file();
    let server = std::fs::canonicalize(server_binaries()?.join("postgres"))?;
    let beside_server = server.parent().map(Path::to_owned);
    let path =
        std::env::var_os("PATH").map(|path| std::env::split_paths(&path).collect::<Vec<_>>()).unwrap_or_default();
    beside_server
        .into_iter()
        .chain(path)
        .find(|dir| has_both(dir))
        .context("the pgbench references need pgbench and psql (Debian: postgresql-client), and neither is installed")
}

/// The number after `prefix` on a line of pgbench's report.
fn field(report: &str, prefix: &str) -> anyhow::Result<f64> {
    let line = report.lines().find_map(|line| line.strip_prefix(prefix));
    let number = line.and_then(|rest| rest.split([' ', '/']).next());
    number.and_then(|n| n.parse().ok()).with_context(|| format!("no {prefix:?} in pgbench's report:\n{report}"))
}

/// The bare endpoint, as a process of its own.
pub struct BareEndpoint {
    child: Child,
    pub driver: Driver,
}

impl BareEndpoint {
    /// Starts `payments bench-endpoint` with two workers, as the reference runs it.
    pub async fn start(world: &World, clients: usize) -> anyhow::Result<BareEndpoint> {
        let command = child::payments(&["bench-endpoint", "--workers", "2"], &[])?;
        let log = world.scratch.join("bench-endpoint.log");
        let child = Child::start("payments bench-endpoint", command, &log, super::endpoint::LISTENING).await?;
        let driver = Driver::new(&child.address.parse()?, "none", clients)?;
        Ok(BareEndpoint { child, driver })
    }

    pub fn watched(&self) -> Option<Watched> {
        self.child.pid().map(Watched::process)
    }

    /// Sends it the `new` scenario's requests; `sent` counts them as they complete.
    pub async fn load(&self, clients: usize, duration: Duration, sent: Arc<AtomicU64>) -> Load {
        self.driver.run(Scenario::New, None, clients, duration, sent).await
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        self.child.stop().await
    }
}

#[cfg(test)]
mod tests {
    use super::{field, logged_latencies, progress_tps};
    use crate::Scratch;

    #[test]
    fn pgbench_progress_lines_give_the_rate_each_second() {
        assert_eq!(progress_tps("3.0 s, 2312.9 tps, lat 13.8 ms stddev 4.2, 0 failed"), Some((3.0, 2312.9)));
        assert_eq!(progress_tps("something else"), None);
    }

    #[test]
    fn pgbench_transaction_logs_are_read_into_a_histogram_and_removed() {
        let scratch = Scratch::create("payments-pgbench-log-").unwrap();
        let prefix = scratch.path().join("pgbench-log-refund.sql");
        // client_id transaction_no time script_no time_epoch time_us: a thread's file each.
        std::fs::write(prefix.with_extension("sql.4242"), "0 0 1200 0 1700000000 1\n1 0 3400 0 1700000000 2\n")
            .unwrap();
        std::fs::write(prefix.with_extension("sql.4242.1"), "2 0 5600 0 1700000000 3\n3 0 failed 0 1700000000 4\n")
            .unwrap();
        std::fs::write(scratch.path().join("pgbench-log-replay.sql.4242"), "0 0 99 0 1700000000 1\n").unwrap();
        let latency_us = logged_latencies(&prefix).unwrap();
        assert_eq!((latency_us.len(), latency_us.min(), latency_us.value_at_quantile(0.5)), (3, 1200, 3401));
        let left: Vec<_> = std::fs::read_dir(scratch.path()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
        assert_eq!(left, ["pgbench-log-replay.sql.4242"], "another script's log is left alone");
    }

    #[test]
    fn pgbench_reports_are_read() {
        let report = "transaction type: new_payment.sql\nnumber of transactions actually processed: 24120\n\
                      number of failed transactions: 0 (0.000%)\nlatency average = 13.270 ms\n\
                      initial connection time = 21.4 ms\ntps = 2411.398201 (without initial connection time)\n";
        assert_eq!(field(report, "number of transactions actually processed: ").unwrap(), 24120.0);
        assert_eq!(field(report, "number of failed transactions: ").unwrap(), 0.0);
        assert_eq!(field(report, "latency average = ").unwrap(), 13.27);
        assert_eq!(field(report, "tps = ").unwrap(), 2411.398201);
        assert!(field(report, "nothing: ").is_err());
    }
}

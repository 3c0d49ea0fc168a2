//! The deployment under test. By default the benchmark starts one of its own, as a user would:
//! a throwaway PostgreSQL cluster with durable settings (every commit flushed to disk: durability
//! is part of the job) and `pg_stat_statements` preloaded; a database migrated by `payments
//! migrate`; an account made by `payments accounts create`; `payments gateway` and `payments
//! serve` as processes of their own; and a webhook receiver for the outbox's events. Or it
//! measures a running deployment it is pointed at.

use std::path::{Path, PathBuf};

use anyhow::Context;
use payments_service::startup::LISTENING;
use reqwest::Url;

use crate::child::{Child, payments};
use crate::webhook::WebhookSink;
use crate::{Nodes, OwnDatabase, Scratch};

/// What the benchmark's own cluster runs with beyond the usual: statement counts, `BEGIN` and
/// `COMMIT` included; and a sample of statements explained to the log as they ran, with their
/// actual times, rows, buffers and triggers (see [`super::plans`]). Nothing that trades durability
/// for speed: fsync and synchronous_commit stay on.
const SERVER_SETTINGS: &[&str] = &[
    "shared_preload_libraries=pg_stat_statements,auto_explain",
    "pg_stat_statements.track_utility=on",
    "auto_explain.log_min_duration=0",
    "auto_explain.log_analyze=on",
    "auto_explain.log_buffers=on",
    "auto_explain.log_triggers=on",
    "auto_explain.log_format=json",
];

/// The benchmark's scratch directories: `/tmp/payments-bench-<pid>`.
const SCRATCH_PREFIX: &str = "payments-bench-";

/// The processes whose CPU time the report can show.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pids {
    pub api: Option<u32>,
    pub gateway: Option<u32>,
    /// The postmaster: with its children, all of PostgreSQL.
    pub postgres: Option<u32>,
}

/// A deployment to measure, and what the benchmark knows of it.
pub struct World {
    pub api_url: Url,
    pub api_key: String,
    pub database_url: Option<String>,
    pub pids: Pids,
    /// Where the benchmark keeps its files (the references' SQL, logs), removed at the end.
    pub scratch: PathBuf,
    /// The log of its own PostgreSQL, where the sampled plans are (none on Citus or elsewhere).
    pub server_log: Option<PathBuf>,
    /// On its own Citus cluster, each node's postmaster, named (`coordinator`, `worker 1`, ...):
    /// its CPU time, with its children's, is reported node by node.
    pub nodes: Vec<(String, u32)>,
    /// Fields drop in order: the processes before the cluster they use, the scratch directory
    /// holding that cluster last.
    own: Option<Own>,
    _scratch: Scratch,
}

struct Own {
    serve: Child,
    gateway: Child,
    webhook: WebhookSink,
    database: Option<OwnDatabase>,
}

impl World {
    /// Starts a deployment of the benchmark's own: on one PostgreSQL, or on a Citus cluster of a
    /// coordinator and `citus_workers` workers; one statement in `explain_every` explained to
    /// the log.
    pub async fn start(citus_workers: Option<u16>, explain_every: u32) -> anyhow::Result<World> {
        let scratch = Scratch::create(SCRATCH_PREFIX)?;
        let mut settings: Vec<String> = SERVER_SETTINGS.iter().map(|s| s.to_string()).collect();
        settings.push(format!("auto_explain.sample_rate={}", 1.0 / f64::from(explain_every)));
        let database = match citus_workers {
            None => OwnDatabase::start(&scratch.path().join("pg"), settings, "bench").await?,
            Some(workers) => OwnDatabase::start_citus(&scratch.path().join("citus"), workers.into(), "bench").await?,
        };
        let (database_url, api_key) = (database.url.clone(), database.api_key.clone());
        // PostgreSQL's CPU time is that of one postmaster's processes; on Citus, of each node's.
        let (postgres, server_log, nodes) = match &database.nodes {
            Nodes::One(_) => {
                let root = scratch.path().join("pg");
                (postmaster_pid(&root), Some(root.join("postgres.log")), Vec::new())
            }
            Nodes::Citus(citus) => {
                let citus = citus.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let nodes = citus.nodes().enumerate().filter_map(|(index, (role, _, root))| {
                    let name = if index == 0 { role.to_owned() } else { format!("{role} {index}") };
                    postmaster_pid(root).map(|pid| (name, pid))
                });
                (None, None, nodes.collect())
            }
        };

        let quiet = [("RUST_LOG", "warn")];
        let gateway = payments(&["gateway", "--bind", "127.0.0.1:0"], &quiet)?;
        let log = scratch.path().join("gateway.log");
        let gateway = Child::start("payments gateway", gateway, &log, "payments gateway listening on").await?;
        let webhook = WebhookSink::start()?;
        let env = [
            ("DATABASE_URL", database_url.as_str()),
            ("GATEWAY_URL", gateway.address.as_str()),
            ("PAYMENTS_BIND", "127.0.0.1:0"),
            // Never the usual 9464, which a `serve` of the user's may hold.
            ("PAYMENTS_METRICS_BIND", "127.0.0.1:0"),
            ("PAYMENTS_WEBHOOK_URL", webhook.url.as_str()),
            // Logging every request would cost more than some of what is measured.
            ("RUST_LOG", "warn"),
        ];
        let log = scratch.path().join("serve.log");
        let serve = Child::start("payments serve", payments(&["serve"], &env)?, &log, LISTENING).await?;

        let pids = Pids { api: serve.pid(), gateway: gateway.pid(), postgres };
        Ok(World {
            api_url: serve.address.parse().context("the address serve printed")?,
            api_key,
            database_url: Some(database_url),
            pids,
            scratch: scratch.path().to_owned(),
            server_log,
            nodes,
            own: Some(Own { serve, gateway, webhook, database: Some(database) }),
            _scratch: scratch,
        })
    }

    /// A running deployment.
    pub fn existing(api_url: Url, api_key: String, database_url: Option<String>, pids: Pids) -> anyhow::Result<World> {
        let scratch = Scratch::create(SCRATCH_PREFIX)?;
        Ok(World {
            api_url,
            api_key,
            database_url,
            pids,
            scratch: scratch.path().to_owned(),
            server_log: None,
            nodes: Vec::new(),
            own: None,
            _scratch: scratch,
        })
    }

    /// Events the service's outbox delivered to the benchmark's webhook so far (own deployment).
    pub fn deliveries(&self) -> Option<u64> {
        self.own.as_ref().map(|own| own.webhook.deliveries())
    }

    /// The connection string of another database beside the service's, on the same server.
    pub fn sibling_database_url(&self, name: &str) -> Option<String> {
        let url = self.database_url.as_ref()?;
        if let Some(Nodes::One(cluster)) = self.own.as_ref().and_then(|own| own.database.as_ref()).map(|d| &d.nodes) {
            return Some(cluster.url(name));
        }
        match Url::parse(url) {
            Ok(mut parsed) if parsed.scheme().starts_with("postgres") => {
                parsed.set_path(name);
                Some(parsed.to_string())
            }
            // The key=value form: the last value of a key wins.
            _ => Some(format!("{url} dbname='{name}'")),
        }
    }

    /// Stops what the benchmark started, in dependency order: the API (which drains its requests
    /// and lets its workers finish), the gateway, the webhook, then the cluster.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let Some(mut own) = self.own.take() else { return Ok(()) };
        own.serve.stop().await?;
        own.gateway.stop().await?;
        own.webhook.stop().await;
        if let Some(database) = own.database.take() {
            database.stop().await?;
        }
        Ok(())
    }
}

/// The postmaster's pid, from the first line of `postmaster.pid`.
fn postmaster_pid(root: &Path) -> Option<u32> {
    let contents = std::fs::read_to_string(root.join("data/postmaster.pid")).ok()?;
    contents.lines().next()?.trim().parse().ok()
}

#![doc = include_str!("../README.md")]

pub mod bench;
pub mod chaos;
pub mod child;
pub mod plot;
pub mod progress;
pub mod relay;
pub mod webhook;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use child::payments;
use payments_service::postgres::citus::CitusCluster;
use payments_service::postgres::cluster::{Cluster, Durability};

/// The service's database in a cluster of our own.
const DATABASE: &str = "payments";

/// A cluster of our own, with the service's database migrated by `payments migrate` and an
/// account made by `payments accounts create`.
pub struct OwnDatabase {
    pub nodes: Nodes,
    pub url: String,
    /// The account's API key.
    pub api_key: String,
}

/// Where the database is: one PostgreSQL, or a Citus cluster's nodes (shared with the chaos run,
/// which crashes its workers).
pub enum Nodes {
    One(Cluster),
    Citus(Arc<Mutex<CitusCluster>>),
}

impl OwnDatabase {
    /// Starts a durable cluster under `root` with these server settings, and makes the database
    /// and an account named `account` in it.
    pub async fn start(root: &Path, settings: Vec<String>, account: &str) -> anyhow::Result<OwnDatabase> {
        let root = root.to_owned();
        let cluster = tokio::task::spawn_blocking(move || {
            let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
            Cluster::start_with_settings(&root, Durability::Durable, &settings)
        })
        .await??;
        execute(&cluster.url("postgres"), &format!("CREATE DATABASE {DATABASE}")).await?;
        let url = cluster.url(DATABASE);
        let api_key = migrate_and_open(&url, &["migrate"], account).await?;
        Ok(OwnDatabase { nodes: Nodes::One(cluster), url, api_key })
    }

    /// A durable Citus cluster under `root` instead, a coordinator and `workers` workers, the
    /// schema distributed over it by `payments migrate --distribute`.
    pub async fn start_citus(root: &Path, workers: usize, account: &str) -> anyhow::Result<OwnDatabase> {
        let root = root.to_owned();
        let citus =
            tokio::task::spawn_blocking(move || CitusCluster::start(&root, workers, Durability::Durable)).await??;
        let url = citus.database(DATABASE).await?;
        let api_key = migrate_and_open(&url, &["migrate", "--distribute"], account).await?;
        Ok(OwnDatabase { nodes: Nodes::Citus(Arc::new(Mutex::new(citus))), url, api_key })
    }

    /// Stops the cluster.
    pub async fn stop(self) -> anyhow::Result<()> {
        tokio::task::spawn_blocking(move || match self.nodes {
            Nodes::One(cluster) => cluster.stop(),
            Nodes::Citus(citus) => match Arc::into_inner(citus) {
                Some(citus) => citus.into_inner().unwrap_or_else(PoisonError::into_inner).stop(),
                None => anyhow::bail!("the Citus cluster is still in use"),
            },
        })
        .await?
    }
}

/// `payments <migrate>` on `url`, then an account named `account`; its API key.
async fn migrate_and_open(url: &str, migrate: &[&str], account: &str) -> anyhow::Result<String> {
    let with_database = [("DATABASE_URL", url)];
    child::output("payments migrate", payments(migrate, &with_database)?).await?;
    let created = payments(&["accounts", "create", account], &with_database)?;
    let created = child::output("payments accounts create", created).await?;
    Ok(created.lines().last().context("no API key printed")?.trim().to_owned())
}

/// Runs one statement on `url`.
pub async fn execute(url: &str, sql: &str) -> anyhow::Result<()> {
    let mut conn = AsyncPgConnection::establish(url).await?;
    diesel::sql_query(sql).execute(&mut conn).await.with_context(|| format!("running {sql}"))?;
    Ok(())
}

/// A run's directory under the system's temporary directory, removed when dropped. A run that was
/// killed leaves its directory behind (its cluster stops by itself: see [`payments_service::postgres::cluster`]),
/// and the next run with the same prefix removes it.
pub struct Scratch(PathBuf);

impl Scratch {
    /// `<tmp>/<prefix><pid>`, such as `/tmp/payments-bench-4242`.
    pub fn create(prefix: &str) -> anyhow::Result<Scratch> {
        for entry in std::fs::read_dir(std::env::temp_dir())?.flatten() {
            let name = entry.file_name();
            // A directory kept for someone to read is named otherwise (see `keep`), and stays.
            let pid = name.to_str().and_then(|name| name.strip_prefix(prefix)).and_then(|pid| pid.parse::<i32>().ok());
            let Some(pid) = pid else { continue };
            if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let dir = std::env::temp_dir().join(format!("{prefix}{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Keeps the directory (and the logs in it) for someone to read, as `<prefix><pid>-kept`,
    /// which no later run removes.
    pub fn keep(self) -> PathBuf {
        let mut kept = self.0.clone().into_os_string();
        kept.push("-kept");
        let path = match std::fs::rename(&self.0, &kept) {
            Ok(()) => PathBuf::from(kept),
            Err(_) => self.0.clone(),
        };
        std::mem::forget(self);
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

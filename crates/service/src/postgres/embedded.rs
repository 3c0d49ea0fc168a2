//! Embedded mode: with no `DATABASE_URL`, a private cluster under `PAYMENTS_DATA_DIR`, migrated
//! so that the service works with no set-up at all (the commands seed the demo account in it).

use std::path::Path;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use super::citus::CitusCluster;
use super::cluster::{Cluster, Durability, is_running, socket_dir, url};
use crate::db::{distribute, migrate};

/// The database the service uses inside the embedded cluster.
const DATABASE: &str = "payments";

/// Whether a process may use a cluster that another process already runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// Only `serve` owns a cluster: when it stops, the cluster stops, and a second `serve` relying
    /// on it would be left without a database. So a second one refuses to start.
    Own,
    /// Short-lived commands (`accounts`, `attention`) and workers use the running one.
    JoinRunning,
}

/// The embedded database: running and migrated. Dropping it stops the cluster if this
/// process started it.
pub struct EmbeddedDatabase {
    pub url: String,
    /// None when another process (a running `serve`) already runs the cluster.
    cluster: Option<Cluster>,
    /// The Citus nodes, when the database is spread over them (`serve --citus-workers N`).
    citus: Option<CitusCluster>,
}

impl EmbeddedDatabase {
    /// Starts the cluster under `data_dir` (or joins the one another process of ours runs there),
    /// creates the database and applies the migrations.
    pub async fn open(data_dir: &Path, sharing: Sharing) -> anyhow::Result<EmbeddedDatabase> {
        let cluster = match (is_running(data_dir), sharing) {
            (true, Sharing::JoinRunning) => None,
            (true, Sharing::Own) => anyhow::bail!(
                "another process already runs the embedded PostgreSQL under {} (a `payments serve`?); stop it, \
                 or give this one its own PAYMENTS_DATA_DIR, or use DATABASE_URL",
                data_dir.display()
            ),
            (false, _) => {
                let root = data_dir.to_owned();
                Some(tokio::task::spawn_blocking(move || Cluster::start(&root, Durability::Durable)).await??)
            }
        };
        let mut admin = AsyncPgConnection::establish(&url(data_dir, "postgres")).await?;
        let exists = diesel::sql_query(format!("SELECT FROM pg_database WHERE datname = '{DATABASE}'"))
            .execute(&mut admin)
            .await?;
        if exists == 0 {
            diesel::sql_query(format!("CREATE DATABASE {DATABASE}")).execute(&mut admin).await?;
        }
        let database_url = url(data_dir, DATABASE);
        migrate::run_pending(&database_url).await?;
        Ok(EmbeddedDatabase { url: database_url, cluster, citus: None })
    }

    /// A local Citus cluster under `data_dir/citus`, a coordinator and `workers` workers (made on
    /// first use, kept across runs), with the database on it, migrated and distributed.
    pub async fn open_citus(data_dir: &Path, workers: usize) -> anyhow::Result<EmbeddedDatabase> {
        let root = data_dir.join("citus");
        let citus =
            tokio::task::spawn_blocking(move || CitusCluster::start(&root, workers, Durability::Durable)).await??;
        let database_url = citus.database(DATABASE).await?;
        distribute::migrate_and_distribute(&database_url).await?;
        Ok(EmbeddedDatabase { url: database_url, cluster: None, citus: Some(citus) })
    }

    /// The Citus nodes, if the database is spread over them: role, port and directory.
    pub fn citus_nodes(&self) -> Vec<(&'static str, u16, std::path::PathBuf)> {
        let nodes = self.citus.iter().flat_map(|citus| citus.nodes());
        nodes.map(|(role, port, root)| (role, port, root.to_owned())).collect()
    }

    /// For `psql -h <this> -U postgres payments`.
    pub fn socket_dir(data_dir: &Path) -> std::path::PathBuf {
        socket_dir(data_dir)
    }

    /// Stops the cluster, if it is ours, and waits for it to exit.
    pub async fn stop(self) -> anyhow::Result<()> {
        if let Some(citus) = self.citus {
            tokio::task::spawn_blocking(move || citus.stop()).await??;
        }
        match self.cluster {
            Some(cluster) => tokio::task::spawn_blocking(move || cluster.stop()).await?,
            None => Ok(()),
        }
    }
}

//! Embedded mode: with no `DATABASE_URL`, a private cluster under `PAYMENTS_DATA_DIR`, migrated
//! so that the service works with no set-up at all (the commands seed the demo account in it).

use std::path::Path;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use super::cluster::{Cluster, Durability, is_running, socket_dir, url};
use super::migrate;

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
        Ok(EmbeddedDatabase { url: database_url, cluster })
    }

    /// For `psql -h <this> -U postgres payments`.
    pub fn socket_dir(data_dir: &Path) -> std::path::PathBuf {
        socket_dir(data_dir)
    }

    /// Stops the cluster, if it is ours, and waits for it to exit.
    pub async fn stop(self) -> anyhow::Result<()> {
        match self.cluster {
            Some(cluster) => tokio::task::spawn_blocking(move || cluster.stop()).await?,
            None => Ok(()),
        }
    }
}

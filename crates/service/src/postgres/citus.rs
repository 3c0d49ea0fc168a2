//! A local Citus cluster: a coordinator and workers, each a PostgreSQL cluster of its own (see
//! [`super::cluster`]) that preloads `citus` and listens on a port of its own on 127.0.0.1, where
//! the nodes reach one another. `payments serve --citus-workers N` keeps one under its data
//! directory; the tests start a throwaway one.
//!
//! A node keeps its port across restarts (in `<node>/port`): the coordinator's metadata names the
//! workers by host and port.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};

use anyhow::Context;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use super::cluster::{Cluster, Durability, server_binaries};

/// What every node runs with beyond the usual. The nodes talk in the clear on the loopback (a
/// server started by root runs as `postgres` with root's home, where libpq would look for a
/// client certificate).
const NODE_SETTINGS: [&str; 5] = [
    "shared_preload_libraries=citus,pg_stat_statements",
    // A transaction prepared on a worker (two-phase commit) that a crash left undecided holds its
    // locks until the coordinator resolves it: every second rather than every minute.
    "citus.recover_2pc_interval=1s",
    "citus.node_conninfo=sslmode=disable",
    "listen_addresses=127.0.0.1",
    // Statements counted by whether they ran on one shard or several (`citus_stat_counters`),
    // which the routing test and the benchmark read.
    "citus.enable_stat_counters=on",
];

/// The running nodes, the coordinator first.
pub struct CitusCluster {
    nodes: Vec<Node>,
    durability: Durability,
}

struct Node {
    /// None while the node is down (see [`CitusCluster::crash_worker`]).
    cluster: Option<Cluster>,
    port: u16,
    root: PathBuf,
}

/// Whether the `citus` extension is installed for the PostgreSQL server the clusters run: `Err`
/// says what is missing and how to install it.
pub fn installed() -> Result<(), String> {
    let bin = server_binaries().map_err(|error| error.to_string())?;
    // The server's own directory (`.../15/bin/postgres`, wherever a link on PATH points from),
    // whose `lib` holds its extensions' libraries.
    let server = fs::canonicalize(bin.join("postgres")).map_err(|error| error.to_string())?;
    let library = server.ancestors().nth(2).map(|version| version.join("lib/citus.so")).unwrap_or_default();
    match library.is_file() {
        true => Ok(()),
        false => Err(format!(
            "Citus is not installed ({} is missing): install the citus extension for this PostgreSQL \
             (Citus's own packages or image; on this project's build machines, `.ci/citus`)",
            library.display()
        )),
    }
}

impl CitusCluster {
    /// Starts (creating them on first use) a coordinator and `workers` workers under `root`.
    pub fn start(root: &Path, workers: usize, durability: Durability) -> anyhow::Result<CitusCluster> {
        installed().map_err(anyhow::Error::msg)?;
        let nodes = (0..=workers)
            .map(|index| {
                let root = root.join(format!("node-{index}"));
                let port = node_port(&root)?;
                let mut node = Node { cluster: None, port, root };
                node.start(durability).with_context(|| format!("starting Citus node {index}"))?;
                Ok(node)
            })
            .collect::<anyhow::Result<Vec<Node>>>()?;
        Ok(CitusCluster { nodes, durability })
    }

    /// How many workers the cluster has.
    pub fn workers(&self) -> usize {
        self.nodes.len() - 1
    }

    /// Stops worker `worker` (from 1) at once, as a crash would: what the coordinator sends it
    /// fails until it is started again ([`CitusCluster::restart_worker`]), which recovers it
    /// from its WAL.
    pub fn crash_worker(&mut self, worker: usize) -> anyhow::Result<()> {
        let node = self.nodes.get_mut(worker).filter(|_| worker > 0).context("no such worker")?;
        match node.cluster.take() {
            Some(cluster) => cluster.crash(),
            None => Ok(()),
        }
    }

    /// Starts worker `worker` again after [`CitusCluster::crash_worker`], on its port, and
    /// returns once it accepts connections.
    pub fn restart_worker(&mut self, worker: usize) -> anyhow::Result<()> {
        let durability = self.durability;
        let node = self.nodes.get_mut(worker).filter(|_| worker > 0).context("no such worker")?;
        match node.cluster {
            Some(_) => Ok(()),
            None => node.start(durability),
        }
    }

    /// Makes `database` on every node (unless it is there), with the extension, and tells the
    /// coordinator of the workers; returns the coordinator's connection string for it.
    pub async fn database(&self, database: &str) -> anyhow::Result<String> {
        for node in &self.nodes {
            let mut admin = AsyncPgConnection::establish(&node.url("postgres")).await?;
            let exists = diesel::sql_query(format!("SELECT 1 FROM pg_database WHERE datname = '{database}'"))
                .execute(&mut admin)
                .await?;
            if exists == 0 {
                diesel::sql_query(format!("CREATE DATABASE {database}")).execute(&mut admin).await?;
            }
            let mut conn = AsyncPgConnection::establish(&node.url(database)).await?;
            diesel::sql_query("CREATE EXTENSION IF NOT EXISTS citus").execute(&mut conn).await?;
        }
        let coordinator = self.nodes[0].url(database);
        let mut conn = AsyncPgConnection::establish(&coordinator).await?;
        let port = self.nodes[0].port;
        diesel::sql_query(format!("SELECT citus_set_coordinator_host('127.0.0.1', {port})")).execute(&mut conn).await?;
        for node in &self.nodes[1..] {
            // Adding a node already there changes nothing.
            diesel::sql_query(format!("SELECT citus_add_node('127.0.0.1', {})", node.port)).execute(&mut conn).await?;
        }
        Ok(coordinator)
    }

    /// Each node: its role, its port and its directory.
    pub fn nodes(&self) -> impl Iterator<Item = (&'static str, u16, &Path)> {
        self.nodes.iter().enumerate().map(|(index, node)| {
            let role = if index == 0 { "coordinator" } else { "worker" };
            (role, node.port, node.root.as_path())
        })
    }

    /// Stops every node (fast shutdown), workers first.
    pub fn stop(self) -> anyhow::Result<()> {
        for node in self.nodes.into_iter().rev() {
            if let Some(cluster) = node.cluster {
                cluster.stop()?;
            }
        }
        Ok(())
    }
}

impl Node {
    fn start(&mut self, durability: Durability) -> anyhow::Result<()> {
        let mut settings: Vec<String> = NODE_SETTINGS.iter().map(|s| (*s).to_owned()).collect();
        settings.push(format!("port={}", self.port));
        let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
        let cluster = Cluster::start_with_settings(&self.root, durability, &settings)
            .with_context(|| format!("under {}", self.root.display()))?;
        self.cluster = Some(cluster);
        Ok(())
    }

    fn url(&self, database: &str) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname={database}", self.port)
    }
}

/// The port of the node under `root`: the one it was given when it was made, or a free one now.
fn node_port(root: &Path) -> anyhow::Result<u16> {
    let file = root.join("port");
    if let Ok(port) = fs::read_to_string(&file) {
        return port.trim().parse().with_context(|| format!("{} holds no port", file.display()));
    }
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    fs::create_dir_all(root)?;
    fs::write(&file, port.to_string())?;
    Ok(port)
}

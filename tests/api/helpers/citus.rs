//! A throwaway Citus cluster per test run, started by the first test that needs it, like the
//! single-node one: a coordinator and two workers, each a PostgreSQL cluster of its own that
//! preloads `citus` and listens on a port of its own on 127.0.0.1, where the nodes reach one
//! another. Each test gets a database of its own on every node, the coordinator told of the
//! workers. Where Citus is not installed, there is none: the test says it was skipped, and why,
//! and passes (`.ci/run` installs Citus, so CI never skips).

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::LazyLock;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use payments_service::db::cluster::{Cluster, Durability, server_binaries};
use uuid::Uuid;

/// The run's nodes, the coordinator first, each with its port; or why there are none.
static NODES: LazyLock<Result<Vec<(Cluster, u16)>, String>> = LazyLock::new(start_nodes);

/// Workers besides the coordinator.
const WORKERS: usize = 2;

fn start_nodes() -> Result<Vec<(Cluster, u16)>, String> {
    let bin = server_binaries().map_err(|error| error.to_string())?;
    // The server's own directory (`.../15/bin/postgres`, wherever a link on PATH points from),
    // whose `lib` holds its extensions' libraries.
    let server = std::fs::canonicalize(bin.join("postgres")).map_err(|error| error.to_string())?;
    let library = server.ancestors().nth(2).map(|version| version.join("lib/citus.so")).unwrap_or_default();
    if !library.is_file() {
        return Err(format!(
            "Citus is not installed ({} is missing); `.ci/run` installs it from the shared citus folder",
            library.display()
        ));
    }
    let root = std::env::temp_dir().join(format!("payments-test-{}", std::process::id())).join("citus");
    (0..=WORKERS)
        .map(|node| {
            let port = free_port();
            // The nodes talk in the clear on the loopback (the server, run as `postgres` from a
            // root process, would otherwise look for a client certificate in root's home).
            let settings = [
                "shared_preload_libraries=citus".to_owned(),
                "citus.node_conninfo=sslmode=disable".into(),
                format!("port={port}"),
                "listen_addresses=127.0.0.1".into(),
            ];
            let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
            let cluster = Cluster::start_with_settings(&node_root(&root, node), Durability::Throwaway, &settings)
                .map_err(|error| format!("starting Citus node {node}: {error:#}"))?;
            Ok((cluster, port))
        })
        .collect()
}

fn node_root(root: &std::path::Path, node: usize) -> PathBuf {
    root.join(format!("node-{node}"))
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().unwrap().port()
}

fn url(port: u16, database: &str) -> String {
    format!("host=127.0.0.1 port={port} user=postgres dbname={database}")
}

async fn execute(url: &str, sql: &str) {
    let mut conn = AsyncPgConnection::establish(url).await.unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    diesel::sql_query(sql).execute(&mut conn).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// A database of one test's own on every node of the run's Citus cluster, the coordinator's
/// metadata naming the workers; nothing migrated yet.
pub struct CitusDatabase {
    /// The coordinator's: what the service connects to.
    pub url: String,
}

impl CitusDatabase {
    /// One, or `None` (after saying why the test is skipped) where Citus is not installed.
    pub async fn create(test: &str) -> Option<CitusDatabase> {
        let nodes = match &*NODES {
            Ok(nodes) => nodes,
            Err(why) => {
                // Straight to stderr, past the test harness's capture: a skip must be seen.
                let _ = writeln!(std::io::stderr(), "skipped {test}: {why}");
                return None;
            }
        };
        let name = format!("citus_{}", Uuid::new_v4().simple());
        for (_, port) in nodes {
            execute(&url(*port, "postgres"), &format!("CREATE DATABASE {name}")).await;
            execute(&url(*port, &name), "CREATE EXTENSION citus").await;
        }
        let coordinator = url(nodes[0].1, &name);
        execute(&coordinator, &format!("SELECT citus_set_coordinator_host('127.0.0.1', {})", nodes[0].1)).await;
        for (_, port) in &nodes[1..] {
            execute(&coordinator, &format!("SELECT citus_add_node('127.0.0.1', {port})")).await;
        }
        Some(CitusDatabase { url: coordinator })
    }
}

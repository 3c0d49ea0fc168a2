//! One throwaway PostgreSQL cluster per test run, a migrated template, and a fresh database per
//! test cloned from it (a file copy: a few tens of milliseconds).

use std::path::PathBuf;
use std::sync::LazyLock;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use payments_service::db::migrate;
use payments_service::postgres::cluster::{Cluster, Durability};
use uuid::Uuid;

const TEMPLATE: &str = "payments_template";

/// The run's cluster, started by the first test that needs it. It is never dropped: it stops when
/// this test process exits, however it exits (see `payments_service::postgres::cluster`).
static CLUSTER: LazyLock<Cluster> = LazyLock::new(|| {
    sweep_leftovers();
    let root = cluster_root(std::process::id());
    let cluster = Cluster::start(&root, Durability::Throwaway).expect("starting the test cluster");
    let (admin, template) = (cluster.url("postgres"), cluster.url(TEMPLATE));
    // The migrations need a runtime of their own: this runs inside some test's runtime.
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
            execute(&admin, &format!("CREATE DATABASE {TEMPLATE}")).await;
            migrate::run_pending(&template).await.expect("migrating the template");
        })
    })
    .join()
    .expect("preparing the template database");
    cluster
});

fn cluster_root(pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("payments-test-{pid}"))
}

/// Removes the directories of earlier runs (their clusters stopped when those runs ended).
fn sweep_leftovers() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("payments-test-")) else { continue };
        let alive =
            pid.parse::<i32>().is_ok_and(|pid| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok());
        if !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

async fn execute(url: &str, sql: &str) {
    let mut conn = AsyncPgConnection::establish(url).await.expect("connecting to the test cluster");
    diesel::sql_query(sql).execute(&mut conn).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// A database of one test's own, dropped with it.
pub struct TestDatabase {
    pub name: String,
    pub url: String,
    /// False for an [`alias`](TestDatabase::alias), which leaves the database to its owner.
    owned: bool,
}

impl TestDatabase {
    /// A migrated one.
    pub async fn create() -> TestDatabase {
        TestDatabase::new(&format!("TEMPLATE {TEMPLATE} STRATEGY FILE_COPY")).await
    }

    /// A migrated one whose clock runs `ahead` (an SQL interval, such as `1 hour`) of the app's, as
    /// after a failover to a host whose clock differs: its `now()` is shadowed by one that adds it.
    pub async fn with_clock_ahead(ahead: &str) -> TestDatabase {
        let database = TestDatabase::create().await;
        let shadow = format!(
            "CREATE SCHEMA clock;
             CREATE FUNCTION clock.now() RETURNS timestamptz LANGUAGE sql STABLE
                 AS 'SELECT pg_catalog.now() + interval ''{ahead}''';
             ALTER DATABASE {} SET search_path = clock, pg_catalog, public;",
            database.name
        );
        let mut conn = AsyncPgConnection::establish(&database.url).await.expect("connecting to the test database");
        conn.batch_execute(&shadow).await.unwrap();
        database
    }

    /// One with no migration applied, for tests that apply them one by one.
    pub async fn empty() -> TestDatabase {
        TestDatabase::new("").await
    }

    async fn new(options: &str) -> TestDatabase {
        let name = format!("t_{}", Uuid::new_v4().simple());
        let cluster = &*CLUSTER;
        execute(&cluster.url("postgres"), &format!("CREATE DATABASE {name} {options}")).await;
        TestDatabase { url: cluster.url(&name), name, owned: true }
    }

    /// A database elsewhere (a Citus cluster's, say), which dropping this leaves be.
    pub fn elsewhere(url: &str) -> TestDatabase {
        TestDatabase { name: String::new(), url: url.to_owned(), owned: false }
    }

    /// The same database, for another app on it; dropping the alias leaves the database be.
    pub fn alias(&self) -> TestDatabase {
        TestDatabase { name: self.name.clone(), url: self.url.clone(), owned: false }
    }

    /// The cluster's socket directory (for a TCP proxy in front of it).
    pub fn socket_path() -> PathBuf {
        payments_service::postgres::cluster::socket_dir(&cluster_root(std::process::id())).join(".s.PGSQL.5432")
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let (admin, sql) = (CLUSTER.url("postgres"), format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(execute(&admin, &sql))
        })
        .join();
    }
}

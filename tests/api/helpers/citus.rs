//! A throwaway Citus cluster per test run, started by the first test that needs it, like the
//! single-node one: a coordinator and two workers (see `payments_service::db::citus`). Each test
//! gets a database of its own on every node, the coordinator told of the workers. Where Citus is
//! not installed, there is none: the test says it was skipped, and why, and passes (`.ci/run`
//! installs Citus, so CI never skips). The tests on Citus take turns (see [`CitusTurn`]).

use std::io::Write;
use std::sync::LazyLock;

use payments_service::db::citus::{self, CitusCluster};
use payments_service::db::cluster::Durability;
use uuid::Uuid;

/// The run's cluster, or why there is none.
static CLUSTER: LazyLock<Result<CitusCluster, String>> = LazyLock::new(|| {
    citus::installed()?;
    let root = std::env::temp_dir().join(format!("payments-test-{}", std::process::id())).join("citus");
    CitusCluster::start(&root, 2, Durability::Throwaway).map_err(|error| format!("{error:#}"))
});

/// A test's turn on Citus, until it is dropped. Each test on Citus drives three servers and often
/// processes of its own, slower than on one PostgreSQL: two at once on a machine of two cores,
/// beside the other tests, make each other's statements run out of time.
pub struct CitusTurn {
    _held: tokio::sync::MutexGuard<'static, ()>,
}

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A database of one test's own on every node of the run's Citus cluster, and the test's turn;
/// nothing migrated yet.
pub struct CitusDatabase {
    /// The coordinator's: what the service connects to.
    pub url: String,
    _turn: CitusTurn,
}

impl CitusDatabase {
    /// One, or `None` (after saying why the test is skipped) where Citus is not installed.
    pub async fn create(test: &str) -> Option<CitusDatabase> {
        let turn = CitusDatabase::turn(test).await?;
        let cluster = match &*CLUSTER {
            Ok(cluster) => cluster,
            Err(why) => {
                // Straight to stderr, past the test harness's capture: a skip must be seen.
                let _ = writeln!(std::io::stderr(), "skipped {test}: {why}");
                return None;
            }
        };
        let name = format!("citus_{}", Uuid::new_v4().simple());
        let url = cluster.database(&name).await.unwrap_or_else(|error| panic!("a database on Citus: {error:#}"));
        Some(CitusDatabase { url, _turn: turn })
    }

    /// The turn of a test on Citus that needs no database of the run's cluster (it starts nodes
    /// of its own), or `None` after saying why the test is skipped.
    pub async fn turn(test: &str) -> Option<CitusTurn> {
        match citus::installed() {
            Ok(()) => Some(CitusTurn { _held: TURN.lock().await }),
            Err(why) => {
                let _ = writeln!(std::io::stderr(), "skipped {test}: {why}");
                None
            }
        }
    }
}

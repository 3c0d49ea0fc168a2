//! A throwaway Citus cluster per test run, started by the first test that needs it, like the
//! single-node one: a coordinator and two workers (see `payments_service::postgres::citus`). Each test
//! gets a database of its own on every node, the coordinator told of the workers. Where Citus is
//! not installed, or its cluster does not start, there is none: the test says it was skipped, and
//! why, and passes, so that `cargo test` runs on a machine without Citus. The tests on Citus take
//! turns (see [`CitusTurn`]).
//!
//! Two variables make the suite prove it ran on Citus; `.ci/run` sets both:
//! - [`REQUIRE_CITUS`] (`PAYMENTS_REQUIRE_CITUS=1`): a test on Citus without its cluster fails,
//!   naming why, instead of passing as skipped.
//! - [`CITUS_TESTS_RAN`] (`PAYMENTS_CITUS_TESTS_RAN=DIR`): each test that got its cluster (or its
//!   turn, for one that starts nodes of its own) leaves a file named after itself in `DIR`, which
//!   `.ci/run` counts against the tests named `on_citus_*` that the binary lists.
//!
//! A test on Citus is named `on_citus_...`: that is how `.ci/run` knows how many there are.

use std::io::Write;
use std::path::PathBuf;
use std::sync::LazyLock;

use payments_service::postgres::citus::{self, CitusCluster};
use payments_service::postgres::cluster::Durability;
use uuid::Uuid;

/// Set (to `1`), a test on Citus that cannot have its cluster fails rather than pass as skipped.
pub const REQUIRE_CITUS: &str = "PAYMENTS_REQUIRE_CITUS";

/// Set to a directory, each test that ran on Citus leaves a file named after itself there.
pub const CITUS_TESTS_RAN: &str = "PAYMENTS_CITUS_TESTS_RAN";

/// What every test on Citus is named first.
const PREFIX: &str = "on_citus_";

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
    /// One, or `None` (after saying why the test is skipped) where Citus is not installed or the
    /// run's cluster did not start.
    pub async fn create(test: &str) -> Option<CitusDatabase> {
        let turn = take_turn(test).await?;
        let cluster = match &*CLUSTER {
            Ok(cluster) => cluster,
            Err(why) => return skipped(test, &format!("the Citus cluster did not start: {why}")),
        };
        ran(test);
        let name = format!("citus_{}", Uuid::new_v4().simple());
        let url = cluster.database(&name).await.unwrap_or_else(|error| panic!("a database on Citus: {error:#}"));
        Some(CitusDatabase { url, _turn: turn })
    }

    /// The turn of a test on Citus that needs no database of the run's cluster (it starts nodes
    /// of its own), or `None` after saying why the test is skipped.
    pub async fn turn(test: &str) -> Option<CitusTurn> {
        let turn = take_turn(test).await?;
        ran(test);
        Some(turn)
    }
}

/// The test's turn on Citus, or `None` (see [`skipped`]) where Citus is not installed.
async fn take_turn(test: &str) -> Option<CitusTurn> {
    match citus::installed() {
        Ok(()) => Some(CitusTurn { _held: TURN.lock().await }),
        Err(why) => skipped(test, &why),
    }
}

/// `None`, after saying why `test` is skipped; or, where Citus is required, a failure saying why.
fn skipped<T>(test: &str, why: &str) -> Option<T> {
    if std::env::var(REQUIRE_CITUS).is_ok_and(|required| required == "1") {
        panic!("{test} cannot run on Citus, and {REQUIRE_CITUS}=1 requires it to: {why}");
    }
    // Straight to stderr, past the test harness's capture: a skip must be seen.
    let _ = writeln!(std::io::stderr(), "skipped {test}: {why}");
    None
}

/// Leaves the running test's mark in [`CITUS_TESTS_RAN`], if set: a file named after the test
/// (the harness names each test's thread after it; `test` where it does not), which must be
/// named [`PREFIX`]`...` to be counted.
fn ran(test: &str) {
    let Some(dir) = std::env::var_os(CITUS_TESTS_RAN) else { return };
    let thread = std::thread::current();
    let name = thread.name().filter(|name| *name != "main").unwrap_or(test);
    let name = name.rsplit("::").next().unwrap_or(name);
    assert!(
        name.starts_with(PREFIX),
        "{name} runs on Citus, so its name starts with {PREFIX} (.ci/run counts them so)"
    );
    std::fs::write(PathBuf::from(dir).join(name), "")
        .unwrap_or_else(|error| panic!("marking {name} as run in {CITUS_TESTS_RAN}: {error}"));
}

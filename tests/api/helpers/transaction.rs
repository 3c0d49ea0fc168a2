//! A transaction a test holds open, and whether another session waits for the locks it holds.

use std::time::Duration;

use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use super::TestApp;

/// A session of the test's own, in a transaction it commits when it chooses.
pub struct OpenTransaction {
    conn: AsyncPgConnection,
    /// Its backend's process id: what `pg_blocking_pids` names.
    pid: i32,
    url: String,
}

impl OpenTransaction {
    /// Begins one on the database at `url`.
    pub async fn begin(url: &str) -> OpenTransaction {
        #[derive(QueryableByName)]
        struct Backend {
            #[diesel(sql_type = diesel::sql_types::Integer)]
            pid: i32,
        }
        let mut conn = AsyncPgConnection::establish(url).await.expect("connecting to the test database");
        let Backend { pid } = diesel::sql_query("SELECT pg_backend_pid() AS pid").get_result(&mut conn).await.unwrap();
        diesel::sql_query("BEGIN").execute(&mut conn).await.unwrap();
        OpenTransaction { conn, pid, url: url.to_owned() }
    }

    /// Runs `sql` in it.
    pub async fn run(&mut self, sql: &str) {
        diesel::sql_query(sql).execute(&mut self.conn).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Its connection, to run a statement of the service's own in it.
    pub fn connection(&mut self) -> &mut AsyncPgConnection {
        &mut self.conn
    }

    /// Whether another session waits for a lock this transaction holds (`pg_blocking_pids`). Not
    /// just any lock wait in the cluster: other tests make those on purpose.
    pub async fn is_waited_for(&self) -> bool {
        let mut watcher = AsyncPgConnection::establish(&self.url).await.expect("connecting to the test database");
        let blocked =
            format!("SELECT count(*) > 0 FROM pg_stat_activity WHERE {} = ANY(pg_blocking_pids(pid))", self.pid);
        TestApp::database_says_on(&mut watcher, &blocked).await
    }

    /// Waits until another session waits for a lock this transaction holds, watched from inside
    /// this transaction's own session (see [`OpenTransaction::commit_once_waited_for`]); `Err`
    /// if none does within `within`.
    pub async fn wait_until_waited_for(&mut self, within: Duration) -> Result<(), String> {
        self.conn.batch_execute(&waited_for_within(within)).await.map_err(|error| error.to_string())
    }

    /// Commits as soon as another session waits for a lock this transaction holds; `Err` (and
    /// nothing committed) if none does within `within`.
    ///
    /// The service's statements wait for a lock at most `db::LOCK_TIMEOUT` (a second), so the
    /// commit must come well inside that, however loaded the machine. The server itself watches
    /// for the waiter (`pg_blocking_pids`, every millisecond) and commits in the same round trip:
    /// no connection per look, no poll interval of the test's, no round trip between seeing the
    /// waiter and committing.
    pub async fn commit_once_waited_for(mut self, within: Duration) -> Result<(), String> {
        let sql = format!("{}; COMMIT", waited_for_within(within));
        self.conn.batch_execute(&sql).await.map_err(|error| error.to_string())
    }

    pub async fn commit(mut self) {
        self.run("COMMIT").await;
    }

    pub async fn rollback(mut self) {
        self.run("ROLLBACK").await;
    }
}

/// A statement that ends once another session waits for a lock this session holds, or fails once
/// none has within `within`.
fn waited_for_within(within: Duration) -> String {
    let ms = within.as_millis();
    format!(
        "DO $$
         DECLARE
             deadline timestamptz := clock_timestamp() + interval '{ms} milliseconds';
         BEGIN
             WHILE NOT EXISTS (SELECT FROM pg_locks WHERE NOT granted AND pg_backend_pid() = ANY (pg_blocking_pids(pid)))
             LOOP
                 IF clock_timestamp() > deadline THEN
                     RAISE EXCEPTION 'no session waited for a lock of this transaction within {ms} ms';
                 END IF;
                 PERFORM pg_sleep(0.001);
             END LOOP;
         END
         $$"
    )
}

//! A transaction a test holds open, and whether another session waits for the locks it holds.

use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

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

    pub async fn commit(mut self) {
        self.run("COMMIT").await;
    }
}

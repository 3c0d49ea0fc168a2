//! The planner's statistics of the tables the request path probes, kept up with their growth
//! while they are young.
//!
//! Each connection prepares a statement once and, from its sixth run on, keeps one generic plan
//! for it, until the statistics of a table it reads change. Every table the request path probes
//! has several indexes that start with `account_id` (a primary key on `(account_id, id)`, unique
//! keys on `(account_id, <a key>)`, the listing's `(account_id, created_seq)`), and which of them
//! answers `account_id = $1 AND id = $2` is decided by the statistics. With none (a table never
//! analyzed), or those of an empty table (one analyzed at migration), the planner takes each
//! account for a single row: every index that starts with `account_id` then costs the same, and
//! it takes the newest, which for a probe by id or by key is the wrong one. Once the table grows,
//! every probe reads all of the account's rows through that index. Autovacuum analyzes the table
//! in the end, after its first 50 changes, but it looks at a database only once a minute
//! (`autovacuum_naptime`): a fresh deployment ran slow for its first minute or so, whenever its
//! connections happened to make their plans while the tables were small (docs/performance.md).
//!
//! So the workers analyze a probed table once, as soon as it holds [`MIN_ROWS`] rows while its
//! statistics were taken from fewer (or never): in the first second or so of a fresh database,
//! and at once in one restored without statistics. (Once more only if a `VACUUM` finds it below
//! that again, emptied, and it then grows back.) Statistics taken from real rows tell the
//! planner how many rows an account has, relative to the table: as the table grows, the planner
//! scales them by its size, so the plans made again from them stay right. After that, autovacuum
//! keeps them up to date. (Analyzing again at each doubling would only make every connection plan
//! its statements again, a few more times, for nothing.)
//!
//! An `ANALYZE` of the migrations' empty tables would not do: a plan made while a table holds a
//! few pages and its statistics say empty reads it sequentially, and keeps doing so as it grows.

use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Bool, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use super::StoreError;

/// The tables the request path probes by account and a key: their statistics pick the index.
/// (The outbox is a queue, whose statistics are stale by nature; its lease does not rely on them.)
pub const PROBED: [&str; 3] = ["idempotency_keys", "payments", "refunds"];

/// Rows a table holds before it counts as grown: below that, whichever index the planner picks,
/// the table is too small for it to matter.
pub const MIN_ROWS: i64 = 100;

/// How long one `ANALYZE` may take (the service's connections stop any statement after 2 s). A
/// young table takes milliseconds; a large one restored without statistics, a few seconds.
const ANALYZE_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(QueryableByName)]
struct Grown {
    #[diesel(sql_type = Text)]
    table_name: String,
}

#[derive(QueryableByName)]
struct Taken {
    #[diesel(sql_type = Bool)]
    taken: bool,
}

/// The [`PROBED`] tables that hold [`MIN_ROWS`] rows (by the live rows the statistics collector
/// counts) but whose statistics were taken from fewer, among those this role has the owner's
/// rights on: `USAGE`, not `MEMBER`, since `ANALYZE` needs the owner's privileges, which a member
/// that does not inherit them lacks (it would be skipped with a warning, run after run). The
/// others are left to autovacuum.
pub async fn grown_tables(conn: &mut AsyncPgConnection) -> Result<Vec<String>, StoreError> {
    let grown: Vec<Grown> = super::query(
        diesel::sql_query(
            "SELECT t.name AS table_name
             FROM unnest($1::text[]) AS t (name)
             JOIN pg_stat_user_tables s ON s.relid = to_regclass(t.name)
             JOIN pg_class c ON c.oid = s.relid
             WHERE s.n_live_tup >= $2 AND c.reltuples < $2
               AND pg_has_role(c.relowner, 'USAGE')",
        )
        .bind::<Array<Text>, _>(&PROBED[..])
        .bind::<BigInt, _>(MIN_ROWS)
        .load(conn),
    )
    .await?;
    Ok(grown.into_iter().map(|grown| grown.table_name).collect())
}

/// Analyzes the [`grown_tables`], and returns the names of those it analyzed. One that another
/// session holds a conflicting lock on (another process's `ANALYZE`, a `VACUUM`, an index built
/// concurrently) is skipped, and not reported: `ANALYZE (SKIP_LOCKED)` only warns of it, so
/// whether statistics were taken is read back from them, and the next run tries again.
pub async fn analyze_grown_tables(conn: &mut AsyncPgConnection) -> Result<Vec<String>, StoreError> {
    let grown = grown_tables(conn).await?;
    let mut analyzed = Vec::new();
    for table_name in grown {
        // Only names from `PROBED` get here. Within a transaction, so that the longer statement
        // timeout lasts for this statement only. `ANALYZE` writes the row count in place, so the
        // transaction's next statement reads it.
        let timeout = format!("SET LOCAL statement_timeout = {}", ANALYZE_TIMEOUT.as_millis());
        let analyze = format!("ANALYZE (SKIP_LOCKED) {table_name}");
        let taken = conn
            .transaction(async |conn| -> Result<bool, diesel::result::Error> {
                diesel::sql_query(&timeout).execute(conn).await?;
                diesel::sql_query(&analyze).execute(conn).await?;
                let taken =
                    diesel::sql_query("SELECT reltuples >= $2 AS taken FROM pg_class WHERE oid = to_regclass($1)")
                        .bind::<Text, _>(&table_name)
                        .bind::<BigInt, _>(MIN_ROWS)
                        .get_result::<Taken>(conn)
                        .await?;
                Ok(taken.taken)
            })
            .await?;
        if taken {
            analyzed.push(table_name);
        }
    }
    Ok(analyzed)
}

//! Spreading the schema over a Citus cluster: every table by `account_id`, colocated, so that an
//! account's rows of every table live on one node, and the tables without an account of their own
//! as reference tables, copied to every node.
//!
//! Citus distributes a table only if every foreign key it has is one Citus allows once both ends
//! are in place: from a distributed table to a reference table, or between colocated tables by a
//! key that includes the distribution column. Ours are all of those kinds, but not while the tables
//! are being converted one by one (a foreign key from a plain table to a reference table makes
//! Citus turn it into a "Citus local" table first, which it then refuses to distribute when it has
//! an identity column). So, in one transaction: the foreign keys of the tables still to convert
//! are dropped, the tables converted, and the foreign keys added back as they were. Tables
//! already distributed are left as they are, so running it again changes nothing, and a table a
//! later migration adds is distributed the next time.
//!
//! Last, the function the claim and the phases are delegated through (see [`super::delegate`])
//! is made and distributed by its account argument, colocated with the tables.

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use super::delegate;

/// The tables copied to every node: `accounts`, which every table's foreign key names, and the
/// events nobody could read, which may belong to no account.
const REFERENCE_TABLES: [&str; 2] = ["accounts", "unreadable_gateway_events"];

/// The table every distributed table is colocated with.
pub(super) const COLOCATED_WITH: &str = "idempotency_keys";

/// Why the schema could not be distributed.
#[derive(Debug, thiserror::Error)]
pub enum DistributeError {
    #[error(
        "the database has no `citus` extension: run `CREATE EXTENSION citus` in it (on a server that preloads \
         citus: shared_preload_libraries = 'citus') and add its worker nodes first; nothing was changed"
    )]
    NoCitus,
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// What was distributed now: (table, how), in order.
pub type Distributed = Vec<(String, &'static str)>;

#[derive(QueryableByName)]
struct Name {
    #[diesel(sql_type = Text)]
    name: String,
}

#[derive(QueryableByName)]
struct ForeignKey {
    #[diesel(sql_type = Text)]
    table_name: String,
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    definition: String,
}

/// Applies the migrations, then distributes what is not distributed yet (see [`distribute`]):
/// `payments migrate --distribute`, and any process started with `PAYMENTS_DISTRIBUTE=1`. A
/// database without Citus is refused before any migration runs.
pub async fn migrate_and_distribute(database_url: &str) -> anyhow::Result<Distributed> {
    let mut conn = AsyncPgConnection::establish(database_url).await?;
    if !has_citus(&mut conn).await? {
        return Err(DistributeError::NoCitus.into());
    }
    super::migrate::run_pending(database_url).await?;
    Ok(distribute(&mut conn).await?)
}

/// Whether the database has the `citus` extension: checked before anything is changed.
pub async fn has_citus(conn: &mut AsyncPgConnection) -> Result<bool, diesel::result::Error> {
    let found = diesel::sql_query("SELECT extname AS name FROM pg_extension WHERE extname = 'citus'")
        .load::<Name>(conn)
        .await?;
    Ok(!found.is_empty())
}

/// Distributes every table of the schema not yet in Citus's metadata; returns what it did.
pub async fn distribute(conn: &mut AsyncPgConnection) -> Result<Distributed, DistributeError> {
    if !has_citus(conn).await? {
        return Err(DistributeError::NoCitus);
    }
    conn.transaction::<_, DistributeError, _>(async |conn| {
        // Several tables are converted in one transaction: Citus must then use one connection
        // per node for all of it.
        conn.batch_execute("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'").await?;
        // The schema's tables that Citus does not hold yet (the migrations' own bookkeeping
        // stays on the coordinator).
        let pending: Vec<String> = diesel::sql_query(
            "SELECT c.relname AS name FROM pg_class c
                 WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'
                   AND c.relname <> '__diesel_schema_migrations'
                   AND NOT EXISTS (SELECT FROM pg_dist_partition p WHERE p.logicalrelid = c.oid)
                 ORDER BY c.relname",
        )
        .load::<Name>(conn)
        .await?
        .into_iter()
        .map(|table| table.name)
        .collect();
        let mut distributed = Vec::new();
        if !pending.is_empty() {
            distributed = distribute_tables(conn, &pending).await?;
        }
        // Made again each time, so that a cluster distributed by an older version runs this one's.
        conn.batch_execute(&delegate::create_function()).await?;
        if !is_distributed_function(conn).await? {
            diesel::sql_query(
                "SELECT create_distributed_function($1::regprocedure, 'account_id', colocate_with => $2)",
            )
            .bind::<Text, _>(delegate::FUNCTION)
            .bind::<Text, _>(COLOCATED_WITH)
            .execute(conn)
            .await?;
            distributed.push((delegate::FUNCTION.to_owned(), "a function, by account_id"));
        }
        Ok(distributed)
    })
    .await
}

/// Whether [`delegate::FUNCTION`] is in Citus's metadata, delegated by its account.
async fn is_distributed_function(conn: &mut AsyncPgConnection) -> Result<bool, diesel::result::Error> {
    let found = diesel::sql_query(
        "SELECT 'delegated' AS name FROM pg_dist_object
             WHERE classid = 'pg_proc'::regclass AND objid = to_regprocedure($1) AND distribution_argument_index = 0",
    )
    .bind::<Text, _>(delegate::FUNCTION)
    .load::<Name>(conn)
    .await?;
    Ok(!found.is_empty())
}

/// Converts `pending`, within the caller's transaction: see the module's documentation.
async fn distribute_tables(conn: &mut AsyncPgConnection, pending: &[String]) -> Result<Distributed, DistributeError> {
    // Every foreign key from or to a table still to convert, as it is defined now.
    let foreign_keys: Vec<ForeignKey> = diesel::sql_query(
        "SELECT conrelid::regclass::text AS table_name, conname AS name,
                        pg_get_constraintdef(oid) AS definition
                 FROM pg_constraint
                 WHERE contype = 'f' AND connamespace = 'public'::regnamespace
                   AND (conrelid::regclass::text = ANY($1) OR confrelid::regclass::text = ANY($1))
                 ORDER BY conrelid::regclass::text, conname",
    )
    .bind::<diesel::sql_types::Array<Text>, _>(pending)
    .load(conn)
    .await?;
    for key in &foreign_keys {
        let drop = format!("ALTER TABLE {} DROP CONSTRAINT {}", quoted(&key.table_name), quoted(&key.name));
        conn.batch_execute(&drop).await?;
    }
    let mut distributed = Vec::new();
    let (reference, by_account): (Vec<&String>, Vec<&String>) =
        pending.iter().partition(|table| REFERENCE_TABLES.contains(&table.as_str()));
    for table in reference {
        diesel::sql_query("SELECT create_reference_table($1)").bind::<Text, _>(table).execute(conn).await?;
        distributed.push((table.clone(), "reference"));
    }
    // The table the others are colocated with goes first, wherever it sorts.
    let mut by_account = by_account;
    by_account.sort_by_key(|table| table.as_str() != COLOCATED_WITH);
    for table in by_account {
        let colocate = if table == COLOCATED_WITH { "default" } else { COLOCATED_WITH };
        diesel::sql_query("SELECT create_distributed_table($1, 'account_id', colocate_with => $2)")
            .bind::<Text, _>(table)
            .bind::<Text, _>(colocate)
            .execute(conn)
            .await?;
        distributed.push((table.clone(), "by account_id"));
    }
    for key in &foreign_keys {
        let add =
            format!("ALTER TABLE {} ADD CONSTRAINT {} {}", quoted(&key.table_name), quoted(&key.name), key.definition);
        conn.batch_execute(&add).await?;
    }
    Ok(distributed)
}

/// An identifier, quoted for SQL.
fn quoted(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

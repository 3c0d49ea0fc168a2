//! Spreading the schema over a Citus cluster: every table by `account_id`, colocated, so that an
//! account's rows of every table live on one node, and the tables without an account of their own
//! as reference tables, copied to every node. Each table is declared in one of two lists
//! ([`BY_ACCOUNT`], [`REFERENCE_TABLES`]); a table in neither is refused before anything changes.
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
//! is made and distributed by its account argument, colocated with the tables, and every shard
//! given the identity defaults that function's statements rely on.

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use super::delegate;
use super::tables::{BY_ACCOUNT, COLOCATED_WITH, REFERENCE_TABLES};

/// Why the schema could not be distributed.
#[derive(Debug, thiserror::Error)]
pub enum DistributeError {
    #[error(
        "the database has no `citus` extension: run `CREATE EXTENSION citus` in it (on a server that preloads \
         citus: shared_preload_libraries = 'citus') and add its worker nodes first; nothing was changed"
    )]
    NoCitus,
    #[error(
        "the table `{0}` is in neither list of db/tables.rs: add it to `BY_ACCOUNT` (and mark it in the \
         statements that run under a key) or to `REFERENCE_TABLES`; nothing was distributed"
    )]
    Undeclared(String),
    #[error("a shard could not be given its identity defaults: {0}")]
    ShardDefaults(String),
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
    let distributed = conn
        .transaction::<_, DistributeError, _>(async |conn| {
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
            conn.batch_execute(&delegate::create_defaults_function()).await?;
            if !in_citus_metadata(conn, delegate::DEFAULTS_FUNCTION, false).await? {
                // Made on every node, called where it is.
                diesel::sql_query("SELECT create_distributed_function($1::regprocedure)")
                    .bind::<Text, _>(delegate::DEFAULTS_FUNCTION)
                    .execute(conn)
                    .await?;
                distributed.push((delegate::DEFAULTS_FUNCTION.to_owned(), "a function, on every node"));
            }
            conn.batch_execute(&delegate::create_function(COLOCATED_WITH)).await?;
            if !in_citus_metadata(conn, delegate::FUNCTION, true).await? {
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
        .await?;
    give_shards_identity_defaults(conn).await?;
    Ok(distributed)
}

/// Has every shard of a table with identity columns given its defaults where it is (see
/// [`delegate::create_defaults_function`]), so that no request waits for one to be read whole.
/// Run on each node apart from this transaction, so after it: each shard must be there.
async fn give_shards_identity_defaults(conn: &mut AsyncPgConnection) -> Result<(), DistributeError> {
    let failed: Vec<Name> = diesel::sql_query(
        "SELECT p.logicalrelid::text || ' shard ' || r.shardid || ': ' || r.result AS name
         FROM pg_dist_partition p,
              run_command_on_shards(p.logicalrelid,
                                    format('SELECT give_shard_identity_defaults(%L, ''%%s'')', p.logicalrelid)) r
         WHERE p.partmethod = 'h' AND NOT r.success
           AND EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = p.logicalrelid AND a.attidentity <> '')",
    )
    .load(conn)
    .await?;
    match failed.into_iter().next() {
        None => Ok(()),
        Some(failure) => Err(DistributeError::ShardDefaults(failure.name)),
    }
}

/// Whether `function` (by its signature) is in Citus's metadata, so made on every node, and if
/// `by_account`, delegated by its first argument. (Citus records a function it made on every node
/// by itself, by no argument.)
async fn in_citus_metadata(
    conn: &mut AsyncPgConnection,
    function: &str,
    by_account: bool,
) -> Result<bool, diesel::result::Error> {
    let found = diesel::sql_query(
        "SELECT 'distributed' AS name FROM pg_dist_object
             WHERE classid = 'pg_proc'::regclass AND objid = to_regprocedure($1)
               AND (NOT $2 OR distribution_argument_index = 0)",
    )
    .bind::<Text, _>(function)
    .bind::<diesel::sql_types::Bool, _>(by_account)
    .load::<Name>(conn)
    .await?;
    Ok(!found.is_empty())
}

/// Converts `pending`, within the caller's transaction: see the module's documentation.
async fn distribute_tables(conn: &mut AsyncPgConnection, pending: &[String]) -> Result<Distributed, DistributeError> {
    let declared = |table: &String| REFERENCE_TABLES.contains(&table.as_str()) || BY_ACCOUNT.contains(&table.as_str());
    if let Some(table) = pending.iter().find(|table| !declared(table)) {
        return Err(DistributeError::Undeclared(table.clone()));
    }
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

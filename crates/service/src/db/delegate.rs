//! On Citus, the statements that write under a key (the claim and every phase) are handed whole to
//! the node that holds the account's rows, and run there as on one PostgreSQL: one round trip
//! and one commit on one node, as one PostgreSQL takes.
//!
//! Citus sends a statement to one shard in one piece only if it can plan it whole there, and it
//! cannot plan an `INSERT` inside a CTE that way: it runs each such CTE as a step of its own, a
//! round trip each, sends what an `INSERT ... SELECT` reads to every node, and commits over all
//! of them. Every phase is such a statement. So on a distributed database they go through
//! `run_on_shard(account_id, statement, parameters)`, a function Citus distributes by its first
//! argument, colocated with the tables (see [`super::distribute`]): the coordinator passes the
//! call to the worker that holds that account's shards, and the function runs the statement there
//! against those shards by their own names (see [`create_function`]), which Citus does not plan.
//!
//! The statement is the text that runs on one PostgreSQL, each placeholder `$k` read from the
//! array instead (`($1[k])::type`), and its values sent as text. Nothing here reads the SQL to
//! find its tables: each statement declares the distributed tables it names where it names them
//! (`{payments}`, `{payments p}`), which the walker writes as `public.payments AS payments` and
//! `public.payments AS p` (see [`super::sql`]), and [`FUNCTION`] replaces exactly that text,
//! `public.<table> AS `, by the account's shard, the alias kept. Every marked table thus carries
//! an alias, and a column named by its table (`payments.amount`) still finds it. A distributed
//! table named without its marker would be planned by Citus again; a test on one PostgreSQL
//! finds any (`tests/api/routing.rs`).
//!
//! What a statement returns is named by the columns PostgreSQL describes for it: asked once per
//! statement and process, on a connection of the [`Routing`]'s own, so that the pool's
//! connections send exactly what they send on one node.
//!
//! The call goes straight to the account's node, on a connection of the service's own to it, where
//! the process can reach it (see [`super::nodes`]); otherwise to the coordinator, which passes it
//! on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as SyncMutex};

use diesel::QueryableByName;
use diesel::pg::{FailedToLookupTypeError, Pg, PgMetadataCacheKey, PgMetadataLookup, PgQueryBuilder, PgTypeMetadata};
use diesel::query_builder::bind_collector::RawBytesBindCollector;
use diesel::query_builder::{AstPass, Query, QueryBuilder, QueryFragment, QueryId};
use diesel::result::{DatabaseErrorKind, Error as DieselError, QueryResult};
use diesel::sql_types::{Array, Nullable, Text, Untyped, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use tokio::sync::{Mutex, OnceCell};
use tokio_postgres::types::Type;
use uuid::Uuid;

use super::nodes::{Node, Nodes, PLACEMENT_SQL};
use super::sql::{marked_prefix, split_result};
use super::tables::COLOCATED_WITH;
use super::{Pool, PooledConnection, discard};
use crate::runtime::ProcessRuntime;

/// The function a statement is delegated through, by its signature.
pub const FUNCTION: &str = "run_on_shard(uuid, text, text[])";

/// Makes [`FUNCTION`]: it runs `statement` with `parameters` as its one parameter, where it is
/// called, against that node's own shards of the account. `account_id` chooses the node: Citus
/// passes the call to the one that holds the account's shards (the function is colocated with
/// `colocated_with`). There, each marked table in the statement (`public.<table> AS `, see
/// [`super::sql`]) becomes the table's shard for the account, its alias kept, so that PostgreSQL
/// runs the statement as it would on one node, whole, and it commits on that node alone: Citus
/// would otherwise plan it again, step by step, and commit over every node.
///
/// What Citus does for its own writes to a shard, the function does first: it takes each shard's
/// metadata lock (which a shard move takes exclusively while it stops writes), and then refuses,
/// as a serialization failure that the caller runs again, a shard that is not on this node (it
/// moved since the call was routed). Run on the coordinator, where Citus did not pass the call on
/// (to a node whose metadata is not synced, or within a transaction block), it refuses at once and
/// says why. It waits for a row lock no longer than the pool's connections do (Citus does not
/// pass a session's settings on to the node). It runs with its caller's rights.
///
/// The statement runs as a statement prepared in the session, named after its text and its shard
/// tables, so that PostgreSQL plans it once per connection, as it does on one node, and not at
/// every call; the shards are found, locked and checked in three queries whatever the number of
/// tables.
///
/// A shard has no defaults for its table's identity columns (Citus fills them in where it plans
/// an insert); the function gives them to it first where it has none (see
/// [`create_defaults_function`]).
pub fn create_function(colocated_with: &str) -> String {
    format!(
        "CREATE OR REPLACE FUNCTION run_on_shard(account_id uuid, statement text, parameters text[])
         RETURNS SETOF record LANGUAGE plpgsql
         SET lock_timeout = {lock_timeout} SET citus.enable_manual_changes_to_shards = on AS $$
         DECLARE
             tables regclass[];
             shards bigint[];
             shard_tables text[];
             elsewhere bigint;
             prepared text;
         BEGIN
             -- The account's shard of each table the statement names.
             SELECT array_agg(p.logicalrelid), array_agg(get_shard_id_for_distribution_column(p.logicalrelid, account_id))
             INTO tables, shards
             FROM pg_dist_partition p
             WHERE p.colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = '{anchor}'::regclass)
               AND position(format('{prefix}', p.logicalrelid::text) IN statement) > 0;
             PERFORM lock_shard_metadata(5, shards);
             SELECT shard INTO elsewhere FROM unnest(shards) AS shard
             WHERE NOT EXISTS (SELECT FROM pg_dist_placement
                               WHERE shardid = shard AND groupid = (SELECT groupid FROM pg_dist_local_group))
             LIMIT 1;
             IF elsewhere IS NOT NULL THEN
                 IF (SELECT groupid FROM pg_dist_local_group) = 0 THEN
                     RAISE EXCEPTION 'run_on_shard ran on the coordinator, not on the node of shard %', elsewhere
                         USING ERRCODE = 'object_not_in_prerequisite_state',
                               HINT = 'Citus passes a call on only outside a transaction block, to a node whose metadata is synced';
                 END IF;
                 RAISE EXCEPTION 'the shard % is not on this node', elsewhere USING ERRCODE = 'serialization_failure';
             END IF;
             FOR i IN 1 .. coalesce(array_length(tables, 1), 0) LOOP
                 shard_tables[i] := shard_name(tables[i], shards[i]);
                 statement := replace(statement, format('{prefix}', tables[i]::text), shard_tables[i] || ' AS ');
             END LOOP;
             -- Prepared once per text, shard tables and session, as the statement is on one
             -- PostgreSQL: a text run by EXECUTE is parsed and planned at every call. The name
             -- counts the shard tables as they are now (a shard that left and came back is
             -- another table). Before a session first runs it, the shards get their identity
             -- defaults; a setting of the session says it is done, and, unlike the prepared
             -- statement, it is undone with the transaction that did it.
             prepared := 'run_on_shard_' || md5(statement || array_to_string(shard_tables::regclass[]::oid[], ','));
             IF current_setting('run_on_shard.' || prepared, true) IS DISTINCT FROM 'ready' THEN
                 FOR i IN 1 .. coalesce(array_length(tables, 1), 0) LOOP
                     PERFORM give_shard_identity_defaults(tables[i], shard_tables[i]);
                 END LOOP;
                 IF NOT EXISTS (SELECT FROM pg_prepared_statements WHERE name = prepared) THEN
                     EXECUTE format('PREPARE %I (text[]) AS %s', prepared, statement);
                 END IF;
                 PERFORM set_config('run_on_shard.' || prepared, 'ready', false);
             END IF;
             RETURN QUERY EXECUTE format('EXECUTE %I (%L)', prepared, parameters);
         END
         $$",
        lock_timeout = super::LOCK_TIMEOUT.as_millis(),
        anchor = colocated_with,
        prefix = marked_prefix("%s"),
    )
}

/// The function that gives a shard its identity defaults, by its signature.
pub const DEFAULTS_FUNCTION: &str = "give_shard_identity_defaults(regclass, text)";

/// Makes [`DEFAULTS_FUNCTION`]: it gives each identity column of `shard_table`, a shard of
/// `table_name` on this node, that has no default the node's sequence for the column plus an
/// offset that puts every value it hands out above those already in the shard. Each node hands
/// out a range of its own, the coordinator the lowest: a shard that moved to a node of a lower
/// range keeps its order (a payment's `created_seq`, by which an account's payments list newest
/// first). Finding the highest value reads the whole shard: [`super::distribute`] has every
/// shard's defaults made where it is, and a shard that moves gets them at its first write on its
/// new node (or from `distribute` run again).
pub fn create_defaults_function() -> String {
    "CREATE OR REPLACE FUNCTION give_shard_identity_defaults(table_name regclass, shard_table text)
     RETURNS void LANGUAGE plpgsql SET citus.enable_manual_changes_to_shards = on AS $$
     DECLARE
         identity record;
         highest bigint;
         handed_out bigint;
     BEGIN
         FOR identity IN
             SELECT a.attname, pg_get_serial_sequence(table_name::text, a.attname) AS sequence
             FROM pg_attribute a
             WHERE a.attrelid = table_name AND a.attidentity <> ''
               AND NOT EXISTS (SELECT FROM pg_attrdef d JOIN pg_attribute s
                                   ON s.attrelid = d.adrelid AND s.attnum = d.adnum
                               WHERE d.adrelid = shard_table::regclass AND s.attname = a.attname)
         LOOP
             -- Once per shard and node: whoever waited here finds the default made.
             PERFORM pg_advisory_xact_lock(shard_table::regclass::oid::bigint);
             CONTINUE WHEN EXISTS (SELECT FROM pg_attrdef d JOIN pg_attribute s
                                       ON s.attrelid = d.adrelid AND s.attnum = d.adnum
                                   WHERE d.adrelid = shard_table::regclass AND s.attname = identity.attname);
             EXECUTE format('SELECT coalesce(max(%I), 0) FROM %s', identity.attname, shard_table) INTO highest;
             EXECUTE format('SELECT last_value FROM %s', identity.sequence) INTO handed_out;
             EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET DEFAULT nextval(%L) + %s',
                            shard_table, identity.attname, identity.sequence, greatest(0, highest - handed_out + 1));
         END LOOP;
     END
     $$"
    .to_owned()
}

/// A statement as it is delegated, the same for every run of it: the text [`FUNCTION`] runs, and
/// the column definition list (`"name" type, ...`) of what it returns.
struct Shape {
    statement: String,
    columns: String,
}

/// How the statements that write under a key reach the database: as they are (one PostgreSQL),
/// or delegated to the account's shard (a database distributed by `payments migrate
/// --distribute`, which made [`FUNCTION`]). Which, it finds out once, at its first statement.
pub struct Routing {
    database_url: String,
    runtime: ProcessRuntime,
    /// Whether statements are delegated, found out once.
    delegates: OnceCell<bool>,
    /// The connection statements are described on, opened when first needed.
    describer: Mutex<Option<tokio_postgres::Client>>,
    /// Each statement's [`Shape`], by its text.
    shapes: SyncMutex<HashMap<String, Arc<Shape>>>,
    /// The connections straight to the nodes, and where each account's shards are; none where
    /// the URL does not parse.
    nodes: Option<Nodes>,
}

impl Routing {
    /// The routing of a process whose pool of `pool_size` connects to `database_url`; on Citus,
    /// each node it reaches straight has a pool of that size too. Made on the process's runtime,
    /// which drives its describing connection (see [`crate::runtime`]).
    pub fn new(database_url: &str, pool_size: u32) -> Routing {
        Routing {
            database_url: database_url.to_owned(),
            runtime: ProcessRuntime::current(),
            delegates: OnceCell::new(),
            describer: Mutex::new(None),
            shapes: SyncMutex::new(HashMap::new()),
            nodes: Nodes::new(database_url, pool_size, ProcessRuntime::current()),
        }
    }

    /// This routing with every call sent through the coordinator, none straight to a node
    /// (`PAYMENTS_CITUS_STRAIGHT_TO_WORKERS=false`).
    pub fn through_coordinator(mut self) -> Routing {
        self.nodes = None;
        self
    }

    /// `statement`, which reads and writes only rows of `account_id`, as a call delegated to the
    /// account's shard; none where statements run as they are.
    pub async fn delegate<Q: QueryFragment<Pg>>(
        &self,
        account_id: Uuid,
        statement: &Q,
    ) -> QueryResult<Option<Delegated>> {
        // Boxed: they are awaited inside every phase's future, which would grow too deep.
        if !Box::pin(self.delegates()).await? {
            return Ok(None);
        }
        let Rendered { sql, types, parameters } = Rendered::of(statement)?;
        let shape = Box::pin(self.shape_of(&sql, &types)).await?;
        let node = Box::pin(self.node_of(account_id)).await;
        Ok(Some(Delegated { account_id, shape, parameters, node }))
    }

    /// Runs a delegated call: straight on its account's node where it can, otherwise on `conn`,
    /// through the coordinator. A node whose connection cannot be had is passed over for a while:
    /// nothing was sent to it.
    pub async fn run<R>(&self, mut delegated: Delegated, conn: &mut AsyncPgConnection) -> QueryResult<Vec<R>>
    where
        R: QueryableByName<Pg> + Send + 'static,
    {
        if let (Some(nodes), Some((node, pool))) = (&self.nodes, delegated.node.take()) {
            match pool.get_owned().await {
                Ok(straight) => return Answering(Some(straight)).load(delegated).await,
                Err(error) => {
                    tracing::warn!(%error, ?node, "no connection to the account's node; through the coordinator");
                    nodes.unreachable(&node);
                }
            }
        }
        delegated.load(conn).await
    }

    /// The node of `account_id`'s shards and its pool, if a call for it can go there straight.
    async fn node_of(&self, account_id: Uuid) -> Option<(Node, Pool)> {
        let nodes = self.nodes.as_ref()?;
        let node = match nodes.known(account_id) {
            Some(node) => node,
            None => match self.placement(account_id).await {
                Ok(node) => {
                    nodes.placed(account_id, node.clone());
                    node
                }
                Err(error) => {
                    tracing::warn!(%error, "where the account's shards are is not known; through the coordinator");
                    None
                }
            },
        }?;
        let pool = nodes.pool(&node)?;
        Some((node, pool))
    }

    /// Where `account_id`'s shards are, as the catalog of the database the process connects to
    /// says ([`PLACEMENT_SQL`]).
    async fn placement(&self, account_id: Uuid) -> QueryResult<Option<Node>> {
        let describer = self.describer().await?;
        let client = describer.as_ref().expect("opened above");
        let row =
            client.query_opt(PLACEMENT_SQL, &[&COLOCATED_WITH, &account_id.to_string()]).await.map_err(unavailable)?;
        Ok(row.map(|row| Node { host: row.get(0), port: row.get::<_, i32>(1) as u16 }))
    }

    /// Whether this database delegates: whether [`FUNCTION`] exists, which only distributing the
    /// schema makes.
    async fn delegates(&self) -> QueryResult<bool> {
        let delegates = self.delegates.get_or_try_init(|| async {
            let mut describer = self.describer().await?;
            let client = describer.as_ref().expect("opened above");
            let row =
                client.query_one("SELECT to_regprocedure($1) IS NOT NULL", &[&FUNCTION]).await.map_err(unavailable)?;
            let delegates: bool = row.get(0);
            if !delegates {
                // Never needed again on this database.
                *describer = None;
            }
            Ok::<_, DieselError>(delegates)
        });
        Ok(*delegates.await?)
    }

    /// The describing connection, opened if it is not.
    async fn describer(&self) -> QueryResult<tokio::sync::MutexGuard<'_, Option<tokio_postgres::Client>>> {
        let mut describer = self.describer.lock().await;
        if describer.as_ref().is_none_or(|client| client.is_closed()) {
            let url = self.database_url.clone();
            let (client, connection) = self
                .runtime
                .run(async move { tokio_postgres::connect(&url, tokio_postgres::NoTls).await })
                .await
                .map_err(|error| unavailable(error.to_string()))?
                .map_err(unavailable)?;
            self.runtime.spawn(async move {
                if let Err(error) = connection.await {
                    tracing::debug!(%error, "the describing connection closed");
                }
            });
            *describer = Some(client);
        }
        Ok(describer)
    }

    /// The [`Shape`] of `sql`, whose parameters are of `types`: made the first time, from what
    /// PostgreSQL describes it returns.
    async fn shape_of(&self, sql: &str, types: &[Type]) -> QueryResult<Arc<Shape>> {
        if let Some(shape) = self.shapes.lock().expect("never held across a panic").get(sql) {
            return Ok(shape.clone());
        }
        let describer = self.describer().await?;
        let client = describer.as_ref().expect("opened above");
        let described = client.prepare_typed(sql, types).await.map_err(unavailable)?;
        let columns: Vec<(&str, &Type)> = described.columns().iter().map(|c| (c.name(), c.type_())).collect();
        let shape = Arc::new(Shape {
            statement: returning_as_described(&read_from_array(sql, types)?, &columns)?,
            columns: columns
                .iter()
                .map(|(name, ty)| format!("{} {}", quoted(name), type_name(ty)))
                .collect::<Vec<_>>()
                .join(", "),
        });
        self.shapes.lock().expect("never held across a panic").insert(sql.to_owned(), shape.clone());
        Ok(shape)
    }
}

/// A statement as diesel renders it: its text, with placeholders `$k`, and the types and values of
/// its parameters, the values as PostgreSQL writes them in text.
struct Rendered {
    sql: String,
    types: Vec<Type>,
    parameters: Vec<Option<String>>,
}

impl Rendered {
    fn of<Q: QueryFragment<Pg>>(statement: &Q) -> QueryResult<Rendered> {
        let mut builder = PgQueryBuilder::default();
        statement.to_sql(&mut builder, &Pg)?;
        let mut binds = RawBytesBindCollector::<Pg>::new();
        statement.collect_binds(&mut binds, &mut NoCustomTypes, &Pg)?;
        let types = binds
            .metadata
            .iter()
            .map(|metadata| {
                metadata.oid().ok().and_then(Type::from_oid).ok_or_else(|| unsupported("a parameter of no known type"))
            })
            .collect::<QueryResult<Vec<Type>>>()?;
        let parameters = binds
            .binds
            .iter()
            .zip(&types)
            .map(|(value, ty)| value.as_deref().map(|bytes| as_text(ty, bytes)).transpose())
            .collect::<QueryResult<_>>()?;
        Ok(Rendered { sql: builder.finish(), types, parameters })
    }
}

/// A statement as a call of [`FUNCTION`]: `SELECT * FROM run_on_shard(...) AS delegated(...)`,
/// which Citus passes whole to the node of the call's account.
pub struct Delegated {
    account_id: Uuid,
    shape: Arc<Shape>,
    parameters: Vec<Option<String>>,
    /// The account's node and its pool, where the call can go straight.
    node: Option<(Node, Pool)>,
}

/// A node's connection while a call runs on it. Should the call be cut short (the operation's
/// timeout drops it), the connection is discarded rather than put back with the call perhaps
/// still running on it; so is one the call failed on other than with the database's answer to
/// the statement (a connection that closed, a command that could not be sent).
struct Answering(Option<PooledConnection>);

impl Answering {
    async fn load<R>(mut self, delegated: Delegated) -> QueryResult<Vec<R>>
    where
        R: QueryableByName<Pg> + Send + 'static,
    {
        let conn = self.0.as_mut().expect("taken only below");
        let rows = delegated.load(&mut **conn).await;
        let answered = match &rows {
            Ok(_) => true,
            Err(DieselError::DatabaseError(kind, _)) => {
                !matches!(kind, DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand)
            }
            Err(_) => false,
        };
        if answered {
            // Answered: the connection goes back as it is.
            self.0 = None;
        }
        rows
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        if let Some(conn) = &mut self.0 {
            discard(conn);
        }
    }
}

impl QueryFragment<Pg> for Delegated {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("SELECT * FROM run_on_shard(");
        out.push_bind_param::<SqlUuid, _>(&self.account_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&self.shape.statement)?;
        out.push_sql(", ");
        out.push_bind_param::<Array<Nullable<Text>>, _>(&self.parameters)?;
        out.push_sql(") AS delegated(");
        out.push_sql(&self.shape.columns);
        out.push_sql(")");
        Ok(())
    }
}

impl QueryId for Delegated {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for Delegated {
    type SqlType = Untyped;
}

/// `sql` with each placeholder `$k` read from the one array parameter instead, cast to the type it
/// was bound as. Our statements have no `$` but their placeholders.
fn read_from_array(sql: &str, types: &[Type]) -> QueryResult<String> {
    let mut out = String::with_capacity(sql.len() + types.len() * 16);
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
        let k: usize =
            rest[at + 1..at + 1 + digits].parse().map_err(|_| unsupported("a `$` that is no placeholder"))?;
        let ty = types.get(k.wrapping_sub(1)).ok_or_else(|| unsupported("a placeholder without its value"))?;
        out.push_str(&format!("($1[{k}])::{}", type_name(ty)));
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `sql` (`WITH <CTEs> SELECT ...`) returning each column as the type it was described as. A
/// column of a domain (such as `client_idempotency_key`) is described as the domain's base type,
/// and a function returning records must return exactly the types its caller lists.
fn returning_as_described(sql: &str, columns: &[(&str, &Type)]) -> QueryResult<String> {
    let ctes = sql.strip_prefix("WITH ").ok_or_else(|| unsupported("no CTEs"))?;
    let (ctes, result) = split_result(ctes).ok_or_else(|| unsupported("no result"))?;
    let cast: Vec<String> = columns
        .iter()
        .map(|(name, ty)| format!("r.{name}::{} AS {name}", type_name(ty), name = quoted(name)))
        .collect();
    Ok(format!("WITH {ctes}SELECT {} FROM ({result}) r", cast.join(", ")))
}

/// A parameter's value, sent in binary, as PostgreSQL writes it in text, which its cast reads
/// back: for the types our statements bind.
fn as_text(ty: &Type, bytes: &[u8]) -> QueryResult<String> {
    let utf8 = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).map_err(|_| unsupported("text that is not UTF-8"));
    match *ty {
        Type::UUID => Uuid::from_slice(bytes).map(|id| id.to_string()).map_err(|_| unsupported("a malformed uuid")),
        Type::TEXT | Type::VARCHAR | Type::JSON => utf8(bytes),
        // Binary `jsonb` is a version byte, then the text.
        Type::JSONB => utf8(bytes.get(1..).unwrap_or_default()),
        Type::BYTEA => Ok(format!("\\x{}", hex::encode(bytes))),
        Type::INT8 | Type::INT4 | Type::INT2 => signed(bytes).map(|n| n.to_string()),
        Type::BOOL => Ok(if bytes.first() == Some(&1) { "true" } else { "false" }.to_owned()),
        // Microseconds since 2000-01-01 UTC.
        Type::TIMESTAMPTZ => {
            let micros = <[u8; 8]>::try_from(bytes).map_err(|_| unsupported("a time of another width"))?;
            let micros = i64::from_be_bytes(micros).checked_add(POSTGRES_EPOCH_MICROS);
            let at = micros
                .and_then(chrono::DateTime::from_timestamp_micros)
                .ok_or_else(|| unsupported("a time out of range"))?;
            Ok(at.format("%Y-%m-%d %H:%M:%S%.6f+00").to_string())
        }
        _ => Err(unsupported(&format!("a parameter of type {ty}"))),
    }
}

/// PostgreSQL's epoch, 2000-01-01 UTC, in microseconds since 1970's.
const POSTGRES_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// A big-endian two's-complement integer of 2, 4 or 8 bytes.
fn signed(bytes: &[u8]) -> QueryResult<i64> {
    let width = || unsupported("an integer of another width");
    Ok(match bytes.len() {
        2 => i16::from_be_bytes(bytes.try_into().map_err(|_| width())?).into(),
        4 => i32::from_be_bytes(bytes.try_into().map_err(|_| width())?).into(),
        8 => i64::from_be_bytes(bytes.try_into().map_err(|_| width())?),
        _ => return Err(width()),
    })
}

/// A type's name as SQL writes it, schema and all.
fn type_name(ty: &Type) -> String {
    format!("{}.{}", quoted(ty.schema()), quoted(ty.name()))
}

fn quoted(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

/// Our statements bind only PostgreSQL's own types, which need no look-up.
struct NoCustomTypes;

impl PgMetadataLookup for NoCustomTypes {
    fn lookup_type(&mut self, type_name: &str, schema: Option<&str>) -> PgTypeMetadata {
        let key = PgMetadataCacheKey::new(schema.map(Into::into), type_name.into());
        PgTypeMetadata::from_result(Err(FailedToLookupTypeError::new(key.into_owned())))
    }
}

/// A statement that cannot be delegated: a bug in ours, which every test on Citus finds.
fn unsupported(what: &str) -> DieselError {
    DieselError::QueryBuilderError(format!("cannot delegate a statement with {what}").into())
}

/// The database could not be asked: as when the pool cannot reach it (see [`super::StoreError`]).
fn unavailable(error: impl ToString) -> DieselError {
    DieselError::DatabaseError(DatabaseErrorKind::UnableToSendCommand, Box::new(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_placeholder_is_read_from_the_array_as_its_type() {
        let sql = "SELECT $1, $2 FROM t WHERE a = $10 AND b = $2";
        let mut types = vec![Type::UUID, Type::TEXT];
        types.extend(std::iter::repeat_n(Type::INT8, 8));
        assert_eq!(
            read_from_array(sql, &types).unwrap(),
            "SELECT ($1[1])::\"pg_catalog\".\"uuid\", ($1[2])::\"pg_catalog\".\"text\" FROM t \
             WHERE a = ($1[10])::\"pg_catalog\".\"int8\" AND b = ($1[2])::\"pg_catalog\".\"text\""
        );
        assert!(read_from_array("SELECT $3", &types[..2]).is_err());
    }

    #[test]
    fn values_are_written_as_postgresql_reads_them() {
        assert_eq!(as_text(&Type::INT8, &(-5_i64).to_be_bytes()).unwrap(), "-5");
        assert_eq!(as_text(&Type::INT2, &(-300_i16).to_be_bytes()).unwrap(), "-300");
        assert_eq!(as_text(&Type::INT4, &70_000_i32.to_be_bytes()).unwrap(), "70000");
        assert_eq!(as_text(&Type::BYTEA, &[0xde, 0xad]).unwrap(), "\\xdead");
        assert_eq!(as_text(&Type::JSONB, b"\x01{\"a\": 1}").unwrap(), "{\"a\": 1}");
        let id = Uuid::now_v7();
        assert_eq!(as_text(&Type::UUID, id.as_bytes()).unwrap(), id.to_string());
        assert_eq!(as_text(&Type::TIMESTAMPTZ, &0_i64.to_be_bytes()).unwrap(), "2000-01-01 00:00:00.000000+00");
        let at = 1_000_000_000_i64 * 1_000_000 + 123_456 - POSTGRES_EPOCH_MICROS;
        assert_eq!(as_text(&Type::TIMESTAMPTZ, &at.to_be_bytes()).unwrap(), "2001-09-09 01:46:40.123456+00");
        assert!(as_text(&Type::TIMESTAMPTZ, &[0; 4]).is_err());
        assert!(as_text(&Type::DATE, &[0; 4]).is_err());
    }
}

//! Citus's routing on one PostgreSQL: a database whose `run_on_shard` stands in for the one
//! `payments migrate --distribute` makes, so that the app delegates every statement that runs
//! under a key (it does wherever the function exists), and each runs where each marked table
//! (`public.<table> AS `, see `payments_service::db::sql`) is a view of it in the schema `shard`,
//! as Citus's puts the account's shard there, as a role with no right on the distributed tables
//! themselves. A statement that names one without its marker is refused (`permission denied`),
//! kept in `shard.unmarked` with the error, and returns nothing, which fails its request.

use std::collections::BTreeSet;

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use payments_service::db::sql::marked_prefix;
use payments_service::db::tables::BY_ACCOUNT;

use super::cluster::TestDatabase;

/// A migrated database of the test's own, with the stand-in.
pub async fn database_with_shards_stand_in() -> TestDatabase {
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.expect("connecting to the test database");
    conn.batch_execute(&stand_in(&database.name)).await.expect("making the stand-in");
    database
}

#[derive(QueryableByName)]
struct Statement {
    #[diesel(sql_type = Text)]
    statement: String,
}

#[derive(QueryableByName)]
struct Refused {
    #[diesel(sql_type = Text)]
    error: String,
    #[diesel(sql_type = Text)]
    statement: String,
}

/// Every statement delegated so far, as it was sent (each table marked).
pub async fn delegated(conn: &mut AsyncPgConnection) -> Vec<String> {
    let ran: Vec<Statement> = diesel::sql_query("SELECT statement FROM shard.ran").load(conn).await.unwrap();
    ran.into_iter().map(|ran| ran.statement).collect()
}

/// What the stand-in refused, if anything: each error, and the first statement refused.
pub async fn unmarked(conn: &mut AsyncPgConnection) -> Option<String> {
    let refused: Vec<Refused> =
        diesel::sql_query("SELECT error, statement FROM shard.unmarked").load(conn).await.unwrap();
    let first = refused.as_slice().first()?;
    let errors: BTreeSet<&str> = refused.iter().map(|refused| refused.error.as_str()).collect();
    Some(format!("named without its marker: {errors:?}, first in:\n{}", first.statement))
}

/// The stand-in, in the database `name`: the views, the role (one per database: roles are the
/// cluster's), and the function.
fn stand_in(name: &str) -> String {
    let role = format!("marked_only_{name}");
    let views: String = BY_ACCOUNT
        .iter()
        .map(|table| format!("CREATE VIEW shard.{table} AS SELECT * FROM public.{table};\n"))
        .collect();
    let tables = BY_ACCOUNT.map(|table| format!("public.{table}")).join(", ");
    let replaced: String = BY_ACCOUNT
        .iter()
        .map(|table| {
            let (marked, view) = (marked_prefix(table), marked_prefix(table).replacen("public.", "shard.", 1));
            format!("statement := replace(statement, '{marked}', '{view}');\n")
        })
        .collect();
    format!(
        "CREATE SCHEMA shard;
         {views}
         CREATE TABLE shard.ran (statement text NOT NULL);
         CREATE TABLE shard.unmarked (error text NOT NULL, statement text NOT NULL);
         CREATE ROLE {role} NOLOGIN;
         GRANT USAGE ON SCHEMA shard TO {role};
         GRANT ALL ON ALL TABLES IN SCHEMA public TO {role};
         GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role};
         REVOKE ALL ON {tables} FROM {role};
         GRANT ALL ON ALL TABLES IN SCHEMA shard TO {role};
         REVOKE ALL ON shard.ran, shard.unmarked FROM {role};
         CREATE FUNCTION run_on_shard(account_id uuid, statement text, parameters text[])
         RETURNS SETOF record LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO shard.ran VALUES (statement);
             {replaced}
             BEGIN
                 SET LOCAL ROLE {role};
                 RETURN QUERY EXECUTE statement USING parameters;
                 RESET ROLE;
             EXCEPTION WHEN insufficient_privilege THEN
                 -- Kept, and the statement undone: it returns no row, which fails its request.
                 INSERT INTO shard.unmarked VALUES (SQLERRM, statement);
             END;
         END
         $$;"
    )
}

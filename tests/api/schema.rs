//! The schema's rules, checked against the migrated database: `schema.rs` matches it, the
//! migrations revert cleanly, every row can be distributed by account, every foreign key is
//! indexed, every text column is bounded, and no check is written the slow way.

use diesel::QueryableByName;
use diesel::sql_types::{Bool, Text};
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use diesel_migrations::MigrationHarness;
use payments_service::db::migrate::MIGRATIONS;

use crate::helpers::TestDatabase;

const SCHEMA_RS: &str = include_str!("../../crates/service/src/db/schema.rs");

#[derive(QueryableByName, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Column {
    #[diesel(sql_type = Text)]
    table_name: String,
    #[diesel(sql_type = Text)]
    column_name: String,
    #[diesel(sql_type = Text)]
    udt_name: String,
    #[diesel(sql_type = Bool)]
    nullable: bool,
}

async fn columns(conn: &mut AsyncPgConnection) -> Vec<Column> {
    diesel::sql_query(
        "SELECT c.table_name::text, c.column_name::text, c.udt_name::text, c.is_nullable = 'YES' AS nullable
         FROM information_schema.columns c
         JOIN information_schema.tables t USING (table_schema, table_name)
         WHERE c.table_schema = 'public' AND c.table_name <> '__diesel_schema_migrations'
           AND t.table_type = 'BASE TABLE'
         ORDER BY c.table_name, c.ordinal_position",
    )
    .load(conn)
    .await
    .unwrap()
}

/// The columns `schema.rs` declares, read from its `table!` blocks.
fn declared_columns() -> Vec<Column> {
    let mut table = None;
    let mut declared = Vec::new();
    for line in SCHEMA_RS.lines().map(str::trim) {
        if let Some((name, _)) = line.split_once(" (").filter(|_| line.ends_with('{')) {
            table = Some(name.to_owned());
        } else if line == "}" {
            table = None;
        } else if let (Some(table), Some((column, sql_type))) = (&table, line.trim_end_matches(',').split_once(" -> "))
        {
            let (nullable, sql_type) = match sql_type.strip_prefix("Nullable<") {
                Some(inner) => (true, inner.trim_end_matches('>')),
                None => (false, sql_type),
            };
            let udt_name = match sql_type {
                "Int2" | "Int4" | "Int8" | "Uuid" | "Text" | "Bytea" | "Jsonb" | "Timestamptz" | "Bool" => {
                    sql_type.to_lowercase()
                }
                "Array<Nullable<Text>>" => "_text".to_owned(),
                other => panic!("schema.rs: an SQL type this test does not know: {other}"),
            };
            declared.push(Column { table_name: table.to_owned(), column_name: column.to_owned(), udt_name, nullable });
        }
    }
    declared.sort();
    declared
}

#[derive(QueryableByName, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PrimaryKey {
    #[diesel(sql_type = Text)]
    table_name: String,
    /// Its columns in order, as `schema.rs` writes them: `a, b`.
    #[diesel(sql_type = Text)]
    columns: String,
}

async fn primary_keys(conn: &mut AsyncPgConnection) -> Vec<PrimaryKey> {
    diesel::sql_query(
        "SELECT c.conrelid::regclass::text AS table_name,
                string_agg(a.attname, ', ' ORDER BY k.position) AS columns
         FROM pg_constraint c
         CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k (attnum, position)
         JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
         WHERE c.contype = 'p' AND c.connamespace = 'public'::regnamespace
           AND c.conrelid::regclass::text <> '__diesel_schema_migrations'
         GROUP BY c.conrelid
         ORDER BY 1",
    )
    .load(conn)
    .await
    .unwrap()
}

/// The primary keys `schema.rs` declares, read from the heads of its `table!` blocks.
fn declared_primary_keys() -> Vec<PrimaryKey> {
    let mut declared: Vec<PrimaryKey> = SCHEMA_RS
        .lines()
        .map(str::trim)
        .filter_map(|line| line.strip_suffix(") {")?.split_once(" ("))
        .map(|(table, columns)| PrimaryKey { table_name: table.to_owned(), columns: columns.to_owned() })
        .collect();
    declared.sort();
    declared
}

#[tokio::test]
async fn schema_rs_matches_the_migrated_database() {
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let mut actual = columns(&mut conn).await;
    actual.sort();
    assert_eq!(declared_columns(), actual);
    assert_eq!(declared_primary_keys(), primary_keys(&mut conn).await, "the primary keys, column by column");
}

#[tokio::test]
async fn the_migrations_revert_and_apply_again() {
    let database = TestDatabase::create().await;
    let url = database.url.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn = <AsyncConnectionWrapper<AsyncPgConnection> as diesel::Connection>::establish(&url).unwrap();
        conn.revert_all_migrations(MIGRATIONS).expect("every down.sql runs");
        let remaining: i64 = diesel::RunQueryDsl::get_result(
            diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
                "(SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename <> '__diesel_schema_migrations')",
            )),
            &mut conn,
        )
        .unwrap();
        assert_eq!(remaining, 0, "down migrations leave no table behind");
        conn.run_pending_migrations(MIGRATIONS).expect("every up.sql runs again");
    })
    .await
    .unwrap();
}

#[derive(QueryableByName, Debug)]
struct Finding {
    #[diesel(sql_type = Text)]
    finding: String,
}

/// Runs a query that lists rule violations, and asserts it lists none.
async fn assert_none(sql: &str) {
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let findings: Vec<String> =
        diesel::sql_query(sql).load::<Finding>(&mut conn).await.unwrap().into_iter().map(|f| f.finding).collect();
    assert!(findings.is_empty(), "{findings:#?}");
}

#[tokio::test]
async fn every_table_but_the_two_of_no_account_carries_account_id_in_every_unique_key() {
    // Unique indexes, not only constraints: an index made unique by `CREATE UNIQUE INDEX` (as a
    // concurrent build makes it) constrains rows as much, and a distributed table needs its
    // distribution column in it too. The two exceptions belong to no account: the accounts
    // themselves, and the events the gateway sent that could not be read (one that names no
    // request of ours names no account); the latter still carries the account when it names one.
    assert_none(
        "SELECT format('%s has no account_id', c.oid::regclass) AS finding
         FROM pg_class c
         WHERE c.relkind IN ('r', 'p') AND c.relnamespace = 'public'::regnamespace
           AND c.relname NOT IN ('accounts', '__diesel_schema_migrations')
           AND NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'account_id')
         UNION ALL
         SELECT format('%s does not include account_id', i.indexrelid::regclass)
         FROM pg_index i
         JOIN pg_class c ON c.oid = i.indrelid
         WHERE i.indisunique AND c.relnamespace = 'public'::regnamespace
           AND c.relname NOT IN ('accounts', 'unreadable_gateway_events', '__diesel_schema_migrations')
           AND NOT EXISTS (SELECT FROM pg_attribute a
                           WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) AND a.attname = 'account_id')",
    )
    .await;
}

#[tokio::test]
async fn every_foreign_key_is_indexed() {
    assert_none(
        "SELECT format('%s.%s has no index', c.conrelid::regclass, c.conname) AS finding
         FROM pg_constraint c
         WHERE c.contype = 'f' AND c.connamespace = 'public'::regnamespace
           AND NOT EXISTS (SELECT FROM pg_index i
                           WHERE i.indrelid = c.conrelid
                             AND (i.indkey::int2[])[0:array_length(c.conkey, 1) - 1] @> c.conkey
                             AND (i.indkey::int2[])[0:array_length(c.conkey, 1) - 1] <@ c.conkey)",
    )
    .await;
}

#[tokio::test]
async fn every_text_column_is_bounded_by_a_check() {
    // By a CHECK of its table, or of the domain that is its type. (A view's columns are its
    // tables'.)
    assert_none(
        "SELECT format('%s.%s has no CHECK', c.table_name, c.column_name) AS finding
         FROM information_schema.columns c
         JOIN information_schema.tables t USING (table_schema, table_name)
         WHERE c.table_schema = 'public' AND c.data_type = 'text' AND c.table_name <> '__diesel_schema_migrations'
           AND t.table_type = 'BASE TABLE'
           AND NOT EXISTS (SELECT FROM pg_constraint k
                           JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = ANY (k.conkey)
                           WHERE k.contype = 'c' AND k.conrelid = c.table_name::regclass
                             AND a.attname = c.column_name)
           AND NOT EXISTS (SELECT FROM pg_constraint k JOIN pg_type t ON t.oid = k.contypid
                           WHERE k.contype = 'c' AND t.typname = c.domain_name)",
    )
    .await;
}

#[tokio::test]
async fn no_check_counts_a_range_of_repetitions() {
    // PostgreSQL runs `{m,n}` as an automaton with states for every count: checking a 40-character
    // idempotency key by `^[ -~]{1,255}$` took about 90 µs, twice per payment; the same rule as a
    // length and an uncounted class takes a microsecond or two (000027).
    assert_none(
        r"SELECT format('%s: %s', conname, pg_get_constraintdef(oid)) AS finding
          FROM pg_constraint
          WHERE contype = 'c' AND connamespace = 'public'::regnamespace
            AND pg_get_constraintdef(oid) ~ '\{[0-9]*,[0-9]*\}'",
    )
    .await;
}

#[tokio::test]
async fn a_key_and_a_request_id_are_held_to_the_same_rules_as_ever() {
    // 000027 restated both domains' checks: these are the edges of the rules they had before.
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let printable: String = (' '..='~').collect();
    let key_cases: [(&str, bool); 11] = [
        ("", false),
        ("a", true),
        (&"k".repeat(255), true),
        (&"k".repeat(256), false),
        (&printable, true),
        (" ", true),
        ("a\tb", false),
        ("a\nb", false),
        ("a\u{7f}", false),
        ("caf\u{e9}", false),
        ("key\n", false),
    ];
    let id_cases: [(&str, bool); 9] = [
        ("", false),
        ("req_0123456789abcdef", true),
        ("AZaz09._:+/=-", true),
        (&"r".repeat(128), true),
        (&"r".repeat(129), false),
        ("a b", false),
        ("a~b", false),
        ("id\n", false),
        ("\u{e9}", false),
    ];
    for (domain, cases) in [("client_idempotency_key", &key_cases[..]), ("request_id", &id_cases[..])] {
        for &(value, accepted) in cases {
            let checked =
                diesel::sql_query(format!("SELECT $1::{domain}")).bind::<Text, _>(value).execute(&mut conn).await;
            assert_eq!(checked.is_ok(), accepted, "{domain} {value:?}: {checked:?}");
        }
    }
}

#[derive(QueryableByName)]
struct DomainCheck {
    #[diesel(sql_type = Text)]
    expression: String,
}

#[tokio::test]
async fn each_restated_check_agrees_with_its_old_expression_on_every_generated_value() {
    // The cases above are edges picked by hand. Here each domain's check, as the database holds
    // it, is evaluated beside the expression 000027 replaced, over every one- and two-byte
    // character (U+0001 to U+07FF) and a sample of the rest up to U+D7FF, each alone, between two
    // letters and after a word, and runs of characters at every length around the limits.
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    for (domain, old) in [("client_idempotency_key", "^[ -~]{1,255}$"), ("request_id", "^[A-Za-z0-9._:+/=-]{1,128}$")] {
        let DomainCheck { expression } = diesel::sql_query(
            r"SELECT regexp_replace(pg_get_constraintdef(c.oid), '^CHECK (.*?)( NOT VALID)?$', '\1') AS expression
              FROM pg_constraint c JOIN pg_type t ON t.oid = c.contypid
              WHERE t.typname = $1",
        )
        .bind::<Text, _>(domain)
        .get_result(&mut conn)
        .await
        .unwrap();
        let now = expression.replace("VALUE", "v");
        let counts: Agreement = diesel::sql_query(format!(
            r"WITH codes (code) AS (SELECT generate_series(1, 2047) UNION ALL SELECT generate_series(2048, 55295, 61)),
                   chars AS (SELECT chr(code) AS c FROM codes),
                   generated (v) AS (
                     SELECT c FROM chars
                     UNION ALL SELECT 'a' || c || 'b' FROM chars
                     UNION ALL SELECT 'key' || c FROM chars
                     UNION ALL SELECT repeat(c, n)
                       FROM unnest(ARRAY['k', ' ', '~', '-', '=', 'é', E'\n', '']) AS c,
                            unnest(ARRAY[0, 1, 2, 127, 128, 129, 254, 255, 256, 1000]) AS n)
              SELECT count(*) AS generated, count(*) FILTER (WHERE v ~ $1) AS accepted,
                     count(*) FILTER (WHERE (v ~ $1) IS DISTINCT FROM ({now})) AS disagreeing,
                     coalesce(array_to_string((array_agg(quote_literal(left(v, 20)))
                       FILTER (WHERE (v ~ $1) IS DISTINCT FROM ({now})))[1:5], ', '), '') AS examples
              FROM generated"
        ))
        .bind::<Text, _>(old)
        .get_result(&mut conn)
        .await
        .unwrap();
        assert_eq!(counts.disagreeing, 0, "{domain}: {now} differs from {old} on {}", counts.examples);
        assert!(
            (90..counts.generated - 1000).contains(&counts.accepted),
            "{domain}: the generated values fall on both sides of the rule"
        );
    }
}

#[derive(QueryableByName)]
struct Agreement {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    generated: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    accepted: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    disagreeing: i64,
    #[diesel(sql_type = Text)]
    examples: String,
}

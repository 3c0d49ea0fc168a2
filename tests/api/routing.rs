//! Every statement of a payment's and a refund's requests finds the rows of each distributed table
//! by the account, given as a parameter: what Citus needs to send it (each step of it, for a
//! statement with `INSERT` CTEs) to the account's shard alone. Read off PostgreSQL's generic plan of
//! each statement the service ran, where a parameter shows as `$n`: every scan of a table
//! distributed by `account_id` must carry `account_id = $n`, not a value joined from elsewhere.
//!
//! And every statement that runs under a key names each distributed table by its marker (see
//! `payments_service::db::sql`), on one PostgreSQL: a stand-in `run_on_shard` runs each delegated
//! statement as a role that may not touch the distributed tables themselves, only views of them
//! that take the shards' place, so a table named without its marker fails the request.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use payments_service::db::sql::marked_prefix;
use payments_service::db::tables::{BY_ACCOUNT, REFERENCE_TABLES};
use payments_service::workers::{Outcome, Worker};
use regex::Regex;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{
    TestApp, database_with_shards_stand_in, delegated, explain, new_key, payment_body, record_statements, sql_of,
    statements, unmarked, wait_until,
};

#[tokio::test]
async fn every_statement_of_a_payment_and_a_refund_finds_its_rows_by_the_account_as_a_parameter() {
    record_statements();
    let app = TestApp::spawn().await;
    // Every path: a process's first payment (the claim alone, then `started`), a later one (with
    // `started` in the claim), one the gateway left unknown and its retry (released, resumed), a
    // refund, a refused one, a reused key, and the look-ups.
    let payment = app.paid(1000, "tok_visa").await;
    app.paid(1000, "tok_visa").await;
    app.gateway.fault("error_before", 1).await;
    let key = new_key();
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);
    let refund = json!({ "payment": payment["id"], "amount": 600 });
    assert_eq!(app.post_refund(&new_key(), &refund).await.status(), StatusCode::CREATED);
    assert_eq!(app.post_refund(&new_key(), &refund).await.status(), StatusCode::BAD_REQUEST);
    assert_eq!(app.post_refund(&key, &refund).await.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // An authorization captured in part, and a cancel that finds it captured.
    let body = json!({ "amount": 2000, "currency": "usd", "source": "tok_visa", "capture": false });
    let authorized: serde_json::Value = app.post_payment(&new_key(), &body).await.json().await.unwrap();
    let change = |action: &str| {
        let path = format!("{}/v1/payments/{}/{action}", app.address, authorized["id"].as_str().unwrap());
        let request = app.http.post(path).bearer_auth(&app.api_key).header("Idempotency-Key", new_key());
        request.json(&json!({})).send()
    };
    assert_eq!(change("capture").await.unwrap().status(), StatusCode::OK);
    assert_eq!(change("cancel").await.unwrap().status(), StatusCode::BAD_REQUEST);
    let id = payment["id"].as_str().unwrap();
    for path in [format!("/v1/payments/{id}"), "/v1/payments".into(), format!("/v1/refunds?payment={id}")] {
        assert_eq!(app.get(&path).await.status(), StatusCode::OK, "{path}");
    }
    assert_eq!(app.key_story(&key).await.status(), StatusCode::OK);

    let types = parameter_types(&app).await;
    let mut ran: Vec<String> =
        statements(&app.database.name).executed.iter().map(|sql| sql_of(sql).to_owned()).collect();
    ran.retain(|sql| BY_ACCOUNT.iter().any(|table| sql.contains(table)));
    ran.sort();
    ran.dedup();
    let account = Regex::new(r"\baccount_id = \$\d+\b").unwrap();
    let mut conn = app.db().await;
    diesel::sql_query("SET plan_cache_mode = force_generic_plan").execute(&mut conn).await.unwrap();
    let mut checked = BTreeMap::new();
    for sql in ran {
        let plan = generic_plan(&mut conn, &sql, types.get(&sql)).await;
        let mut unrouted = Vec::new();
        scans_without_the_account(&plan, &account, &mut unrouted);
        checked.insert(sql, unrouted);
    }

    let ran = |part: &str| checked.keys().filter(|sql| sql.contains(part)).count();
    let marked = |statement: &str, table: &str| format!("{statement} {}", marked_prefix(table));
    assert!(
        ran(&marked("INSERT INTO", "payments")) >= 2,
        "the claim with `started`, and `started` alone: {checked:#?}"
    );
    assert!(ran(&marked("INSERT INTO", "refunds")) >= 1 && ran(&marked("UPDATE", "payments")) >= 3, "{checked:#?}");
    assert!(ran("idempotency_key.released") == 1, "{checked:#?}");
    assert!(
        ran(&marked("INSERT INTO", "payment_changes")) >= 1 && ran(&marked("UPDATE", "payment_changes")) >= 1,
        "{checked:#?}"
    );
    let unrouted: Vec<_> = checked.iter().filter(|(_, scans)| !scans.is_empty()).collect();
    assert!(unrouted.is_empty(), "scans of distributed tables without `account_id = $n`: {unrouted:#?}");
}

#[derive(QueryableByName)]
struct Prepared {
    #[diesel(sql_type = Text)]
    statement: String,
    #[diesel(sql_type = Array<Text>)]
    types: Vec<String>,
}

/// The parameters' types of each statement the service keeps prepared, by its SQL text (what it
/// runs with `sql_query` is not kept, and PostgreSQL infers its types).
async fn parameter_types(app: &TestApp) -> HashMap<String, Vec<String>> {
    let mut types = HashMap::new();
    for mut conn in app.idle_service_connections().await {
        let prepared: Vec<Prepared> =
            diesel::sql_query("SELECT statement, parameter_types::text[] AS types FROM pg_prepared_statements")
                .load(&mut *conn)
                .await
                .unwrap();
        types.extend(prepared.into_iter().map(|Prepared { statement, types }| (statement, types)));
    }
    types
}

#[derive(QueryableByName)]
struct Parameters {
    #[diesel(sql_type = BigInt)]
    count: i64,
}

/// The generic plan of `sql` (`plan_cache_mode` is `force_generic_plan` on `conn`), prepared with
/// `types` if given.
async fn generic_plan(conn: &mut AsyncPgConnection, sql: &str, types: Option<&Vec<String>>) -> Value {
    let prepare = match types {
        Some(types) if !types.is_empty() => format!("PREPARE routed ({}) AS {sql}", types.join(", ")),
        _ => format!("PREPARE routed AS {sql}"),
    };
    diesel::sql_query(&prepare).execute(conn).await.unwrap_or_else(|e| panic!("{prepare}: {e}"));
    let count =
        "SELECT cardinality(parameter_types)::bigint AS count FROM pg_prepared_statements WHERE name = 'routed'";
    let Parameters { count } = diesel::sql_query(count).get_result(conn).await.unwrap();
    let execute = match count {
        0 => "EXECUTE routed".to_owned(),
        _ => format!("EXECUTE routed({})", vec!["NULL"; count as usize].join(", ")),
    };
    let plan = explain(conn, "VERBOSE, FORMAT JSON", &execute).await;
    diesel::sql_query("DEALLOCATE routed").execute(conn).await.unwrap();
    plan
}

/// Each scan in `plan` of a distributed table whose conditions do not name the account as a
/// parameter, with its conditions.
fn scans_without_the_account(plan: &Value, account: &Regex, unrouted: &mut Vec<String>) {
    let table = plan["Relation Name"].as_str().filter(|table| BY_ACCOUNT.contains(table));
    let node = plan["Node Type"].as_str().unwrap_or("?");
    // A `ModifyTable`'s rows come from the scans below it (an `INSERT`'s from its `SELECT`).
    if let (Some(table), false) = (table, node == "ModifyTable") {
        let conditions: Vec<&str> =
            ["Index Cond", "Recheck Cond", "Filter", "TID Cond"].iter().filter_map(|c| plan[c].as_str()).collect();
        if !conditions.iter().any(|condition| account.is_match(condition)) {
            unrouted.push(format!("{node} on {table}: {conditions:?}"));
        }
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        scans_without_the_account(child, account, unrouted);
    }
}

/// Every request that runs under a key, on one PostgreSQL whose `run_on_shard` stands in for
/// Citus's (see `helpers/shards.rs`): a payment (its first in the process, then one with `started`
/// in the claim), a replay, a refund and a refused one, a capture and a cancel that finds it
/// captured, a key the gateway left unknown that the completer finishes, and a late retry of an
/// expired key. Each statement is delegated, as on Citus, and runs as a role with no right on the
/// distributed tables, where each marked table is a view of it: one named without its marker
/// fails with `permission denied`, and so does the request.
#[tokio::test]
async fn every_statement_under_a_key_names_each_distributed_table_by_its_marker() {
    let database = database_with_shards_stand_in().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    assert_eq!(tables_undeclared(&mut conn).await, Vec::<String>::new(), "every table is in one list");
    let app = TestApp::builder()
        .key_retention(Duration::from_secs(2))
        .gateway_timeout(Duration::from_millis(300))
        .workers(|w| w.completer_backoff = Duration::ZERO)
        .spawn_on(database)
        .await;

    let payment =
        expect(&app, app.post_payment(&new_key(), &payment_body()).await, StatusCode::CREATED, "payment").await;
    let key = new_key();
    expect(&app, app.post_payment(&key, &payment_body()).await, StatusCode::CREATED, "a second payment").await;
    let replay = app.post_payment(&key, &payment_body()).await;
    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
    let refund = json!({ "payment": payment["id"], "amount": 600 });
    expect(&app, app.post_refund(&new_key(), &refund).await, StatusCode::CREATED, "refund").await;
    expect(&app, app.post_refund(&new_key(), &refund).await, StatusCode::BAD_REQUEST, "refund of too much").await;
    let body = json!({ "amount": 2000, "currency": "usd", "source": "tok_visa", "capture": false });
    let authorized =
        expect(&app, app.post_payment(&new_key(), &body).await, StatusCode::CREATED, "authorization").await;
    let change = |action: &str, body: Value| {
        let path = format!("{}/v1/payments/{}/{action}", app.address, authorized["id"].as_str().unwrap());
        let request = app.http.post(path).bearer_auth(&app.api_key).header("Idempotency-Key", new_key());
        request.json(&body).send()
    };
    expect(&app, change("capture", json!({ "amount": 1500 })).await.unwrap(), StatusCode::OK, "capture").await;
    expect(&app, change("cancel", json!({})).await.unwrap(), StatusCode::BAD_REQUEST, "cancel of a captured one").await;

    // Left at `started`, the gateway's answer lost: the completer finishes it.
    app.gateway.fault("error_after", 1).await;
    let abandoned = new_key();
    let left = app.post_payment(&abandoned, &payment_body()).await;
    expect(&app, left, StatusCode::SERVICE_UNAVAILABLE, "a payment whose answer was lost").await;
    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(app.key_row(&abandoned).await.unwrap().recovery_point, "finished");

    wait_until(Duration::from_secs(10), "the key expired", || app.key_has_expired(&key)).await;
    expect(&app, app.post_payment(&key, &payment_body()).await, StatusCode::GONE, "a late retry").await;

    // Each of those went through the stand-in, and between them they named these tables.
    let ran = delegated(&mut conn).await;
    let named: BTreeSet<&str> =
        BY_ACCOUNT.into_iter().filter(|table| ran.iter().any(|sql| sql.contains(&marked_prefix(table)))).collect();
    let written = [
        "audit_records",
        "events",
        "gateway_events",
        "idempotency_keys",
        "key_resources",
        "open_authorizations",
        "payment_changes",
        "payments",
        "refunds",
    ];
    assert_eq!(named, written.into_iter().collect(), "{} statements delegated", ran.len());
    assert_eq!(unmarked(&mut conn).await, None);
}

/// `response`'s JSON, once its status is `status`; else what the stand-in refused, if anything.
async fn expect(app: &TestApp, response: reqwest::Response, status: StatusCode, what: &str) -> Value {
    let got = response.status();
    let body = response.text().await.unwrap();
    if got != status {
        panic!("{what}: {got} {body}\n{}", unmarked(&mut app.db().await).await.unwrap_or_default());
    }
    serde_json::from_str(&body).unwrap_or_default()
}

#[derive(QueryableByName)]
struct Table {
    #[diesel(sql_type = Text)]
    name: String,
}

/// The schema's tables in neither of `db/distribute.rs`'s lists.
async fn tables_undeclared(conn: &mut AsyncPgConnection) -> Vec<String> {
    let tables: Vec<Table> = diesel::sql_query(
        "SELECT relname::text AS name FROM pg_class
         WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' AND relname <> '__diesel_schema_migrations'
         ORDER BY relname",
    )
    .load(conn)
    .await
    .unwrap();
    let declared = |table: &str| BY_ACCOUNT.contains(&table) || REFERENCE_TABLES.contains(&table);
    tables.into_iter().map(|table| table.name).filter(|table| !declared(table)).collect()
}

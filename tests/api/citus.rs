//! The schema on a real Citus cluster (a coordinator and two workers, see
//! [`crate::helpers::CitusDatabase`]): `payments migrate --distribute` spreads every table by
//! account, colocated, and a second run changes nothing; without Citus it refuses and changes
//! nothing; and the service answers on the distributed schema as on one PostgreSQL. Each test is
//! skipped, saying so, where Citus is not installed.

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Text};
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::process::Command;

use crate::helpers::{CitusDatabase, GatewayControl, HeldProxy, Process, TestApp, TestDatabase, new_key};
use payments_service::db::migrate::MIGRATIONS;
use payments_service::workers::{Outcome, Worker};

/// `payments migrate --distribute` against `database_url`: its exit code and output.
async fn migrate_distribute(database_url: &str) -> (Option<i32>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_payments"));
    command.args(["migrate", "--distribute"]).env("DATABASE_URL", database_url).env("RUST_BACKTRACE", "0");
    let output = command.output().await.unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    (output.status.code(), text)
}

#[derive(QueryableByName, Debug, PartialEq, Eq, Clone)]
struct Placed {
    #[diesel(sql_type = Text)]
    table_name: String,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Text)]
    column: String,
    #[diesel(sql_type = BigInt)]
    colocation: i64,
}

/// Where Citus keeps each table, by name.
async fn placement(url: &str) -> Vec<Placed> {
    let mut conn = AsyncPgConnection::establish(url).await.unwrap();
    diesel::sql_query(
        "SELECT table_name::text, citus_table_type AS kind, distribution_column AS column,
                colocation_id::bigint AS colocation
         FROM citus_tables ORDER BY table_name::text",
    )
    .load(&mut conn)
    .await
    .unwrap()
}

#[derive(QueryableByName)]
struct Name {
    #[diesel(sql_type = Text)]
    name: String,
}

/// The schema's tables (the migrations' bookkeeping aside), and its foreign keys and views, by name:
/// on a Citus coordinator, neither the shards it keeps of the reference tables (which Citus hides
/// from `pg_class`, not from `pg_constraint`) nor Citus's own views.
async fn schema(url: &str) -> (Vec<String>, Vec<String>, Vec<String>) {
    let mut conn = AsyncPgConnection::establish(url).await.unwrap();
    let mut names = async |sql: &str| -> Vec<String> {
        let rows: Vec<Name> = diesel::sql_query(sql).load(&mut conn).await.unwrap();
        rows.into_iter().map(|row| row.name).collect()
    };
    let tables = names(
        "SELECT relname::text AS name FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'
           AND relname <> '__diesel_schema_migrations' ORDER BY 1",
    )
    .await;
    let keys = names(
        "SELECT conrelid::regclass::text || '.' || conname || ' ' || pg_get_constraintdef(oid) AS name
         FROM pg_constraint WHERE contype = 'f' AND connamespace = 'public'::regnamespace
           AND conrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace)
         ORDER BY 1",
    )
    .await;
    let views = names(
        "SELECT viewname::text AS name FROM pg_views WHERE schemaname = 'public' AND viewname NOT LIKE 'citus%' ORDER BY 1",
    )
    .await;
    (tables, keys, views)
}

/// Checks that every table of the database at `url` is in Citus's metadata, by account and
/// colocated or a reference table, with the foreign keys and the view a single node has; returns
/// where each is and the schema.
async fn distributed_as_on_one_node(url: &str) -> (Vec<Placed>, (Vec<String>, Vec<String>, Vec<String>)) {
    let placed = placement(url).await;
    let (tables, keys, views) = schema(url).await;
    let names: Vec<&str> = placed.iter().map(|table| table.table_name.as_str()).collect();
    assert_eq!(names, tables, "every table is in Citus's metadata");
    let payments = placed.iter().find(|table| table.table_name == "payments").unwrap().clone();
    for table in &placed {
        match table.table_name.as_str() {
            // Copied to every node: every table's foreign key names `accounts`, and an unreadable
            // event may belong to no account.
            "accounts" | "unreadable_gateway_events" => assert_eq!(table.kind, "reference", "{table:?}"),
            _ => {
                assert_eq!((table.kind.as_str(), table.column.as_str()), ("distributed", "account_id"), "{table:?}");
                assert_eq!(table.colocation, payments.colocation, "colocated with payments: {table:?}");
            }
        }
    }
    // Nothing a single node has is lost on the way: the same foreign keys, the same view.
    let single = TestDatabase::create().await;
    let (single_tables, single_keys, single_views) = schema(&single.url).await;
    assert_eq!((tables.clone(), keys.clone(), views.clone()), (single_tables, single_keys, single_views));

    (placed, (tables, keys, views))
}

#[tokio::test]
async fn on_citus_the_schema_distributes_by_account_colocated_and_a_second_run_changes_nothing() {
    let Some(citus) = CitusDatabase::create("on_citus_the_schema_distributes_by_account_colocated").await else {
        return;
    };
    let (code, output) = migrate_distribute(&citus.url).await;
    assert_eq!(code, Some(0), "{output}");
    assert!(output.contains("distributed payments: by account_id"), "{output}");

    let (placed, (tables, keys, views)) = distributed_as_on_one_node(&citus.url).await;
    // Every shard can take the inserts run on its node (see db::delegate).
    let mut conn = AsyncPgConnection::establish(&citus.url).await.unwrap();
    let defaults: Option<String> = diesel::select(diesel::dsl::sql::<diesel::sql_types::Nullable<Text>>(
        "string_agg(DISTINCT r.result, ', ') FROM pg_dist_partition p JOIN pg_attribute a ON a.attrelid = p.logicalrelid,
              run_command_on_shards(p.logicalrelid, format(
                  'SELECT count(*) FROM pg_attrdef d JOIN pg_attribute s ON s.attrelid = d.adrelid AND s.attnum = d.adnum
                   WHERE d.adrelid = ''%%s''::regclass AND s.attname = %L', a.attname)) r
         WHERE p.partmethod = 'h' AND a.attidentity <> ''",
    ))
    .get_result(&mut conn)
    .await
    .unwrap();
    assert_eq!(defaults.as_deref(), Some("1"), "each identity column of each shard has one default");

    // Again: nothing to do, and nothing changes.
    let (code, output) = migrate_distribute(&citus.url).await;
    assert_eq!(code, Some(0), "{output}");
    assert!(output.contains("every table was distributed already"), "{output}");
    assert_eq!(placement(&citus.url).await, placed);
    assert_eq!(schema(&citus.url).await, (tables, keys, views));
}

#[tokio::test]
async fn distributing_without_citus_refuses_and_changes_nothing() {
    let database = TestDatabase::empty().await;
    let (code, output) = migrate_distribute(&database.url).await;
    assert_ne!(code, Some(0), "{output}");
    assert!(output.contains("no `citus` extension") && output.contains("nothing was changed"), "{output}");
    let (tables, keys, views) = schema(&database.url).await;
    assert!(tables.is_empty() && keys.is_empty() && views.is_empty(), "no migration ran: {tables:?}");
}

/// A table in neither of `db/tables.rs`' lists (`BY_ACCOUNT`, the reference tables) could be
/// named unmarked by a statement that runs under a key: distributing refuses it, by name, and
/// distributes nothing.
#[tokio::test]
async fn on_citus_a_table_in_neither_list_is_refused_by_name_and_nothing_is_distributed() {
    let Some(citus) = CitusDatabase::create("on_citus_a_table_in_neither_list").await else { return };
    payments_service::db::migrate::run_pending(&citus.url).await.unwrap();
    let mut conn = AsyncPgConnection::establish(&citus.url).await.unwrap();
    conn.batch_execute("CREATE TABLE strays (account_id uuid NOT NULL)").await.unwrap();

    let (code, output) = migrate_distribute(&citus.url).await;
    assert_ne!(code, Some(0), "{output}");
    assert!(output.contains("the table `strays` is in neither list"), "{output}");
    assert_eq!(placement(&citus.url).await, Vec::<Placed>::new(), "nothing distributed");
}

#[tokio::test]
async fn on_citus_a_payment_is_made_replayed_refused_for_another_body_and_refunded() {
    let Some(citus) = CitusDatabase::create("on_citus_a_payment_is_made_replayed").await else { return };
    // The server migrates and distributes the schema itself before it listens.
    let gateway = Process::gateway().await;
    let server = Process::serve(&citus.url, &gateway.url, &["--no-workers"], &[("PAYMENTS_DISTRIBUTE", "1")]).await;
    let placed = placement(&citus.url).await;
    assert!(placed.iter().any(|table| table.table_name == "payments" && table.kind == "distributed"), "{placed:?}");
    let mut conn = AsyncPgConnection::establish(&citus.url).await.unwrap();
    let (_, api_key) = payments_service::accounts::create(&mut conn, "on citus").await.unwrap();
    let http = reqwest::Client::new();
    let post = |path: &str, key: &str, body: &Value| {
        let request = http.post(format!("{}{path}", server.url)).bearer_auth(&api_key).header("Idempotency-Key", key);
        request.json(body).send()
    };
    let (key, body) = (new_key(), json!({ "amount": 5000, "currency": "usd", "source": "tok_visa" }));
    let made = post("/v1/payments", &key, &body).await.unwrap();
    assert_eq!(made.status(), StatusCode::CREATED);
    let made = made.bytes().await.unwrap();
    let replayed = post("/v1/payments", &key, &body).await.unwrap();
    assert_eq!((replayed.status(), replayed.bytes().await.unwrap()), (StatusCode::CREATED, made.clone()));
    let other = post("/v1/payments", &key, &json!({ "amount": 6000, "currency": "usd", "source": "tok_visa" }));
    assert_eq!(other.await.unwrap().status(), StatusCode::UNPROCESSABLE_ENTITY);
    let payment: Value = serde_json::from_slice(&made).unwrap();
    let refund = post("/v1/refunds", &new_key(), &json!({ "payment": payment["id"], "amount": 2000 })).await.unwrap();
    assert_eq!(refund.status(), StatusCode::CREATED);
    let stats = GatewayControl::new(&gateway.url).all_stats().await;
    assert_eq!((&stats["charges"], &stats["refunds"]), (&json!(1), &json!(1)), "{stats}");
}

/// A distributed database and an app on it (its workers run only when a test runs them).
async fn app_on_citus(test: &str) -> Option<(CitusDatabase, TestApp)> {
    app_on_citus_keeping_keys(test, payments_service::config::Settings::default().key_retention).await
}

/// [`app_on_citus`], its keys kept `retention`.
async fn app_on_citus_keeping_keys(test: &str, retention: std::time::Duration) -> Option<(CitusDatabase, TestApp)> {
    let (citus, database) = distributed(test).await?;
    let app = TestApp::builder()
        .gateway_timeout(std::time::Duration::from_millis(500))
        .key_retention(retention)
        .workers(|w| w.completer_backoff = std::time::Duration::ZERO);
    Some((citus, app.spawn_on(database).await))
}

/// How many times the statements that name `run_on_shard` ran in `url`'s database since its
/// statistics were reset.
async fn delegated_calls(url: &str) -> i64 {
    #[derive(QueryableByName)]
    struct Calls {
        #[diesel(sql_type = BigInt)]
        calls: i64,
    }
    let mut conn = AsyncPgConnection::establish(url).await.unwrap();
    let counted: Calls = diesel::sql_query(
        "SELECT coalesce(sum(calls), 0)::bigint AS calls FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND query LIKE '%run_on_shard(%'",
    )
    .get_result(&mut conn)
    .await
    .unwrap();
    counted.calls
}

/// The URL of the node that holds `account_id`'s shards, as the coordinator's catalog gives it:
/// `coordinator_url` (`host=... port=...`) with that node's port.
async fn account_node_url(
    coordinator_url: &str,
    coordinator: &mut AsyncPgConnection,
    account_id: uuid::Uuid,
) -> String {
    #[derive(QueryableByName)]
    struct Port {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        nodeport: i32,
    }
    let node: Port = diesel::sql_query(
        "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n ON n.groupid = p.groupid
         WHERE p.shardid = get_shard_id_for_distribution_column('idempotency_keys', $1)",
    )
    .bind::<diesel::sql_types::Uuid, _>(account_id)
    .get_result(coordinator)
    .await
    .unwrap();
    let parts: Vec<String> = coordinator_url
        .split(' ')
        .map(|part| match part.starts_with("port=") {
            true => format!("port={}", node.nodeport),
            false => part.to_owned(),
        })
        .collect();
    parts.join(" ")
}

#[tokio::test]
async fn on_citus_a_keys_statements_go_straight_to_its_accounts_node_never_through_the_coordinator() {
    let Some((citus, app)) = app_on_citus("on_citus_a_keys_statements_go_straight").await else { return };
    let mut coordinator = AsyncPgConnection::establish(&citus.url).await.unwrap();
    coordinator.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await.unwrap();
    let node_url = account_node_url(&citus.url, &mut coordinator, app.account_id).await;
    for url in [&citus.url, &node_url] {
        let mut conn = AsyncPgConnection::establish(url).await.unwrap();
        conn.batch_execute("SELECT pg_stat_statements_reset()").await.unwrap();
    }

    let payment: Value = app.post_payment(&new_key(), &crate::helpers::payment_body()).await.json().await.unwrap();
    let refund = app.post_refund(&new_key(), &json!({ "payment": payment["id"], "amount": 100 })).await;
    assert_eq!(refund.status(), StatusCode::CREATED);

    // Two statements a request at least (the claim with its first phase, and the last phase):
    // each ran on the account's node, called there by the service, and none on the coordinator.
    assert_eq!(delegated_calls(&citus.url).await, 0, "calls through the coordinator");
    let straight = delegated_calls(&node_url).await;
    assert!(straight >= 4, "{straight} calls on the account's node");
}

/// The switch that turns straight routing off (`PAYMENTS_CITUS_STRAIGHT_TO_WORKERS=false`): a
/// `serve` that has it sends every call through the coordinator, which passes it on.
#[tokio::test]
async fn on_citus_straight_routing_turned_off_sends_a_keys_statements_through_the_coordinator() {
    let Some(citus) = CitusDatabase::create("on_citus_straight_routing_turned_off").await else { return };
    let gateway = Process::gateway().await;
    let env = [("PAYMENTS_DISTRIBUTE", "1"), ("PAYMENTS_CITUS_STRAIGHT_TO_WORKERS", "false")];
    let server = Process::serve(&citus.url, &gateway.url, &["--no-workers"], &env).await;
    let mut coordinator = AsyncPgConnection::establish(&citus.url).await.unwrap();
    coordinator.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await.unwrap();
    let (_, api_key) = payments_service::accounts::create(&mut coordinator, "through the coordinator").await.unwrap();
    coordinator.batch_execute("SELECT pg_stat_statements_reset()").await.unwrap();

    let paid = reqwest::Client::new()
        .post(format!("{}/v1/payments", server.url))
        .bearer_auth(&api_key)
        .header("Idempotency-Key", new_key())
        .json(&crate::helpers::payment_body())
        .send()
        .await
        .unwrap();
    assert_eq!(paid.status(), StatusCode::CREATED);

    // The claim with its first phase, and the last phase: both through the coordinator.
    let through = delegated_calls(&citus.url).await;
    assert!(through >= 2, "{through} calls through the coordinator");
}

#[tokio::test]
async fn on_citus_a_late_retry_of_an_expired_key_is_410_naming_its_payment_before_and_after_the_reaper() {
    let retention = std::time::Duration::from_secs(2);
    let Some((_turn, app)) = app_on_citus_keeping_keys("on_citus_a_late_retry_of_an_expired_key", retention).await
    else {
        return;
    };
    let key = new_key();
    let payment: Value = app.post_payment(&key, &crate::helpers::payment_body()).await.json().await.unwrap();
    crate::helpers::wait_until(std::time::Duration::from_secs(10), "the key expired", || app.key_has_expired(&key))
        .await;
    let late = async || {
        let late = app.post_payment(&key, &crate::helpers::payment_body()).await;
        assert_eq!(late.status(), StatusCode::GONE);
        let problem: Value = late.json().await.unwrap();
        assert_eq!(problem["type"], "https://payments.example/problems/idempotency-key-expired");
        assert_eq!(problem["payment"]["id"], payment["id"]);
    };
    // Answered by the claim from the key's row, then, once the reaper deleted it, from the payment.
    late().await;
    // Counted as one reaped key (the reaper's metric), though Citus ran its statement as steps.
    let retention = payments_service::config::Settings::default().key_retention;
    let reaped = payments_service::idempotency::reap_finished(&mut app.db().await, retention, 10).await.unwrap();
    assert_eq!(reaped, 1);
    assert!(app.key_row(&key).await.is_none(), "reaped");
    late().await;
    assert_eq!(app.gateway.all_stats().await["charges"], 1);
}

#[tokio::test]
async fn on_citus_a_keys_story_tells_what_the_node_and_the_coordinator_wrote_in_the_order_it_happened() {
    let Some((_turn, app)) = app_on_citus("on_citus_a_keys_story_in_order").await else { return };
    let (key, body) = (new_key(), crate::helpers::payment_body());
    app.gateway.fault("error_after", 1).await;
    assert_eq!(app.post_payment(&key, &body).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(app.post_payment(&key, &body).await.status(), StatusCode::CREATED);
    // The claim and the phases are written on the account's node, the release through the
    // coordinator: each numbers its records from a range of its own.
    let story: Value = app.key_story(&key).await.json().await.unwrap();
    assert_eq!(crate::key_story::actions(&story), crate::key_story::ERROR_AFTER_TRAIL);
}

#[tokio::test]
async fn on_citus_an_accounts_payments_list_newest_first_after_its_shards_move_to_a_node_of_a_lower_range() {
    let Some((_turn, app)) = app_on_citus("on_citus_payments_list_newest_first_after_a_move").await else { return };
    let pay = async || -> String {
        let paid = app.post_payment(&new_key(), &crate::helpers::payment_body()).await;
        assert_eq!(paid.status(), StatusCode::CREATED);
        paid.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned()
    };
    let mut made = vec![pay().await];
    let account: String = diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>("account_id::text FROM payments"))
        .get_result(&mut app.db().await)
        .await
        .unwrap();
    // Each node numbers what it writes from a range of its own, the second above the first: the
    // account's shards go to the second node, take a payment there, and come back to the first.
    for group in [2, 1] {
        let moved = format!(
            "SELECT citus_move_shard_placement(p.shardid, here.nodename, here.nodeport, there.nodename,
                                               there.nodeport, shard_transfer_mode => 'block_writes')
             FROM pg_dist_placement p, pg_dist_node here, pg_dist_node there
             WHERE p.shardid = get_shard_id_for_distribution_column('payments', '{account}'::uuid)
               AND here.groupid = p.groupid AND there.groupid = {group} AND here.groupid <> {group}"
        );
        app.run_sql(&moved).await;
        made.push(pay().await);
    }
    let listed: Value = app.get("/v1/payments?limit=10").await.json().await.unwrap();
    let listed: Vec<&str> = listed["data"].as_array().unwrap().iter().map(|p| p["id"].as_str().unwrap()).collect();
    made.reverse();
    assert_eq!(listed, made, "newest first");
}

#[tokio::test]
async fn on_citus_the_completer_finishes_a_payment_its_client_left() {
    let Some((_turn, app)) = app_on_citus("on_citus_the_completer_finishes").await else { return };
    let (key, body) = (new_key(), crate::helpers::payment_body());
    app.gateway.fault("error_after", 1).await;
    assert_eq!(app.post_payment(&key, &body).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    let completer = app.workers().completer;
    assert_eq!(completer.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(completer.run_once().await.unwrap(), Outcome::Idle);
    let replay = app.post_payment(&key, &body).await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(app.gateway.all_stats().await["charges"], 1, "charged once: the look-up found it");
}

/// The completer's choice of the keys it can drive reads what each key made, on the key's own
/// shard: a key made at another gateway is left alone, and given up on for a person once nobody
/// has run it for long.
#[tokio::test]
async fn on_citus_the_completer_leaves_a_key_made_at_another_gateway_and_gives_up_on_it_once_nobody_runs_it() {
    let Some((_turn, app)) = app_on_citus("on_citus_the_completer_leaves_a_key_made_elsewhere").await else { return };
    let (key, body) = (new_key(), crate::helpers::payment_body());
    app.gateway.fault("error_after", 1).await;
    assert_eq!(app.post_payment(&key, &body).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    app.run_sql(&format!("UPDATE payments SET gateway = 'acct_elsewhere' WHERE idempotency_key = '{key}'")).await;
    let completer = app.workers().completer;

    assert_eq!(completer.run_once().await.unwrap(), Outcome::Idle);
    let ago = payments_service::idempotency::STRANDED_AFTER.as_secs() + 60;
    app.run_sql(&format!("UPDATE idempotency_keys SET last_run_at = now() - interval '{ago} seconds'")).await;
    assert_eq!(completer.run_once().await.unwrap(), Outcome::Worked);

    let given_up = "SELECT needs_attention_at IS NOT NULL AND completer_attempts = 0
                           AND attention_reason LIKE '%acct_elsewhere%' FROM idempotency_keys";
    assert!(app.database_says(given_up).await);
    assert_eq!(app.gateway.stats().await.look_ups, 0, "never looked up at a gateway that does not hold it");
}

#[tokio::test]
async fn on_citus_every_worker_takes_its_work_one_account_at_a_time() {
    let Some((_turn, app)) = app_on_citus("on_citus_every_worker_takes_its_work").await else { return };
    // A payment with a refund the gateway leaves pending (the settler's), an authorization left
    // past its time (the lapse's), and the events both stage (the outbox's).
    let paid: Value = app
        .post_payment(&new_key(), &json!({ "amount": 5000, "currency": "usd", "source": "tok_refundPending" }))
        .await
        .json()
        .await
        .unwrap();
    let refund = app.post_refund(&new_key(), &json!({ "payment": paid["id"], "amount": 1000 })).await;
    assert_eq!(refund.status(), StatusCode::CREATED);
    let authorized = app
        .post_payment(&new_key(), &json!({ "amount": 3000, "currency": "usd", "source": "tok_visa", "capture": false }))
        .await;
    let authorized: Value = authorized.json().await.unwrap();
    let id = authorized["id"].as_str().unwrap();
    app.run_sql(&format!("UPDATE open_authorizations SET capture_before = now() WHERE payment_id = '{id}'")).await;
    app.run_sql(&format!("UPDATE payments SET capture_before = now() WHERE id = '{id}'")).await;
    app.gateway.settle_refunds().await;
    app.run_sql("UPDATE refunds SET settle_at = now()").await;

    let workers = app.workers();
    assert_eq!(workers.settler.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(workers.lapser.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(workers.outbox.run_once().await.unwrap(), Outcome::Worked);
    workers.reaper.run_once().await.unwrap();
    workers.analyzer.run_once().await.unwrap();
    let refunded: Value =
        app.get(&format!("/v1/payments/{}", paid["id"].as_str().unwrap())).await.json().await.unwrap();
    assert_eq!(refunded["amount_refunded"], 1000, "settled: {refunded}");
    let lapsed: Value = app.get(&format!("/v1/payments/{id}")).await.json().await.unwrap();
    assert_eq!((&lapsed["status"], &lapsed["cancellation_reason"]), (&json!("canceled"), &json!("expired")));
    let left = "(SELECT count(*) = 0 FROM staged_jobs WHERE leased_until IS NULL AND dead_at IS NULL)";
    assert!(app.database_says(left).await, "every event taken by the outbox");
}

#[tokio::test]
async fn on_citus_one_new_key_sent_thirty_times_at_once_over_two_servers_is_never_410_and_charged_once() {
    let Some(citus) = CitusDatabase::create("on_citus_one_new_key_sent_thirty_times").await else { return };
    let gateway = Process::gateway().await;
    // The charge held at the gateway while the other 29 requests are answered, and long gateway
    // timeouts (and leases to match), so that it still is answered then.
    let proxy = HeldProxy::holding(&gateway.url, HeldProxy::charges);
    let held = [("PAYMENTS_GATEWAY_TIMEOUT_MS", "60000"), ("PAYMENTS_LOCK_TIMEOUT_MS", "200000")];
    let env = [[("PAYMENTS_DISTRIBUTE", "1")].as_slice(), &held].concat();
    let first = Process::serve(&citus.url, &proxy.url, &["--no-workers"], &env).await;
    let second = Process::serve(&citus.url, &proxy.url, &["--no-workers"], &held).await;
    let mut conn = AsyncPgConnection::establish(&citus.url).await.unwrap();
    let (_, api_key) = payments_service::accounts::create(&mut conn, "racing on citus").await.unwrap();
    let http = reqwest::Client::new();
    for round in 0..4 {
        let (key, body) = (new_key(), json!({ "amount": 5000, "currency": "usd", "source": "tok_visa" }));
        let sent = (0..30).map(|n| {
            let server = if n % 2 == 0 { &first } else { &second };
            let request = http.post(format!("{}/v1/payments", server.url)).bearer_auth(&api_key);
            let sent = request.header("Idempotency-Key", &key).json(&body).send();
            async move { sent.await.unwrap().status().as_u16() }
        });
        let race = proxy.race(sent.collect()).await;
        let statuses = &race.statuses;
        // On a loaded machine a step may run out of time, and the service fails closed (503);
        // what must never come is a 410 for a key still in flight.
        assert!(statuses.iter().all(|status| [201, 409, 503].contains(status)), "round {round}: {race:?}");
        // At most one charge went out, and the race itself was decided: a request answered while
        // it was in flight found the key taken (`409`), or the one that took it made the payment.
        assert!(race.calls <= 1, "round {round}: {race:?}");
        let decided = race.while_held.contains(&409) || statuses.contains(&201);
        assert!(decided, "round {round}: no answer came from the race itself, every one failed closed: {race:?}");
        // A charge not made yet (its request failed closed before it) is let through when asked again.
        proxy.release(1 - race.calls);
        // Asked again while it is in flight or failed closed, the key ends as one payment.
        let asked = || async {
            let request = http.post(format!("{}/v1/payments", first.url)).bearer_auth(&api_key);
            let status = request.header("Idempotency-Key", &key).json(&body).send().await.unwrap().status();
            assert!([201, 409, 503].contains(&status.as_u16()), "round {round}, asked again: {status}");
            status == StatusCode::CREATED
        };
        crate::helpers::wait_until(std::time::Duration::from_secs(60), "the key answers 201", asked).await;
    }
    let stats = GatewayControl::new(&gateway.url).all_stats().await;
    assert_eq!(stats["charges"], 4, "one charge a key: {stats}");
}

#[tokio::test]
async fn on_citus_serve_with_workers_starts_a_coordinator_and_workers_and_pays_on_them() {
    let Some(_turn) = CitusDatabase::turn("on_citus_serve_with_workers").await else { return };
    let data = std::env::temp_dir().join(format!("payments-citus-serve-{}", uuid::Uuid::new_v4().simple()));
    let data_dir = data.to_str().unwrap();
    let server = Process::serve_with(&["serve", "--citus-workers", "2", "--data-dir", data_dir], &[]).await;
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/payments", server.url))
        .bearer_auth(payments_service::accounts::DEMO_API_KEY)
        .header("Idempotency-Key", new_key())
        .json(&json!({ "amount": 1000, "currency": "usd", "source": "tok_visa" }))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    // The coordinator (its port kept beside its data) holds the schema, distributed.
    let port = std::fs::read_to_string(data.join("citus/node-0/port")).unwrap();
    let placed = placement(&format!("host=127.0.0.1 port={} user=postgres dbname=payments", port.trim())).await;
    assert!(placed.iter().any(|table| table.table_name == "payments" && table.kind == "distributed"), "{placed:?}");
    for worker in ["node-1", "node-2"] {
        assert!(data.join("citus").join(worker).join("data/PG_VERSION").exists(), "{worker}");
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&data);
}

/// Processes killed and paused, worker nodes crashed, crash points, gateway faults and
/// misdelivered events, on Citus.
#[tokio::test]
async fn on_citus_chaos_kills_crashes_and_faults_and_every_invariant_holds() {
    let Some(_turn) = CitusDatabase::turn("on_citus_chaos").await else { return };
    let mut command = Command::new(env!("CARGO_BIN_EXE_payments"));
    command.args(["chaos", "--citus-workers", "2", "--keys", "50"]).env("RUST_BACKTRACE", "0");
    let output = command.output().await.unwrap();
    let table = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{table}\n{}", String::from_utf8_lossy(&output.stderr));
    crate::chaos::every_invariant_held(&table);
    // The storm happened on the distributed database too, its workers crashed and started again.
    let rows =
        ["kills (SIGKILL)", "Citus workers crashed", "gateway faults", "captures and cancels (keys)", "refunds (keys)"];
    for row in rows {
        assert!(crate::chaos::count(&table, row) > 0, "{row}: {table}");
    }
}

#[tokio::test]
async fn on_citus_captures_cancels_and_refunds_racing_over_two_servers_keep_the_money_rules() {
    use crate::captures::{HELD_CHANGES_ENV, one_change_wins_while_it_is_in_flight};
    let Some(citus) = CitusDatabase::create("on_citus_captures_cancels_and_refunds_racing").await else { return };
    let gateway = Process::gateway().await;
    let proxy = HeldProxy::holding(&gateway.url, HeldProxy::changes);
    let env = [[("PAYMENTS_DISTRIBUTE", "1")].as_slice(), &HELD_CHANGES_ENV].concat();
    let servers = [
        Process::serve(&citus.url, &proxy.url, &["--no-workers"], &env).await,
        Process::serve(&citus.url, &proxy.url, &["--no-workers"], &HELD_CHANGES_ENV).await,
    ];
    let mut conn = AsyncPgConnection::establish(&citus.url).await.unwrap();
    let (_, api_key) = payments_service::accounts::create(&mut conn, "racing money on citus").await.unwrap();
    let http = reqwest::Client::new();
    // Each request under a key of its own, sent again with it while it is answered 503 or 409, as
    // a client does: on a loaded machine a step of a statement may run out of time, and the
    // service fails closed. What the money rules hold is the final answers.
    let post = async |server: &Process, path: String, body: Value| -> reqwest::Result<reqwest::Response> {
        let key = new_key();
        let mut attempts = 0;
        loop {
            let request = http.post(format!("{}{path}", server.url)).bearer_auth(&api_key);
            let answer = request.header("Idempotency-Key", &key).json(&body).send().await?;
            let again = [StatusCode::SERVICE_UNAVAILABLE, StatusCode::CONFLICT].contains(&answer.status());
            attempts += 1;
            if !again || attempts == 30 {
                return Ok(answer);
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    };
    let control = GatewayControl::new(&gateway.url);
    for round in 0..3 {
        // Twelve captures and cancels of one authorization at once, the first to reach the gateway
        // held there: exactly one wins.
        let body = json!({ "amount": 5000, "currency": "usd", "source": "tok_visa", "capture": false });
        let authorized: Value = post(&servers[0], "/v1/payments".into(), body).await.unwrap().json().await.unwrap();
        let id = authorized["id"].as_str().unwrap().to_owned();
        let change = |n: usize, action: &str| {
            let sent = post(&servers[n % 2], format!("/v1/payments/{id}/{action}"), json!({}));
            async move { sent.await.unwrap().status().as_u16() }
        };
        one_change_wins_while_it_is_in_flight(&proxy, &control, round, change).await;

        // Eight refunds of 1,000 at once of a payment of 5,000: five fit, three are refused.
        let body = json!({ "amount": 5000, "currency": "usd", "source": "tok_visa" });
        let paid: Value = post(&servers[1], "/v1/payments".into(), body).await.unwrap().json().await.unwrap();
        let refunds = (0..8)
            .map(|n| post(&servers[n % 2], "/v1/refunds".into(), json!({ "payment": paid["id"], "amount": 1000 })));
        let statuses = statuses_of(refunds).await;
        assert_eq!(statuses.iter().filter(|&&status| status == 201).count(), 5, "round {round}: {statuses:?}");
        assert_eq!(statuses.iter().filter(|&&status| status == 400).count(), 3, "round {round}: {statuses:?}");
    }
    let stats = control.all_stats().await;
    assert_eq!(stats["captures"].as_u64().unwrap() + stats["cancels"].as_u64().unwrap(), 3, "{stats}");
    assert_eq!(stats["refunds"], 15, "{stats}");
}

#[tokio::test]
async fn on_citus_a_payment_whose_answer_was_lost_is_finished_by_its_retry_charged_once() {
    let Some((_turn, app)) = app_on_citus("on_citus_a_payment_whose_answer_was_lost").await else { return };
    for fault in ["error_after", "timeout_after"] {
        let (key, body) = (new_key(), crate::helpers::payment_body());
        app.gateway.fault(fault, 1).await;
        assert_eq!(app.post_payment(&key, &body).await.status(), StatusCode::SERVICE_UNAVAILABLE, "{fault}");
        let retried = app.post_payment(&key, &body).await;
        assert_eq!(retried.status(), StatusCode::CREATED, "{fault}");
    }
    assert_eq!(app.gateway.all_stats().await["charges"], 2, "each charged once: the look-up found it");
}

#[derive(QueryableByName, Debug, PartialEq, Eq, Clone, Copy)]
struct Executions {
    #[diesel(sql_type = BigInt)]
    single_shard: i64,
    #[diesel(sql_type = BigInt)]
    multi_shard: i64,
}

/// How many distributed executions the coordinator ran for this database so far, by whether each
/// went to one shard or several (Citus's own counters, on for the database).
async fn executions(conn: &mut AsyncPgConnection) -> Executions {
    diesel::sql_query(
        "SELECT query_execution_single_shard AS single_shard, query_execution_multi_shard AS multi_shard
             FROM citus_stat_counters WHERE name = current_database()",
    )
    .get_result(conn)
    .await
    .unwrap()
}

#[tokio::test]
async fn on_citus_each_statement_of_a_request_runs_on_the_accounts_shard_alone() {
    use crate::round_trips::{STATEMENTS_PER_PAYMENT, STATEMENTS_PER_REFUND};
    let Some(citus) = CitusDatabase::create("on_citus_each_statement_goes_to_one_shard").await else { return };
    let (code, output) = migrate_distribute(&citus.url).await;
    assert_eq!(code, Some(0), "{output}");
    let mut conn = AsyncPgConnection::establish(&citus.url).await.unwrap();
    conn.batch_execute(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET citus.enable_stat_counters = on', current_database()); END $$",
    )
    .await
    .unwrap();
    conn.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await.unwrap();
    let (account, api_key) = payments_service::accounts::create(&mut conn, "routed").await.unwrap();
    let node_url = account_node_url(&citus.url, &mut conn, account.id).await;
    let gateway = Process::gateway().await;
    // No workers: every statement counted is a request's.
    let server = Process::serve(&citus.url, &gateway.url, &["--no-workers"], &[]).await;
    let http = reqwest::Client::new();
    let pay = || async {
        let body = json!({ "amount": 5000, "currency": "usd", "source": "tok_visa" });
        let request = http.post(format!("{}/v1/payments", server.url)).bearer_auth(&api_key);
        let answer = request.header("Idempotency-Key", new_key()).json(&body).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::CREATED);
        answer.json::<Value>().await.unwrap()
    };
    // The first payment authenticates and asks the gateway who it is: not counted.
    pay().await;
    let mut counters = AsyncPgConnection::establish(&citus.url).await.unwrap();
    let before = executions(&mut counters).await;
    let called_before = delegated_calls(&node_url).await;

    const PAYMENTS: usize = 4;
    for _ in 0..PAYMENTS {
        let payment = pay().await;
        let path = format!("{}/v1/payments/{}", server.url, payment["id"].as_str().unwrap());
        let looked_up = http.get(&path).bearer_auth(&api_key).send().await.unwrap();
        assert_eq!(looked_up.status(), StatusCode::OK);
        let refund = http.post(format!("{}/v1/refunds", server.url)).bearer_auth(&api_key);
        let body = json!({ "payment": payment["id"], "amount": 1000 });
        let refund = refund.header("Idempotency-Key", new_key()).json(&body).send().await.unwrap();
        assert_eq!(refund.status(), StatusCode::CREATED);
    }

    // Every statement ran on the account's shard alone, none on several. The claim and every
    // phase go straight to the account's node, which runs them against its shards (see
    // docs/performance.md): the coordinator executed only the look-ups, one each, and the node
    // was called once per claim and phase.
    let after = executions(&mut counters).await;
    let ran = Executions {
        single_shard: after.single_shard - before.single_shard,
        multi_shard: after.multi_shard - before.multi_shard,
    };
    assert_eq!(ran.multi_shard, 0, "{ran:?}");
    assert_eq!(ran.single_shard, PAYMENTS as i64, "one execution per look-up: {ran:?}");
    let called = delegated_calls(&node_url).await - called_before;
    let statements = (PAYMENTS * (STATEMENTS_PER_PAYMENT + STATEMENTS_PER_REFUND)) as i64;
    assert_eq!(called, statements, "one call per claim and phase");
}

/// The migrations that came after the schema first ran on Citus: authorize-then-capture's, which
/// add columns and checks to `payments` and new tables, and the audit records' new default.
const LATER_MIGRATIONS: usize = 4;

#[tokio::test]
async fn on_citus_later_migrations_apply_to_the_distributed_schema_and_what_they_add_is_distributed() {
    let Some(citus) = CitusDatabase::create("on_citus_later_migrations_apply").await else { return };
    // The schema as it stood before the later migrations, distributed.
    let url = citus.url.clone();
    let applied = tokio::task::spawn_blocking(move || {
        use diesel_migrations::MigrationHarness as _;
        let mut conn: AsyncConnectionWrapper<AsyncPgConnection> = diesel::Connection::establish(&url).unwrap();
        let all = conn.pending_migrations(MIGRATIONS).unwrap().len();
        for _ in 0..all - LATER_MIGRATIONS {
            conn.run_next_migration(MIGRATIONS).unwrap();
        }
        all
    })
    .await
    .unwrap();
    let mut conn = AsyncPgConnection::establish(&citus.url).await.unwrap();
    payments_service::db::distribute::distribute(&mut conn).await.unwrap();

    // The rest, as `payments migrate --distribute` applies them: they run on the distributed
    // tables, and what they made is distributed too.
    let (code, output) = migrate_distribute(&citus.url).await;
    assert_eq!(code, Some(0), "{output}");
    let versions: i64 = diesel::sql_query("SELECT count(*) AS count FROM __diesel_schema_migrations")
        .get_result::<Count>(&mut conn)
        .await
        .unwrap()
        .count;
    assert_eq!(versions as usize, applied);
    distributed_as_on_one_node(&citus.url).await;
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    count: i64,
}

/// The statuses of requests sent all at once, in order.
async fn statuses_of(
    requests: impl IntoIterator<Item = impl Future<Output = reqwest::Result<reqwest::Response>>>,
) -> Vec<u16> {
    let answers = futures_util::future::join_all(requests).await;
    answers.into_iter().map(|answer| answer.unwrap().status().as_u16()).collect()
}

/// A distributed database of one test's own (and the test's turn), and it as a [`TestDatabase`]
/// that leaves it be.
async fn distributed(test: &str) -> Option<(CitusDatabase, TestDatabase)> {
    let citus = CitusDatabase::create(test).await?;
    let (code, output) = migrate_distribute(&citus.url).await;
    assert_eq!(code, Some(0), "{output}");
    let database = TestDatabase::elsewhere(&citus.url);
    Some((citus, database))
}

#[tokio::test]
async fn on_citus_a_payment_that_crashed_its_process_after_the_charge_is_recovered_by_the_retry_charged_once() {
    use crate::crash_recovery::{Crashed, recovered_by_the_retry};
    let Some((_turn, database)) = distributed("on_citus_a_payment_that_crashed_recovered_by_the_retry").await else {
        return;
    };
    recovered_by_the_retry(Crashed::of_in(database, "/v1/payments", "after_charge", true).await).await;
}

#[tokio::test]
async fn on_citus_a_refund_that_crashed_its_process_is_finished_by_the_completer_refunded_once() {
    use crate::crash_recovery::{Crashed, completed};
    let Some((_turn, database)) = distributed("on_citus_a_refund_that_crashed_finished_by_the_completer").await else {
        return;
    };
    let crashed = Crashed::resumed_in(database, "/v1/refunds", "after_refund", "after_refund_created").await;
    completed(crashed, "after_refund_created").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_citus_the_same_gateway_event_fifty_times_at_once_over_two_servers_is_applied_once() {
    let Some((_turn, database)) = distributed("on_citus_the_same_gateway_event_fifty_times").await else { return };
    crate::gateway_events::fifty_times_at_once_over_two_servers(database).await;
}

/// `payments attention retry KEY_ID [--gateway ID]` on Citus, where a row lock is refused in a
/// statement that spans shards: the command finds the key's account first, and then locks and
/// writes by account and id, each statement on the account's shard. A payment stranded on a
/// gateway that is gone is recorded at the one answering now and handed back, and the completer
/// charges it there, once; a refund, with its payment, the same way; and a key a worker gave up
/// on is handed back as it is.
#[tokio::test]
async fn on_citus_an_operator_hands_back_a_key_needing_attention_with_or_without_another_gateway() {
    let Some((_turn, database)) = distributed("on_citus_attention_retry").await else { return };
    let app = TestApp::builder()
        .workers(|w| {
            w.completer_backoff = std::time::Duration::ZERO;
            w.completer_max_attempts = 1;
        })
        .spawn_on(database)
        .await;
    let attention_retry = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_payments"));
        command.args(["attention", "retry"]).args(args).env_remove("DATABASE_URL");
        command.env("DATABASE_URL", &app.database.url).output()
    };
    let needing_attention = async || {
        payments_service::idempotency::needing_attention(&mut app.db().await, &payments_service::endpoints::all())
            .await
            .unwrap()
    };

    // A payment left at `started` by a run that recorded a gateway that is gone: given up on.
    let (key, body) = (new_key(), crate::helpers::payment_body());
    let key_id = app.seed_key(&key, &body, "started", crate::helpers::Lock::Free).await;
    let payment_id = app.seed_payment(key_id, &key, "pending", None).await;
    app.run_sql(&format!(
        "UPDATE payments SET gateway = 'acct_gone' WHERE account_id = '{}' AND id = '{payment_id}'",
        app.account_id
    ))
    .await;
    // No process reaches that gateway: once nobody has run the key for long, it is given up on.
    stranded_long_ago(&app, key_id).await;
    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(needing_attention().await.len(), 1);

    let now_answering = app.gateway_id().await;
    let mut conn = AsyncPgConnection::establish(&app.database.url).await.unwrap();
    let before = executions(&mut conn).await;
    let retried = attention_retry(&[&key_id.to_string(), "--gateway", &now_answering]).await.unwrap();
    assert!(retried.status.success(), "{}", String::from_utf8_lossy(&retried.stderr));
    // One statement asked every shard: the look-up of the key's account, which locks nothing.
    let after = executions(&mut conn).await;
    assert_eq!(after.multi_shard - before.multi_shard, 1, "{before:?} then {after:?}");
    assert!(needing_attention().await.is_empty());
    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(app.post_payment(&key, &body).await.status(), StatusCode::CREATED);
    assert_eq!(app.gateway.all_stats().await["charges"], 1, "charged once, where it is now recorded");

    // A refund of a payment whose recorded gateway is wrong: the refund and its payment are
    // recorded at the one answering now, and the refund is made there.
    let paid = app.paid(1000, "tok_visa").await;
    let id = paid["id"].as_str().unwrap();
    app.run_sql(&format!(
        "UPDATE payments SET gateway = 'acct_wrong' WHERE account_id = '{}' AND id = '{id}'",
        app.account_id
    ))
    .await;
    let (refund_key, refund) = (new_key(), json!({ "payment": id, "amount": 400 }));
    assert_eq!(app.post_refund(&refund_key, &refund).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    let refund_key_id = app.key_row(&refund_key).await.unwrap().id;
    stranded_long_ago(&app, refund_key_id).await;
    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Worked);
    assert_eq!(needing_attention().await.iter().map(|key| key.id).collect::<Vec<_>>(), [refund_key_id]);
    let retried = attention_retry(&[&refund_key_id.to_string(), "--gateway", &now_answering]).await.unwrap();
    assert!(retried.status.success(), "{}", String::from_utf8_lossy(&retried.stderr));
    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Worked);
    let refunded: Value = app.post_refund(&refund_key, &refund).await.json().await.unwrap();
    assert_eq!(refunded["status"], "succeeded", "{refunded}");
    let changed = "SELECT count(*) = 3 FROM audit_records WHERE action LIKE '%.gateway_changed' AND actor = 'operator'";
    assert!(app.database_says(changed).await, "the first payment, the refund and its payment");

    // A key a worker gave up on, handed back as it is; once back, it is on the list no more.
    let other = new_key();
    let other_id = app.seed_key(&other, &body, "started", crate::helpers::Lock::Free).await;
    app.run_sql(&format!(
        "UPDATE idempotency_keys SET needs_attention_at = now(), attention_reason = 'the gateway keeps failing'
         WHERE account_id = '{}' AND id = '{other_id}'",
        app.account_id
    ))
    .await;
    let retried = attention_retry(&[&other_id.to_string()]).await.unwrap();
    assert!(retried.status.success(), "{}", String::from_utf8_lossy(&retried.stderr));
    assert!(needing_attention().await.is_empty());
    let again = attention_retry(&[&other_id.to_string()]).await.unwrap();
    assert!(!again.status.success(), "nothing left to hand back");
}

/// Makes the key row `key_id` look as if nobody had run it for longer than a completer waits for a
/// process that reaches its gateway (see `STRANDED_AFTER`).
async fn stranded_long_ago(app: &TestApp, key_id: uuid::Uuid) {
    let ago = payments_service::idempotency::STRANDED_AFTER.as_secs() + 60;
    app.run_sql(&format!(
        "UPDATE idempotency_keys SET last_run_at = now() - interval '{ago} seconds'
         WHERE account_id = '{}' AND id = '{key_id}'",
        app.account_id
    ))
    .await;
}

/// `payments <args>` with `env`, which must exit before it prints `ready`: its exit code and
/// what it printed on stderr.
async fn refused_at_start(args: &[&str], env: &[(&str, &str)], ready: &str) -> (Option<i32>, String) {
    use tokio::io::AsyncBufReadExt;
    let mut command = Command::new(env!("CARGO_BIN_EXE_payments"));
    command.args(args).env_remove("DATABASE_URL").env_remove("GATEWAY_URL").envs(env.iter().copied());
    command.env("RUST_BACKTRACE", "0").stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = command.kill_on_drop(true).spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    while let Some(line) = lines.next_line().await.unwrap() {
        assert!(!line.starts_with(ready), "payments {args:?} started: {line}");
    }
    let output = child.wait_with_output().await.unwrap();
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// A role with every grant a service needs on one PostgreSQL, that does not own the tables,
/// cannot write on Citus: `run_on_shard` takes each shard's metadata lock, which Citus lets a
/// table's owner alone take. `serve` and `worker` refuse to start as it, with the reason and the
/// fix (they started, and every POST was then `503 database-unavailable`); a process that started
/// all the same (its database was down at the time) answers `500`, never calling a refused
/// permission an unreachable database.
#[tokio::test]
async fn on_citus_a_role_that_does_not_own_the_tables_is_refused_at_start_and_never_called_unreachable() {
    let Some((citus, database)) = distributed("on_citus_a_role_that_does_not_own_the_tables").await else { return };
    let role = format!("dml_{}", uuid::Uuid::new_v4().simple());
    let mut conn = AsyncPgConnection::establish(&citus.url).await.unwrap();
    conn.batch_execute(&format!(
        "CREATE ROLE {role} LOGIN;
         GRANT USAGE ON SCHEMA public TO {role};
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};
         GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role}"
    ))
    .await
    .unwrap();
    let as_role = citus.url.replace("user=postgres", &format!("user={role}"));
    assert_ne!(as_role, citus.url);

    let env = [
        ("DATABASE_URL", as_role.as_str()),
        ("GATEWAY_URL", "http://127.0.0.1:1"),
        ("PAYMENTS_BIND", "127.0.0.1:0"),
        ("PAYMENTS_METRICS_BIND", "127.0.0.1:0"),
    ];
    let serve = ["serve", "--no-workers"];
    for (args, ready) in
        [(&serve[..], payments_service::startup::LISTENING), (&["worker"], payments_service::startup::WORKER_RUNNING)]
    {
        let (code, stderr) = refused_at_start(args, &env, ready).await;
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        let said = [role.as_str(), "does not own the distributed tables", "idempotency_keys", "GRANT postgres TO"];
        assert!(said.iter().all(|words| stderr.contains(words)), "{args:?}: {stderr}");
    }

    let app = TestApp::builder().database_url(as_role).spawn_on(database).await;
    let response = app.post_payment(&new_key(), &crate::helpers::payment_body()).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/internal-error");
    assert_eq!(app.gateway.all_stats().await["charges"], 0);
}

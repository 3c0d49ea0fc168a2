//! The binary's commands, as an operator runs them.

use std::time::Duration;

use diesel_async::AsyncConnection;
use payments_service::idempotency::needing_attention;
use tokio::process::Command;

use crate::helpers::{
    HeldProxy, Lock, Process, TestApp, TestDatabase, new_key, payment_body, plan_nodes, record_statements, sql_of,
    statements, wait_until,
};

async fn payments(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_payments"));
    command.args(args).env_remove("DATABASE_URL").envs(env.iter().copied());
    command.output().await.unwrap()
}

#[tokio::test]
async fn serve_and_worker_refuse_unsafe_settings_and_say_how_to_fix_them() {
    for command in ["serve", "worker"] {
        let short_lock = payments(&[command, "--lock-timeout-ms", "20000"], &[]).await;
        assert!(!short_lock.status.success());
        let error = String::from_utf8_lossy(&short_lock.stderr);
        assert!(error.contains("PAYMENTS_LOCK_TIMEOUT_MS") && error.contains("at least 39500 ms"), "{error}");

        let short_retention = payments(&[command], &[("PAYMENTS_KEY_RETENTION_SECS", "60")]).await;
        assert!(!short_retention.status.success());
        assert!(String::from_utf8_lossy(&short_retention.stderr).contains("Raise the retention"));

        // An authorization held for more than a year: no network holds one.
        let endless = payments(&[command], &[("PAYMENTS_AUTHORIZATION_TTL_SECS", "99999999999")]).await;
        assert!(!endless.status.success());
        let error = String::from_utf8_lossy(&endless.stderr);
        assert!(error.contains("authorization-ttl-secs") && error.contains("31536000"), "{error}");
    }
}

#[tokio::test]
async fn an_operator_lists_keys_needing_attention_and_hands_them_back() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "started", Lock::Free).await;
    app.run_sql(&format!(
        "UPDATE idempotency_keys SET needs_attention_at = now(), attention_reason = 'the gateway keeps failing', \
         completer_attempts = 8 WHERE id = '{key_id}'"
    ))
    .await;
    let env = [("DATABASE_URL", app.database.url.as_str())];

    let listed = payments(&["attention", "list"], &env).await;
    assert!(listed.status.success());
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert!(listed.contains(&key_id.to_string()) && listed.contains(&key), "{listed}");
    assert!(listed.contains("attempts=8") && listed.contains("the gateway keeps failing"), "{listed}");

    let retried = payments(&["attention", "retry", &key_id.to_string()], &env).await;
    assert!(retried.status.success(), "{}", String::from_utf8_lossy(&retried.stderr));
    assert!(needing_attention(&mut app.db().await, &payments_service::endpoints::all()).await.unwrap().is_empty());
    let again = payments(&["attention", "retry", &key_id.to_string()], &env).await;
    assert!(!again.status.success(), "nothing left to retry");
    let empty = payments(&["attention", "list"], &env).await;
    assert_eq!(String::from_utf8(empty.stdout).unwrap().trim(), "no key needs attention");
}

#[tokio::test]
async fn a_worker_stops_cleanly_on_sigterm() {
    let app = TestApp::spawn().await;
    let mut worker = crate::helpers::Process::worker(&app.database.url, app.gateway_url(), &[]).await;

    worker.signal(nix::sys::signal::Signal::SIGTERM);

    assert!(worker.exited().await.success());
}

#[tokio::test]
async fn a_worker_on_a_shared_database_needs_the_gateway_the_servers_use() {
    let app = TestApp::spawn().await;

    let worker = payments(&["worker"], &[("DATABASE_URL", app.database.url.as_str())]).await;

    assert!(!worker.status.success());
    assert!(String::from_utf8_lossy(&worker.stderr).contains("GATEWAY_URL is required with DATABASE_URL"));
}

/// A fresh directory for an embedded cluster that a test expects never to start.
fn unused_data_dir() -> String {
    std::env::temp_dir().join(format!("payments-unused-{}", uuid::Uuid::new_v4().simple())).display().to_string()
}

#[tokio::test]
async fn serve_refuses_to_put_its_mock_gateway_anywhere_but_where_it_was_told() {
    // A `payments gateway` (or anything) holds the address the in-process mock would take.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let data_dir = unused_data_dir();
    let env = [
        ("PAYMENTS_DATA_DIR", data_dir.as_str()),
        ("PAYMENTS_BIND", "127.0.0.1:0"),
        ("PAYMENTS_METRICS_BIND", "127.0.0.1:0"),
    ];

    let serve = payments(&["serve", "--mock-gateway-bind", &taken], &env).await;

    assert!(!serve.status.success(), "no quiet move to another port");
    let error = String::from_utf8_lossy(&serve.stderr);
    assert!(error.contains(&taken) && error.contains("GATEWAY_URL"), "{error}");
}

#[tokio::test]
async fn serve_on_a_shared_database_needs_its_gateway_or_an_explicit_private_mock() {
    let app = TestApp::spawn().await;
    let env = [
        ("DATABASE_URL", app.database.url.as_str()),
        ("PAYMENTS_BIND", "127.0.0.1:0"),
        ("PAYMENTS_METRICS_BIND", "127.0.0.1:0"),
    ];

    let refused = payments(&["serve"], &env).await;

    assert!(!refused.status.success());
    let error = String::from_utf8_lossy(&refused.stderr);
    assert!(error.contains("GATEWAY_URL") && error.contains("--private-mock-gateway"), "{error}");
    let env = [("DATABASE_URL", app.database.url.as_str()), ("PAYMENTS_MOCK_GATEWAY_BIND", "127.0.0.1:0")];
    let chosen = crate::helpers::Process::serve_with(&["serve", "--private-mock-gateway"], &env).await;
    assert!(chosen.url.starts_with("http://127.0.0.1:"), "it serves once the choice is explicit");
}

#[tokio::test]
async fn embedded_mode_never_serves_the_demo_key_beyond_loopback() {
    let data_dir = unused_data_dir();
    let env = [("PAYMENTS_DATA_DIR", data_dir.as_str()), ("PAYMENTS_MOCK_GATEWAY_BIND", "127.0.0.1:0")];

    let serve = payments(&["serve", "--bind", "0.0.0.0:0"], &env).await;

    assert!(!serve.status.success());
    let error = String::from_utf8_lossy(&serve.stderr);
    assert!(error.contains("sk_test_demo") && error.contains("127.0.0.1") && error.contains("DATABASE_URL"), "{error}");
    assert!(!std::path::Path::new(&data_dir).exists(), "refused before any cluster was made");
}

#[tokio::test]
async fn serve_moves_its_mock_off_a_taken_usual_address_and_says_so() {
    // Hold the usual address, unless something else already does.
    let _held = std::net::TcpListener::bind(payments_service::config::DEFAULT_GATEWAY_BIND);
    let data_dir = unused_data_dir();

    let serve = crate::helpers::Process::serve_with(&["serve"], &[("PAYMENTS_DATA_DIR", data_dir.as_str())]).await;

    let mut stdout = serve.stdout.clone();
    let printed =
        stdout.wait_for(|lines| lines.iter().any(|line| line.starts_with("gateway: "))).await.unwrap().clone();
    let gateway = printed.iter().find_map(|line| line.strip_prefix("gateway: in-process mock at ")).unwrap();
    assert!(gateway.ends_with("(127.0.0.1:8081 is taken)"), "{gateway}");
    assert!(!gateway.starts_with("http://127.0.0.1:8081 "), "{gateway}");
    drop(serve);
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test]
async fn stats_show_which_account_repeats_its_keys_most() {
    let app = TestApp::spawn().await;
    let other_key = app.create_account("quiet").await;
    // This account: one payment, replayed twice, and a request while another holds a key.
    let key = new_key();
    for _ in 0..3 {
        app.post_payment(&key, &payment_body()).await;
    }
    let held = new_key();
    app.seed_key(&held, &payment_body(), "started", Lock::Live).await;
    app.post_payment(&held, &payment_body()).await;
    // The other: one payment, asked once.
    let response = app
        .http
        .post(format!("{}/v1/payments", app.address))
        .bearer_auth(&other_key)
        .header("Idempotency-Key", new_key())
        .json(&payment_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    app.flush_request_counts().await;
    app.flush_request_counts().await; // nothing new: adds nothing

    let stats = payments(&["stats", "--hours", "1"], &[("DATABASE_URL", app.database.url.as_str())]).await;
    assert!(stats.status.success(), "{}", String::from_utf8_lossy(&stats.stderr));
    let stats = String::from_utf8(stats.stdout).unwrap();
    let rows: Vec<Vec<&str>> = stats.lines().skip(2).map(|line| line.split_whitespace().collect()).collect();
    // requests, new, resumed, replayed, 409, 422, 410, repeated, account id, (name)
    assert_eq!(rows[0][..8], ["4", "1", "0", "2", "1", "0", "0", "75.0%"], "{stats}");
    assert_eq!(rows[0][8], app.account_id.to_string());
    assert_eq!(rows[1][..8], ["1", "1", "0", "0", "0", "0", "0", "0.0%"], "{stats}");
    assert_eq!(rows[1][9], "(quiet)");
}

#[tokio::test]
async fn stats_read_only_the_hours_asked_for_through_the_index_on_hour() {
    record_statements();
    let app = TestApp::spawn().await;
    // 90 days of hourly counts, the default retention, for 50 accounts (108,000 rows).
    app.run_sql(
        "INSERT INTO key_request_counts (account_id, hour, created, replayed)
         SELECT ('00000000-0000-4000-8000-' || lpad(a::text, 12, '0'))::uuid,
                date_trunc('hour', now(), 'UTC') - h * interval '1 hour', 2, 1
         FROM generate_series(1, 50) a, generate_series(0, 2159) h",
    )
    .await;
    app.run_sql("ANALYZE key_request_counts").await;

    // As `payments stats --hours 24` asks, on a connection of the service's (whose statements are
    // recorded).
    let mut conn = payments_service::db::establish(&app.database.url).await.unwrap();
    let accounts = payments_service::metrics::per_account(&mut conn, 24).await.unwrap();
    assert_eq!(accounts.len(), 50);
    // The last 24 hours (23 if the clock passed a whole hour since the rows were written).
    let hours = accounts[0].replayed;
    assert!(hours == 24 || hours == 23, "{accounts:?}");
    assert!(accounts.iter().all(|account| (account.created, account.replayed) == (2 * hours, hours)), "{accounts:?}");

    let executed = statements(&app.database.name).executed;
    let read = executed.iter().find(|sql| sql.contains("FROM key_request_counts")).expect("the stats statement");
    let mut conn = app.db().await;
    let prepare = format!("PREPARE stats(int8) AS {}", sql_of(read));
    diesel_async::RunQueryDsl::execute(diesel::sql_query(prepare), &mut conn).await.unwrap();
    let plan = plan_nodes(&mut conn, "EXECUTE stats(24)").await;
    let counts: Vec<_> = plan.iter().filter(|node| node.relation.as_deref() == Some("key_request_counts")).collect();
    assert!(counts.iter().all(|node| node.node_type != "Seq Scan"), "no sequential scan: {plan:#?}");
    assert!(
        plan.iter().any(|node| node.index.as_deref() == Some("key_request_counts_hour_idx")),
        "the hours read through their index: {plan:#?}"
    );
}

/// `serve` on a fresh database, its gateway behind a proxy that holds every call until let through
/// (the identity look-up and a first payment's charge are let through), and an API key.
async fn serve_with_a_held_gateway() -> (Process, HeldProxy, String, Process, TestDatabase) {
    let database = TestDatabase::create().await;
    let mut conn = diesel_async::AsyncPgConnection::establish(&database.url).await.unwrap();
    let (_, api_key) = payments_service::accounts::create(&mut conn, "stopping").await.unwrap();
    let gateway = Process::gateway().await;
    let proxy = HeldProxy::start(&gateway.url);
    let env = [("DATABASE_URL", database.url.as_str()), ("GATEWAY_URL", proxy.url.as_str())];
    let serve = Process::serve_with(&["serve"], &env).await;
    proxy.release(2);
    let first = pay(&serve.url, &api_key).await.unwrap();
    assert_eq!(first.status(), reqwest::StatusCode::CREATED);
    (serve, proxy, api_key, gateway, database)
}

async fn pay(url: &str, api_key: &str) -> reqwest::Result<reqwest::Response> {
    reqwest::Client::new()
        .post(format!("{url}/v1/payments"))
        .bearer_auth(api_key)
        .header("Idempotency-Key", new_key())
        .json(&payment_body())
        .send()
        .await
}

/// Sends `serve` a stop signal (`signals` is 1 or 2) while a payment's charge is held at the proxy
/// (and lets the charge through after one): the payment's answer, and how the process exited.
async fn stopped_while_charging(signals: usize) -> (reqwest::Result<reqwest::Response>, std::process::ExitStatus) {
    let (mut serve, proxy, api_key, _gateway, _database) = serve_with_a_held_gateway().await;
    let url = serve.url.clone();
    let paying = pay(&url, &api_key);
    let stop = async {
        wait_until(Duration::from_secs(10), "the charge is under way", || async { proxy.received() == 3 }).await;
        serve.signal(nix::sys::signal::Signal::SIGTERM);
        match signals {
            1 => proxy.release(1),
            _ => {
                // The second once the first is taken, as a person's second Ctrl-C comes.
                let mut logs = serve.stderr.clone();
                logs.wait_for(|lines| lines.iter().any(|line| line.contains("a second stop signal exits at once")))
                    .await
                    .unwrap();
                serve.signal(nix::sys::signal::Signal::SIGTERM);
            }
        }
        serve.exited().await
    };
    tokio::join!(paying, stop)
}

#[tokio::test]
async fn a_stop_signal_drains_the_request_under_way_and_a_second_one_stops_at_once() {
    let (answer, exited) = stopped_while_charging(1).await;
    assert_eq!(answer.unwrap().status(), reqwest::StatusCode::CREATED, "drained, not cut off");
    assert!(exited.success());

    // The process exits without waiting for the charge, which is never let through.
    let (answer, exited) = stopped_while_charging(2).await;
    assert_eq!(exited.code(), Some(1), "exited at once, unclean");
    assert!(answer.is_err(), "the request was cut off with the process: {answer:?}");
}

#[tokio::test]
async fn model_check_holds_every_guarantee_and_finds_each_broken_rule() {
    let checked = payments(&["model", "check"], &[]).await;
    let out = String::from_utf8(checked.stdout).unwrap();
    assert!(checked.status.success(), "{out}");
    for property in payments_model::ALWAYS {
        assert!(out.contains(&format!("holds:       {property}\n")), "{out}");
    }
    for property in payments_model::SOMETIMES {
        assert!(out.contains(&format!("reached:     {property}\n")), "{out}");
    }
    for property in payments_model::AUTHORIZATION_ALWAYS {
        assert!(out.contains(&format!("holds:       {property}\n")), "{out}");
    }

    let broken = payments(&["model", "check", "--broken", "no-look-up-before-charging"], &[]).await;
    let out = String::from_utf8(broken.stdout).unwrap();
    assert_eq!(broken.status.code(), Some(3), "{out}");
    assert!(out.contains("BROKEN:      at most one charge per key\n"), "{out}");
    assert!(out.contains("the gateway forgets its idempotency keys"), "the path to it, step by step: {out}");
}

#[tokio::test]
async fn model_explore_serves_the_checkers_explorer() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let bind = free.to_string();
    let explorer = Process::start(&["model", "explore", "--bind", &bind], &[], "the model's explorer at ").await;
    let status: serde_json::Value =
        crate::helpers::wait_for(Duration::from_secs(30), "the explorer answers", || async {
            let answer = reqwest::get(format!("{}.status", explorer.url)).await.ok()?;
            answer.json().await.ok()
        })
        .await;
    assert!(status.to_string().contains("at most one charge per key"), "{status}");
    let states: serde_json::Value =
        reqwest::get(format!("{}.states", explorer.url)).await.unwrap().json().await.unwrap();
    assert!(states.as_array().is_some_and(|states| !states.is_empty()), "{states}");
}

//! Two `serve` processes and a `worker` process on one database keep every guarantee: one
//! charge per key, however the requests are spread; a request whose server dies is finished by
//! the worker; refunds with different keys never take more than the payment between them; and,
//! with a gateway each, a key is driven only by a process that reaches its gateway.

use std::time::Duration;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use payments_service::db::schema::audit_records;
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{
    GatewayControl, Process, TestApp, TestDatabase, new_key, payment_body, post_all_at_once, wait_until,
};

/// The shortest lock timeout the service accepts for this gateway timeout (three calls, 7.5 s of
/// phase attempts, a 1 s checkout and 1 s to spare), short enough for a test to wait out.
const ENV: [(&str, &str); 4] = [
    ("PAYMENTS_LOCK_TIMEOUT_MS", "13100"),
    ("PAYMENTS_GATEWAY_TIMEOUT_MS", "1200"),
    ("PAYMENTS_WORKER_INTERVAL_MS", "100"),
    ("PAYMENTS_COMPLETER_BACKOFF_MS", "0"),
];

/// Everything runs as long as this does. Fields drop in order: the processes, then the database.
struct Cluster {
    api_key: String,
    control: GatewayControl,
    servers: [Process; 2],
    _worker: Process,
    _gateway: Process,
    database: TestDatabase,
}

async fn start() -> Cluster {
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let (_, api_key) = payments_service::accounts::create(&mut conn, "many").await.unwrap();
    let gateway = Process::gateway().await;
    let control = GatewayControl::new(&gateway.url);
    let servers = [
        Process::serve(&database.url, &gateway.url, &["--no-workers"], &ENV).await,
        Process::serve(&database.url, &gateway.url, &["--no-workers"], &ENV).await,
    ];
    let worker = Process::worker(&database.url, &gateway.url, &ENV).await;
    Cluster { api_key, control, servers, _worker: worker, _gateway: gateway, database }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_identical_requests_over_two_servers_make_one_charge() {
    let cluster = start().await;
    // A slow charge keeps the first request in flight while the others arrive.
    cluster.control.faults(json!({ "mode": "latency", "latency_ms": 500, "count": 30 })).await;
    let key = new_key();

    let servers: Vec<String> = (0..30).map(|i| cluster.servers[i % 2].url.clone()).collect();
    let answers = post_all_at_once(&servers, &cluster.api_key, &key).await;

    let fresh = answers.iter().filter(|(status, replayed)| *status == StatusCode::CREATED && !replayed).count();
    assert_eq!(fresh, 1, "{answers:?}");
    assert!(
        answers.iter().all(|(status, _)| [StatusCode::CREATED, StatusCode::CONFLICT].contains(status)),
        "{answers:?}"
    );
    assert_eq!(cluster.control.stats().await.charges, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_whose_server_is_killed_is_finished_by_the_worker() {
    let cluster = start().await;
    cluster.control.faults(json!({ "mode": "latency", "latency_ms": 1000, "count": 1 })).await;
    let key = new_key();
    let post = |url: String| {
        reqwest::Client::new()
            .post(format!("{url}/v1/payments"))
            .bearer_auth(&cluster.api_key)
            .header("Idempotency-Key", &key)
            .json(&payment_body())
            .send()
    };

    // The first server takes the request and dies while the gateway is charging.
    let in_flight = tokio::spawn(post(cluster.servers[0].url.clone()));
    wait_until(Duration::from_secs(10), "the charge request reaches the gateway", || async {
        cluster.control.stats().await.requests == 1
    })
    .await;
    cluster.servers[0].signal(nix::sys::signal::Signal::SIGKILL);
    assert!(in_flight.await.unwrap().is_err());

    // Nobody retries: the test only watches the database. Once the lock is stale the worker takes
    // the key over, finds the charge the gateway made, and finishes the request.
    let database = &cluster.database.url;
    wait_until(Duration::from_secs(30), "the worker finishes the request", || async {
        let mut conn = AsyncPgConnection::establish(database).await.unwrap();
        TestApp::database_says_on(&mut conn, "SELECT recovery_point = 'finished' FROM idempotency_keys").await
    })
    .await;
    let mut conn = AsyncPgConnection::establish(database).await.unwrap();
    let trail: Vec<(String, String)> = audit_records::table
        .order(audit_records::id)
        .select((audit_records::action, audit_records::actor))
        .load(&mut conn)
        .await
        .unwrap();
    let trail: Vec<(&str, &str)> = trail.iter().map(|(action, actor)| (action.as_str(), actor.as_str())).collect();
    // The outbox, woken by the finish, may have delivered the payment's event already: after it.
    let delivered = ("event.delivered", "outbox");
    if let Some(at) = trail.iter().position(|record| *record == delivered) {
        assert_eq!(trail[at - 1], ("payment.finished", "completer"), "{trail:?}");
    }
    let trail: Vec<(&str, &str)> = trail.into_iter().filter(|record| *record != delivered).collect();
    // After the dead server's claim, only the worker's completer (which may have let the key go
    // and taken it again, on a slow machine): no client finished it.
    let (claim, rest) = trail.split_at(2);
    assert_eq!(claim, [("idempotency_key.claimed", "api"), ("payment.created", "api")], "{trail:?}");
    assert!(rest.iter().all(|(_, actor)| *actor == "completer"), "{trail:?}");
    assert_eq!(rest.first().map(|(action, _)| *action), Some("idempotency_key.taken_over"), "{trail:?}");
    let finish = [("payment.charge_recorded", "completer"), ("payment.finished", "completer")];
    assert!(rest.ends_with(&finish), "{trail:?}");
    let replay = post(cluster.servers[1].url.clone()).await.unwrap();
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
    assert_eq!(cluster.control.stats().await.charges, 1);
    assert_eq!(cluster.control.stats().await.requests, 1, "adopted by look-up, not charged again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_refunds_with_different_keys_over_two_servers_refund_the_payment_once() {
    let cluster = start().await;
    let http = reqwest::Client::new();
    let paid = http
        .post(format!("{}/v1/payments", cluster.servers[0].url))
        .bearer_auth(&cluster.api_key)
        .header("Idempotency-Key", new_key())
        .json(&json!({ "amount": 999, "currency": "usd", "source": "tok_visa" }))
        .send()
        .await
        .unwrap();
    let payment: serde_json::Value = paid.json().await.unwrap();
    // Slow refunds keep the winners' reservations pending while the others decide.
    cluster.control.faults(json!({ "mode": "latency", "latency_ms": 300, "count": 20 })).await;

    let mut refunds = tokio::task::JoinSet::new();
    for i in 0..20 {
        let request = http
            .post(format!("{}/v1/refunds", cluster.servers[i % 2].url))
            .bearer_auth(&cluster.api_key)
            .header("Idempotency-Key", new_key())
            .json(&json!({ "payment": payment["id"], "amount": 333 }));
        refunds.spawn(async move {
            let response = request.send().await.unwrap();
            let status = response.status();
            (status, response.json::<serde_json::Value>().await.unwrap())
        });
    }
    let answers = refunds.join_all().await;

    let refunded: Vec<_> = answers.iter().filter(|(status, _)| *status == StatusCode::CREATED).collect();
    assert_eq!(refunded.len(), 3, "{answers:?}");
    assert!(refunded.iter().all(|(_, refund)| refund["status"] == "succeeded"), "{refunded:?}");
    let refused = |(status, problem): &&(StatusCode, serde_json::Value)| {
        *status == StatusCode::BAD_REQUEST
            && ["refund-exceeds-payment", "payment-already-refunded"]
                .iter()
                .any(|kind| problem["type"].as_str().is_some_and(|t| t.ends_with(kind)))
    };
    assert_eq!(answers.iter().filter(refused).count(), 17, "{answers:?}");
    let stats = cluster.control.all_stats().await;
    assert_eq!((stats["refunds"].as_u64(), stats["refunded_amount"].as_u64()), (Some(3), Some(999)));
    let now: serde_json::Value = http
        .get(format!("{}/v1/payments/{}", cluster.servers[1].url, payment["id"].as_str().unwrap()))
        .bearer_auth(&cluster.api_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!((now["amount_refunded"].as_i64(), now["refunded"].as_bool()), (Some(999), Some(true)));
}

/// The secret both gateways sign their events with, and every `serve` checks them by.
const SECRET: &str = "whsec_blue_green";

/// Whether `condition` holds in the database at `url` now.
async fn says(url: &str, condition: String) -> bool {
    TestApp::database_says_on(&mut AsyncPgConnection::establish(url).await.unwrap(), &condition).await
}

async fn pay(server: &str, api_key: &str, key: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{server}/v1/payments"))
        .bearer_auth(api_key)
        .header("Idempotency-Key", key)
        .json(&payment_body())
        .send()
        .await
        .unwrap()
}

/// Blue and green: two `serve`s on one database, each with a gateway of its own, as while moving
/// from one gateway to another. A payment made through green whose answer was lost waits, made at
/// green's gateway, which tells of the charge in an event; blue receives it, and it makes the key
/// due at once for every completer. Blue's completer, as eager as one gets (no backoff), never
/// takes the key: its gateway knows nothing of the charge, and each take spent one of the key's
/// attempts and put it back to wait out its backoff, for every process. It finishes a key of its
/// own, made after, so it had its chance. Then a worker at green's gateway, whose backoff would
/// keep it waiting ten minutes but for the event's nudge, finishes the key at its first attempt.
/// (Before, blue's completer took the key, found it "made at the gateway acct_A, and acct_B
/// answers", and counted an attempt, again and again, until the key needed attention.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_made_at_one_gateway_is_finished_by_a_process_that_reaches_it_and_never_taken_by_another() {
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let (_, api_key) = payments_service::accounts::create(&mut conn, "blue-green").await.unwrap();
    let with_secret: Vec<(&str, &str)> =
        ENV.iter().copied().chain([("PAYMENTS_GATEWAY_WEBHOOK_SECRETS", SECRET)]).collect();
    let blue_gateway = Process::gateway().await;
    let blue = Process::serve(&database.url, &blue_gateway.url, &[], &with_secret).await;
    let to_blue = format!("{}/webhooks/gateway", blue.url);
    let green_gateway = Process::start(
        &["gateway", "--bind", "127.0.0.1:0", "--control", "--events-url", &to_blue, "--webhook-secret", SECRET],
        &[],
        "payments gateway listening on",
    )
    .await;
    let green = Process::serve(&database.url, &green_gateway.url, &["--no-workers"], &with_secret).await;
    let (at_blue, at_green) = (GatewayControl::new(&blue_gateway.url), GatewayControl::new(&green_gateway.url));
    let url = database.url.as_str();

    // Green's payment: charged at green's gateway, its answer lost; the gateway's event about the
    // charge reaches blue, and nudges the key.
    at_green.fault("error_after", 1).await;
    let green_key = new_key();
    assert_eq!(pay(&green.url, &api_key, &green_key).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    let green_row = format!("FROM idempotency_keys k WHERE k.idempotency_key = '{green_key}'");
    wait_until(Duration::from_secs(20), "green's gateway's event reaches blue", || {
        says(url, format!("SELECT EXISTS (SELECT FROM gateway_events e WHERE e.idempotency_key_id = k.id) {green_row}"))
    })
    .await;
    // Blue's own payment, its answer lost too: blue's completer finishes it.
    at_blue.fault("error_after", 1).await;
    let blue_key = new_key();
    assert_eq!(pay(&blue.url, &api_key, &blue_key).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    wait_until(Duration::from_secs(20), "blue's completer finishes blue's key", || {
        says(
            url,
            format!("SELECT recovery_point = 'finished' FROM idempotency_keys WHERE idempotency_key = '{blue_key}'"),
        )
    })
    .await;

    // Green's key, due and waiting longer, was never taken: no attempt spent, its nudge kept.
    let untouched = format!(
        "SELECT completer_attempts = 0 AND nudged_at IS NOT NULL
                AND NOT EXISTS (SELECT FROM audit_records a WHERE a.resource_id = k.id AND a.actor = 'completer')
         {green_row}"
    );
    assert!(says(url, untouched).await, "blue's completer took green's key");
    assert_eq!(at_blue.stats().await.look_ups, 1, "blue's gateway was asked about blue's key alone");

    // A worker at green's gateway finishes it, at its first attempt: the nudge made it due.
    let patient: Vec<(&str, &str)> =
        with_secret.iter().copied().filter(|(var, _)| *var != "PAYMENTS_COMPLETER_BACKOFF_MS").collect();
    let patient: Vec<(&str, &str)> = patient.into_iter().chain([("PAYMENTS_COMPLETER_BACKOFF_MS", "600000")]).collect();
    let _green_worker = Process::worker(&database.url, &green_gateway.url, &patient).await;
    wait_until(Duration::from_secs(20), "green's worker finishes green's key", || {
        says(url, format!("SELECT recovery_point = 'finished' {green_row}"))
    })
    .await;
    let taken_once = format!(
        "SELECT completer_attempts = 1
                AND (SELECT array_agg(a.action::text ORDER BY a.id) FROM audit_records a
                     WHERE a.resource_id = k.id AND a.actor = 'completer') = ARRAY['idempotency_key.taken_over']
         {green_row}"
    );
    assert!(says(url, taken_once).await, "taken once, by green's worker, and finished");
    assert_eq!(at_green.stats().await.charges, 1);
    let replay = pay(&green.url, &api_key, &green_key).await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
}

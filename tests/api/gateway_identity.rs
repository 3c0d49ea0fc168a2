//! Which gateway answered is one rule, read off every answer: the `Gateway-Account` it names, or
//! nobody known if it names none (then it speaks only for the address's own identity). A payment an earlier run may have charged is settled only by what its own gateway
//! says, or by a charge of ours found wherever it is: a gateway that knows nothing of it would
//! charge a second time, so it is never asked to charge.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use payments_service::db::schema::payments as payments_table;
use payments_service::idempotency::{STRANDED_AFTER, needing_attention};
use payments_service::workers::{Outcome, Worker};
use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{
    ChargesOnlyProxy, GatewayControl, Lock, Process, TestApp, TestDatabase, database_with_shards_stand_in, new_key,
    payment_body, unmarked, wait_until,
};

/// The gateway that `key`'s payment records.
async fn recorded_gateway(app: &TestApp, key: &str) -> String {
    payments_table::table
        .filter(payments_table::idempotency_key.eq(key))
        .select(payments_table::gateway)
        .get_result::<Option<String>>(&mut app.db().await)
        .await
        .unwrap()
        .unwrap()
}

/// Time passes for `key`: nobody has run it for longer than a worker that cannot drive it waits
/// for one that can.
async fn untaken_for_long(app: &TestApp, key: &str) {
    let ago = STRANDED_AFTER.as_secs() + 60;
    app.run_sql(&format!(
        "UPDATE idempotency_keys SET last_run_at = now() - interval '{ago} seconds' WHERE idempotency_key = '{key}'"
    ))
    .await;
}

/// The identity the mock gateway at `gateway` names itself by.
async fn identity_of(gateway: &Process) -> String {
    let account: Value = reqwest::get(format!("{}/v1/account", gateway.url)).await.unwrap().json().await.unwrap();
    account["id"].as_str().unwrap().to_owned()
}

/// Kills `gateway` and starts a new one, with an empty memory, on its address.
async fn replace(gateway: &mut Process) -> Process {
    let address = gateway.url.trim_start_matches("http://").to_owned();
    gateway.signal(nix::sys::signal::Signal::SIGKILL);
    gateway.exited().await;
    Process::start(&["gateway", "--bind", &address, "--control"], &[], "payments gateway listening on").await
}

#[tokio::test]
async fn a_worker_at_another_gateway_never_charges_a_payment_started_elsewhere() {
    let (first, second) = (Process::gateway().await, Process::gateway().await);
    let (at_first, at_second) = (GatewayControl::new(&first.url), GatewayControl::new(&second.url));
    let app = TestApp::builder()
        .gateway_url(&first.url)
        .workers(|w| {
            w.completer_backoff = Duration::ZERO;
            w.completer_max_attempts = 2;
        })
        .spawn()
        .await;
    let key = new_key();
    // The first gateway charges, and the answer is lost: the payment waits at `started`.
    at_first.fault("error_after", 1).await;
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);

    // A worker whose gateway is the second one never takes the key: it could not drive it.
    let elsewhere = app.workers_at_gateway(&second.url);
    for _ in 0..2 {
        assert_eq!(elsewhere.completer.run_once().await.unwrap(), Outcome::Idle);
    }
    let asked = at_second.stats().await;
    assert_eq!((asked.requests, asked.look_ups), (0, 0), "a gateway that knows nothing of it is never asked");
    assert!(app.database_says("SELECT completer_attempts = 0 FROM idempotency_keys").await, "no attempt spent");

    // No process that reaches the first gateway runs it for long: the worker gives up on it,
    // naming both gateways.
    untaken_for_long(&app, &key).await;
    assert_eq!(elsewhere.completer.run_once().await.unwrap(), Outcome::Worked);
    let attention = needing_attention(&mut app.db().await, &payments_service::endpoints::all()).await.unwrap();
    assert_eq!(attention.len(), 1);
    let reason = &attention[0].attention_reason;
    assert!(reason.contains(&*app.gateway_id().await) && reason.contains(&identity_of(&second).await), "{reason}");
    assert_eq!(at_second.stats().await.look_ups, 0);
    // A process with the right gateway finishes it, with the one charge that was made.
    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(at_first.stats().await.charges, 1);
}

#[tokio::test]
async fn a_gateway_restarted_with_an_empty_memory_is_another_gateway() {
    let mut gateway = Process::gateway().await;
    let app = TestApp::builder().gateway_url(&gateway.url).spawn().await;
    let key = new_key();
    GatewayControl::new(&gateway.url).fault("error_after", 1).await;
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);

    // The mock restarts on the same address, its charges gone.
    let restarted = replace(&mut gateway).await;

    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::SERVICE_UNAVAILABLE, "it waits for the gateway it started at");
    let asked = GatewayControl::new(&restarted.url).stats().await;
    assert_eq!((asked.requests, asked.look_ups), (0, 1), "the new one is asked to look, and never to charge");
}

/// A worker whose process learned its gateway before the gateway was replaced at its address may
/// still take a key made at the old one; the answer, named by the new one, tells it that it
/// reaches another gateway. It hands the key back as it took it, for a process that reaches the
/// old one: no attempt spent, its last run and its nudge as they were. Taken for an unknown
/// outcome, that take counted an attempt and started the key's backoff over, for every process.
#[tokio::test]
async fn a_worker_that_finds_another_gateway_behind_its_address_hands_the_key_back_untouched() {
    let mut gateway = Process::gateway().await;
    let app =
        TestApp::builder().gateway_url(&gateway.url).workers(|w| w.completer_backoff = Duration::ZERO).spawn().await;
    // The app knows its gateway, whose answer to a charge is lost; the gateway's event nudged
    // the key.
    GatewayControl::new(&gateway.url).fault("error_after", 1).await;
    let key = new_key();
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    app.run_sql("UPDATE idempotency_keys SET nudged_at = now() - interval '1 second'").await;
    let as_left = run_state(&app, &key).await;
    // The gateway is replaced at its address, unbeknown to the app.
    let replaced = replace(&mut gateway).await;
    let completer = app.workers().completer;

    assert_eq!(completer.run_once().await.unwrap(), Outcome::Worked);

    assert_eq!(run_state(&app, &key).await, as_left, "no attempt spent, its last run and nudge as they were");
    let trail = app.audit_trail().await;
    let by_completer: Vec<&str> =
        trail.iter().filter(|(_, actor)| actor == "completer").map(|(action, _)| action.as_str()).collect();
    assert_eq!(by_completer, ["idempotency_key.taken_over", "idempotency_key.handed_back"]);
    // Knowing now which gateway answers, it leaves the key alone.
    assert_eq!(completer.run_once().await.unwrap(), Outcome::Idle);
    let asked = GatewayControl::new(&replaced.url).stats().await;
    assert_eq!((asked.requests, asked.look_ups), (0, 1), "asked to look once, never to charge");
}

/// What decides when a worker takes `key` next: its last run, its nudge, and its attempts.
async fn run_state(app: &TestApp, key: &str) -> (DateTime<Utc>, Option<DateTime<Utc>>, i32) {
    use payments_service::db::schema::idempotency_keys as keys;
    keys::table
        .filter(keys::idempotency_key.eq(key))
        .select((keys::last_run_at, keys::nudged_at, keys::completer_attempts))
        .get_result(&mut app.db().await)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_payment_charged_at_a_gateway_replaced_since_this_process_last_asked_follows_it_there() {
    let mut gateway = Process::gateway().await;
    // Routed as on Citus: the phase that records the new gateway runs under a key, its table marked.
    let database = database_with_shards_stand_in().await;
    let app = TestApp::builder().gateway_url(&gateway.url).spawn_on(database).await;
    // The app has learnt who its gateway is...
    assert_eq!(app.post_payment(&new_key(), &payment_body()).await.status(), StatusCode::CREATED);
    // ...which is then replaced at the same address, unbeknown to it.
    let replaced = replace(&mut gateway).await;
    let at_replaced = GatewayControl::new(&replaced.url);
    at_replaced.fault("error_after", 1).await;
    let key = new_key();

    // The new gateway charges, and the answer is lost; the payment follows the charge there...
    let first = app.post_payment(&key, &payment_body()).await;
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);

    // ...so the retry reconciles there, and adopts the one charge.
    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(at_replaced.stats().await.charges, 1);
    let trail = app.audit_trail().await;
    assert!(trail.iter().any(|(action, _)| action == "payment.gateway_changed"), "{trail:?}");
    assert_eq!(unmarked(&mut app.db().await).await, None);
}

#[tokio::test]
async fn a_key_released_before_its_payment_existed_is_charged_at_the_gateway_that_answers_now() {
    let mut gateway = Process::gateway().await;
    let app = TestApp::builder().gateway_url(&gateway.url).spawn().await;
    // The process's first request, whose `started` statement fails: its claim ran alone (the
    // process had not heard from its gateway), `started` asked the gateway who it is and then
    // failed, so the key is let go at `started`, with no payment, and the app has learnt who its
    // gateway is. (Later, the claim runs `started` in its statement, and such a failure leaves no
    // key row: see `first_phase.rs`.)
    app.run_sql("ALTER TABLE payments ADD CONSTRAINT refuses_4242 CHECK (amount <> 4242) NOT VALID").await;
    let (key, body) = (new_key(), json!({ "amount": 4242, "currency": "usd", "source": "tok_visa" }));
    assert_eq!(app.post_payment(&key, &body).await.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let row = app.key_row(&key).await.unwrap();
    assert_eq!((row.recovery_point.as_str(), row.locked_until), ("started", None));
    app.run_sql("ALTER TABLE payments DROP CONSTRAINT refuses_4242").await;

    // The gateway is replaced at its address, unbeknown to the app.
    let replaced = replace(&mut gateway).await;
    let retry = app.post_payment(&key, &body).await;

    assert_eq!(retry.status(), StatusCode::CREATED, "{}", retry.text().await.unwrap());
    let asked = GatewayControl::new(&replaced.url).stats().await;
    assert_eq!((asked.charges, asked.requests), (1, 1));
    let answered_by: Value = reqwest::get(format!("{}/v1/account", replaced.url)).await.unwrap().json().await.unwrap();
    assert_eq!(recorded_gateway(&app, &key).await, answered_by["id"].as_str().unwrap());
}

#[tokio::test]
async fn a_gateway_behind_a_proxy_that_hides_its_account_endpoint_is_one_gateway() {
    let gateway = Process::gateway().await;
    let proxy = ChargesOnlyProxy::start(&gateway.url);
    let app = TestApp::builder().gateway_url(&proxy.url).spawn().await;
    let identity: Value = reqwest::get(format!("{}/v1/account", gateway.url)).await.unwrap().json().await.unwrap();

    // The account question gets the proxy's 404, which names nobody; the look-up of a key nobody
    // uses, asked next, names the gateway, and the payment records it.
    let first = new_key();
    assert_eq!(app.post_payment(&first, &payment_body()).await.status(), StatusCode::CREATED);
    assert_eq!(recorded_gateway(&app, &first).await, identity["id"].as_str().unwrap());

    // An unknown outcome is settled by the retry's look-up, under that same identity.
    GatewayControl::new(&gateway.url).fault("error_after", 1).await;
    let key = new_key();
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::CREATED, "{}", retry.text().await.unwrap());
    let asked = GatewayControl::new(&gateway.url).stats().await;
    // The look-ups: who answers, then the retry's.
    assert_eq!((asked.charges, asked.requests, asked.look_ups), (2, 2, 2));
    let trail = app.audit_trail().await;
    assert!(!trail.iter().any(|(action, _)| action == "payment.gateway_changed"), "{trail:?}");
}

#[tokio::test]
async fn a_charge_of_ours_found_at_another_gateway_is_adopted_there() {
    // A payment records a gateway that is gone (a run's move to the gateway that answered it
    // did not commit), and the gateway answering now holds the payment's charge.
    let gateway = Process::gateway().await;
    let app = TestApp::builder().gateway_url(&gateway.url).spawn().await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "started", Lock::Free).await;
    let payment_id = app.seed_payment(key_id, &key, "pending", None).await;
    app.run_sql(&format!("UPDATE payments SET gateway = 'acct_gone' WHERE id = '{payment_id}'")).await;
    let charge: Value = reqwest::Client::new()
        .post(format!("{}/v1/charges", gateway.url))
        .header("Idempotency-Key", app.downstream_key(key_id))
        .json(&json!({ "amount": 1000, "currency": "usd", "source": "tok_visa", "metadata": {} }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();

    let retry = app.post_payment(&key, &payment_body()).await;

    assert_eq!(retry.status(), StatusCode::CREATED);
    let payment: Value = retry.json().await.unwrap();
    assert_eq!(payment["gateway_charge_id"], charge["id"]);
    assert_eq!(GatewayControl::new(&gateway.url).stats().await.requests, 1, "never asked to charge again");
    assert_eq!(recorded_gateway(&app, &key).await, *app.gateway_id().await);
}

#[tokio::test]
async fn an_identity_a_payment_cannot_record_makes_the_answer_unreadable() {
    use reqwest::header::HeaderValue;
    let too_long = HeaderValue::from_str(&format!("acct_{}", "x".repeat(300))).unwrap();
    let not_ascii = HeaderValue::from_bytes(b"acct_\xff").unwrap();
    for named in [too_long, not_ascii] {
        let gateway = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/charges"))
            .respond_with(
                ResponseTemplate::new(200)
                    .insert_header("Gateway-Account", named.clone())
                    .set_body_json(json!({ "id": "ch_1" })),
            )
            .mount(&gateway)
            .await;
        let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
        let key = new_key();

        let response = app.post_payment(&key, &payment_body()).await;

        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{named:?}");
        assert_eq!(recorded_gateway(&app, &key).await, gateway.uri() + "/", "{named:?}");
        let trail = app.audit_trail().await;
        assert!(!trail.iter().any(|(action, _)| action == "payment.gateway_changed"), "{trail:?}");
    }
}

/// A wiremock gateway that names itself `acct_behind_a_proxy` on every answer: it knows no
/// charge until asked, and charges `ch_made`.
async fn named_gateway_behind_a_proxy() -> MockServer {
    let gateway = MockServer::start().await;
    let named = |status: u16| ResponseTemplate::new(status).insert_header("Gateway-Account", "acct_behind_a_proxy");
    Mock::given(method("GET"))
        .and(path("/v1/account"))
        .respond_with(named(200).set_body_json(json!({ "id": "acct_behind_a_proxy" })))
        .mount(&gateway)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .respond_with(named(200).set_body_json(json!({ "object": "list", "data": [] })))
        .mount(&gateway)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/charges"))
        .respond_with(named(200).set_body_json(json!({ "id": "ch_made", "status": "succeeded" })))
        .mount(&gateway)
        .await;
    gateway
}

/// The proxy in front of `gateway` answers the next request to `route` itself with `answer`,
/// which names no gateway.
async fn proxy_answers_once(gateway: &MockServer, verb: &str, route: &str, answer: ResponseTemplate) {
    let once = Mock::given(method(verb)).and(path(route)).respond_with(answer);
    once.up_to_n_times(1).with_priority(1).mount(gateway).await;
}

#[tokio::test]
async fn a_proxys_own_502_in_front_of_a_gateway_that_names_itself_moves_no_payment() {
    let gateway = named_gateway_behind_a_proxy().await;
    // The proxy's own answers, once each: to the process's first question (who answers here?),
    // and to a charge request, which never reached the gateway.
    let proxys_502 = || ResponseTemplate::new(502).set_body_string("Bad Gateway");
    proxy_answers_once(&gateway, "GET", "/v1/account", proxys_502()).await;
    proxy_answers_once(&gateway, "POST", "/v1/charges", proxys_502()).await;
    let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
    let key = new_key();

    // The 502 named nobody; the look-up asked next named the gateway, which the payment records.
    // The charge's 502 leaves its outcome unknown, and moves nothing.
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(recorded_gateway(&app, &key).await, "acct_behind_a_proxy", "no 502 named a gateway");
    // The retry looks the charge up where the payment says, finds none, and charges there, once.
    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::CREATED, "{}", retry.text().await.unwrap());
    assert_eq!(recorded_gateway(&app, &key).await, "acct_behind_a_proxy");
    let trail = app.audit_trail().await;
    assert!(!trail.iter().any(|(action, _)| action == "payment.gateway_changed"), "{trail:?}");
}

/// A proxy's own 4xx names no gateway, so it teaches nothing and settles nothing: a `429` of its
/// rate limiter, or a `403` of its firewall, to a charge for a payment whose gateway names
/// itself leaves the outcome unknown, the payment stays with the gateway the process knows, and
/// the retry charges there. Taken as the URL's, the 429 moved the payment to a "gateway" that
/// holds nothing, and no retry, completer run or `attention retry` could charge it again; taken
/// as the gateway's, the 403 failed the payment for good (a stored 502).
#[tokio::test]
async fn a_proxys_own_4xx_in_front_of_a_gateway_the_process_knows_moves_no_payment() {
    for proxys in [ResponseTemplate::new(429).set_body_string("Slow down"), ResponseTemplate::new(403)] {
        let gateway = named_gateway_behind_a_proxy().await;
        let app = TestApp::builder().gateway_url(gateway.uri()).spawn().await;
        assert_eq!(&*app.gateway_id().await, "acct_behind_a_proxy", "the process knows its gateway");
        proxy_answers_once(&gateway, "POST", "/v1/charges", proxys).await;
        let key = new_key();

        assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(recorded_gateway(&app, &key).await, "acct_behind_a_proxy");
        let retry = app.post_payment(&key, &payment_body()).await;
        assert_eq!(retry.status(), StatusCode::CREATED, "{}", retry.text().await.unwrap());
        assert_eq!(&*app.gateway_id().await, "acct_behind_a_proxy", "the 4xx taught the process nothing");
        let trail = app.audit_trail().await;
        assert!(!trail.iter().any(|(action, _)| action == "payment.gateway_changed"), "{trail:?}");
    }
}

/// A fresh process whose question "who answers here?" gets a proxy's bare `404`, and whose
/// first charge times out before it reaches the gateway: the look-up asked next names the
/// gateway, which the payment records, and the retry settles it there. (Before, the 404 taught
/// the process the URL's identity, the payment recorded it, and the gateway that named itself on
/// the retry's look-up was "another gateway": `503` for ever.)
#[tokio::test]
async fn a_fresh_process_whose_identity_question_gets_a_bare_404_and_whose_charge_times_out_charges_once() {
    let gateway = named_gateway_behind_a_proxy().await;
    proxy_answers_once(&gateway, "GET", "/v1/account", ResponseTemplate::new(404)).await;
    let stalled = ResponseTemplate::new(504).set_delay(Duration::from_secs(5));
    proxy_answers_once(&gateway, "POST", "/v1/charges", stalled).await;
    let app = TestApp::builder().gateway_url(gateway.uri()).gateway_timeout(Duration::from_millis(500)).spawn().await;
    let key = new_key();

    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(recorded_gateway(&app, &key).await, "acct_behind_a_proxy", "the 404 taught nothing");
    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::CREATED, "{}", retry.text().await.unwrap());
}

/// A payment recorded under the address's identity (nothing at the address named a gateway when
/// it started) is not settled by the first gateway to name itself there: its charge may have
/// been made, its answer lost, at a gateway since restarted with an empty memory, which would
/// charge it again. It waits for a person, who knows where it was charged.
#[tokio::test]
async fn a_payment_recorded_before_any_gateway_named_itself_is_never_charged_by_a_gateway_that_names_itself_later() {
    let gateway = MockServer::start().await;
    // Nothing names a gateway: the payment records the address. The charge is made, by a
    // gateway that names itself, but its answer comes too late.
    for route in ["/v1/account", "/v1/charges"] {
        proxy_answers_once(&gateway, "GET", route, ResponseTemplate::new(502)).await;
    }
    let charged = ResponseTemplate::new(200)
        .insert_header("Gateway-Account", "acct_first")
        .set_body_json(json!({ "id": "ch_lost", "status": "succeeded" }))
        .set_delay(Duration::from_secs(2));
    Mock::given(method("POST")).and(path("/v1/charges")).respond_with(charged).up_to_n_times(1).mount(&gateway).await;
    let app = TestApp::builder().gateway_url(gateway.uri()).gateway_timeout(Duration::from_millis(500)).spawn().await;
    let key = new_key();
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(recorded_gateway(&app, &key).await, gateway.uri() + "/");

    // The gateway is replaced by another, which names itself, with an empty memory.
    let replaced = |status: u16| ResponseTemplate::new(status).insert_header("Gateway-Account", "acct_second");
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .respond_with(replaced(200).set_body_json(json!({ "object": "list", "data": [] })))
        .mount(&gateway)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/charges"))
        .respond_with(replaced(200).set_body_json(json!({ "id": "ch_again", "status": "succeeded" })))
        .mount(&gateway)
        .await;

    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::SERVICE_UNAVAILABLE, "{}", retry.text().await.unwrap());
    let requests = gateway.received_requests().await.unwrap();
    let charges = requests.iter().filter(|request| request.method.as_str() == "POST").count();
    assert_eq!(charges, 1, "never asked to charge again");
}

/// A payment that records a gateway gone for good (or one recorded wrongly) needs a person: the
/// completer leaves it to a process that reaches that gateway, and, once none has run it for long,
/// gives up on it, naming the recorded gateway and the one answering now. Once the person
/// knows the recorded gateway holds nothing under the key, `payments attention retry KEY_ID
/// --gateway <the one answering now>` records that one instead and hands the key back, and the
/// worker charges there, once. A refund is put right the same way, with its payment.
#[tokio::test]
async fn a_key_stranded_on_a_gateway_recorded_wrongly_is_put_right_by_an_operator() {
    let gateway = Process::gateway().await;
    let at_gateway = GatewayControl::new(&gateway.url);
    let app = TestApp::builder()
        .gateway_url(&gateway.url)
        .workers(|w| {
            w.completer_backoff = Duration::ZERO;
            w.completer_max_attempts = 1;
        })
        .spawn()
        .await;
    let now_answering = app.gateway_id().await;
    let env = [("DATABASE_URL", app.database.url.as_str())];
    let attention =
        || async { needing_attention(&mut app.db().await, &payments_service::endpoints::all()).await.unwrap() };

    // A payment left at `started` by a run that recorded a gateway that is gone.
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "started", Lock::Free).await;
    let payment_id = app.seed_payment(key_id, &key, "pending", None).await;
    app.run_sql(&format!("UPDATE payments SET gateway = 'acct_gone' WHERE id = '{payment_id}'")).await;
    // The completer leaves it to a process that reaches that gateway; none runs it for long.
    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Idle);
    untaken_for_long(&app, &key).await;
    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Worked);
    let stuck = attention().await;
    assert_eq!(stuck.len(), 1);
    assert!(stuck[0].attention_reason.contains("acct_gone") && stuck[0].attention_reason.contains(&*now_answering));
    assert_eq!(at_gateway.stats().await.requests, 0, "never charged where it was not recorded");

    let retried = attention_retry(&key_id.to_string(), &now_answering, &env).await;
    assert!(retried.status.success(), "{}", String::from_utf8_lossy(&retried.stderr));
    assert!(attention().await.is_empty());
    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Worked);
    let replay = app.post_payment(&key, &payment_body()).await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(at_gateway.stats().await.charges, 1);
    let changed =
        "SELECT count(*) = 1 FROM audit_records WHERE action = 'payment.gateway_changed' AND actor = 'operator'";
    assert!(app.database_says(changed).await);

    // A refund of a payment charged here whose recorded gateway is wrong: the same way out.
    let payment = app.paid(1000, "tok_visa").await;
    let id = payment["id"].as_str().unwrap();
    app.run_sql(&format!("UPDATE payments SET gateway = 'acct_wrong' WHERE id = '{id}'")).await;
    let refund_key = new_key();
    let refund = json!({ "payment": id, "amount": 400 });
    assert_eq!(app.post_refund(&refund_key, &refund).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Idle);
    untaken_for_long(&app, &refund_key).await;
    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Worked);
    let refund_key_id = app.key_row(&refund_key).await.unwrap().id;
    assert_eq!(attention().await.iter().map(|key| key.id).collect::<Vec<_>>(), [refund_key_id]);
    // A gateway no gateway could name itself by is refused, and changes nothing.
    let refused = attention_retry(&refund_key_id.to_string(), "acct\twrong", &env).await;
    assert!(!refused.status.success());
    assert_eq!(attention().await.len(), 1);

    let retried = attention_retry(&refund_key_id.to_string(), &now_answering, &env).await;
    assert!(retried.status.success(), "{}", String::from_utf8_lossy(&retried.stderr));
    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Worked);
    let refunded: Value = app.post_refund(&refund_key, &refund).await.json().await.unwrap();
    assert_eq!(refunded["status"], "succeeded", "{refunded}");
    assert!(app.database_says(&format!("SELECT gateway = '{now_answering}' FROM payments WHERE id = '{id}'")).await);
}

/// A `serve` whose completer looks for work every 100 ms and takes a key as soon as it is free
/// (with the shortest lock timeout it accepts for this gateway timeout).
const EAGER_SERVE: [(&str, &str); 4] = [
    ("PAYMENTS_LOCK_TIMEOUT_MS", "13100"),
    ("PAYMENTS_GATEWAY_TIMEOUT_MS", "1200"),
    ("PAYMENTS_WORKER_INTERVAL_MS", "100"),
    ("PAYMENTS_COMPLETER_BACKOFF_MS", "0"),
];

/// A capture whose payment records its gateway wrongly: the gateway that holds the charge
/// answers, and is not believed (`503`). The capture stands as its authorization's one change, so
/// every other capture or cancel is refused (the lapse's too), until a person records where the
/// charge is: `attention retry KEY_ID --gateway` records it on the change and its payment, as on
/// a payment or a refund, and the `serve`'s completer finishes the capture there, adopting what
/// the gateway did. (Before, the command found no pending payment or refund under the key and
/// refused: the authorization stayed blocked for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_stranded_on_a_gateway_recorded_wrongly_is_put_right_by_an_operator_and_finishes() {
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let (_, api_key) = payments_service::accounts::create(&mut conn, "stranded").await.unwrap();
    let gateway = Process::gateway().await;
    let serve = Process::serve(&database.url, &gateway.url, &[], &EAGER_SERVE).await;
    let http = reqwest::Client::new();
    let post = |path: String, key: &str, body: Value| {
        let request = http.post(format!("{}{path}", serve.url)).bearer_auth(&api_key).header("Idempotency-Key", key);
        request.json(&body).send()
    };
    let says = |condition: String| {
        let url = database.url.clone();
        async move { TestApp::database_says_on(&mut AsyncPgConnection::establish(&url).await.unwrap(), &condition).await }
    };
    let authorization = json!({ "amount": 5000, "currency": "usd", "source": "tok_visa", "capture": false });
    let authorized: Value = post("/v1/payments".into(), &new_key(), authorization).await.unwrap().json().await.unwrap();
    let id = authorized["id"].as_str().unwrap();
    assert_eq!(authorized["status"], "requires_capture");
    diesel::sql_query(format!("UPDATE payments SET gateway = 'acct_gone' WHERE id = '{id}'"))
        .execute(&mut conn)
        .await
        .unwrap();

    // The capture is made at the gateway, whose answer is not believed: it names another.
    let capture = new_key();
    let stranded = post(format!("/v1/payments/{id}/capture"), &capture, json!({})).await.unwrap();
    assert_eq!(stranded.status(), StatusCode::SERVICE_UNAVAILABLE);
    let cancel = post(format!("/v1/payments/{id}/cancel"), &new_key(), json!({})).await.unwrap();
    assert_eq!(cancel.status(), StatusCode::BAD_REQUEST, "the stranded capture holds the authorization");
    // No process reaches `acct_gone`: once nobody has run the key for long, the completer gives up.
    let ago = STRANDED_AFTER.as_secs() + 60;
    let aged = format!(
        "UPDATE idempotency_keys SET last_run_at = now() - interval '{ago} seconds' WHERE idempotency_key = '{capture}'"
    );
    diesel::sql_query(aged).execute(&mut conn).await.unwrap();
    let of_capture = format!("FROM idempotency_keys WHERE idempotency_key = '{capture}'");
    wait_until(Duration::from_secs(20), "the completer gives up on the stranded capture", || {
        says(format!("SELECT needs_attention_at IS NOT NULL AND attention_reason LIKE '%acct_gone%' {of_capture}"))
    })
    .await;

    let key_id = needing_attention(&mut conn, &payments_service::endpoints::all()).await.unwrap().remove(0).id;
    let holder = identity_of(&gateway).await;
    let env = [("DATABASE_URL", database.url.as_str())];
    let retried = attention_retry(&key_id.to_string(), &holder, &env).await;
    assert!(retried.status.success(), "{}", String::from_utf8_lossy(&retried.stderr));

    wait_until(Duration::from_secs(20), "the completer finishes the capture", || {
        says(format!("SELECT recovery_point = 'finished' {of_capture}"))
    })
    .await;
    let replay = post(format!("/v1/payments/{id}/capture"), &capture, json!({})).await.unwrap();
    assert_eq!(replay.status(), StatusCode::OK);
    let captured: Value = replay.json().await.unwrap();
    assert_eq!((&captured["status"], &captured["amount_captured"]), (&json!("succeeded"), &json!(5000)));
    assert_eq!(GatewayControl::new(&gateway.url).all_stats().await["captures"], 1, "captured once, by the first call");
    let recorded = format!(
        "SELECT count(*) = 2 FROM audit_records
         WHERE action IN ('payment_change.gateway_changed', 'payment.gateway_changed') AND actor = 'operator'
           AND data->>'to' = '{holder}'"
    );
    assert!(says(recorded).await, "the change and its payment record the gateway, on the record");
}

async fn attention_retry(key_id: &str, gateway: &str, env: &[(&str, &str)]) -> std::process::Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_payments"));
    command
        .args(["attention", "retry", key_id, "--gateway", gateway])
        .env_remove("DATABASE_URL")
        .envs(env.iter().copied());
    command.output().await.unwrap()
}

#[tokio::test]
async fn a_refund_is_never_made_or_believed_at_another_gateway_than_the_payments() {
    let mut gateway = Process::gateway().await;
    let app = TestApp::builder().gateway_url(&gateway.url).spawn().await;
    let payment = app.paid(1000, "tok_visa").await;
    let charged_at = app.gateway_id().await;

    // The mock restarts on the same address, its charges gone: another gateway answers there.
    let restarted = replace(&mut gateway).await;
    let response = app.post_refund(&new_key(), &json!({ "payment": payment["id"], "amount": 400 })).await;

    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "its answer is not the charge's gateway's");
    assert_eq!(response.headers()["retry-after"], "2");
    let id = payment["id"].as_str().unwrap();
    let reserved = format!(
        "SELECT p.amount_refund_pending = 400 AND p.amount_refunded = 0 AND r.status = 'pending'
         FROM payments p JOIN refunds r ON r.payment_id = p.id WHERE p.id = '{id}'"
    );
    assert!(app.database_says(&reserved).await, "nothing final: pending, its amount reserved");
    assert_ne!(*app.gateway_id().await, *charged_at, "the process now knows the other gateway");
    let refunds = GatewayControl::new(&restarted.url).all_stats().await["refunds"].as_u64();
    assert_eq!(refunds, Some(0), "nothing refunded at the other gateway");
}

//! The README's first command: `payments serve` with no configuration at all runs its own
//! PostgreSQL and mock gateway, takes a payment with the demo key, and stops cleanly.

use std::time::Duration;

use payments_service::gateway::signature::{self, WebhookSecret};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{GatewayControl, Process, new_key, payment_body, wait_until};

#[tokio::test]
async fn serve_with_embedded_defaults_takes_payments_and_stops_cleanly() {
    // A checkout in a private directory, as `mktemp -d` makes them (0700): the server, which runs
    // as another user when the tests run as root, must still reach its data.
    let private = std::env::temp_dir().join(format!("payments-embedded-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let data_dir = private.join(".payments");
    let data = data_dir.to_str().unwrap();
    let env = [
        ("PAYMENTS_DATA_DIR", data),
        ("PAYMENTS_BIND", "127.0.0.1:0"),
        ("PAYMENTS_MOCK_GATEWAY_BIND", "127.0.0.1:0"),
        ("PAYMENTS_METRICS_BIND", "127.0.0.1:0"),
    ];

    let mut serve = Process::start(&["serve"], &env, payments_service::startup::LISTENING).await;
    let printed = |text: &'static str| {
        let mut stdout = serve.stdout.clone();
        async move { stdout.wait_for(|lines| lines.iter().any(|line| line.contains(text))).await.is_ok() }
    };
    assert!(printed("demo API key: sk_test_demo").await);
    assert!(printed("try: curl").await);

    let http = reqwest::Client::new();
    let key = new_key();
    let pay = || {
        http.post(format!("{}/v1/payments", serve.url))
            .bearer_auth("sk_test_demo")
            .header("Idempotency-Key", &key)
            .json(&payment_body())
            .send()
    };
    let created = pay().await.unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let payment: Value = created.json().await.unwrap();
    assert_eq!(payment["status"], "succeeded");

    // Its mock tells it of the charge, at its own webhook, signed with a secret made for this run
    // (which the service accepts, or the event would not be acknowledged).
    let line = |prefix: &str| {
        let lines = serve.stdout.borrow();
        let line = lines.iter().find_map(|line| line.strip_prefix(prefix).map(str::to_owned));
        line.unwrap_or_else(|| panic!("no {prefix:?} line in {lines:?}"))
    };
    assert_eq!(line("gateway events: to "), format!("{}/webhooks/gateway", serve.url));
    let secret = line("webhook secret: ").split_whitespace().next().unwrap().to_owned();
    assert!(secret.starts_with("whsec_") && secret.len() == 6 + 32, "{secret}");
    let mock = line("gateway: in-process mock at ");
    let gateway = GatewayControl::new(&mock);
    wait_until(Duration::from_secs(20), "the charge's event is acknowledged", || async {
        gateway.all_stats().await["events_acknowledged"] == 1
    })
    .await;
    // And an event signed by hand with the printed secret is taken; one signed otherwise is not.
    let event = json!({"id": "evt_by_hand", "object": "event", "type": "charge.succeeded", "created": 1,
        "data": {"object": {"id": "ch_by_hand"}}, "request": {"idempotency_key": "not-ours"}})
    .to_string();
    let now = chrono::Utc::now().timestamp();
    for (signed_with, status) in [(secret.as_str(), StatusCode::OK), ("whsec_other", StatusCode::BAD_REQUEST)] {
        let header = signature::sign(&[WebhookSecret::new(signed_with)], now, event.as_bytes());
        let sent = http.post(format!("{}/webhooks/gateway", serve.url)).header("Gateway-Signature", header);
        let answer = sent.body(event.clone()).send().await.unwrap();
        assert_eq!(answer.status(), status, "signed with {signed_with}");
    }

    // A second `serve` on the same directory refuses to share the first one's cluster.
    let second = tokio::process::Command::new(env!("CARGO_BIN_EXE_payments"))
        .args(["serve", "--bind", "127.0.0.1:0", "--mock-gateway-bind", "127.0.0.1:0"])
        .env("PAYMENTS_DATA_DIR", data)
        .env_remove("DATABASE_URL")
        .output()
        .await
        .unwrap();
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("another process already runs the embedded PostgreSQL"));

    // While it runs, `accounts create` joins the same cluster.
    let account = tokio::process::Command::new(env!("CARGO_BIN_EXE_payments"))
        .args(["accounts", "create", "Acme"])
        .env("PAYMENTS_DATA_DIR", data)
        .env_remove("DATABASE_URL")
        .output()
        .await
        .unwrap();
    assert!(account.status.success(), "{}", String::from_utf8_lossy(&account.stderr));
    let api_key = String::from_utf8(account.stdout).unwrap().lines().last().unwrap().to_owned();
    assert!(api_key.starts_with("sk_") && api_key.len() > 20, "{api_key}");
    let listed = http.get(format!("{}/v1/payments", serve.url)).bearer_auth(&api_key).send().await.unwrap();
    assert_eq!(listed.status(), StatusCode::OK, "the new key works at once");

    // A worker beside it charges through the same in-process mock, wherever that listens.
    let mock = serve
        .stdout
        .borrow()
        .iter()
        .find_map(|line| line.strip_prefix("gateway: in-process mock at ").map(str::to_owned));
    let mock = mock.expect("serve names its mock gateway");
    let worker = Process::start(&["worker"], &env, payments_service::startup::WORKER_RUNNING).await;
    assert!(worker.url.contains(&format!("gateway {mock}/")), "{} should name {mock}", worker.url);
    drop(worker);

    serve.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(serve.exited().await.success());
    assert!(!data_dir.join("data/postmaster.pid").exists(), "the cluster stopped with the service");

    // The data survives a restart: the payment is replayed, not made again. The secret is new.
    let mut serve = Process::start(&["serve"], &env, payments_service::startup::LISTENING).await;
    let mut stdout = serve.stdout.clone();
    let lines = stdout.wait_for(|lines| lines.iter().any(|line| line.starts_with("webhook secret: "))).await.unwrap();
    assert!(!lines.iter().any(|line| line.contains(&secret)), "a secret per run");
    drop(lines);
    let replay = http
        .post(format!("{}/v1/payments", serve.url))
        .bearer_auth("sk_test_demo")
        .header("Idempotency-Key", &key)
        .json(&payment_body())
        .send()
        .await
        .unwrap();
    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
    serve.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(serve.exited().await.success());
    std::fs::remove_dir_all(&private).unwrap();
}

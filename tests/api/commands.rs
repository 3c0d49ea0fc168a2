//! The binary's commands, as an operator runs them.

use payments::idempotency::needing_attention;
use tokio::process::Command;

use crate::helpers::{Lock, TestApp, new_key, payment_body};

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
        assert!(error.contains("PAYMENTS_LOCK_TIMEOUT_MS") && error.contains("at least 36000 ms"), "{error}");

        let short_retention = payments(&[command], &[("PAYMENTS_KEY_RETENTION_SECS", "60")]).await;
        assert!(!short_retention.status.success());
        assert!(String::from_utf8_lossy(&short_retention.stderr).contains("Raise the retention"));
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
    assert!(needing_attention(&mut app.db().await).await.unwrap().is_empty());
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

//! `payments chaos`, as a reader runs it: a short run in a world of its own, and one against a
//! running deployment. Both make refunds beside the payments, and check them.

use tokio::process::Command;

use crate::helpers::{Svg, TestApp};

async fn chaos(args: &[&str]) -> (Option<i32>, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_payments"));
    command.arg("chaos").args(args);
    for var in ["DATABASE_URL", "GATEWAY_URL", "PAYMENTS_API_KEY"] {
        command.env_remove(var);
    }
    command.kill_on_drop(true);
    // However it goes wrong, a run ends: a chaos run that hangs fails the test instead.
    let output = tokio::time::timeout(std::time::Duration::from_secs(600), command.output()).await;
    let output = output.expect("payments chaos ended within 10 minutes").expect("running payments chaos");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

/// The count on a row of the table, such as `kills (SIGKILL)   12   serve-a 5, ...`.
pub fn count(table: &str, row: &str) -> u64 {
    let line = table.lines().find(|line| line.trim_start().starts_with(row)).unwrap_or_else(|| panic!("no {row}"));
    let rest = line.trim_start()[row.len()..].split_whitespace().next().unwrap_or_default();
    rest.parse().unwrap_or_else(|_| panic!("no count in {line:?}"))
}

/// Every invariant the table holds, payments', refunds', authorizations' and the gateway's events'.
const INVARIANTS: usize = 20;

/// The invariant that every payment records the money its gateway holds.
const MONEY_HELD: &str = "every payment records the money its gateway holds, or is flagged for a person";

/// The invariants of the gateway's events.
const ACKNOWLEDGED: &str = "each gateway event sent, acknowledged, and one inbox row";
const APPLIED_ONCE: &str = "each gateway event applied once (one gateway_event.received)";
const NO_DISAGREEMENT: &str = "no gateway event disagreed; no key flagged gateway_disagreement";

/// The detail of the invariant `name`, which held.
fn held<'a>(table: &'a str, name: &str) -> &'a str {
    let line = table.lines().find(|line| line.contains(name)).unwrap_or_else(|| panic!("no {name}: {table}"));
    assert!(line.trim_start().starts_with("held "), "{line}");
    line[line.find(name).unwrap() + name.len()..].trim()
}

/// That the gateway's events were checked, not skipped, and held: `sent` of them (as many
/// acknowledged, as many rows in the inbox, but for those about the authorizations the gateway
/// changed on its own, which have none), each applied once, none a disagreement.
fn events_held(table: &str, sent: u64) {
    assert!(sent > 0, "{table}");
    let own = count(table, "gateway changed on its own");
    let rows = sent - own;
    assert_eq!(
        held(table, ACKNOWLEDGED),
        format!("{sent} sent, {sent} acknowledged, {rows} inbox rows and {own} about the gateway's own changes")
    );
    assert_eq!(held(table, APPLIED_ONCE), format!("{rows} records for {rows} events"));
    assert_eq!(held(table, NO_DISAGREEMENT), "0 in the inbox, 0 keys flagged");
    assert_eq!(count(table, "inbox rows"), rows, "{table}");
}

/// That a run's table says every invariant held: each of the [`INVARIANTS`] listed and `held`,
/// none broken, and the gateway's events among them checked, not skipped (see [`events_held`]).
pub fn every_invariant_held(table: &str) {
    assert!(table.ends_with("every invariant held\n"), "{table}");
    assert!(!table.contains("BROKEN"), "{table}");
    assert_eq!(table.matches("\n  held   ").count(), INVARIANTS, "{table}");
    events_held(table, count(table, "events sent"));
}

/// The detail on a row of the table, after its count.
fn detail<'a>(table: &'a str, row: &str) -> &'a str {
    let line = table.lines().find(|line| line.trim_start().starts_with(row)).unwrap_or_else(|| panic!("no {row}"));
    line.trim_start()[row.len()..].trim()
}

#[tokio::test]
async fn a_short_chaos_run_kills_crashes_and_faults_and_every_invariant_holds() {
    let plots = std::env::temp_dir().join(format!("payments-plots-{}", uuid::Uuid::new_v4().simple()));
    let (code, table, log) = chaos(&["--keys", "200", "--plot", plots.to_str().unwrap()]).await;
    assert_eq!(code, Some(0), "{table}\n{log}");
    every_invariant_held(&table);
    assert_eq!(count(&table, "payments (keys)"), 200);
    // Refunds were mixed in: several at once on one payment, so that the money rule refused some
    // of them; some left pending by the gateway (the invariants hold that they settled).
    assert!(count(&table, "refunds (keys)") > 0, "{table}");
    assert!(!detail(&table, "refunds (keys)").ends_with(" 0 of them by 2 or 3 refunds at once"), "{table}");
    let outcomes = detail(&table, "refund outcomes");
    assert!(
        outcomes.contains("refused payment-already-refunded") || outcomes.contains("refused refund-exceeds-payment"),
        "{table}"
    );
    let settled = table.lines().find(|line| line.contains("every pending refund settled")).unwrap();
    assert!(!settled.contains(" 0 answered pending"), "{table}");
    // Authorizations were mixed in: captures and cancels raced for them, and the lapse took the
    // ones left alone (the invariants hold that exactly one won each, as at the gateway).
    assert!(count(&table, "captures and cancels (keys)") > 0, "{table}");
    let ended = detail(&table, "captures and cancels (keys)");
    for outcome in ["captured ×", "cancelled ×", "lapsed ×"] {
        assert!(ended.contains(outcome), "{outcome}: {table}");
    }
    assert!(!ended.contains("still open"), "{table}");
    // The gateway captured or cancelled some authorizations on its own, and every payment records
    // the money its gateway holds for it (none needed a person).
    assert!(count(&table, "gateway changed on its own") > 0, "{table}");
    assert!(held(&table, MONEY_HELD).ends_with("0 flagged for a person, 0 broken"), "{table}");
    // The storm happened: processes were killed and restarted, and frozen past their leases; the
    // gateway failed and forgot its keys; some requests carried crash points and some clients
    // walked away.
    let storm = [
        "kills (SIGKILL)",
        "pauses past the lease",
        "gateway faults",
        "gateway forgot its keys",
        "crash points sent",
        "abandoned after one try",
    ];
    for row in storm {
        assert!(count(&table, row) > 0, "{row}: {table}");
    }
    // The gateway's events were misdelivered: some sent twice, some of those to both servers at
    // once, and servers killed while events were on their way; each was acknowledged, recorded
    // once and applied once, and none was taken for a disagreement.
    let twice = detail(&table, "events sent");
    assert!(!twice.contains("; 0 of them twice") && !twice.contains(", 0 to both servers"), "{table}");
    assert!(count(&table, "kills amid events") > 0, "{table}");
    timeline_holds_the_storm(&plots.join("chaos-timeline.svg"), &table);
    std::fs::remove_dir_all(&plots).unwrap();
}

/// The timeline marks every kill, pause and forgetting the table counts, and draws the attempts
/// by answer, the gateway's requests and faults, and the keys unfinished.
fn timeline_holds_the_storm(path: &std::path::Path, table: &str) {
    let timeline = Svg::read(path);
    let texts = timeline.texts();
    let rows = ["killed", "paused", "crash-point abort", "keys forgotten"];
    let rules = ["load ends", "every key asked once more"];
    let lines = ["201", "charge and refund requests", "failed on purpose", "keys unfinished"];
    let labels = ["attempts per second", "at the gateway, per second", "seconds since the load started"];
    for text in rows.into_iter().chain(rules).chain(lines).chain(labels) {
        assert!(texts.contains(&text), "{text}: {texts:?}");
    }
    let (kill, pause, forgetting) = ("#D62728", "#FF7F0E", "#7F7F7F");
    assert_eq!(timeline.ticks(kill) as u64, count(table, "kills (SIGKILL)"), "a tick per kill");
    assert_eq!(timeline.bars(pause) as u64, count(table, "pauses past the lease"), "a bar per pause");
    assert_eq!(timeline.ticks(forgetting) as u64, count(table, "gateway forgot its keys"), "a tick per forgetting");
    // The attempts answered 201, and the keys unfinished, sampled each second.
    for (what, color) in [("201", "#2CA02C"), ("keys unfinished", "#1F77B4")] {
        assert!(timeline.series(color) > 0, "{what}: {texts:?}");
    }
}

#[tokio::test]
async fn a_running_deployment_is_driven_and_checked_but_not_killed() {
    // Its gateway sends its events to it, and the run checks them too.
    let app = TestApp::builder().gateway_events().spawn().await;
    // This deployment runs no workers: every client sees its payment through, and nothing would
    // settle a refund the gateway left pending.
    let args = [
        ["--url", app.address.as_str()],
        ["--api-key", app.api_key.as_str()],
        ["--database-url", app.database.url.as_str()],
        ["--gateway-url", app.gateway_url()],
        ["--keys", "30"],
        ["--abandon-rate", "0"],
        ["--pending-refund-rate", "0"],
    ];
    let (code, table, log) = chaos(&args.concat()).await;
    assert_eq!(code, Some(0), "{table}\n{log}");
    for row in ["kills (SIGKILL)", "pauses past the lease", "crash points sent"] {
        assert_eq!(count(&table, row), 0, "{row}: {table}");
    }
    assert_eq!(table.matches("not checked: the deployment's webhook is not the run's").count(), 2, "{table}");
    // Charges made at once and authorizations alike.
    let stats = app.gateway.all_stats().await;
    let succeeded = stats["charges"].as_u64().unwrap() + stats["authorizations"].as_u64().unwrap();
    assert!(table.contains(&format!("{succeeded} = {succeeded} = {succeeded}")), "{table}");
    // Its authorizations are not left to lapse (it need not lapse them within the run): each
    // ends by a capture or a cancel.
    assert!(!detail(&table, "captures and cancels (keys)").contains("lapsed"), "{table}");
    let refunds = app.gateway.all_stats().await["refunds"].as_u64().unwrap();
    assert!(refunds > 0, "{table}");
    assert!(table.contains(&format!("{refunds} = {refunds} = {refunds}")), "{table}");
    let sent = app.gateway.all_stats().await["events"].as_u64().unwrap();
    assert_eq!(count(&table, "events sent"), sent, "{table}");
    events_held(&table, sent);
}

#[tokio::test]
async fn without_kills_a_server_that_crashed_at_a_crash_point_is_still_started_again() {
    let (code, table, log) = chaos(&["--keys", "40", "--no-kills", "--crash-rate", "0.5", "--clients", "8"]).await;
    assert_eq!(code, Some(0), "{table}\n{log}");
    for row in ["kills (SIGKILL)", "pauses past the lease"] {
        assert_eq!(count(&table, row), 0, "{row}: {table}");
    }
    // Crash points aborted servers, and they came back: no client had to give up.
    let aborted = table.lines().find(|line| line.contains("crash points sent")).unwrap_or_default();
    assert!(!aborted.contains(" 0 processes aborted"), "{table}");
    assert_eq!(count(&table, "clients that gave up"), 0, "{table}");
}

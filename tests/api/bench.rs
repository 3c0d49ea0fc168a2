//! `payments bench`, briefly, against a deployment of its own: it reports every figure (the refund
//! scenario's and its pgbench reference's too), finds the protocol keeping its promises under
//! load, draws what it saw, and leaves nothing running behind it.

use serde_json::Value;

use crate::helpers::Svg;

/// Each scenario's colour in the charts, and the references'.
const SCENARIO_COLORS: [(&str, &str); 5] = [
    ("new", "#1F77B4"),
    ("replay", "#2CA02C"),
    ("duplicates", "#9467BD"),
    ("refund", "#FF7F0E"),
    ("capture", "#D62728"),
];
const REFERENCES: [&str; 4] = ["pgbench new_payment.sql", "pgbench replay.sql", "pgbench refund.sql", "bare endpoint"];

/// Where each figure is in the JSON report; all of them must be there and measured.
const FIGURES: &[&str] = &[
    "/machine/cores",
    "/machine/kernel",
    "/machine/postgresql",
    "/settings/clients",
    "/api_rss_kib/before",
    "/api_rss_kib/after",
    "/references/pgbench_new_payment/tps",
    "/references/pgbench_new_payment/latency_average_ms",
    "/references/pgbench_new_payment/postgres_cpu_us_per_transaction",
    "/references/pgbench_new_payment/wal_bytes_per_transaction",
    "/references/pgbench_replay/tps",
    "/references/pgbench_refund/tps",
    "/references/pgbench_refund/latency_average_ms",
    "/references/pgbench_refund/postgres_cpu_us_per_transaction",
    "/references/pgbench_refund/wal_bytes_per_transaction",
    "/references/bare_endpoint/throughput_per_s",
    "/references/bare_endpoint/latency_ms/p99",
    "/references/bare_endpoint/cpu_us_per_request/endpoint",
    "/ratios/new_vs_pgbench_new_payment",
    "/ratios/replay_vs_bare_endpoint",
    "/ratios/replay_vs_pgbench_replay",
    "/ratios/replay_p99_vs_bare_endpoint_p99",
    "/ratios/new_p99_vs_new_mean",
    "/ratios/refund_vs_pgbench_refund",
    "/ratios/refund_vs_new",
    "/ratios/capture_vs_new",
];

/// What every scenario reports.
const SCENARIO_FIGURES: &[&str] = &[
    "/requests",
    "/duration_s",
    "/throughput_per_s",
    "/latency_ms/p50",
    "/latency_ms/p90",
    "/latency_ms/p99",
    "/latency_ms/max",
    "/latency_ms/mean",
    "/errors",
    "/violations",
    "/cpu_us_per_request/api",
    "/cpu_us_per_request/gateway",
    "/cpu_us_per_request/postgres",
    "/cpu_us_per_request/bench",
    "/statements_per_request",
    "/wal_bytes_per_request",
    "/payments_created",
    "/refunds_created",
    "/during_load/cpu_us_per_request/api",
    "/during_load/cpu_us_per_request/postgres",
    "/during_load/statements_per_request",
    "/during_load/wal_bytes_per_request",
    "/outbox/backlog_max",
    "/outbox/drain_ms",
    "/outbox/deliveries",
];

#[tokio::test]
async fn bench_reports_every_figure_and_finds_no_violation() {
    let json = std::env::temp_dir().join(format!("payments-bench-{}.json", uuid::Uuid::new_v4().simple()));
    let plots = std::env::temp_dir().join(format!("payments-plots-{}", uuid::Uuid::new_v4().simple()));
    let mut bench = tokio::process::Command::new(env!("CARGO_BIN_EXE_payments"));
    bench.args(["bench", "--clients", "4", "--duration", "1s", "--replay-keys", "40", "--references"]);
    // Every statement explained, so that each scenario's costliest have their plans.
    bench.args(["--explain-every", "1", "--json"]);
    bench.arg(&json).arg("--plot").arg(&plots).env_remove("DATABASE_URL").kill_on_drop(true);
    bench.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let bench = bench.spawn().unwrap();
    let scratch = std::env::temp_dir().join(format!("payments-bench-{}", bench.id().unwrap()));
    let output = bench.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "payments bench failed:\n{stderr}");
    assert!(!scratch.exists(), "its cluster and logs are removed at the end");
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.contains("| new payments / pgbench new payment tps |"), "{table}");
    assert!(table.contains("| refunds / pgbench refund tps |"), "{table}");
    assert!(table.contains("| authorized and captured / new payments |"), "{table}");

    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    for figure in FIGURES {
        assert!(report.pointer(figure).is_some_and(|v| !v.is_null()), "{figure} missing in {report:#}");
    }
    for scenario in ["new", "replay", "duplicates", "refund", "capture"] {
        let figures = &report["scenarios"][scenario];
        for figure in SCENARIO_FIGURES {
            assert!(figures.pointer(figure).is_some_and(|v| !v.is_null()), "{scenario}{figure} missing in {figures:#}");
        }
        // A capture's pair is answered, last, `200`; every other scenario's request `201`.
        let success = if scenario == "capture" { "200" } else { "201" };
        assert!(figures["statuses"][success].as_u64().unwrap() > 0, "{scenario}: {figures:#}");
        assert!(figures["throughput_per_s"].as_f64().unwrap() > 0.0, "{scenario}: {figures:#}");
        assert_eq!(figures["violations"], 0, "{scenario}: {figures:#}");
    }
    let duplicates = &report["scenarios"]["duplicates"];
    assert!(duplicates["groups"].as_u64().unwrap() > 0);
    assert_eq!(duplicates["payments_created"], duplicates["groups"], "one payment per key: {duplicates:#}");
    let new = &report["scenarios"]["new"];
    assert_eq!(new["payments_created"], new["requests"], "{new:#}");
    // The per-statement table: the claim, a new key's first phase in it, runs once per payment.
    assert!(table.contains("| statements of `new`, per request |"), "{table}");
    let statements = new["statements"].as_array().unwrap();
    let claim = statements.iter().find(|s| s["statement"].as_str().unwrap().starts_with("WITH inserted, key_audited"));
    let claim = claim.unwrap_or_else(|| panic!("no claim among {statements:#?}"));
    assert!((claim["calls_per_request"].as_f64().unwrap() - 1.0).abs() < 0.05, "{claim:#}");
    assert!(claim["exec_us_per_request"].as_f64().unwrap() > 0.0, "{claim:#}");
    // And its plan as it ran: the key row inserted, the payment with it, the account's row checked.
    let plans = new["plans"].as_array().unwrap();
    let plan = plans.iter().find(|p| p["statement"] == claim["statement"]);
    let plan = plan.unwrap_or_else(|| panic!("no plan of the claim among {plans:#?}")).to_string();
    for node in ["CTE inserted: Insert on idempotency_keys", "CTE created: Insert on payments", "rows 1"] {
        assert!(plan.contains(node), "{node} not in {plan}");
    }
    assert!(table.contains("plans of `new`'s costliest statements"), "{table}");
    assert!(new["outbox"]["deliveries"].as_u64() >= new["payments_created"].as_u64(), "every event delivered");
    // Each refund request made one refund, and no payment; each refund's event was delivered.
    let refund = &report["scenarios"]["refund"];
    assert_eq!(
        (refund["refunds_created"].as_u64(), refund["payments_created"].as_u64()),
        (refund["requests"].as_u64(), Some(0)),
        "{refund:#}"
    );
    assert!(refund["outbox"]["deliveries"].as_u64() >= refund["refunds_created"].as_u64(), "every event delivered");
    // Each capture request authorized one payment and captured it.
    let capture = &report["scenarios"]["capture"];
    assert_eq!(capture["payments_created"], capture["requests"], "{capture:#}");
    assert_eq!(capture["errors"], 0, "{capture:#}");
    assert!(report["ratios"]["capture_vs_new"].as_f64().unwrap() > 0.0, "{report:#}");
    assert_eq!(report["references"]["pgbench_refund"]["failed"], 0);
    assert!(report["references"]["bare_endpoint"]["throughput_per_s"].as_f64().unwrap() > 0.0);

    charts_hold_every_run(&plots);
    std::fs::remove_dir_all(&plots).unwrap();
}

/// The latency chart has a curve per scenario and per reference, each named with its
/// percentiles; the throughput chart, a line per scenario and the bare endpoint, and the outbox
/// backlog of each scenario.
fn charts_hold_every_run(plots: &std::path::Path) {
    let latency = Svg::read(&plots.join("bench-latency.svg"));
    let texts = latency.texts();
    for run in SCENARIO_COLORS.iter().map(|(name, _)| *name).chain(REFERENCES) {
        assert!(latency.has_text(&format!("{run}: p50 ")), "{run}: {texts:?}");
    }
    for label in ["latency by percentile", "50%", "90%", "99%", "percentile", "latency"] {
        assert!(texts.iter().any(|text| text.contains(label)), "{label}: {texts:?}");
    }
    for (name, color) in SCENARIO_COLORS {
        assert!(latency.series(color) > 0, "{name}'s curve");
    }

    let throughput = Svg::read(&plots.join("bench-throughput.svg"));
    let texts = throughput.texts();
    let names = SCENARIO_COLORS.iter().map(|(name, _)| *name).chain(["bare endpoint"]);
    let labels = ["requests (transactions) per second", "outbox backlog (events)", "seconds since the run started"];
    for text in names.chain(labels) {
        assert!(texts.contains(&text), "{text}: {texts:?}");
    }
    for (name, color) in SCENARIO_COLORS {
        assert!(throughput.series(color) > 0, "{name}'s throughput and backlog");
    }
}

#[tokio::test]
async fn on_citus_bench_reports_the_scenarios_beside_one_postgresql() {
    let test = "on_citus_bench_reports_the_scenarios";
    let Some(_turn) = crate::helpers::CitusDatabase::turn(test).await else { return };
    let json = std::env::temp_dir().join(format!("payments-bench-{}.json", uuid::Uuid::new_v4().simple()));
    let mut bench = tokio::process::Command::new(env!("CARGO_BIN_EXE_payments"));
    bench.args(["bench", "--clients", "4", "--duration", "1s", "--replay-keys", "40"]);
    bench.args(["--scenarios", "new,replay,refund", "--citus-workers", "2", "--json"]).arg(&json);
    bench.env_remove("DATABASE_URL").kill_on_drop(true);
    let output = bench.output().await.unwrap();
    assert!(output.status.success(), "payments bench failed:\n{}", String::from_utf8_lossy(&output.stderr));
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.contains("On Citus, a coordinator and 2 workers"), "{table}");

    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    let citus = &report["citus"];
    assert_eq!(citus["workers"], 2, "{citus:#}");
    for scenario in ["new", "replay", "refund"] {
        let ratio = citus["vs_single_node"][scenario].as_f64();
        assert!(ratio.is_some_and(|r| r > 0.0), "{scenario}: {citus:#}");
        let figures = &citus["scenarios"][scenario];
        assert_eq!(figures["violations"], 0, "{scenario}: {figures:#}");
        for figure in
            ["statements_per_request", "single_shard_executions_per_request", "multi_shard_executions_per_request"]
        {
            assert!(figures[figure].as_f64().is_some(), "{scenario} {figure}: {figures:#}");
        }
    }
    // Each new payment made one payment on Citus too, and each refund one refund.
    let new = &citus["scenarios"]["new"];
    assert_eq!(new["payments_created"], new["requests"], "{new:#}");
    let refund = &citus["scenarios"]["refund"];
    assert_eq!(refund["refunds_created"], refund["requests"], "{refund:#}");
    // Each node's CPU per request, named, and PostgreSQL's as theirs together.
    let cpu = &new["cpu_us_per_request"];
    let nodes: Vec<&str> = cpu["nodes"].as_array().unwrap().iter().map(|n| n["node"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["coordinator", "worker 1", "worker 2"], "{cpu:#}");
    let all: f64 = cpu["nodes"].as_array().unwrap().iter().map(|n| n["cpu_us"].as_f64().unwrap()).sum();
    assert!(all > 0.0 && (cpu["postgres"].as_f64().unwrap() - all).abs() < 1e-6, "{cpu:#}");
    // A projection for more workers, from those figures; the table says it is one.
    let projected: Vec<u64> =
        citus["projected"].as_array().unwrap().iter().map(|p| p["workers"].as_u64().unwrap()).collect();
    assert_eq!(projected, [2, 4, 8, 16], "{citus:#}");
    for p in citus["projected"].as_array().unwrap() {
        let (limit, coordinator) = (p["workers_limit_per_s"].as_f64().unwrap(), p["coordinator_limit_per_s"].as_f64());
        assert_eq!(p["payments_per_s"].as_f64(), Some(coordinator.map_or(limit, |c| c.min(limit))), "{p:#}");
    }
    assert!(table.contains("a projection, not a measurement"), "{table}");
    // One PostgreSQL's figures carry no Citus counts.
    assert!(report["scenarios"]["new"]["single_shard_executions_per_request"].is_null());
    assert!(report["scenarios"]["new"]["cpu_us_per_request"]["nodes"].is_null());
}

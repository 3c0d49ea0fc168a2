//! This process's connection pool, as bb8 counts it.

use prometheus::proto::MetricFamily;
use prometheus::{Counter, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::db::Pool;

/// The pool's figures now: bb8 keeps the counts, and they are copied into fresh metrics.
pub(super) fn gather(pool: &Pool) -> Vec<MetricFamily> {
    let state = pool.state();
    let stats = &state.statistics;
    let registry = Registry::new();

    let connections = IntGaugeVec::new(
        Opts::new("db_pool_connections", "Connections of this process's pool, in use or idle."),
        &["state"],
    )
    .expect("a valid gauge");
    connections.with_label_values(&["in_use"]).set(i64::from(state.connections - state.idle_connections));
    connections.with_label_values(&["idle"]).set(i64::from(state.idle_connections));

    let checkouts = IntCounterVec::new(
        Opts::new(
            "db_pool_checkouts_total",
            "Connection checkouts: at once, after a wait, or timed out (answered 503).",
        ),
        &["result"],
    )
    .expect("a valid counter");
    checkouts.with_label_values(&["direct"]).inc_by(stats.get_direct);
    checkouts.with_label_values(&["waited"]).inc_by(stats.get_waited);
    checkouts.with_label_values(&["timed_out"]).inc_by(stats.get_timed_out);

    let waited =
        Counter::new("db_pool_checkout_wait_seconds_total", "Time checkouts spent waiting for a connection, in all.")
            .expect("a valid counter");
    waited.inc_by(stats.get_wait_time.as_secs_f64());

    registry.register(Box::new(connections)).expect("registered once");
    registry.register(Box::new(checkouts)).expect("registered once");
    registry.register(Box::new(waited)).expect("registered once");
    registry.gather()
}

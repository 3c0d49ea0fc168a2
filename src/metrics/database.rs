//! The system's state as the database has it, read at each scrape: the same in every process.

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Double};
use diesel_async::RunQueryDsl;
use prometheus::proto::MetricFamily;
use prometheus::{Gauge, IntGauge, IntGaugeVec, Opts, Registry};

use crate::db::{self, Pool, StoreError};

#[derive(QueryableByName)]
struct State {
    #[diesel(sql_type = BigInt)]
    started: i64,
    #[diesel(sql_type = BigInt)]
    charge_created: i64,
    #[diesel(sql_type = BigInt)]
    needing_attention: i64,
    #[diesel(sql_type = BigInt)]
    events_pending: i64,
    #[diesel(sql_type = BigInt)]
    events_dead: i64,
    #[diesel(sql_type = Double)]
    oldest_event_age: f64,
}

/// One statement; each count is served by a partial index, except the outbox's, whose table holds
/// only what is still on its way out.
const STATE_SQL: &str = "
SELECT count(*) FILTER (WHERE k.recovery_point = 'started') AS started,
       count(*) FILTER (WHERE k.recovery_point = 'charge_created') AS charge_created,
       (SELECT count(*) FROM idempotency_keys WHERE needs_attention_at IS NOT NULL) AS needing_attention,
       o.pending AS events_pending, o.dead AS events_dead, o.oldest_age AS oldest_event_age
FROM (SELECT count(*) FILTER (WHERE dead_at IS NULL) AS pending,
             count(*) FILTER (WHERE dead_at IS NOT NULL) AS dead,
             coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE dead_at IS NULL)), 0)::float8
                 AS oldest_age
      FROM staged_jobs) o
LEFT JOIN idempotency_keys k ON k.finished_at IS NULL AND k.needs_attention_at IS NULL
GROUP BY o.pending, o.dead, o.oldest_age";

/// The gauges, built fresh from what the database says now.
pub(super) async fn gather(pool: &Pool) -> Result<Vec<MetricFamily>, StoreError> {
    let mut conn = db::connect(pool).await?;
    let state: State = db::query(diesel::sql_query(STATE_SQL).get_result(&mut conn)).await?;

    let registry = Registry::new();
    let unfinished = IntGaugeVec::new(
        Opts::new(
            "idempotency_keys_unfinished",
            "Unfinished keys that a client or the completer may still drive, by recovery point (system-wide).",
        ),
        &["recovery_point"],
    )
    .expect("a valid gauge");
    unfinished.with_label_values(&["started"]).set(state.started);
    unfinished.with_label_values(&["charge_created"]).set(state.charge_created);
    let gauges = [
        (
            "idempotency_keys_needing_attention",
            "Keys the completer gave up on: each waits for a person (`payments attention list`).",
            state.needing_attention,
        ),
        ("outbox_events_pending", "Events staged and not yet delivered (system-wide).", state.events_pending),
        ("outbox_events_dead", "Events whose delivery failed for the last time (system-wide).", state.events_dead),
    ];
    registry.register(Box::new(unfinished)).expect("registered once");
    for (name, help, value) in gauges {
        let gauge = IntGauge::new(name, help).expect("a valid gauge");
        gauge.set(value);
        registry.register(Box::new(gauge)).expect("registered once");
    }
    let age = Gauge::new(
        "outbox_oldest_event_age_seconds",
        "How long the oldest undelivered event has waited: 0 when none waits (system-wide).",
    )
    .expect("a valid gauge");
    age.set(state.oldest_event_age);
    registry.register(Box::new(age)).expect("registered once");
    Ok(registry.gather())
}

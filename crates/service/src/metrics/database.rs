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
    #[diesel(sql_type = Double)]
    oldest_due_delivery_age: f64,
}

/// The most rows a count reads. A scrape must cost the same at any backlog (a webhook receiver
/// down for a day, dead letters nobody cleared, keys left for a person): each of these counts stops
/// here, and a gauge at this value means "this many or more". It is far past any threshold worth
/// alerting on, and about as many index entries as a few milliseconds read.
pub const COUNT_CAP: i64 = 10_000;

/// One statement, each part of it read from an index, whatever the tables hold (the oldest due
/// delivery from `webhook_deliveries_due_idx`). The capped counts
/// are ordered as their index is (`events_to_fan_out_idx`, `staged_jobs_dead_at_created_at_idx`,
/// `idempotency_keys_attention_idx`), so that any plan but reading that index and stopping at the
/// cap would have to sort everything first: the planner takes the index whatever its statistics
/// say (unordered, it may take a sequential scan "until the cap is reached", which reads the whole
/// table if the rows it counts are few or at its end). The unfinished keys are counted whole from
/// their partial index: they are the live backlog, which the completer works off (or hands to a
/// person) within half an hour, not a history. An event waits first for the fan-out, then in the
/// sink's queue: pending is either.
const STATE_SQL: &str = "
WITH unfinished AS (
    SELECT count(*) FILTER (WHERE recovery_point = 'started') AS started,
           count(*) FILTER (WHERE recovery_point = 'charge_created') AS charge_created
    FROM idempotency_keys
    WHERE finished_at IS NULL AND needs_attention_at IS NULL
)
SELECT u.started, u.charge_created,
       (SELECT count(*) FROM (SELECT FROM idempotency_keys WHERE needs_attention_at IS NOT NULL
                              ORDER BY needs_attention_at LIMIT $1) n) AS needing_attention,
       least($1, (SELECT count(*) FROM (SELECT FROM events WHERE fanned_out_at IS NULL
                                        ORDER BY created_at LIMIT $1) f)
               + (SELECT count(*) FROM (SELECT FROM staged_jobs WHERE dead_at IS NULL
                                        ORDER BY dead_at, created_at LIMIT $1) p)) AS events_pending,
       (SELECT count(*) FROM (SELECT FROM staged_jobs WHERE dead_at IS NOT NULL
                              ORDER BY dead_at, created_at LIMIT $1) d) AS events_dead,
       coalesce(extract(epoch FROM now() - least(
           (SELECT created_at FROM events WHERE fanned_out_at IS NULL ORDER BY created_at LIMIT 1),
           (SELECT created_at FROM staged_jobs WHERE dead_at IS NULL ORDER BY dead_at, created_at LIMIT 1)
       )), 0)::float8 AS oldest_event_age,
       coalesce(extract(epoch FROM now() - (SELECT next_attempt_at FROM webhook_deliveries
                                             WHERE status = 'pending' AND next_attempt_at <= now()
                                             ORDER BY next_attempt_at LIMIT 1)), 0)::float8
           AS oldest_due_delivery_age
FROM unfinished u";

/// The gauges, built fresh from what the database says now.
pub(super) async fn gather(pool: &Pool) -> Result<Vec<MetricFamily>, StoreError> {
    let mut conn = db::connect(pool).await?;
    let state: State =
        db::query(diesel::sql_query(STATE_SQL).bind::<BigInt, _>(COUNT_CAP).get_result(&mut conn)).await?;

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
    let capped = |help: &str| format!("{help} Counted up to {COUNT_CAP}: at that, this many or more.");
    registry.register(Box::new(unfinished)).expect("registered once");
    for (name, help, value) in gauges {
        let gauge = IntGauge::new(name, capped(help)).expect("a valid gauge");
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
    let due = Gauge::new(
        "webhook_oldest_due_delivery_age_seconds",
        "How long the delivery to a merchant's endpoint due longest has waited past its time: 0 when none is \
         due (system-wide; a delivery to a disabled endpoint counts too).",
    )
    .expect("a valid gauge");
    due.set(state.oldest_due_delivery_age);
    registry.register(Box::new(due)).expect("registered once");
    Ok(registry.gather())
}

//! The lapse: cancels authorizations once they are past their `capture_before`.

use std::sync::Arc;

use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Uuid as SqlUuid};
use diesel_async::RunQueryDsl;
use tracing::Instrument;
use uuid::Uuid;

use super::{Outcome, Worker};
use crate::authorizations;
use crate::config::WorkerSettings;
use crate::db;
use crate::request_id::RequestId;
use crate::state::AppState;

/// The longest a lapse the gateway refused waits before it is tried again.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// Cancels one lapsed authorization per run, the soonest lapsed first, through a cancel of its own
/// (see [`authorizations::lapse`]): at the gateway too, and racing captures and cancels under their
/// rule. An authorization a change already stands on (a capture or a cancel under way) is left to
/// it. A lapse the gateway refused for good (its cancel failed, the authorization still open) is
/// tried again after the completer's backoff, doubled with each refusal, up to an hour: never
/// every run, each with a key and a gateway call of its own. Any number of lapsers may run: two
/// that pick the same authorization race like any two changes, and one of them is refused.
pub struct Lapser {
    state: Arc<AppState>,
    backoff: Duration,
}

impl Lapser {
    pub fn new(state: Arc<AppState>, settings: &WorkerSettings) -> Lapser {
        Lapser { state, backoff: settings.completer_backoff }
    }
}

#[derive(QueryableByName)]
struct Lapsed {
    #[diesel(sql_type = SqlUuid)]
    account_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    payment_id: Uuid,
}

impl Worker for Lapser {
    const NAME: &'static str = "lapser";

    async fn run_once(&self) -> anyhow::Result<Outcome> {
        let run = RequestId::generate();
        let mut conn = db::connect(&self.state.db).await?;
        // The refused lapses of an authorization: `n` of them, the last at `last`; it is due again
        // `backoff · 2^(n-1)` after that.
        let due = diesel::sql_query(
            "SELECT o.account_id, o.payment_id FROM open_authorizations o
             WHERE o.capture_before <= now()
               AND NOT EXISTS (SELECT FROM payment_changes c
                               WHERE c.account_id = o.account_id AND c.payment_id = o.payment_id
                                 AND c.status = 'pending')
               AND coalesce((SELECT max(c.updated_at)
                                    + least($1 * power(2, count(*) - 1), $2) * interval '1 millisecond'
                             FROM payment_changes c
                             WHERE c.account_id = o.account_id AND c.payment_id = o.payment_id
                               AND c.status = 'failed' AND c.cancellation_reason = 'expired'),
                            '-infinity') <= now()
             ORDER BY o.capture_before
             LIMIT 1",
        )
        .bind::<BigInt, _>(millis(self.backoff))
        .bind::<BigInt, _>(millis(MAX_BACKOFF));
        let lapsed: Option<Lapsed> = db::query(db::first_row(due.load(&mut conn))).await?;
        drop(conn);
        let Some(Lapsed { account_id, payment_id }) = lapsed else { return Ok(Outcome::Idle) };
        let span = tracing::info_span!("lapser.run", request_id = %run);
        let reply = authorizations::lapse(&self.state, account_id, payment_id, &run).instrument(span).await?;
        tracing::info!(%payment_id, status = reply.response.status, "an authorization lapsed");
        Ok(Outcome::Worked)
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

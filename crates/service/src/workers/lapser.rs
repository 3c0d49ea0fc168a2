//! The lapse: cancels authorizations once they are past their `capture_before`.

use std::sync::Arc;

use diesel::sql_types::Uuid as SqlUuid;
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::RunQueryDsl;
use tracing::Instrument;
use uuid::Uuid;

use super::{Outcome, Worker};
use crate::captures;
use crate::db;
use crate::request_id::RequestId;
use crate::state::AppState;

/// Cancels one lapsed authorization per run, the soonest lapsed first, through a cancel of its own
/// (see [`captures::lapse`]): at the gateway too, and racing captures and cancels under their
/// rule. An authorization a change already stands on (a capture or a cancel under way) is left to
/// it. Any number of lapsers may run: two that pick the same authorization race like any two
/// changes, and one of them is refused.
pub struct Lapser {
    state: Arc<AppState>,
}

impl Lapser {
    pub fn new(state: Arc<AppState>) -> Lapser {
        Lapser { state }
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
        let due = diesel::sql_query(
            "SELECT o.account_id, o.payment_id FROM open_authorizations o
             WHERE o.capture_before <= now()
               AND NOT EXISTS (SELECT FROM payment_changes c
                               WHERE c.account_id = o.account_id AND c.payment_id = o.payment_id
                                 AND c.status = 'pending')
             ORDER BY o.capture_before
             LIMIT 1",
        );
        let lapsed: Option<Lapsed> = db::query(async { due.get_result(&mut conn).await.optional() }).await?;
        drop(conn);
        let Some(Lapsed { account_id, payment_id }) = lapsed else { return Ok(Outcome::Idle) };
        let span = tracing::info_span!("lapser.run", request_id = %run);
        let reply = captures::lapse(&self.state, account_id, payment_id, &run).instrument(span).await?;
        tracing::info!(%payment_id, status = reply.response.status, "an authorization lapsed");
        Ok(Outcome::Worked)
    }
}

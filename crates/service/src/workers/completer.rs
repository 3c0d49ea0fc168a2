//! The completer: finishes requests that their clients abandoned.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use diesel_async::AsyncPgConnection;
use tracing::Instrument;

use super::{Outcome, Worker};
use crate::audit::Actor;
use crate::config::WorkerSettings;
use crate::db;
use crate::endpoints;
use crate::idempotency::{
    Abandoned, DriveError, Reason, StoredResponse, claim_abandoned, give_up_on_stranded, mark_needs_attention, release,
};
use crate::metrics::{CompleterOutcome, Unfinished};
use crate::request_id::RequestId;
use crate::state::AppState;

/// Takes over one abandoned key per run and drives it to `finished`, backing off exponentially
/// between attempts; after `max_attempts` it gives up, and the key needs attention. It takes only
/// keys it can drive: those made at the gateway its process reaches, or at none yet, or past their
/// gateway call. A key made at another gateway is left to a process that reaches it; one that no
/// such process has run for [`STRANDED_AFTER`](crate::idempotency::STRANDED_AFTER) is given up on.
pub struct Completer {
    state: Arc<AppState>,
    backoff: Duration,
    max_attempts: u32,
    /// What the gateway said it is when last asked, and when: a gateway that never names itself in
    /// its answers would otherwise be asked at every run.
    asked: Mutex<Option<(Arc<str>, Instant)>>,
}

/// How long what the gateway said it is stands before it is asked again.
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(60);

impl Completer {
    pub fn new(state: Arc<AppState>, settings: &WorkerSettings) -> Completer {
        let (backoff, max_attempts) = (settings.completer_backoff, settings.completer_max_attempts);
        Completer { state, backoff, max_attempts, asked: Mutex::new(None) }
    }
}

impl Worker for Completer {
    const NAME: &'static str = "completer";

    async fn run_once(&self) -> anyhow::Result<Outcome> {
        // A run is named like a request: its id is in its log lines and its audit records.
        let run = RequestId::generate();
        self.complete_one(&run).instrument(tracing::info_span!("completer.run", request_id = %run)).await
    }
}

impl Completer {
    async fn complete_one(&self, run: &RequestId) -> anyhow::Result<Outcome> {
        let metrics = &self.state.metrics;
        let gateway = self.gateway().await;
        let mut conn = db::connect(&self.state.db).await?;
        let lease = self.state.settings.lock_timeout;
        let keyed = endpoints::all();
        let Some(abandoned) = claim_abandoned(&mut conn, &keyed, gateway.as_deref(), lease, self.backoff, run).await?
        else {
            return self.give_up_on_stranded(&mut conn, gateway.as_deref(), run).await;
        };
        drop(conn);
        let (lock, attempt) = (abandoned.lock.clone(), abandoned.attempts);
        let key_id = lock.key_id;
        match complete(&self.state, abandoned, run).await {
            Ok(response) => {
                metrics.completer_run(CompleterOutcome::Finished);
                tracing::info!(%key_id, attempt, response.status = response.status, "finished an abandoned request");
            }
            // Handed back as it was taken (see `Run::drive`): no attempt of the key's was spent.
            Err(error @ DriveError::HeldElsewhere(_)) => {
                metrics.completer_run(CompleterOutcome::HandedBack);
                tracing::info!(%key_id, %error, "handed an abandoned request back to a process that reaches its gateway");
            }
            Err(error) if attempt >= self.max_attempts => {
                let mut conn = db::connect(&self.state.db).await?;
                let reason = Reason { code: error.unfinished().as_str(), detail: &error.to_string() };
                if mark_needs_attention(&mut conn, &lock, reason, run).await? {
                    metrics.completer_run(CompleterOutcome::GaveUp);
                    tracing::error!(
                        %key_id, attempt, %error,
                        "gave up on an abandoned request: it needs attention (see `payments attention list`)"
                    );
                }
            }
            Err(error) => {
                metrics.completer_run(CompleterOutcome::RetryLater);
                tracing::warn!(%key_id, attempt, %error, "could not finish an abandoned request yet; it will be tried again");
            }
        }
        Ok(Outcome::Worked)
    }

    /// The gateway this process reaches, which decides the keys its completer can drive: the one
    /// it knows, or, before any answer named one, the one its gateway says it is when asked; none
    /// while it cannot be asked (then only keys made at no gateway yet, or past their gateway call,
    /// are taken).
    async fn gateway(&self) -> Option<Arc<str>> {
        if let Some(known) = self.state.gateway.known_id() {
            return Some(known);
        }
        let fresh = |(id, at): &(Arc<str>, Instant)| (at.elapsed() < ASK_AGAIN_AFTER).then(|| id.clone());
        if let Some(id) = self.asked.lock().unwrap_or_else(PoisonError::into_inner).as_ref().and_then(fresh) {
            return Some(id);
        }
        let id = self.state.gateway.id().await.ok()?;
        *self.asked.lock().unwrap_or_else(PoisonError::into_inner) = Some((id.clone(), Instant::now()));
        Some(id)
    }

    /// With nothing to take, gives up on the keys made at another gateway that no process reaching
    /// theirs has run for a long while (see [`give_up_on_stranded`]): each needs a person.
    async fn give_up_on_stranded(
        &self,
        conn: &mut AsyncPgConnection,
        gateway: Option<&str>,
        run: &RequestId,
    ) -> anyhow::Result<Outcome> {
        let Some(gateway) = gateway else { return Ok(Outcome::Idle) };
        let code = Unfinished::UnknownOutcome.as_str();
        let given_up = give_up_on_stranded(conn, &endpoints::all(), gateway, code, run).await?;
        for key_id in &given_up {
            self.state.metrics.completer_run(CompleterOutcome::GaveUp);
            tracing::error!(
                %key_id, gateway.account = gateway,
                "gave up on a request made at another gateway that no process reaching it has run for long: it needs \
                 attention (see `payments attention list`)"
            );
        }
        Ok(if given_up.is_empty() { Outcome::Idle } else { Outcome::Worked })
    }
}

/// Drives an abandoned key through the phases of the endpoint it was used on, as the registry
/// lists it.
async fn complete(state: &AppState, abandoned: Abandoned, run: &RequestId) -> Result<StoredResponse, DriveError> {
    match endpoints::at(abandoned.endpoint.path) {
        Some(entry) => (entry.complete)(state, abandoned, run).await,
        None => {
            let error =
                DriveError::inconsistent(format!("a key used on {}, which no phases drive", abandoned.endpoint.path));
            let reason = Reason { code: Unfinished::Internal.as_str(), detail: &error.to_string() };
            release(state.keys(), &abandoned.lock, Actor::Completer, reason, run).await;
            Err(error)
        }
    }
}

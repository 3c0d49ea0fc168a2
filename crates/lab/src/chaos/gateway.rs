//! The mock gateway, as a run drives and reads it: its `/_control` endpoints (faults, forgetting
//! its keys, misdelivering its events, changing authorizations on its own, counters, the events it
//! sent, the changes it made on its own), and look-ups of what it holds.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::Context;
use futures_util::{StreamExt, TryStreamExt};
use reqwest::Url;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::check::{GatewayCharge, OwnChange, SentEvent};

/// Look-ups at the gateway at once, after the run.
const LOOK_UPS_AT_ONCE: usize = 16;

/// How long the gateway's control endpoints may take to answer.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// The mock gateway's counters, as `GET /_control/stats` gives them.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct GatewayStats {
    pub charges: u64,
    pub requests: u64,
    pub faults: u64,
    /// Refunds made, whatever their status.
    pub refunds: u64,
    pub refund_requests: u64,
    /// Charges only authorized; authorizations captured; authorizations cancelled.
    pub authorizations: u64,
    pub captures: u64,
    pub cancels: u64,
    pub capture_requests: u64,
    pub cancel_requests: u64,
    /// Events made (none by a gateway that sends no events).
    pub events: u64,
    /// Events of which at least one attempt was made.
    pub events_sent: u64,
    /// Events of which at least one copy got a `2xx`.
    pub events_acknowledged: u64,
}

impl GatewayStats {
    /// Events made and not acknowledged yet: held back, or being sent, or sent again.
    pub fn events_on_their_way(&self) -> u64 {
        self.events.saturating_sub(self.events_acknowledged)
    }
}

/// How the gateway misdelivers its events during the storm: `POST /_control/events`'s body.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EventStorm {
    /// The share of events sent twice, both copies at the same moment.
    pub duplicate_rate: f64,
    /// How long each event is held back before it is sent.
    pub delay_ms: u64,
    /// Whether they go out in batches, each in an order that is not the one they were made in.
    pub shuffle: bool,
}

/// The mock gateway's `/_control` endpoints.
#[derive(Clone)]
pub struct GatewayControl {
    base: Url,
    http: reqwest::Client,
}

impl GatewayControl {
    pub fn new(base: &Url) -> anyhow::Result<GatewayControl> {
        let http = reqwest::Client::builder().timeout(CONTROL_TIMEOUT).build()?;
        Ok(GatewayControl { base: base.clone(), http })
    }

    pub async fn stats(&self) -> anyhow::Result<GatewayStats> {
        let response = self.http.get(self.base.join("_control/stats")?).send().await?;
        response
            .error_for_status()?
            .json()
            .await
            .context("the gateway's /_control/stats (is it started with --control?)")
    }

    /// The charges `ids`, as the gateway shows them now, by id.
    pub async fn charges(&self, ids: impl Iterator<Item = String>) -> anyhow::Result<HashMap<String, GatewayCharge>> {
        let look_up = |id: String| async move {
            let url = self.base.join("v1/charges/")?.join(&id)?;
            let charge = self.http.get(url).send().await?.error_for_status()?.json().await?;
            anyhow::Ok((id, charge))
        };
        futures_util::stream::iter(ids).map(look_up).buffer_unordered(LOOK_UPS_AT_ONCE).try_collect().await
    }

    /// The charges the gateway made with each downstream key, by whose they are.
    pub async fn charges_by_key<T>(
        &self,
        keys: impl Iterator<Item = (T, String)>,
    ) -> anyhow::Result<HashMap<T, Vec<GatewayCharge>>>
    where
        T: std::hash::Hash + Eq,
    {
        #[derive(Deserialize)]
        struct List {
            data: Vec<GatewayCharge>,
        }
        let look_up = |(whose, key): (T, String)| async move {
            let mut url = self.base.join("v1/charges")?;
            url.query_pairs_mut().append_pair("idempotency_key", &key);
            let list: List = self.http.get(url).send().await?.error_for_status()?.json().await?;
            anyhow::Ok((whose, list.data))
        };
        futures_util::stream::iter(keys).map(look_up).buffer_unordered(LOOK_UPS_AT_ONCE).try_collect().await
    }

    /// The ids of the refunds the gateway made with each downstream key, by whose they are.
    pub async fn refunds_by_key<T>(
        &self,
        keys: impl Iterator<Item = (T, String)>,
    ) -> anyhow::Result<HashMap<T, Vec<String>>>
    where
        T: std::hash::Hash + Eq,
    {
        #[derive(Deserialize)]
        struct List {
            data: Vec<Made>,
        }
        #[derive(Deserialize)]
        struct Made {
            id: String,
        }
        let look_up = |(whose, key): (T, String)| async move {
            let mut url = self.base.join("v1/refunds")?;
            url.query_pairs_mut().append_pair("idempotency_key", &key);
            let list: List = self.http.get(url).send().await?.error_for_status()?.json().await?;
            anyhow::Ok((whose, list.data.into_iter().map(|refund| refund.id).collect()))
        };
        futures_util::stream::iter(keys).map(look_up).buffer_unordered(LOOK_UPS_AT_ONCE).try_collect().await
    }

    /// From now on, each charge or refund request fails with probability `rate`.
    pub async fn random_faults(&self, rate: f64) -> anyhow::Result<()> {
        let plan = json!({ "mode": "random", "rate": rate, "count": u32::MAX });
        self.http.post(self.base.join("_control/faults")?).json(&plan).send().await?.error_for_status()?;
        Ok(())
    }

    /// From now on, the gateway captures (all or part) or cancels each authorization made with
    /// probability `rate`, on its own, a moment drawn from none to `within` after it was made.
    pub async fn change_authorizations(&self, rate: f64, within: Duration) -> anyhow::Result<()> {
        let plan = json!({ "rate": rate, "within_ms": within.as_millis() });
        let url = self.base.join("_control/authorizations/own-changes")?;
        self.http.post(url).json(&plan).send().await?.error_for_status()?;
        Ok(())
    }

    /// From now on, the gateway leaves the authorizations made to the service (those it drew a
    /// change for already are still changed).
    pub async fn leave_authorizations(&self) -> anyhow::Result<()> {
        self.http.delete(self.base.join("_control/authorizations/own-changes")?).send().await?.error_for_status()?;
        Ok(())
    }

    /// Every change the gateway made on its own, by charge id.
    pub async fn own_changes(&self) -> anyhow::Result<HashMap<String, OwnChange>> {
        #[derive(Deserialize)]
        struct List {
            data: Vec<OwnChange>,
        }
        let url = self.base.join("_control/authorizations/own-changes/made")?;
        let response = self.http.get(url).send().await?;
        let list: List = response.error_for_status()?.json().await.context("the gateway's own changes")?;
        Ok(list.data.into_iter().map(|change| (change.charge.clone(), change)).collect())
    }

    /// Makes the gateway forget its idempotency keys (it keeps its charges, found by look-ups).
    pub async fn forget_keys(&self) -> anyhow::Result<()> {
        self.http.delete(self.base.join("_control/idempotency-keys")?).send().await?.error_for_status()?;
        Ok(())
    }

    pub async fn clear_faults(&self) -> anyhow::Result<()> {
        self.http.delete(self.base.join("_control/faults")?).send().await?.error_for_status()?;
        Ok(())
    }

    /// From now on, the gateway sends its events as `storm` says: some twice, late, shuffled.
    pub async fn misdeliver_events(&self, storm: EventStorm) -> anyhow::Result<()> {
        self.http.post(self.base.join("_control/events")?).json(&storm).send().await?.error_for_status()?;
        Ok(())
    }

    /// From now on, each event is sent once, at once, in the order made.
    pub async fn deliver_events(&self) -> anyhow::Result<()> {
        self.http.delete(self.base.join("_control/events")?).send().await?.error_for_status()?;
        Ok(())
    }

    /// How many deliveries of the events not among `sent_before` have not been acknowledged yet:
    /// each copy of an event sent, and each event the gateway still holds back.
    pub async fn events_unacknowledged(&self, sent_before: &HashSet<String>) -> anyhow::Result<i64> {
        // The counters first: an event sent between the two reads is then counted twice (and
        // asked about again), never missed.
        let stats = self.stats().await?;
        let held_back = stats.events.saturating_sub(stats.events_sent);
        let sent = self.events_sent().await?;
        let unacknowledged: u64 = sent
            .iter()
            .filter(|event| !sent_before.contains(&event.id))
            .map(|event| u64::from(event.unacknowledged()))
            .sum();
        Ok(i64::try_from(held_back + unacknowledged)?)
    }

    /// Every event the gateway sent, in the order first sent.
    pub async fn events_sent(&self) -> anyhow::Result<Vec<SentEvent>> {
        #[derive(Deserialize)]
        struct List {
            data: Vec<SentEvent>,
        }
        let response = self.http.get(self.base.join("_control/events/sent")?).send().await?;
        let list: List = response.error_for_status()?.json().await.context("the gateway's /_control/events/sent")?;
        Ok(list.data)
    }
}

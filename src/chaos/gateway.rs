//! The mock gateway, as a run drives and reads it: its `/_control` endpoints (faults, forgetting
//! its keys, counters), and look-ups of what it holds.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use futures_util::{StreamExt, TryStreamExt};
use reqwest::Url;
use serde::Deserialize;
use serde_json::json;

use super::check::GatewayCharge;

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

    /// Makes the gateway forget its idempotency keys (it keeps its charges, found by look-ups).
    pub async fn forget_keys(&self) -> anyhow::Result<()> {
        self.http.delete(self.base.join("_control/idempotency-keys")?).send().await?.error_for_status()?;
        Ok(())
    }

    pub async fn clear_faults(&self) -> anyhow::Result<()> {
        self.http.delete(self.base.join("_control/faults")?).send().await?.error_for_status()?;
        Ok(())
    }
}

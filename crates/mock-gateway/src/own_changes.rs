//! What the gateway does to authorizations on its own, as its dashboard or another system of the
//! merchant's would: the plan set through `/_control/authorizations/own-changes`, under which each
//! authorization made is, with some probability, captured (all of it, or part) or cancelled by the
//! gateway itself, at a moment drawn after it was made: perhaps before the merchant has its
//! answer, perhaps after. A merchant that records what its gateway holds copes with this.

use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

/// The longest wait a plan may ask for: short enough that a typo does not leave an authorization
/// waiting for good on a change the gateway decided on.
const MAX_WITHIN: Duration = Duration::from_secs(3_600);

/// The share of the changes that are cancels; the others are captures.
const CANCELS: f64 = 0.5;

/// The share of the captures that take part of the authorization (a quarter to three quarters);
/// the others take all of it.
const PARTIAL: f64 = 0.5;

/// The idempotency keys the gateway makes its own changes under begin so: none of a merchant's,
/// so that their events are never taken for the answer to a merchant's request.
pub(super) const OWN_KEY_PREFIX: &str = "own";

/// How the gateway changes the authorizations made from now on. The default changes none.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(super) struct OwnChangePlan {
    /// The probability that an authorization is changed by the gateway on its own.
    rate: f64,
    /// The change comes a moment drawn from none to this long after the authorization was made.
    within: Duration,
}

/// What the gateway does to one authorization on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum OwnChange {
    /// Captures it: all of it (`None`), or this much, the rest released.
    Capture(Option<u64>),
    Cancel,
}

impl OwnChangePlan {
    /// What the gateway will do on its own to an authorization of `amount` made now, and how long
    /// after: with probability `rate` a capture or a cancel, none otherwise (a rate of 1 always
    /// changes it, 0 never does).
    pub(super) fn draw(&self, amount: u64, rng: &mut impl Rng) -> Option<(Duration, OwnChange)> {
        // `random` is in [0, 1), so a rate of 1.0 always changes it.
        if rng.random::<f64>() >= self.rate {
            return None;
        }
        let change = if rng.random::<f64>() < CANCELS {
            OwnChange::Cancel
        } else if rng.random::<f64>() < PARTIAL && amount >= 4 {
            OwnChange::Capture(Some(rng.random_range(amount / 4..=amount * 3 / 4)))
        } else {
            OwnChange::Capture(None)
        };
        let after = Duration::from_millis(rng.random_range(0..=u64::try_from(self.within.as_millis()).unwrap_or(0)));
        Some((after, change))
    }

    /// The plan as `GET /_control/authorizations/own-changes` shows it.
    pub(super) fn view(&self) -> OwnChangeSpec {
        OwnChangeSpec { rate: self.rate, within_ms: u64::try_from(self.within.as_millis()).unwrap_or(u64::MAX) }
    }
}

/// The body of `POST /_control/authorizations/own-changes`, and what `GET` shows: every field may
/// be left out (0 and 0).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OwnChangeSpec {
    #[serde(default)]
    rate: f64,
    #[serde(default)]
    within_ms: u64,
}

/// Why a plan of own changes was refused.
#[derive(Debug, PartialEq, thiserror::Error)]
pub(super) enum InvalidOwnChangePlan {
    #[error("rate must be between 0 and 1")]
    Rate,
    #[error("within_ms must be at most {} (an hour)", MAX_WITHIN.as_millis())]
    Within,
}

impl OwnChangeSpec {
    pub(super) fn into_plan(self) -> Result<OwnChangePlan, InvalidOwnChangePlan> {
        if !(0.0..=1.0).contains(&self.rate) {
            return Err(InvalidOwnChangePlan::Rate);
        }
        let within = Duration::from_millis(self.within_ms);
        if within > MAX_WITHIN {
            return Err(InvalidOwnChangePlan::Within);
        }
        Ok(OwnChangePlan { rate: self.rate, within })
    }
}

/// A change the gateway made on its own, as `GET /_control/authorizations/own-changes/made` lists
/// it: what a checker tells from the merchant's own changes. Field order is the wire order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct OwnChangeMade {
    /// The charge it changed.
    pub(super) charge: String,
    /// `capture` or `cancel`.
    pub(super) kind: &'static str,
    /// What the charge captured (none once cancelled).
    pub(super) amount_captured: u64,
    /// The gateway's own key it made the change under.
    pub(super) idempotency_key: String,
    /// The id of the event the change made (none from a gateway that sends no events).
    pub(super) event: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(json: &str) -> Result<OwnChangePlan, InvalidOwnChangePlan> {
        serde_json::from_str::<OwnChangeSpec>(json).expect("test spec parses").into_plan()
    }

    #[test]
    fn a_plan_is_checked_and_shown_as_it_was_set() {
        let set = plan(r#"{"rate": 0.25, "within_ms": 3000}"#).unwrap();
        assert_eq!(serde_json::to_value(set.view()).unwrap(), serde_json::json!({"rate": 0.25, "within_ms": 3000}));
        assert_eq!(plan("{}").unwrap(), OwnChangePlan::default(), "every field may be left out");
        assert_eq!(plan(r#"{"rate": 1.5}"#), Err(InvalidOwnChangePlan::Rate));
        assert_eq!(plan(r#"{"rate": -0.1}"#), Err(InvalidOwnChangePlan::Rate));
        assert_eq!(plan(r#"{"within_ms": 3600001}"#), Err(InvalidOwnChangePlan::Within));
        assert!(serde_json::from_str::<OwnChangeSpec>(r#"{"delay_ms": 5}"#).is_err(), "unknown fields are refused");
    }

    #[test]
    fn a_rate_of_one_always_changes_within_its_time_and_zero_never() {
        let mut rng = rand::rng();
        let always = plan(r#"{"rate": 1.0, "within_ms": 200}"#).unwrap();
        let mut kinds = std::collections::HashSet::new();
        for _ in 0..200 {
            let (after, change) = always.draw(1000, &mut rng).expect("always");
            assert!(after <= Duration::from_millis(200), "{after:?}");
            if let OwnChange::Capture(Some(amount)) = change {
                assert!((250..=750).contains(&amount), "{amount}");
            }
            kinds.insert(std::mem::discriminant(&change));
            assert_eq!(OwnChangePlan::default().draw(1000, &mut rng), None);
        }
        assert_eq!(kinds.len(), 2, "captures and cancels both");
    }
}

//! How the gateway misdelivers its events on purpose: the plan set through `/_control/events`,
//! which sends some events twice, late, or out of order, as real gateways do now and then (their
//! delivery is at least once, in no promised order). A receiver that copes with these copes with
//! the real thing.

use std::time::Duration;

use rand::Rng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

/// The longest delay a plan may ask for: long past any receiver's signature tolerance (events are
/// signed again at each attempt, so a late one still verifies), and short enough that a typo does
/// not hold the events for good.
const MAX_DELAY: Duration = Duration::from_secs(3_600);

/// How the gateway misdelivers the events it makes from now on. The default delivers each event
/// once, at once, in the order made.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(super) struct EventPlan {
    /// The probability that an event is sent twice: two deliveries of the same event (same id,
    /// same body), sent at the same moment, each retried until acknowledged.
    duplicate_rate: f64,
    /// How long each event is held back after it was made before its first attempt.
    pub(super) delay: Duration,
    /// Whether events go out in batches, each in an order that is never the one they were made in.
    pub(super) shuffle: bool,
}

impl EventPlan {
    /// How many deliveries the next event gets: 1, or 2 with probability `duplicate_rate` (a rate
    /// of 1 always sends two, 0 never does).
    pub(super) fn copies(&self, rng: &mut impl Rng) -> u8 {
        // `random` is in [0, 1), so a rate of 1.0 always duplicates.
        if rng.random::<f64>() < self.duplicate_rate { 2 } else { 1 }
    }

    /// The plan as `GET /_control/events` shows it.
    pub(super) fn view(&self) -> EventPlanSpec {
        EventPlanSpec {
            duplicate_rate: self.duplicate_rate,
            delay_ms: u64::try_from(self.delay.as_millis()).unwrap_or(u64::MAX),
            shuffle: self.shuffle,
        }
    }
}

/// Puts `batch` in a random order that is never the one it came in (for two events or more: a
/// shuffle that happens to leave them in order is reversed), so that "shuffled" always means "out
/// of order" to whoever receives them.
pub(super) fn shuffle<T>(batch: &mut Vec<T>, rng: &mut impl Rng) {
    let mut numbered: Vec<(usize, T)> = batch.drain(..).enumerate().collect();
    numbered.shuffle(rng);
    if numbered.is_sorted_by_key(|(made, _)| *made) {
        numbered.reverse();
    }
    batch.extend(numbered.into_iter().map(|(_, item)| item));
}

/// The body of `POST /_control/events`, and what `GET` shows: every field may be left out (0,
/// 0 and false).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EventPlanSpec {
    #[serde(default)]
    duplicate_rate: f64,
    #[serde(default)]
    delay_ms: u64,
    #[serde(default)]
    shuffle: bool,
}

/// Why an event plan was refused.
#[derive(Debug, PartialEq, thiserror::Error)]
pub(super) enum InvalidEventPlan {
    #[error("duplicate_rate must be between 0 and 1")]
    DuplicateRate,
    #[error("delay_ms must be at most {} (an hour)", MAX_DELAY.as_millis())]
    Delay,
}

impl EventPlanSpec {
    pub(super) fn into_plan(self) -> Result<EventPlan, InvalidEventPlan> {
        if !(0.0..=1.0).contains(&self.duplicate_rate) {
            return Err(InvalidEventPlan::DuplicateRate);
        }
        let delay = Duration::from_millis(self.delay_ms);
        if delay > MAX_DELAY {
            return Err(InvalidEventPlan::Delay);
        }
        Ok(EventPlan { duplicate_rate: self.duplicate_rate, delay, shuffle: self.shuffle })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(json: &str) -> Result<EventPlan, InvalidEventPlan> {
        serde_json::from_str::<EventPlanSpec>(json).expect("test spec parses").into_plan()
    }

    #[test]
    fn a_plan_is_checked_and_shown_as_it_was_set() {
        let set = plan(r#"{"duplicate_rate": 0.5, "delay_ms": 250, "shuffle": true}"#).unwrap();
        assert_eq!((set.delay, set.shuffle), (Duration::from_millis(250), true));
        let shown = serde_json::to_value(set.view()).unwrap();
        assert_eq!(shown, serde_json::json!({"duplicate_rate": 0.5, "delay_ms": 250, "shuffle": true}));
        assert_eq!(plan("{}").unwrap(), EventPlan::default(), "every field may be left out");
        assert_eq!(plan(r#"{"duplicate_rate": 1.5}"#), Err(InvalidEventPlan::DuplicateRate));
        assert_eq!(plan(r#"{"duplicate_rate": -0.1}"#), Err(InvalidEventPlan::DuplicateRate));
        assert_eq!(plan(r#"{"delay_ms": 3600001}"#), Err(InvalidEventPlan::Delay));
        assert!(serde_json::from_str::<EventPlanSpec>(r#"{"delay": 5}"#).is_err(), "unknown fields are refused");
    }

    #[test]
    fn a_rate_of_one_always_duplicates_and_zero_never() {
        let mut rng = rand::rng();
        let always = plan(r#"{"duplicate_rate": 1.0}"#).unwrap();
        for _ in 0..100 {
            assert_eq!(always.copies(&mut rng), 2);
            assert_eq!(EventPlan::default().copies(&mut rng), 1);
        }
    }

    #[test]
    fn a_shuffled_batch_holds_the_same_events_never_in_the_order_made() {
        let mut rng = rand::rng();
        for len in 2..8 {
            for _ in 0..200 {
                let mut batch: Vec<usize> = (0..len).collect();
                shuffle(&mut batch, &mut rng);
                assert!(!batch.is_sorted(), "{batch:?}");
                batch.sort();
                assert_eq!(batch, (0..len).collect::<Vec<_>>());
            }
        }
        let mut one = vec!["a"];
        shuffle(&mut one, &mut rng);
        assert_eq!(one, ["a"]);
    }
}

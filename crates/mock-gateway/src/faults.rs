//! Fault injection: the plan set through `/_control/faults`, and how each
//! charge or refund request draws its fault from it.

use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

/// The fault one charge or refund request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    None,
    /// Answer 500 before doing anything.
    ErrorBefore,
    /// Process normally, then answer 500.
    ErrorAfter,
    /// Process normally, then never answer.
    TimeoutAfter,
    /// Hold the processing for this long, then carry on normally.
    Latency(Duration),
}

/// The faults `random` chooses among: each leaves the caller unsure whether
/// a charge (or refund) was made, which is what a retrying client must cope with.
const RANDOM_FAULTS: [Fault; 3] = [Fault::ErrorBefore, Fault::ErrorAfter, Fault::TimeoutAfter];

impl Fault {
    /// The name used on the wire, as in `"injected fault: error_after"`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::ErrorBefore => "error_before",
            Fault::ErrorAfter => "error_after",
            Fault::TimeoutAfter => "timeout_after",
            Fault::Latency(_) => "latency",
        }
    }

    /// Whether the request fails (rather than being served, slowly or not).
    pub(super) fn is_failure(self) -> bool {
        RANDOM_FAULTS.contains(&self)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Fixed(Fault),
    /// With this probability, one of [`RANDOM_FAULTS`]; otherwise none.
    Random(f64),
}

/// Which faults the gateway injects into the next charge and refund requests.
///
/// Every `POST /v1/charges` and `POST /v1/refunds` (replays included) uses up
/// one request of the plan; once it is used up, the gateway behaves normally again.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultPlan {
    mode: Mode,
    /// Requests left; `None` for a plan that never runs out.
    remaining: Option<u32>,
}

impl FaultPlan {
    /// No faults: every request is served normally.
    pub fn none() -> Self {
        FaultPlan { mode: Mode::Fixed(Fault::None), remaining: None }
    }

    /// For every request from now on, with probability `rate`, one of
    /// `error_before`, `error_after` or `timeout_after`, drawn uniformly.
    /// A `rate` of 1 or more always faults; 0, less, or NaN never does.
    pub fn random(rate: f64) -> Self {
        FaultPlan { mode: Mode::Random(rate), remaining: None }
    }

    /// Takes the fault for the next charge or refund request, using up one request.
    pub(super) fn draw(&mut self, rng: &mut impl Rng) -> Fault {
        let fault = match self.mode {
            Mode::Fixed(fault) => fault,
            // `random` is in [0, 1), so a rate of 1.0 always faults.
            Mode::Random(rate) if rng.random::<f64>() < rate => RANDOM_FAULTS[rng.random_range(0..RANDOM_FAULTS.len())],
            Mode::Random(_) => Fault::None,
        };
        if let Some(left) = &mut self.remaining {
            *left = left.saturating_sub(1);
            if *left == 0 {
                *self = FaultPlan::none();
            }
        }
        fault
    }

    /// The plan as `GET /_control/faults` shows it.
    pub(super) fn view(&self) -> PlanView {
        let (mode, latency_ms, rate) = match self.mode {
            Mode::Fixed(Fault::None) => (ModeName::None, None, None),
            Mode::Fixed(Fault::ErrorBefore) => (ModeName::ErrorBefore, None, None),
            Mode::Fixed(Fault::ErrorAfter) => (ModeName::ErrorAfter, None, None),
            Mode::Fixed(Fault::TimeoutAfter) => (ModeName::TimeoutAfter, None, None),
            Mode::Fixed(Fault::Latency(d)) => (ModeName::Latency, Some(d.as_millis()), None),
            Mode::Random(rate) => (ModeName::Random, None, Some(rate)),
        };
        PlanView { mode, remaining: self.remaining, latency_ms, rate }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
enum ModeName {
    None,
    ErrorBefore,
    ErrorAfter,
    TimeoutAfter,
    Latency,
    Random,
}

/// The body of `POST /_control/faults`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FaultSpec {
    mode: ModeName,
    count: Option<u32>,
    latency_ms: Option<u64>,
    rate: Option<f64>,
}

/// The current plan; `remaining` is `null` for a plan that never runs out.
#[derive(Debug, Serialize)]
pub(super) struct PlanView {
    mode: ModeName,
    remaining: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    latency_ms: Option<u128>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate: Option<f64>,
}

/// Why a fault spec was refused.
#[derive(Debug, PartialEq, thiserror::Error)]
pub(super) enum InvalidFaultSpec {
    #[error("count must be at least 1")]
    ZeroCount,
    #[error("mode latency needs latency_ms")]
    MissingLatency,
    #[error("mode random needs a rate between 0 and 1")]
    BadRate,
    #[error("latency_ms is only for mode latency, rate only for mode random")]
    UnusedParameter,
}

impl FaultSpec {
    /// Checks the parameters against the mode. Parameters that the mode would
    /// ignore are refused rather than dropped, so a typo in a test's setup
    /// fails loudly instead of injecting a different fault.
    pub(super) fn into_plan(self) -> Result<FaultPlan, InvalidFaultSpec> {
        let count = self.count.unwrap_or(1);
        if count == 0 {
            return Err(InvalidFaultSpec::ZeroCount);
        }
        let mode = match (self.mode, self.latency_ms, self.rate) {
            (ModeName::Latency, Some(ms), None) => Mode::Fixed(Fault::Latency(Duration::from_millis(ms))),
            (ModeName::Latency, None, None) => return Err(InvalidFaultSpec::MissingLatency),
            (ModeName::Random, None, Some(rate)) if (0.0..=1.0).contains(&rate) => Mode::Random(rate),
            (ModeName::Random, None, _) => return Err(InvalidFaultSpec::BadRate),
            (_, Some(_), _) | (_, _, Some(_)) => return Err(InvalidFaultSpec::UnusedParameter),
            (ModeName::None, None, None) => return Ok(FaultPlan::none()),
            (ModeName::ErrorBefore, None, None) => Mode::Fixed(Fault::ErrorBefore),
            (ModeName::ErrorAfter, None, None) => Mode::Fixed(Fault::ErrorAfter),
            (ModeName::TimeoutAfter, None, None) => Mode::Fixed(Fault::TimeoutAfter),
        };
        Ok(FaultPlan { mode, remaining: Some(count) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> Result<FaultPlan, InvalidFaultSpec> {
        serde_json::from_str::<FaultSpec>(json).expect("test spec parses").into_plan()
    }

    #[test]
    fn a_plan_runs_out_after_count_requests() {
        let mut plan = spec(r#"{"mode": "error_after", "count": 2}"#).expect("a valid spec");
        let mut rng = rand::rng();
        assert_eq!(plan.draw(&mut rng), Fault::ErrorAfter);
        assert_eq!(plan.draw(&mut rng), Fault::ErrorAfter);
        assert_eq!(plan.draw(&mut rng), Fault::None);
        assert_eq!(plan, FaultPlan::none());
    }

    #[test]
    fn random_rate_one_always_faults_and_zero_never() {
        let mut rng = rand::rng();
        let mut always = FaultPlan::random(1.0);
        let mut never = FaultPlan::random(0.0);
        for _ in 0..100 {
            assert!(RANDOM_FAULTS.contains(&always.draw(&mut rng)));
            assert_eq!(never.draw(&mut rng), Fault::None);
        }
    }

    #[test]
    fn specs_are_checked_against_their_mode() {
        let latency = spec(r#"{"mode": "latency", "latency_ms": 20}"#).expect("a valid spec");
        assert_eq!(latency.mode, Mode::Fixed(Fault::Latency(Duration::from_millis(20))));
        assert_eq!(latency.remaining, Some(1));
        let cases = [
            (r#"{"mode": "latency"}"#, InvalidFaultSpec::MissingLatency),
            (r#"{"mode": "random", "rate": 1.5}"#, InvalidFaultSpec::BadRate),
            (r#"{"mode": "random"}"#, InvalidFaultSpec::BadRate),
            (r#"{"mode": "error_before", "count": 0}"#, InvalidFaultSpec::ZeroCount),
            (r#"{"mode": "error_before", "rate": 0.5}"#, InvalidFaultSpec::UnusedParameter),
        ];
        for (json, error) in cases {
            assert_eq!(spec(json), Err(error), "{json}");
        }
    }
}

//! When to try again, and how long to wait first.
//!
//! A retry waits a random time between zero and an exponentially growing ceiling ("full
//! jitter"): clients that failed together do not come back together, so a server that is
//! recovering is not hit by every client at the same instant. The ceiling is capped, so a long
//! outage is polled at a steady pace, and the whole request stops at a deadline or after a number
//! of attempts, whichever comes first. The server's `Retry-After` is a floor: the client never
//! comes back sooner than it was asked to. No attempt starts so close to the deadline that it
//! could hardly be answered ([`MIN_ATTEMPT_TIME`]).

use std::time::Duration;

use rand::Rng;

/// Attempts of one request, the first included: enough that the deadline, not the count, usually
/// ends a long wait (a key held by a request that was cut short answers `409` until its lock runs
/// out, and each `409` asks for a second's wait).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 30;

/// How long one request may take, all its attempts and waits included. It outlasts a server's
/// lock on a key whose request was cut short (90 s by default), after which a retry takes over.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(120);

/// The ceiling of the first wait; it doubles after each failed attempt.
pub const DEFAULT_BASE_DELAY: Duration = Duration::from_millis(500);

/// The ceiling never grows past this.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(20);

/// How long one attempt may take before it is given up and retried. A payment request takes
/// milliseconds, but up to a few gateway calls when the gateway is slow (10 s each by default).
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);

/// The least time before the deadline a retry must have to be sent (or the attempt timeout, if
/// that is shorter): enough for the service's slowest answer that needs no gateway call (while the
/// database is out it answers `503` within 2.5 s). With less, the attempt would most likely be cut
/// off unanswered: one more request whose outcome is unknown, and load on a service that may be
/// struggling, for nothing learnt.
pub const MIN_ATTEMPT_TIME: Duration = Duration::from_secs(3);

/// How hard to try.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub deadline: Duration,
    pub base_delay: Duration,
    pub max_delay: Duration,
    pub attempt_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            deadline: DEFAULT_DEADLINE,
            base_delay: DEFAULT_BASE_DELAY,
            max_delay: DEFAULT_MAX_DELAY,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
        }
    }
}

impl RetryPolicy {
    /// The wait after failed attempt `attempt` (1 for the first), at least `retry_after`.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>, rng: &mut impl Rng) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        let ceiling = self.base_delay.saturating_mul(1 << doublings).min(self.max_delay);
        let jittered = ceiling.mul_f64(rng.random::<f64>());
        jittered.max(retry_after.unwrap_or_default())
    }

    /// The wait before the attempt after `attempt`, `elapsed` since the first began: `None` if
    /// that attempt would start with too little time left before the deadline to be answered.
    pub fn next_wait(
        &self,
        attempt: u32,
        elapsed: Duration,
        retry_after: Option<Duration>,
        rng: &mut impl Rng,
    ) -> Option<Duration> {
        let wait = self.delay(attempt, retry_after, rng);
        let last_start = self.deadline.checked_sub(MIN_ATTEMPT_TIME.min(self.attempt_timeout))?;
        // Checked: a server may ask for any wait at all.
        elapsed.checked_add(wait).is_some_and(|start| start <= last_start).then_some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_jittered_below_a_doubling_capped_ceiling() {
        let policy = RetryPolicy {
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(1_000),
            ..RetryPolicy::default()
        };
        let mut rng = rand::rng();
        for (attempt, ceiling_ms) in [(1, 100), (2, 200), (3, 400), (4, 800), (5, 1_000), (40, 1_000)] {
            let waits: Vec<Duration> = (0..200).map(|_| policy.delay(attempt, None, &mut rng)).collect();
            assert!(waits.iter().all(|wait| *wait <= Duration::from_millis(ceiling_ms)), "attempt {attempt}");
            // Full jitter: spread over the whole range, not bunched at the ceiling.
            assert!(waits.iter().any(|wait| *wait < Duration::from_millis(ceiling_ms / 2)), "attempt {attempt}");
        }
    }

    #[test]
    fn retry_after_is_a_floor() {
        let policy = RetryPolicy { max_delay: Duration::from_millis(100), ..RetryPolicy::default() };
        let mut rng = rand::rng();
        for _ in 0..100 {
            assert!(policy.delay(1, Some(Duration::from_secs(2)), &mut rng) == Duration::from_secs(2));
        }
    }

    #[test]
    fn no_retry_starts_with_too_little_time_left_before_the_deadline() {
        // Waits of exactly the server's `Retry-After` (none without one), a 10 s deadline.
        let policy = RetryPolicy {
            deadline: Duration::from_secs(10),
            base_delay: Duration::ZERO,
            max_delay: Duration::ZERO,
            ..RetryPolicy::default()
        };
        let wait = |policy: &RetryPolicy, elapsed_ms, retry_after| {
            policy.next_wait(3, Duration::from_millis(elapsed_ms), retry_after, &mut rand::rng())
        };
        assert_eq!(wait(&policy, 6_900, None), Some(Duration::ZERO));
        assert_eq!(wait(&policy, 7_000, None), Some(Duration::ZERO), "exactly MIN_ATTEMPT_TIME left");
        assert_eq!(wait(&policy, 7_001, None), None);
        assert_eq!(wait(&policy, 9_990, None), None, "an attempt of 10 ms is not sent");
        let two = Some(Duration::from_secs(2));
        assert_eq!(wait(&policy, 5_000, two), Some(Duration::from_secs(2)));
        assert_eq!(wait(&policy, 5_500, two), None, "the wait would leave 2.5 s");
        assert_eq!(wait(&policy, 0, Some(Duration::MAX)), None, "a huge Retry-After");
        // Attempts allowed less than MIN_ATTEMPT_TIME need only their own timeout.
        let short = RetryPolicy { attempt_timeout: Duration::from_millis(500), ..policy };
        assert_eq!(wait(&short, 9_500, None), Some(Duration::ZERO));
        assert_eq!(wait(&short, 9_501, None), None);
        // A deadline shorter than an attempt leaves room for the first attempt only.
        let tiny = RetryPolicy { deadline: Duration::from_secs(1), ..policy };
        assert_eq!(wait(&tiny, 0, None), None);
    }
}

//! When a failed delivery is attempted next (`PAYMENTS_WEBHOOK_RETRY_SCHEDULE`): the schedule's
//! next delay, within 20 % either way so that the deliveries an outage failed together do not come
//! back together; never sooner than the receiver's `Retry-After` on a `429` or a `503`, which is
//! honoured up to an hour. After the schedule's last delay the delivery has failed.

use std::time::Duration;

use rand::Rng;

/// The default: eight attempts in about 27 hours.
pub const DEFAULT_RETRY_SCHEDULE: &str = "5s,5m,30m,2h,5h,10h,10h";

/// How far each delay may stray, either way, as a share of it.
const JITTER: f64 = 0.2;

/// The longest `Retry-After` honoured: a receiver may not park a delivery for longer.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60 * 60);

/// The delays between attempts, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySchedule(Vec<Duration>);

impl RetrySchedule {
    /// Comma-separated durations (`5s,5m,2h`), each more than zero.
    pub fn parse(text: &str) -> Result<RetrySchedule, String> {
        let delay = |item: &str| match humantime::parse_duration(item.trim()) {
            Ok(delay) if !delay.is_zero() => Ok(delay),
            _ => Err(format!("{item:?} is not a delay such as 5s, 30m or 2h")),
        };
        let delays = text.split(',').map(delay).collect::<Result<Vec<_>, _>>()?;
        Ok(RetrySchedule(delays))
    }

    /// How many attempts a delivery gets in all: the first, and one after each delay.
    pub fn attempts(&self) -> usize {
        self.0.len() + 1
    }

    /// The wait before the next attempt, after `made` attempts that failed (the first is 1);
    /// none once the schedule is spent. `retry_after`: what the last answer asked, if it was a
    /// `429` or a `503`.
    pub fn next(&self, made: usize, retry_after: Option<Duration>, rng: &mut impl Rng) -> Option<Duration> {
        let delay = *self.0.get(made.checked_sub(1)?)?;
        let jittered = delay.mul_f64(rng.random_range(1.0 - JITTER..=1.0 + JITTER));
        Some(jittered.max(retry_after.unwrap_or_default().min(MAX_RETRY_AFTER)))
    }
}

impl Default for RetrySchedule {
    fn default() -> RetrySchedule {
        RetrySchedule::parse(DEFAULT_RETRY_SCHEDULE).expect("the default schedule parses")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn the_default_is_eight_attempts_in_about_27_hours() {
        let schedule = RetrySchedule::default();
        assert_eq!(schedule.attempts(), 8);
        let total: Duration = schedule.0.iter().sum();
        assert_eq!(total, Duration::from_secs(5 + 5 * 60 + 30 * 60 + (2 + 5 + 10 + 10) * 3600));
        assert_eq!(schedule.0[0], Duration::from_secs(5));
    }

    #[test]
    fn each_delay_strays_at_most_20_percent_and_the_schedule_ends() {
        let schedule = RetrySchedule::parse("10m, 2h").unwrap();
        let mut rng = rand::rng();
        let waits: Vec<Duration> = (0..500).map(|_| schedule.next(1, None, &mut rng).unwrap()).collect();
        assert!(waits.iter().all(|wait| (8 * MINUTE..=12 * MINUTE).contains(wait)), "{waits:?}");
        assert!(waits.iter().any(|wait| *wait < 9 * MINUTE) && waits.iter().any(|wait| *wait > 11 * MINUTE), "spread");
        assert!(schedule.next(2, None, &mut rng).unwrap() >= 96 * MINUTE);
        assert_eq!(schedule.next(3, None, &mut rng), None, "after the last delay, failed");
        assert_eq!(schedule.next(0, None, &mut rng), None);
    }

    #[test]
    fn a_retry_after_is_honoured_up_to_an_hour() {
        let schedule = RetrySchedule::parse("5s").unwrap();
        let mut rng = rand::rng();
        assert_eq!(schedule.next(1, Some(10 * MINUTE), &mut rng), Some(10 * MINUTE));
        assert_eq!(schedule.next(1, Some(30 * 60 * MINUTE), &mut rng), Some(MAX_RETRY_AFTER));
        assert!(schedule.next(1, Some(Duration::from_secs(1)), &mut rng).unwrap() >= Duration::from_secs(4));
    }

    #[test]
    fn a_schedule_is_durations_each_more_than_zero() {
        assert_eq!(RetrySchedule::parse("1s,90s").unwrap().0, [Duration::from_secs(1), Duration::from_secs(90)]);
        for bad in ["", "5", "5s,", "0s", "soon", "5s,,5m"] {
            assert!(RetrySchedule::parse(bad).is_err(), "{bad:?}");
        }
    }
}

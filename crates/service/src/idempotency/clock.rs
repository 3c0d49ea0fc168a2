//! The clock a process keeps the database's times on: leases and expiries, each learnt from a
//! statement and counted here without asking the database again.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// How much of the time left a [`Deadline`] gives up, as a fraction (1/1000): the database's clock
/// and ours may run at slightly different rates (NTP slews a clock by at most 500 parts per
/// million), and over a retention of a day that is up to 43 s, by which a cache could outlive what
/// it holds. Twice the worst slew, so it never does.
const RATE_MARGIN_DIVISOR: u32 = 1000;

/// Time since the machine booted, suspensions included (`CLOCK_BOOTTIME`). `Instant` would not
/// do: on Linux it stops while the machine sleeps, and a lease judged by it would seem to last
/// longer than it did.
pub(super) fn since_boot() -> Duration {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).expect("Linux has CLOCK_BOOTTIME");
    Duration::from(now)
}

/// A moment the database decides (a key's expiry), on this process's [`since_boot`] clock, early
/// rather than late: counted from before the statement that learnt it was sent (the database's
/// `now()` is later than that), less [`RATE_MARGIN_DIVISOR`]'s share of the time left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Deadline {
    /// On [`since_boot`].
    at: Duration,
}

impl Deadline {
    /// `left` after `sent`, a reading of [`since_boot`] taken before the statement that said so
    /// was sent.
    pub(super) fn counted_from(sent: Duration, left: Duration) -> Deadline {
        Deadline { at: sent.saturating_add(left - left / RATE_MARGIN_DIVISOR) }
    }

    /// `left` from now, for a moment the database is about to set to at least its `now()` plus
    /// `left` (a key about to finish).
    pub fn after(left: Duration) -> Deadline {
        Deadline::counted_from(since_boot(), left)
    }

    /// How long until it comes; zero once it has.
    pub fn time_left(&self) -> Duration {
        self.at.saturating_sub(since_boot())
    }

    /// Whether it has come.
    pub fn has_passed(&self) -> bool {
        self.has_passed_at(since_boot())
    }

    /// Whether it has come by `now`, a reading of [`since_boot`].
    pub(super) fn has_passed_at(&self, now: Duration) -> bool {
        now >= self.at
    }
}

/// The database's clock, from a time it gave (its `now()` in a statement) counted on by this
/// process's [`since_boot`]: ahead of the database's own by the statement's way there (its `now()`
/// came after it was sent) and [`RATE_MARGIN_DIVISOR`]'s share of the time since, never behind.
#[derive(Debug, Clone, Copy)]
pub struct DatabaseClock {
    read: DateTime<Utc>,
    /// On [`since_boot`]: when the statement that gave `read` was sent.
    sent: Duration,
}

impl DatabaseClock {
    pub(super) fn read(read: DateTime<Utc>, sent: Duration) -> DatabaseClock {
        DatabaseClock { read, sent }
    }

    /// The database's time now, in whole microseconds, as it keeps a time.
    pub fn now(&self) -> DateTime<Utc> {
        let since = since_boot().saturating_sub(self.sent);
        let since = chrono::TimeDelta::from_std(since + since / RATE_MARGIN_DIVISOR).unwrap_or(chrono::TimeDelta::MAX);
        let now = self.read.checked_add_signed(since).unwrap_or(DateTime::<Utc>::MAX_UTC);
        DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_comes_early_never_late() {
        let sent = since_boot();
        let deadline = Deadline::counted_from(sent, Duration::from_secs(86_400));
        assert!(deadline.at <= sent + Duration::from_secs(86_400) - Duration::from_secs(86));
        assert!(Deadline::counted_from(sent, Duration::ZERO).has_passed());
        assert!(!Deadline::after(Duration::from_secs(60)).has_passed());
        assert_eq!(Deadline::counted_from(Duration::MAX, Duration::MAX).at, Duration::MAX, "saturates");
    }

    #[test]
    fn the_databases_clock_runs_on_from_its_reading_in_microseconds() {
        let read = DateTime::from_timestamp_micros(1_800_000_000_000_001).unwrap();
        let clock = DatabaseClock::read(read, since_boot() - Duration::from_secs(10));
        let now = clock.now();
        assert!(now >= read + chrono::TimeDelta::milliseconds(10_010), "ten seconds on, and the margin: {now}");
        assert!(now < read + chrono::TimeDelta::seconds(11), "{now}");
        assert_eq!(now.timestamp_subsec_nanos() % 1000, 0, "whole microseconds");
    }
}

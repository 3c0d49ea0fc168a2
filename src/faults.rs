//! Fault injection: `X-Fault-Inject: crash=<point>` makes the process abort at that point, with no
//! clean-up, exactly like `kill -9`. Honoured only with `PAYMENTS_FAULT_INJECTION=1` (logged
//! loudly at start). The header is never part of a request's fingerprint or stored params, so a
//! retry, or a worker re-driving the request, does not crash again.

use std::fmt;
use std::str::FromStr;

/// The header that asks for a crash.
pub const FAULT_HEADER: &str = "X-Fault-Inject";

/// Where a request can be made to crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// `started` committed, before the gateway call.
    AfterStarted,
    /// The gateway answered, before the `charge_created` transaction commits.
    AfterCharge,
    /// `charge_created` committed, before the `finished` transaction commits.
    AfterChargeCreated,
}

impl CrashPoint {
    const ALL: [(CrashPoint, &'static str); 3] = [
        (CrashPoint::AfterStarted, "after_started"),
        (CrashPoint::AfterCharge, "after_charge"),
        (CrashPoint::AfterChargeCreated, "after_charge_created"),
    ];
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Self::ALL.iter().find(|(point, _)| point == self).map(|(_, name)| *name);
        f.write_str(name.unwrap_or_default())
    }
}

/// Parses the header's value, `crash=<point>`.
impl FromStr for CrashPoint {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let point = value.trim().strip_prefix("crash=").unwrap_or_default();
        Self::ALL.iter().find(|(_, name)| *name == point).map(|(point, _)| *point).ok_or_else(|| {
            format!("{FAULT_HEADER} must be crash=after_started, crash=after_charge or crash=after_charge_created")
        })
    }
}

/// Aborts the process if the request asked to crash `here`.
pub fn crash_at(armed: Option<CrashPoint>, here: CrashPoint) {
    if armed == Some(here) {
        tracing::error!(crash_point = %here, "fault injection: aborting the process");
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_names_a_point() {
        assert_eq!("crash=after_started".parse(), Ok(CrashPoint::AfterStarted));
        assert_eq!("crash=after_charge".parse(), Ok(CrashPoint::AfterCharge));
        assert_eq!(" crash=after_charge_created".parse(), Ok(CrashPoint::AfterChargeCreated));
        assert!("crash=nowhere".parse::<CrashPoint>().is_err());
        assert!("after_started".parse::<CrashPoint>().is_err());
        assert_eq!(CrashPoint::AfterCharge.to_string(), "after_charge");
    }
}

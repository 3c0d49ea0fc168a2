//! Fault injection: `X-Fault-Inject: crash=<point>` makes the process abort at that point, with no
//! clean-up, exactly like `kill -9`; `pause=<point>` makes it stop itself there (`SIGSTOP`, as a
//! frozen VM or a stopped process would) until someone sends it `SIGCONT`; `pause=every` stops it
//! at each point the request passes, so a test can step it from one to the next. Honoured only with
//! `PAYMENTS_FAULT_INJECTION=1` (logged loudly at start). The header is never part of a request's
//! fingerprint or stored params, so a retry, or a worker re-driving the request, does not fault
//! again.

use std::fmt;
use std::str::FromStr;

/// The header that asks for a fault.
pub const FAULT_HEADER: &str = "X-Fault-Inject";

/// Where a request can be made to fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// `started` committed, before the gateway call.
    AfterStarted,
    /// The gateway answered, before the `charge_created` transaction commits.
    AfterCharge,
    /// `charge_created` committed, before the `finished` transaction commits.
    AfterChargeCreated,
    /// A refund's gateway call answered, before the `refund_created` transaction commits.
    AfterRefund,
    /// `refund_created` committed, before the refund's `finished` transaction commits.
    AfterRefundCreated,
    /// A capture's or a cancel's gateway call answered, before its `capture_created` or
    /// `cancel_created` commits.
    AfterChange,
    /// `capture_created` or `cancel_created` committed, before `finished` commits.
    AfterChangeCreated,
}

/// What happens to the process at the point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Abort, like `kill -9`.
    Crash,
    /// Stop, like `kill -STOP`, and carry on when continued.
    Pause,
}

/// A fault a request asks for: an action at a point, or (`None`) at every point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub action: FaultAction,
    pub point: Option<FaultPoint>,
}

impl FaultPoint {
    const ALL: [(FaultPoint, &'static str); 7] = [
        (FaultPoint::AfterStarted, "after_started"),
        (FaultPoint::AfterCharge, "after_charge"),
        (FaultPoint::AfterChargeCreated, "after_charge_created"),
        (FaultPoint::AfterRefund, "after_refund"),
        (FaultPoint::AfterRefundCreated, "after_refund_created"),
        (FaultPoint::AfterChange, "after_change"),
        (FaultPoint::AfterChangeCreated, "after_change_created"),
    ];
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Self::ALL.iter().find(|(point, _)| point == self).map(|(_, name)| *name);
        f.write_str(name.unwrap_or_default())
    }
}

/// Parses the header's value, `crash=<point>` or `pause=<point>`.
impl FromStr for Fault {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let (action, point) = value.trim().split_once('=').unwrap_or_default();
        let action = match action {
            "crash" => Some(FaultAction::Crash),
            "pause" => Some(FaultAction::Pause),
            _ => None,
        };
        let point = match point {
            "every" => Some(None),
            point => FaultPoint::ALL.iter().find(|(_, name)| *name == point).map(|(point, _)| Some(*point)),
        };
        match (action, point) {
            (Some(action), Some(point)) => Ok(Fault { action, point }),
            _ => Err(format!(
                "{FAULT_HEADER} must be crash=<point> or pause=<point>, where <point> is after_started, after_charge, \
                 after_charge_created, after_refund, after_refund_created, after_change, after_change_created or (to \
                 pause at each) every"
            )),
        }
    }
}

/// Carries out the request's fault if it is armed for `here`.
pub fn fault_at(armed: Option<Fault>, here: FaultPoint) {
    let Some(fault) = armed.filter(|fault| fault.point.is_none_or(|point| point == here)) else { return };
    match fault.action {
        FaultAction::Crash => {
            tracing::error!(crash_point = %here, "fault injection: aborting the process");
            std::process::abort();
        }
        FaultAction::Pause => {
            tracing::warn!(pause_point = %here, "fault injection: stopping the process until it gets SIGCONT");
            // The whole process stops here, every thread with it, as a frozen machine would.
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_names_an_action_and_a_point() {
        let crash = |point| Ok(Fault { action: FaultAction::Crash, point: Some(point) });
        assert_eq!("crash=after_started".parse(), crash(FaultPoint::AfterStarted));
        assert_eq!("crash=after_charge".parse(), crash(FaultPoint::AfterCharge));
        assert_eq!(" crash=after_charge_created".parse(), crash(FaultPoint::AfterChargeCreated));
        assert_eq!(
            "pause=after_started".parse(),
            Ok(Fault { action: FaultAction::Pause, point: Some(FaultPoint::AfterStarted) })
        );
        assert_eq!("pause=every".parse(), Ok(Fault { action: FaultAction::Pause, point: None }));
        assert!("crash=nowhere".parse::<Fault>().is_err());
        assert!("after_started".parse::<Fault>().is_err());
        assert!("sleep=after_started".parse::<Fault>().is_err());
        assert_eq!(FaultPoint::AfterCharge.to_string(), "after_charge");
    }
}

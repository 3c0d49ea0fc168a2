//! What we ask the gateway to do with an authorized charge (capture it, or cancel it), and where
//! such a charge stands.
//!
//! A capture or a cancel goes under a key of its own (see [`downstream_key`]), like a charge, so a
//! request repeated after an unknown outcome does it at most once. What the gateway refuses
//! because the charge was captured or cancelled already ([`Changed::Before`]) is settled by
//! reading the charge ([`GatewayClient::get_charge`]): a capture of ours whose answer was lost
//! reads as captured.
//!
//! [`downstream_key`]: super::downstream_key
//! [`GatewayClient::get_charge`]: super::GatewayClient::get_charge

use serde::Serialize;

/// A capture: how much of the authorization, the rest released.
#[derive(Debug, Serialize)]
pub struct CaptureRequest {
    pub amount: i64,
}

/// A cancel: nothing to say but which charge (the path).
#[derive(Debug, Serialize)]
pub struct CancelRequest {}

/// Where an authorized charge stands at the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authorization {
    /// Authorized, neither captured nor cancelled: the money is held.
    Open,
    /// Captured, for this much (the rest released).
    Captured {
        amount: i64,
    },
    Canceled,
    /// The charge failed (a decline): there was never anything to capture or cancel.
    Failed,
}

/// What a capture's or a cancel's answer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changed {
    /// Done now: the charge as it stands after it.
    Now(Authorization),
    /// Refused, because the charge was captured or cancelled before (by this key under a
    /// forgotten key, or otherwise): read it to know which.
    Before,
}

//! What we ask the gateway to refund and what can come of it.
//!
//! A refund request goes under a key of its own (see [`downstream_key`]), like a charge. Its
//! answer is a [`Refund`], whose status may still change (`pending`), or a [`GatewayError`]:
//! `Rejected` when the gateway refused it (more than the charge has left, an unknown charge:
//! definitive, nothing was refunded), `Unavailable` or `Timeout` when nobody knows. An unknown
//! outcome is never "not refunded".
//!
//! [`downstream_key`]: super::downstream_key
//! [`GatewayError`]: super::GatewayError

use std::collections::BTreeMap;

use serde::Serialize;

/// A refund request, as the gateway takes it.
#[derive(Debug, Serialize)]
pub struct RefundRequest<'a> {
    /// The gateway's id of the charge to refund.
    pub charge: &'a str,
    /// In the charge's minor units.
    pub amount: i64,
    /// `duplicate`, `fraudulent` or `requested_by_customer`, as Stripe takes them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'a str>,
    pub metadata: &'a BTreeMap<String, String>,
}

/// A refund the gateway made, as it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    /// The gateway's id (`re_...`), fit to be recorded.
    pub id: String,
    pub status: RefundStatus,
}

/// Where a refund the gateway made stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundStatus {
    /// Not settled yet (Stripe's `pending` and `requires_action`): the money is on its way back,
    /// and may still not arrive. Ask again later ([`GatewayClient::get_refund`]).
    ///
    /// [`GatewayClient::get_refund`]: super::GatewayClient::get_refund
    Pending,
    Succeeded,
    /// The refund failed (or was canceled): nothing was refunded, and the charge has the amount
    /// to refund again. `code` is the gateway's `failure_reason` (`unknown` if it gives none),
    /// cleaned to be recorded.
    Failed {
        code: String,
    },
}

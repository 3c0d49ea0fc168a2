//! The payment gateway: our client for it (charges and refunds). The mock we run in tests and
//! demos is a crate of its own (`payments-mock-gateway`); the signature on its events is
//! `payments-wire`'s, which both sides share.

mod answers;
mod authorization;
mod charge;
mod client;
mod reconcile;
mod refund;
pub mod reports;

pub use authorization::{Authorization, CancelRequest, CaptureRequest, Changed};
pub use charge::{
    Charge, ChargeRequest, ChargeState, GatewayError, WrongGateway, downstream_key, parse_downstream_key,
};
pub use client::{Answered, GatewayClient, recordable_identity};
pub use payments_wire::{IDENTITY_HEADER, signature};
pub use reconcile::{Settles, adoptable, settles};
pub use refund::{Refund, RefundRequest, RefundStatus};

//! The payment gateway: our client for it (charges and refunds), and the mock we run in tests and
//! demos.

mod answers;
mod charge;
mod client;
pub mod mock;
mod refund;
pub mod signature;

pub use charge::{Charge, ChargeRequest, GatewayError, WrongGateway, downstream_key, parse_downstream_key};
pub use client::{Answered, GatewayClient, IDENTITY_HEADER, recordable_identity};
pub use refund::{Refund, RefundRequest, RefundStatus};

//! The payment gateway: our client for it, and the mock we run in tests and demos.

mod answers;
mod client;
pub mod mock;

pub use client::{Charge, ChargeRequest, GatewayClient, GatewayError, IDENTITY_HEADER, downstream_key};

//! The payment gateway: our client for it, and the mock we run in tests and demos.

mod answers;
mod charge;
mod client;
pub mod mock;

pub use charge::{Charge, ChargeRequest, GatewayError, WrongGateway, downstream_key};
pub use client::{Answered, GatewayClient, IDENTITY_HEADER};

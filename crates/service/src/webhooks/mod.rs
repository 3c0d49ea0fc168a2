//! Merchant webhooks: every event an account's endpoints subscribe to, delivered to them signed
//! (Standard Webhooks, `payments_wire::standard_webhooks`), over a network the service does not
//! trust ([`network`]).

pub mod network;
pub mod schedule;

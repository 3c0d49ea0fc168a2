//! Merchant webhooks: the events an account's changes announce, kept ([`events`]); the endpoints
//! an account registers for them ([`endpoints`]); and every event an account's endpoints
//! subscribe to, delivered to them signed
//! (Standard Webhooks, `payments_wire::standard_webhooks`), over a network the service does not
//! trust ([`network`]): an attempt at a time ([`deliver`]), tried again on a schedule
//! ([`schedule`]).

pub mod deliver;
pub mod deliveries;
pub mod endpoints;
pub mod events;
pub mod network;
pub mod schedule;

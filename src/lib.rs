//! `payments`: a reference payment API that makes `POST /v1/payments` safe to retry.
//!
//! Start reading at [`payments::create`]: the recovery-point loop and its phases, on one screen.
//! [`idempotency`] holds the protocol's generic parts (the key, the fingerprint, the claim, the
//! fenced phase runner); [`http`] the thin handlers and the one mapping of errors to responses;
//! [`gateway`] the client with its typed outcomes, and the mock gateway; [`workers`] the
//! completer, reaper and outbox that finish what clients abandon, and the settler that settles
//! pending refunds; [`bench`] measures the service under load, against references.

pub mod accounts;
pub mod audit;
pub mod bench;
pub mod chaos;
pub mod cli;
pub mod client;
pub mod commands;
pub mod config;
pub mod db;
pub mod events;
pub mod faults;
pub mod fields;
pub mod gateway;
pub mod http;
pub mod idempotency;
pub mod lab;
pub mod metrics;
pub mod outbox;
pub mod payments;
pub mod problem;
pub mod refunds;
pub mod request_id;
pub mod runtime;
pub mod startup;
pub mod state;
pub mod story;
pub mod telemetry;
pub mod workers;

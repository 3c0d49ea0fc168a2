#![doc = include_str!("../README.md")]

pub mod accounts;
pub mod audit;
pub mod authorizations;
pub mod config;
pub mod db;
pub mod events;
pub mod faults;
pub mod fields;
pub mod gateway;
pub mod http;
pub mod idempotency;
pub mod metrics;
pub mod outbox;
pub mod payments;
pub mod postgres;
pub mod refunds;
pub mod request_id;
pub mod runtime;
pub mod startup;
pub mod state;
pub mod story;
pub mod telemetry;
pub mod workers;

pub use payments_wire::problem;

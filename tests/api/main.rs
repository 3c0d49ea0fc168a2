//! The integration tests: one binary, so the crate links once and the run shares one cluster.

mod bench;
mod commands;
mod completer;
mod concurrency;
mod conflicts;
mod crash_recovery;
mod create_payment;
mod database_outage;
mod embedded;
mod fencing;
mod gateway_faults;
mod gateway_identity;
mod gateway_mock;
mod helpers;
mod logs;
mod many_instances;
mod openapi;
mod outbox;
mod reaper;
mod replay;
mod resumption;
mod round_trips;
mod schema;
mod validation;

//! The gateway's events: the consumer side of idempotency. The gateway tells the service what
//! happened, at least once: twice, late, out of order, or forged by whoever finds the URL. Each
//! event is verified on its raw bytes before anything reads it ([`crate::gateway::signature`]),
//! then applied exactly once by the database ([`receive`]): never a check-then-insert, never a set
//! in memory.

mod apply;
mod event;

pub use apply::{CREATED_AHEAD_TOLERANCE, DISAGREEMENT, UNSEEN_PATIENCE, keep_unreadable, receive};
pub use event::{GatewayEvent, Unreadable};

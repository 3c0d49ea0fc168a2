//! Refunds: the request, the stored refund, how it is shown, how it is created (on the same
//! idempotency driver as a payment), and how a refund the gateway left pending settles.

pub mod create;
mod model;
mod request;
mod settle;
mod view;
mod writes;

pub use create::{Create, ENDPOINT, REFUND_CREATED};
pub use model::{Refund, RefundStatus};
pub use request::{CreateRefundBody, RefundReason, RefundRequest};
pub use settle::{Backoff, DueRefund, SettledBy, Settlement, lease_due_refund, settle_refund};
pub use view::{RefundList, RefundView};

//! Authorize now, capture later: `POST /v1/payments/{id}/capture` and `/cancel`, each an
//! idempotent request on the same driver as a payment and a refund, ending an authorization (a
//! payment made with `capture: false`). Only the phases are their own; see [`create`].

mod create;
mod request;
mod view;
mod writes;

pub use create::{
    CANCEL, CANCEL_CREATED, CAPTURE, CAPTURE_CREATED, Cancel, Capture, Change, MadeChange, lapse, made_by_key,
};
pub use request::{CancelBody, CancellationReason, CaptureBody, ChangeBody, ChangeKind, ChangeRequest};

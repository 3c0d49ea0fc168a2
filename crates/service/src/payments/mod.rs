//! Payments: the request, the stored payment, how it is shown, and how it is created.

pub mod create;
mod model;
mod request;
pub(crate) mod view;
pub(crate) mod writes;

pub use create::{CHARGE_CREATED, Create, ENDPOINT};
pub use model::{ChargeOutcome, GATEWAY_REJECTED, Payment, PaymentStatus};
pub use request::{CreatePaymentBody, MAX_AMOUNT, validate_metadata};
pub use view::{PaymentList, PaymentView};

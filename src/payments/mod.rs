//! Payments: the request, the stored payment, how it is shown, and how it is created.

pub mod create;
mod model;
mod request;
mod story;
mod view;
mod writes;

pub use create::{Created, complete_abandoned, create_payment};
pub use model::{ChargeOutcome, Payment, PaymentStatus};
pub use request::{CreatePaymentBody, ValidationError};
pub use story::{KeyStory, TRAIL_LIMIT};
pub use view::{PaymentList, PaymentView};

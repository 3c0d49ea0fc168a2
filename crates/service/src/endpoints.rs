//! The registry: every endpoint whose `POST`s run under idempotency keys, a line each. The router
//! routes each to one generic handler, the completer finishes each one's abandoned requests by it,
//! the metrics count each by its label, and the operator's commands find what each one's keys
//! made. Adding an endpoint is its module (its [`Keyed`] implementation, its phases, its own
//! table's migration) and its line here: see docs/ARCHITECTURE.md, "Adding an endpoint".

use actix_web::FromRequest;

use crate::http::{ApiError, ResourceId, idempotent};
use crate::idempotency::Endpoint;
use crate::keyed::{Keyed, Registered};
use crate::webhooks::endpoints as webhook_endpoints;
use crate::{authorizations, payments, refunds};

/// The keyed endpoints.
pub static KEYED: &[Registered] = &[
    entry::<payments::Create>(),
    entry::<refunds::Create>(),
    entry::<authorizations::Capture>(),
    entry::<authorizations::Cancel>(),
    entry::<webhook_endpoints::Create>(),
    entry::<webhook_endpoints::RotateSecret>(),
];

/// The entry of `E`, answered over HTTP by the generic handler.
const fn entry<E: Keyed>() -> Registered
where
    ResourceId<E::On>: FromRequest<Error = ApiError>,
{
    Registered::of::<E>(idempotent::route::<E>)
}

/// The layer's view of every keyed endpoint.
pub fn all() -> Vec<&'static Endpoint> {
    KEYED.iter().map(|entry| entry.endpoint).collect()
}

/// The keyed endpoint at `path`, if one is registered.
pub fn at(path: &str) -> Option<&'static Registered> {
    Registered::at(KEYED, path)
}

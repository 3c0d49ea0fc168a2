//! What handlers take from a request, each rejecting with an [`ApiError`].

use std::future::{Ready, ready};
use std::marker::PhantomData;

use actix_web::http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, TRANSFER_ENCODING};
use actix_web::{FromRequest, HttpRequest, dev::Payload, web};
use futures_util::TryFutureExt;
use futures_util::future::{Either, LocalBoxFuture, MapErr, MapOk, TryJoin, try_join};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::error::ApiError;
use crate::faults::{FAULT_HEADER, Fault};
use crate::fields::Object;
use crate::idempotency::{IdempotencyKey, KeyError};
#[cfg(doc)]
use crate::keyed::Keyed;
use crate::state::AppState;

/// The largest request body accepted. A payment with a full description and full metadata is
/// about 12 KiB of JSON.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// The largest raw body accepted: a gateway event's. An event carries the charge or refund as the
/// gateway shows it, with the description and metadata of a request that was itself up to
/// [`MAX_BODY_BYTES`], and its own fields around them: an event refused for its size would be
/// sent again for ever. Four times the request's bound leaves room for any the gateway can make.
pub const MAX_EVENT_BYTES: usize = 4 * MAX_BODY_BYTES;

/// The account whose API key the request carries (`Authorization: Bearer <key>`), and then `T`,
/// the rest of what the handler reads from the request: nothing else is read until the key is
/// known, so a request without a valid key is a `401` whatever else is wrong with it (a body, a
/// header, a query or an id that would be a `400`, `404` or `415` to its account). Extracted side
/// by side, the first error ready would win, and a key that needs a database look-up is never
/// the first.
pub struct Authenticated<T>(pub Uuid, pub T);

/// `T`'s extraction once the account is known at once: no allocation of its own.
type Known<T> = MapOk<
    TryJoin<
        Ready<Result<Uuid, actix_web::Error>>,
        MapErr<<T as FromRequest>::Future, fn(<T as FromRequest>::Error) -> actix_web::Error>,
    >,
    fn((Uuid, T)) -> Authenticated<T>,
>;

impl<T: FromRequest + 'static> FromRequest for Authenticated<T>
where
    T::Error: Into<actix_web::Error>,
{
    type Error = actix_web::Error;
    type Future = Either<Known<T>, LocalBoxFuture<'static, Result<Self, actix_web::Error>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let state = req.app_data::<web::Data<AppState>>();
        let api_key = sent_once(req, AUTHORIZATION.as_str())
            .ok()
            .flatten()
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, key)| key.trim());
        let (Some(state), Some(api_key)) = (state, api_key) else {
            return Either::Right(Box::pin(ready(Err(ApiError::Unauthorized.into()))));
        };
        // A key seen lately is known at once: nearly every request's is, and boxing the database
        // look-up's future for it (a large allocation) cost more than the look-up in memory.
        let unremembered = match state.api_keys.remembered(api_key) {
            Ok(id) => {
                let rest = T::from_request(req, payload).map_err(Into::into as fn(T::Error) -> actix_web::Error);
                let both = try_join(ready(Ok(id)), rest);
                return Either::Left(both.map_ok((|(id, rest)| Authenticated(id, rest)) as fn((Uuid, T)) -> Self));
            }
            Err(unremembered) => unremembered,
        };
        let (state, req, mut payload) = (state.clone(), req.clone(), payload.take());
        Either::Right(Box::pin(async move {
            let id = state.api_keys.authenticate(&state.db, unremembered).await.map_err(ApiError::from)?;
            let id = id.ok_or(ApiError::Unauthorized)?;
            let rest = T::from_request(&req, &mut payload).await.map_err(Into::into)?;
            Ok(Authenticated(id, rest))
        }))
    }
}

/// A header sent more than once.
pub(super) struct Repeated;

/// The one value of the header `name`, if it was sent. Sent twice, a header that names one thing
/// (an API key, an idempotency key, a fault, a body's type) names none: HTTP reads the two lines
/// as one list, and taking either would let a request that carried only the other mean something
/// else.
pub(super) fn sent_once<'r>(req: &'r HttpRequest, name: &str) -> Result<Option<&'r HeaderValue>, Repeated> {
    let mut sent = req.headers().get_all(name);
    match (sent.next(), sent.next()) {
        (value, None) => Ok(value),
        (_, Some(_)) => Err(Repeated),
    }
}

/// The request's `Idempotency-Key`, required and valid.
pub struct IdempotencyKeyHeader(pub IdempotencyKey);

impl FromRequest for IdempotencyKeyHeader {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let key = match sent_once(req, "Idempotency-Key") {
            Ok(None) => Err(KeyError::Missing),
            Ok(Some(value)) => IdempotencyKey::parse(value.as_bytes()),
            Err(Repeated) => Err(KeyError::Repeated),
        };
        ready(key.map(IdempotencyKeyHeader).map_err(ApiError::from))
    }
}

/// The fault a request asks for with `X-Fault-Inject`: always none unless fault injection is
/// enabled. A malformed header is a 400 either way, as the API documents the header's values
/// whether or not this service honours them.
pub struct FaultRequest(pub Option<Fault>);

impl FromRequest for FaultRequest {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let enabled = req.app_data::<web::Data<AppState>>().is_some_and(|state| state.settings.fault_injection);
        let requested = match sent_once(req, FAULT_HEADER) {
            Err(Repeated) => Err(format!("{FAULT_HEADER} is sent more than once; ask for one fault")),
            Ok(value) => value.map(|value| value.to_str().map_err(|e| e.to_string()).and_then(str::parse)).transpose(),
        };
        ready(requested.map(|fault| FaultRequest(fault.filter(|_| enabled))).map_err(ApiError::InvalidRequest))
    }
}

/// Refuses a body whose type is sent twice, before it is read: actix's extractors read the first
/// `Content-Type` alone, so `application/json` then `text/plain` was a payment, and the reverse a
/// `415`. Every endpoint that reads a body reads it through this check.
fn content_type_sent_once(req: &HttpRequest) -> Result<(), ApiError> {
    match sent_once(req, CONTENT_TYPE.as_str()) {
        Ok(_) => Ok(()),
        Err(Repeated) => Err(ApiError::InvalidRequest(
            "Content-Type is sent more than once; send the body's type once, `application/json`.".into(),
        )),
    }
}

/// The `{id}` of a route about one resource, `R` (a payment, a refund). An id that does not parse
/// names no such resource: it is `R`'s not-found, never another resource's.
pub struct PathId<R>(pub Uuid, pub PhantomData<R>);

/// A resource a route names by id, and the answer when the id names none.
pub trait Named {
    /// What its ids begin with where the API shows them (`evt_`), if anything.
    const PREFIX: &'static str = "";

    fn not_found() -> ApiError;

    /// The id `text` names, if it is one of `R`'s.
    fn parse_id(text: &str) -> Option<Uuid> {
        Uuid::parse_str(text.strip_prefix(Self::PREFIX)?).ok()
    }
}

impl<R: Named> FromRequest for PathId<R> {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let id = req.match_info().get("id").and_then(R::parse_id);
        ready(id.map(|id| PathId(id, PhantomData)).ok_or_else(R::not_found))
    }
}

/// The id of the resource a keyed endpoint's path names (see [`Keyed::On`]): `None` for an
/// endpoint whose path names none (`R` is `()`), else the id, or `R`'s not-found answer for one
/// that is no id.
pub struct ResourceId<R>(pub Option<Uuid>, PhantomData<R>);

impl FromRequest for ResourceId<()> {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(_: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(Ok(ResourceId(None, PhantomData)))
    }
}

impl<R: Named> FromRequest for ResourceId<R> {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let id = PathId::<R>::from_request(req, payload).into_inner();
        ready(id.map(|PathId(id, _)| ResourceId(Some(id), PhantomData)))
    }
}

/// A JSON body, read as actix's `web::Json` reads it (bounded, as [`extractor_configs`] says),
/// once its type is known to be sent once: a JSON object, and nothing else (see [`Object`]). Every
/// body a client sends is read through here.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + 'static> FromRequest for JsonBody<T> {
    type Error = actix_web::Error;
    type Future = Either<
        Ready<Result<Self, actix_web::Error>>,
        MapOk<<web::Json<Object<T>> as FromRequest>::Future, fn(web::Json<Object<T>>) -> Self>,
    >;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        if sent_nothing(req) {
            // No body at all reads as `{}`: a body whose every field may be left out (a rotation's)
            // may be left out whole, and any other is refused for the fields it misses.
            let empty = serde_json::from_str::<Object<T>>("{}")
                .map(|Object(body)| JsonBody(body))
                .map_err(|error| ApiError::MalformedBody(format!("No body was sent, and {error}.")).into());
            return Either::Left(ready(empty));
        }
        match content_type_sent_once(req) {
            Err(error) => Either::Left(ready(Err(error.into()))),
            Ok(()) => Either::Right(
                web::Json::<Object<T>>::from_request(req, payload)
                    .map_ok((|json: web::Json<Object<T>>| JsonBody(json.into_inner().0)) as fn(_) -> _),
            ),
        }
    }
}

/// Whether a request carries no body at all: no `Content-Type`, and a `Content-Length` of 0 (or
/// none, and no chunked body).
fn sent_nothing(req: &HttpRequest) -> bool {
    let headers = req.headers();
    let length = headers.get(CONTENT_LENGTH).and_then(|length| length.to_str().ok());
    !headers.contains_key(CONTENT_TYPE)
        && !headers.contains_key(TRANSFER_ENCODING)
        && length.is_none_or(|length| length.trim() == "0")
}

/// A raw body (a gateway event's, verified before it is parsed), bounded as [`extractor_configs`]
/// says, once its type is known to be sent once.
pub struct RawBody(pub web::Bytes);

impl FromRequest for RawBody {
    type Error = ApiError;
    type Future = Either<
        Ready<Result<Self, ApiError>>,
        MapOk<MapErr<<web::Bytes as FromRequest>::Future, fn(actix_web::Error) -> ApiError>, fn(web::Bytes) -> Self>,
    >;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        match content_type_sent_once(req) {
            Err(error) => Either::Left(ready(Err(error))),
            Ok(()) => Either::Right(
                web::Bytes::from_request(req, payload)
                    .map_err(ApiError::from as fn(actix_web::Error) -> ApiError)
                    .map_ok(RawBody as fn(web::Bytes) -> Self),
            ),
        }
    }
}

/// Every body, query string and path parameter that fails to parse is answered as a problem.
pub fn extractor_configs(cfg: &mut web::ServiceConfig) {
    cfg.app_data(
        web::JsonConfig::default().limit(MAX_BODY_BYTES).error_handler(|error, _| ApiError::from(error).into()),
    )
    .app_data(web::QueryConfig::default().error_handler(|error, _| ApiError::from(error).into()))
    // Raw bodies (a gateway event's, verified before it is read) are bounded too: an unsigned
    // megabyte costs nothing to send and a signature check to refuse.
    .app_data(web::PayloadConfig::new(MAX_EVENT_BYTES))
    .app_data(web::PathConfig::default().error_handler(|error, _| ApiError::from(error).into()));
}

/// A raw body that could not be read (see [`extractor_configs`]'s bound).
impl From<actix_web::Error> for ApiError {
    fn from(error: actix_web::Error) -> Self {
        match error.as_error::<actix_web::error::PayloadError>() {
            Some(actix_web::error::PayloadError::Overflow) => ApiError::PayloadTooLarge { limit: MAX_EVENT_BYTES },
            _ => ApiError::MalformedBody(format!("The body could not be read: {error}.")),
        }
    }
}

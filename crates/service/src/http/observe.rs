//! What happens around every request: it gets its id, its log span and its place in the metrics.

use std::future::{Ready, ready};
use std::time::Instant;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::Method;
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{Error, FromRequest, HttpMessage, HttpRequest, web};
use tracing::Instrument;

use super::error::ApiError;
use crate::request_id::{INCOMING_REQUEST_ID_HEADER, RequestId};
use crate::state::AppState;

/// The `route` label of a request that matched no route: never its raw path, which a client
/// chooses (and so would make a label value per request).
const UNMATCHED: &str = "unmatched";

/// Gives the request its id (the caller's valid `X-Request-Id`, or a new one), runs it in a span
/// that carries the id (so every log line of the request has it), and on the way out: puts the id
/// in `Request-Id` and in the body of a problem, and counts the request by its route's template.
pub async fn observe(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    let started = Instant::now();
    let id = req
        .headers()
        .get(INCOMING_REQUEST_ID_HEADER)
        .and_then(|value| RequestId::from_caller(value.as_bytes()))
        .unwrap_or_else(RequestId::generate);
    req.extensions_mut().insert(id.clone());
    let span = tracing::info_span!("request", request_id = %id, http.method = %req.method(), http.route = tracing::field::Empty);
    // Every route and the default service answer with a response, errors included; an `Err` here
    // would come from actix itself, and goes on as it is (the request cannot be kept to answer it:
    // routing needs to hold it alone).
    let mut response = next.call(req).instrument(span.clone()).await?.map_into_boxed_body();
    // An error was rendered without the request's id (actix renders it where the id is not in
    // reach): render it again, with the id in its body.
    if let Some(error) = response.response().error().and_then(|error| error.as_error::<ApiError>()) {
        let rendered = error.response(Some(&id));
        response = response.into_response(rendered);
    }
    let value = HeaderValue::from_str(id.as_str()).expect("a request id is plain ASCII");
    response.headers_mut().insert(REQUEST_ID, value);

    if let Some(state) = response.request().app_data::<web::Data<AppState>>() {
        let request = response.request();
        let route = request.match_pattern();
        let route = route.as_deref().unwrap_or(UNMATCHED);
        span.record("http.route", route);
        let method = method_label(request.method());
        state.metrics.http_request(method, route, response.status().as_str(), started.elapsed());
    }
    Ok(response)
}

/// [`crate::request_id::REQUEST_ID_HEADER`], made once instead of checked again for every answer.
const REQUEST_ID: HeaderName = HeaderName::from_static("request-id");

/// The `method` label: a client may send any method name, and a label must come from a closed set.
fn method_label(method: &Method) -> &'static str {
    const KNOWN: [Method; 7] =
        [Method::GET, Method::POST, Method::PUT, Method::DELETE, Method::PATCH, Method::HEAD, Method::OPTIONS];
    let known = KNOWN.iter().find(|known| *known == method);
    known.map_or("other", |known| known.as_str())
}

/// The id [`observe`] gave the request.
impl FromRequest for RequestId {
    type Error = ApiError;
    type Future = Ready<Result<RequestId, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let id = req.extensions().get::<RequestId>().cloned();
        ready(
            id.ok_or_else(|| {
                ApiError::Internal("the request has no id: the request middleware is not installed".into())
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_is_written_as_named() {
        assert!(REQUEST_ID.as_str().eq_ignore_ascii_case(crate::request_id::REQUEST_ID_HEADER));
    }

    #[test]
    fn an_unknown_method_is_counted_as_other() {
        assert_eq!(method_label(&Method::POST), "POST");
        assert_eq!(method_label(&Method::from_bytes(b"FOO1").unwrap()), "other");
    }
}

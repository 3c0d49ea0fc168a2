//! The HTTP surface: the route table, extractors, handlers, and errors as problem details.

pub mod error;
mod events;
mod extract;
mod health;
mod idempotency_keys;
pub mod idempotent;
mod observe;
mod page;
mod payments;
mod refunds;
mod webhook_endpoints;
mod webhooks;

use std::rc::Rc;

use actix_web::dev::ResourceDef;
use actix_web::http::Method;
use actix_web::{HttpRequest, HttpResponse, Route, web};

use crate::keyed::Registered;

pub use error::ApiError;
pub use extract::{Named, ResourceId};
pub use health::OPENAPI_YAML;
pub use observe::observe;

/// One endpoint: every route of the app is registered from [`routes`] (the table below and the
/// keyed endpoints of the registry), which is also what the test comparing the app with
/// `openapi.yaml` reads.
pub struct Endpoint {
    pub method: Method,
    pub path: &'static str,
    route: fn() -> Route,
}

/// The API but for its keyed `POST`s, as a table: those are the registry's (see
/// [`crate::endpoints`]), each answered by one generic handler ([`idempotent::route`]).
pub const ENDPOINTS: &[Endpoint] = &[
    Endpoint { method: Method::GET, path: "/v1/payments", route: || web::get().to(payments::list_payments) },
    Endpoint { method: Method::GET, path: "/v1/payments/{id}", route: || web::get().to(payments::get_payment) },
    Endpoint { method: Method::GET, path: "/v1/refunds", route: || web::get().to(refunds::list_refunds) },
    Endpoint { method: Method::GET, path: "/v1/refunds/{id}", route: || web::get().to(refunds::get_refund) },
    Endpoint { method: Method::GET, path: "/v1/events", route: || web::get().to(events::list_events) },
    Endpoint { method: Method::GET, path: "/v1/events/{id}", route: || web::get().to(events::get_event) },
    Endpoint {
        method: Method::GET,
        path: "/v1/webhook_endpoints",
        route: || web::get().to(webhook_endpoints::list_endpoints),
    },
    Endpoint {
        method: Method::GET,
        path: "/v1/webhook_endpoints/{id}",
        route: || web::get().to(webhook_endpoints::get_endpoint),
    },
    Endpoint {
        method: Method::POST,
        path: "/v1/webhook_endpoints/{id}",
        route: || web::post().to(webhook_endpoints::update_endpoint),
    },
    Endpoint {
        method: Method::DELETE,
        path: "/v1/webhook_endpoints/{id}",
        route: || web::delete().to(webhook_endpoints::delete_endpoint),
    },
    Endpoint {
        method: Method::POST,
        path: "/v1/webhook_endpoints/{id}/recover",
        route: || web::post().to(webhook_endpoints::recover_endpoint),
    },
    Endpoint {
        method: Method::GET,
        path: "/v1/webhook_endpoints/{id}/attempts",
        route: || web::get().to(webhook_endpoints::list_attempts),
    },
    Endpoint {
        method: Method::GET,
        path: "/v1/idempotency_keys",
        route: || web::get().to(idempotency_keys::key_story),
    },
    Endpoint {
        method: Method::POST,
        path: "/webhooks/gateway",
        route: || web::post().to(webhooks::receive_gateway_event),
    },
    Endpoint { method: Method::GET, path: "/healthz", route: || web::get().to(health::healthz) },
    Endpoint { method: Method::GET, path: "/readyz", route: || web::get().to(health::readyz) },
    Endpoint { method: Method::GET, path: "/openapi.yaml", route: || web::get().to(health::openapi) },
];

/// Every route of the API: the keyed endpoints `keyed` (a `POST` each), then [`ENDPOINTS`].
pub fn routes(keyed: &[Registered]) -> Vec<Endpoint> {
    let keyed =
        keyed.iter().map(|entry| Endpoint { method: Method::POST, path: entry.endpoint.path, route: entry.route });
    keyed.chain(ENDPOINTS.iter().map(|e| Endpoint { method: e.method.clone(), path: e.path, route: e.route })).collect()
}

/// What the metrics listener serves: never the API's address, since the metrics show every
/// tenant's volumes to whoever reaches them.
pub const METRICS_ENDPOINTS: &[Endpoint] =
    &[Endpoint { method: Method::GET, path: "/metrics", route: || web::get().to(health::metrics) }];

/// The API: every route of [`routes`], the keyed endpoints being `keyed` (the registry's), which
/// handlers that ask of every endpoint (a key's story) read as app data.
pub fn configure(cfg: &mut web::ServiceConfig, keyed: &'static [Registered]) {
    extract::extractor_configs(cfg);
    cfg.app_data(web::Data::new(keyed));
    register(cfg, &routes(keyed));
}

/// The metrics listener: `GET /metrics` alone.
pub fn configure_metrics(cfg: &mut web::ServiceConfig) {
    register(cfg, METRICS_ENDPOINTS);
}

/// The prefix of the API's versioned paths.
const VERSION: &str = "/v1";

/// The longest path a not-found problem repeats as it was sent; beyond it, the problem names the
/// route's template instead, so that a client's long path is not echoed back. The longest real
/// one, a refund's, is 48 bytes.
const MAX_NAMED_PATH: usize = 100;

/// Registers `endpoints`, one resource per path (so a known path with an unknown method is a 405,
/// not a 404), and answers everything else with a problem too.
fn register(cfg: &mut web::ServiceConfig, endpoints: &[Endpoint]) {
    let mut paths: Vec<&str> = endpoints.iter().map(|endpoint| endpoint.path).collect();
    paths.sort_unstable();
    paths.dedup();
    for path in paths {
        let routes = endpoints.iter().filter(|endpoint| endpoint.path == path);
        let resource = routes.fold(web::resource(path), |resource, endpoint| resource.route((endpoint.route)()));
        let allowed: Vec<&str> = endpoints.iter().filter(|e| e.path == path).map(|e| e.method.as_str()).collect();
        let allowed = allowed.join(", ");
        cfg.service(resource.default_service(web::to(move || {
            let allowed = allowed.clone();
            async move { Err::<HttpResponse, _>(ApiError::MethodNotAllowed { allowed }) }
        })));
    }
    // `/payments` is the path a reader tries first: a path whose versioned twin is a route, for
    // any method, is a 404 that names the twin. The twins are the routes themselves, so a new
    // endpoint has its own at once.
    let versioned = versioned_routes(endpoints);
    cfg.default_service(web::to(move |req: HttpRequest| {
        let error = unversioned_twin(&versioned, req.path()).map_or(ApiError::RouteNotFound, ApiError::Unversioned);
        async move { Err::<HttpResponse, _>(error) }
    }));
}

/// The routes of `endpoints` under [`VERSION`].
fn versioned_routes(endpoints: &[Endpoint]) -> Rc<[ResourceDef]> {
    let versioned = endpoints
        .iter()
        .filter(|endpoint| endpoint.path.strip_prefix(VERSION).is_some_and(|rest| rest.starts_with('/')));
    versioned.map(|endpoint| ResourceDef::new(endpoint.path)).collect()
}

/// The versioned path `path` would be a route at, if any: the path itself when it is short
/// enough to repeat, else the route's template.
fn unversioned_twin(versioned: &[ResourceDef], path: &str) -> Option<String> {
    let twin = format!("{VERSION}{path}");
    let route = versioned.iter().find(|route| route.is_match(&twin))?;
    Some(match twin.len() <= MAX_NAMED_PATH {
        true => twin,
        false => route.pattern().unwrap_or(VERSION).to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unversioned_path_names_its_twin_as_sent_or_by_its_template_when_long() {
        let versioned = versioned_routes(&routes(&[]));
        let twin = |path: &str| unversioned_twin(&versioned, path);
        assert_eq!(twin("/payments").as_deref(), Some("/v1/payments"));
        assert_eq!(twin("/refunds/abc").as_deref(), Some("/v1/refunds/abc"));
        assert_eq!(twin("/idempotency_keys").as_deref(), Some("/v1/idempotency_keys"));
        let long = format!("/payments/{}", "a".repeat(MAX_NAMED_PATH));
        assert_eq!(twin(&long).as_deref(), Some("/v1/payments/{id}"));
        for path in ["/", "/disputes", "/payments/", "/payments/abc/refunds", "/v1/payments/abc/x", "/healthz"] {
            assert_eq!(twin(path), None, "{path}");
        }
        assert!(versioned_routes(METRICS_ENDPOINTS).is_empty(), "the metrics listener names no API path");
    }
}

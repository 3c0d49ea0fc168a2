//! The HTTP surface: the route table, extractors, handlers, and errors as problem details.

pub mod error;
mod extract;
mod health;
mod idempotency_keys;
mod observe;
mod payments;
mod refunds;
mod webhooks;

use actix_web::http::Method;
use actix_web::{HttpResponse, Route, web};

pub use error::ApiError;
pub use health::OPENAPI_YAML;
pub use observe::observe;

/// One endpoint: every route of the app is registered from [`ENDPOINTS`], which is also what the
/// test comparing the app with `openapi.yaml` reads.
pub struct Endpoint {
    pub method: Method,
    pub path: &'static str,
    route: fn() -> Route,
}

/// The API, as a table.
pub const ENDPOINTS: &[Endpoint] = &[
    Endpoint { method: Method::POST, path: "/v1/payments", route: || web::post().to(payments::create_payment) },
    Endpoint { method: Method::GET, path: "/v1/payments", route: || web::get().to(payments::list_payments) },
    Endpoint { method: Method::GET, path: "/v1/payments/{id}", route: || web::get().to(payments::get_payment) },
    Endpoint { method: Method::POST, path: "/v1/refunds", route: || web::post().to(refunds::create_refund) },
    Endpoint { method: Method::GET, path: "/v1/refunds", route: || web::get().to(refunds::list_refunds) },
    Endpoint { method: Method::GET, path: "/v1/refunds/{id}", route: || web::get().to(refunds::get_refund) },
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

/// What the metrics listener serves: never the API's address, since the metrics show every
/// tenant's volumes to whoever reaches them.
pub const METRICS_ENDPOINTS: &[Endpoint] =
    &[Endpoint { method: Method::GET, path: "/metrics", route: || web::get().to(health::metrics) }];

/// The API: every endpoint of [`ENDPOINTS`].
pub fn configure(cfg: &mut web::ServiceConfig) {
    extract::extractor_configs(cfg);
    register(cfg, ENDPOINTS);
}

/// The metrics listener: `GET /metrics` alone.
pub fn configure_metrics(cfg: &mut web::ServiceConfig) {
    register(cfg, METRICS_ENDPOINTS);
}

/// Registers `endpoints`, one resource per path (so a known path with an unknown method is a 405,
/// not a 404), and answers everything else with a problem too.
fn register(cfg: &mut web::ServiceConfig, endpoints: &'static [Endpoint]) {
    let mut paths: Vec<&str> = endpoints.iter().map(|endpoint| endpoint.path).collect();
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
    cfg.default_service(web::to(|| async { Err::<HttpResponse, _>(ApiError::RouteNotFound) }));
}

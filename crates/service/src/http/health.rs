//! Health, readiness, metrics and the API description.

use actix_web::{HttpResponse, web};
use diesel::IntoSql;
use diesel::sql_types::Integer;
use diesel_async::RunQueryDsl;
use serde_json::json;

use super::error::ApiError;
use crate::db;
use crate::state::AppState;

/// The OpenAPI document in the repository, served as it is.
pub const OPENAPI_YAML: &str = include_str!("../../../../openapi.yaml");

/// `GET /healthz`: the process is up (it does not touch the database).
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

/// `GET /readyz`: the database answers, so requests can be served; otherwise 503.
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let mut conn = db::connect(&state.db).await?;
    db::query(diesel::select(1.into_sql::<Integer>()).execute(&mut conn)).await?;
    Ok(HttpResponse::Ok().json(json!({ "status": "ready" })))
}

/// `GET /metrics`: what this process counted, and the system's state as the database has it, in
/// the Prometheus text format.
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let text = state.metrics.render(&state.db).await;
    HttpResponse::Ok().content_type(crate::metrics::CONTENT_TYPE).body(text)
}

/// `GET /openapi.yaml`
pub async fn openapi() -> HttpResponse {
    HttpResponse::Ok().content_type("application/yaml").body(OPENAPI_YAML)
}

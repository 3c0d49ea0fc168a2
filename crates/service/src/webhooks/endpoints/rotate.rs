//! `POST /v1/webhook_endpoints/{id}/rotate_secret`: a new secret for an endpoint, the old one
//! signing beside it until it expires (`expires_in` seconds, a day unless asked), so that a
//! receiver can take the new one up without refusing a delivery meanwhile. The layer's other
//! shape, as a create: the answer is known before the claim (the endpoint as it stands, and the
//! new secret; or, for an endpoint the account does not have, `404`), so the key is claimed, the
//! secret rotated and the key finished in one statement. A replay returns the same secret.

use diesel::QueryResult;
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::AstPass;
use diesel::sql_types::{BigInt, Text, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

use super::{EndpointView, WebhookEndpoint, endpoint_id, new_secret};
use crate::audit::AuditRecord;
use crate::db;
use crate::db::sql::{Parameters, no_parameter};
use crate::faults::Fault;
use crate::fields::{IntegralNumber, Omittable, ValidationError};
use crate::idempotency::{
    Canonical, DriveError, Endpoint, KnownAnswer, NewKey, PhaseWrites, Phases, Run, StoredResponse,
};
use crate::keyed::{Keyed, Resource};
use crate::problem::{Problem, ProblemType};
use crate::state::AppState;

/// How long the old secret signs unless asked: a day.
const DEFAULT_EXPIRES_IN: i64 = 86_400;
/// The longest it may: a week.
const MAX_EXPIRES_IN: i64 = 604_800;

/// The endpoint: a key used here is bound to it. Its keys are finished by their claim.
pub static ROTATE: Endpoint = Endpoint {
    method: "POST",
    path: "/v1/webhook_endpoints/{id}/rotate_secret",
    label: "webhook_secret_rotations",
    points: &[],
    made_in: "webhook_endpoints",
    at_gateway: false,
};

/// The body, as clients send it (it may be left out: `{}`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateBody {
    #[serde(default)]
    expires_in: Omittable<IntegralNumber>,
}

/// A validated rotation: the endpoint, and how long its old secret keeps signing. Its fields are
/// declared in alphabetical order (see `Fingerprint::of`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RotateRequest {
    pub endpoint: Uuid,
    pub expires_in: i64,
}

impl Canonical for RotateRequest {}

/// `POST /v1/webhook_endpoints/{id}/rotate_secret`, as the registry lists it.
pub struct RotateSecret;

impl Keyed for RotateSecret {
    const ENDPOINT: &'static Endpoint = &ROTATE;
    type On = WebhookEndpoint;
    type Body = RotateBody;
    type Request = RotateRequest;

    fn validate(body: RotateBody, on: Option<Uuid>) -> Result<RotateRequest, ValidationError> {
        let endpoint = on.ok_or_else(|| ValidationError::new("the path names no webhook endpoint"))?;
        let expires_in = body.expires_in.sent().map_or(DEFAULT_EXPIRES_IN, |IntegralNumber(seconds)| seconds);
        if !(0..=MAX_EXPIRES_IN).contains(&expires_in) {
            return Err(ValidationError::new(format!(
                "expires_in must be an integer from 0 to {MAX_EXPIRES_IN} (seconds the old secret keeps signing)."
            )));
        }
        Ok(RotateRequest { endpoint, expires_in })
    }

    fn phases(state: &AppState, request: RotateRequest, _: Option<Fault>) -> impl Phases + '_ {
        RotatePhases { state, request, secret: new_secret(), found: None }
    }

    /// A rotation makes nothing of its own: its story shows the endpoint it rotated.
    async fn made(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        key_id: Option<Uuid>,
        _: &str,
    ) -> QueryResult<Option<Resource>> {
        let Some(key_id) = key_id else { return Ok(None) };
        let endpoint = diesel::sql_query(
            "SELECT e.account_id, e.id, e.url, e.enabled_events, e.description, e.status, e.disabled_reason,
                    e.idempotency_key_id, e.created_at
             FROM webhook_endpoints e
             JOIN idempotency_keys k ON k.account_id = $1 AND k.id = $2 AND k.resource_id = e.id
             WHERE e.account_id = $1",
        )
        .bind::<SqlUuid, _>(account_id)
        .bind::<SqlUuid, _>(key_id)
        .get_result::<WebhookEndpoint>(conn)
        .await
        .optional()?;
        Ok(endpoint.map(|endpoint| Resource {
            key_id: Some(key_id),
            resources: vec![("webhook_endpoint", endpoint.id)],
            shown: ("webhook_endpoint", json!(EndpointView::from(&endpoint))),
            created_at: endpoint.created_at,
        }))
    }
}

/// A rotation's one phase, and the answer it knows before it runs.
struct RotatePhases<'a> {
    state: &'a AppState,
    request: RotateRequest,
    secret: String,
    /// The endpoint as the account has it now, read before the claim; none if it has no such one.
    found: Option<WebhookEndpoint>,
}

impl Phases for RotatePhases<'_> {
    type Started = Rotated;

    /// The endpoint's new secret, the old one kept until it expires: written only if the endpoint
    /// is there (the requirement), which the claim holds before it finishes the key.
    fn first_phase<'p>(&'p mut self, new: &'p NewKey<'p>) -> Option<impl PhaseWrites + 'p> {
        let audit = AuditRecord {
            account_id: new.account_id,
            action: "webhook_endpoint.secret_rotated",
            resource_type: "webhook_endpoint",
            resource_id: self.request.endpoint,
            actor: new.actor,
            data: json!({ "expires_in": self.request.expires_in }),
            request_id: Some(new.request_id.as_str()),
        };
        self.found.is_some().then(|| Rotate { new, request: &self.request, secret: &self.secret, audit })
    }

    /// The endpoint as the account has it now, with its new secret; or `404` if it has no such
    /// endpoint (stored under the key, as a refund's missing payment is).
    async fn answer_with_claim(&mut self, new: &NewKey<'_>) -> Result<Option<KnownAnswer>, DriveError> {
        let mut conn = db::connect(&self.state.db).await?;
        self.found = db::query(WebhookEndpoint::find(&mut conn, new.account_id, self.request.endpoint)).await?;
        let answer = match &self.found {
            Some(endpoint) => {
                let view = EndpointView { secret: Some(&self.secret), ..EndpointView::from(endpoint) };
                let body = serde_json::to_vec(&view).expect("an endpoint serialises");
                KnownAnswer { response: StoredResponse { status: 200, body }, made: Some(endpoint.id) }
            }
            None => {
                let detail = "There is no webhook endpoint with this id in your account.";
                let problem = Problem::new(ProblemType::WebhookEndpointNotFound, detail)
                    .of_request(Some(new.request_id.as_str()));
                KnownAnswer {
                    response: StoredResponse { status: problem.status(), body: problem.to_bytes() },
                    made: None,
                }
            }
        };
        Ok(Some(answer))
    }

    fn started_with_claim(&mut self, _: Rotated) {}

    async fn advance(&mut self, run: &mut Run<'_>) -> Result<(), DriveError> {
        Err(DriveError::inconsistent(format!("a rotation's key at {}: its claim finishes it", run.recovery_point())))
    }

    async fn expired_answer(&mut self, new: &NewKey<'_>, made: Uuid) -> Result<StoredResponse, DriveError> {
        let detail = format!(
            "This Idempotency-Key rotated the secret of webhook endpoint {}, and its stored response has expired. \
             Nothing was rotated now.",
            endpoint_id(made)
        );
        let problem =
            Problem::new(ProblemType::IdempotencyKeyExpired, detail).of_request(Some(new.request_id.as_str()));
        Ok(StoredResponse { status: 410, body: problem.to_bytes() })
    }
}

/// What a rotation's phase returns: the endpoint's id.
#[derive(Debug, QueryableByName)]
pub struct Rotated {
    #[expect(dead_code, reason = "a phase returns a row; the answer is known already")]
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
}

/// The rotation and its audit record, after the claim's fence.
struct Rotate<'a> {
    new: &'a NewKey<'a>,
    request: &'a RotateRequest,
    secret: &'a str,
    audit: AuditRecord<'a>,
}

impl PhaseWrites for Rotate<'_> {
    fn sql(&self) -> &'static str {
        "rotated AS (
             UPDATE {webhook_endpoints}
             SET previous_secret = secret, previous_secret_expires_at = now() + {expires_in} * interval '1 second',
                 secret = {secret}, updated_at = now()
             WHERE account_id = {account} AND id = {endpoint} AND EXISTS (SELECT FROM fence)
             RETURNING id
         ), audited AS (
             INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                    {audit.data}, {audit.request_id}
             FROM rotated
         )
         SELECT id FROM rotated"
    }

    /// The endpoint is there, and locked until the statement commits: a delete under way is
    /// waited for (and then the endpoint is gone, and the key is not finished), never read past.
    fn requirement(&self) -> &'static str {
        " AND EXISTS (SELECT FROM {webhook_endpoints} WHERE account_id = {account} AND id = {endpoint} FOR NO KEY UPDATE)"
    }
}

impl Parameters for Rotate<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match name {
            "account" => out.push_bind_param::<SqlUuid, _>(&self.new.account_id),
            "endpoint" => out.push_bind_param::<SqlUuid, _>(&self.request.endpoint),
            "secret" => out.push_bind_param::<Text, _>(self.secret),
            "expires_in" => out.push_bind_param::<BigInt, _>(&self.request.expires_in),
            name if name.starts_with("audit.") => self.audit.walk_parameter(name, out),
            name => Err(no_parameter(name)),
        }
    }
}

//! `POST /v1/webhook_endpoints`: the layer's other shape. A request that calls no other system
//! knows its whole answer before it starts: the endpoint's id, its secret (from the operating
//! system's CSPRNG) and its time are made here, in the process. So the claim inserts the key
//! finished with that answer, and writes the endpoint after it, in one statement: one
//! transaction, in which the request is claimed, written and finished, or nothing is (Brandur's
//! atomic phase with no foreign state). A key that exists is answered as any: replayed, refused
//! for another body (`422`), or `410` once it expired.
//!
//! ```text
//!         claim + the endpoint written + finished
//!   (new) ───────────────────────────────────────► finished
//!                                                  response stored, with the secret
//! ```

use chrono::{SubsecRound, Utc};
use diesel::QueryResult;
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::AstPass;
use diesel::sql_types::{Array, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::AsyncPgConnection;
use serde_json::json;
use uuid::Uuid;

use super::request::{CreateEndpointBody, EndpointRequest, check_address};
use super::{EndpointView, WebhookEndpoint, endpoint_id, new_secret};
use crate::audit::AuditRecord;
use crate::db;
use crate::db::sql::{Parameters, no_parameter};
use crate::faults::Fault;
use crate::fields::ValidationError;
use crate::idempotency::{DriveError, Endpoint, KnownAnswer, NewKey, PhaseWrites, Phases, Run, StoredResponse};
use crate::keyed::{Keyed, Resource};
use crate::problem::{Problem, ProblemType};
use crate::state::AppState;

/// The endpoint: a key used here is bound to it. Its keys are finished by their claim, so none is
/// ever left for a worker, and what they make is held nowhere but here.
pub static ENDPOINT: Endpoint = Endpoint {
    method: "POST",
    path: "/v1/webhook_endpoints",
    label: "webhook_endpoints",
    points: &[],
    made_in: "webhook_endpoints",
    at_gateway: false,
};

/// `POST /v1/webhook_endpoints`, as the registry lists it.
pub struct Create;

impl Keyed for Create {
    const ENDPOINT: &'static Endpoint = &ENDPOINT;
    type On = ();
    type Body = CreateEndpointBody;
    type Request = EndpointRequest;

    fn validate(body: CreateEndpointBody, _: Option<Uuid>) -> Result<EndpointRequest, ValidationError> {
        body.validate()
    }

    fn admit(state: &AppState, request: &EndpointRequest) -> Result<(), ValidationError> {
        check_address(&state.settings.webhook_guard(), &request.url)
    }

    fn phases(state: &AppState, request: EndpointRequest, _: Option<Fault>) -> impl Phases + '_ {
        CreatePhases::new(state, request)
    }

    async fn made(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        key_id: Option<Uuid>,
        key: &str,
    ) -> QueryResult<Option<Resource>> {
        let endpoint = WebhookEndpoint::find_by_key(conn, account_id, key_id, key).await?;
        Ok(endpoint.map(|endpoint| Resource {
            key_id: Some(endpoint.idempotency_key_id),
            resources: vec![("webhook_endpoint", endpoint.id)],
            shown: ("webhook_endpoint", json!(EndpointView::from(&endpoint))),
            created_at: endpoint.created_at,
        }))
    }
}

/// A create's one phase, and the answer it knows before it runs.
struct CreatePhases<'a> {
    state: &'a AppState,
    request: EndpointRequest,
    /// The endpoint as it will be made: its id, secret and time decided here, once.
    made: WebhookEndpoint,
    secret: String,
}

impl<'a> CreatePhases<'a> {
    fn new(state: &'a AppState, request: EndpointRequest) -> Self {
        let secret = new_secret();
        let made = WebhookEndpoint {
            account_id: Uuid::nil(),
            id: Uuid::now_v7(),
            url: request.url.clone(),
            enabled_events: request.enabled_events.iter().cloned().map(Some).collect(),
            description: request.description.clone(),
            status: "enabled".to_owned(),
            disabled_reason: None,
            idempotency_key_id: Uuid::nil(),
            // As the database keeps it: to the microsecond.
            created_at: Utc::now().trunc_subsecs(6),
        };
        CreatePhases { state, request, made, secret }
    }
}

impl Phases for CreatePhases<'_> {
    type Started = Written;

    /// The endpoint, written after the key the claim inserts finished.
    fn first_phase<'p>(&'p mut self, new: &'p NewKey<'p>) -> Option<impl PhaseWrites + 'p> {
        let data = json!({ "url": self.request.url, "enabled_events": self.request.enabled_events });
        let audit = AuditRecord {
            account_id: new.account_id,
            action: "webhook_endpoint.created",
            resource_type: "webhook_endpoint",
            resource_id: self.made.id,
            actor: new.actor,
            data,
            request_id: Some(new.request_id.as_str()),
        };
        Some(WriteEndpoint { new, made: &self.made, secret: &self.secret, audit })
    }

    async fn answer_with_claim(&mut self, _: &NewKey<'_>) -> Result<Option<KnownAnswer>, DriveError> {
        let view = EndpointView { secret: Some(&self.secret), ..EndpointView::from(&self.made) };
        let body = serde_json::to_vec(&view).expect("an endpoint serialises");
        Ok(Some(KnownAnswer { response: StoredResponse { status: 201, body }, made: Some(self.made.id) }))
    }

    fn started_with_claim(&mut self, _: Written) {}

    async fn advance(&mut self, run: &mut Run<'_>) -> Result<(), DriveError> {
        Err(DriveError::inconsistent(format!(
            "a webhook endpoint's key at {}: its claim finishes it",
            run.recovery_point()
        )))
    }

    async fn expired_answer(&mut self, new: &NewKey<'_>, made: Uuid) -> Result<StoredResponse, DriveError> {
        let id = endpoint_id(made);
        let detail = format!(
            "This Idempotency-Key made webhook endpoint {id}, and its stored response has expired. Nothing was made \
             now; GET /v1/webhook_endpoints/{id} shows the endpoint (its secret is shown only once)."
        );
        let mut conn = db::connect(&self.state.db).await?;
        let endpoint = db::query(WebhookEndpoint::find(&mut conn, new.account_id, made)).await?;
        let problem =
            Problem::new(ProblemType::IdempotencyKeyExpired, detail).of_request(Some(new.request_id.as_str()));
        let body = match endpoint {
            Some(endpoint) => problem.with(json!({ "webhook_endpoint": EndpointView::from(&endpoint) })).to_bytes(),
            None => problem.to_bytes(),
        };
        Ok(StoredResponse { status: 410, body })
    }
}

/// What the create's phase returns: the endpoint's id.
#[derive(Debug, QueryableByName)]
pub struct Written {
    #[expect(dead_code, reason = "a phase returns a row; the answer is known already")]
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
}

/// The endpoint's row and its audit record, after the claim's fence (the key row it inserted).
struct WriteEndpoint<'a> {
    new: &'a NewKey<'a>,
    made: &'a WebhookEndpoint,
    secret: &'a str,
    audit: AuditRecord<'a>,
}

impl PhaseWrites for WriteEndpoint<'_> {
    fn sql(&self) -> &'static str {
        "made AS (
             INSERT INTO {webhook_endpoints} (account_id, id, url, enabled_events, description, secret,
                                              idempotency_key_id, idempotency_key, created_at)
             SELECT {account}, {id}, {url}, {enabled_events}, {description}, {secret}, fence.id, {key}, {created_at}
             FROM fence
             RETURNING id
         ), audited AS (
             INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                    {audit.data}, {audit.request_id}
             FROM made
         )
         SELECT id FROM made"
    }
}

impl Parameters for WriteEndpoint<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        match name {
            "account" => out.push_bind_param::<SqlUuid, _>(&self.new.account_id),
            "id" => out.push_bind_param::<SqlUuid, _>(&self.made.id),
            "url" => out.push_bind_param::<Text, _>(&self.made.url),
            "enabled_events" => out.push_bind_param::<Array<Nullable<Text>>, _>(&self.made.enabled_events),
            "description" => out.push_bind_param::<Nullable<Text>, _>(&self.made.description),
            "secret" => out.push_bind_param::<Text, _>(self.secret),
            "key" => out.push_bind_param::<Text, _>(self.new.key.as_str()),
            "created_at" => out.push_bind_param::<Timestamptz, _>(&self.made.created_at),
            name if name.starts_with("audit.") => self.audit.walk_parameter(name, out),
            name => Err(no_parameter(name)),
        }
    }
}

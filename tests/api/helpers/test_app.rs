//! `TestApp`: the application on a random port, against a database of its own, with helpers
//! named after the endpoints they call.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use payments_mock_gateway::{Controls, FaultPlan, MockGateway, Webhook, new_webhook_secret};
use payments_service::config::{Settings, WorkerSettings};
use payments_service::db::delegate::Routing;
use payments_service::db::schema::{audit_records, events, idempotency_keys, payments as payments_table};
use payments_service::gateway::GatewayClient;
use payments_service::gateway::signature::WebhookSecret;
use payments_service::startup::{Application, MetricsServer};
use payments_service::state::AppState;
use payments_service::workers::{Worker, Workers};
use reqwest::Response;
use serde_json::{Value, json};
use uuid::Uuid;

use super::cluster::TestDatabase;
use super::gateway::GatewayControl;

/// A valid payment body.
pub fn payment_body() -> Value {
    json!({ "amount": 1000, "currency": "usd", "source": "tok_visa", "description": "Order #42" })
}

/// A key nobody else uses.
pub fn new_key() -> String {
    format!("key-{}", Uuid::new_v4())
}

pub struct TestAppBuilder {
    settings: Settings,
    workers: WorkerSettings,
    gateway_url: Option<String>,
    database_url: Option<String>,
    gateway_events: bool,
}

impl TestAppBuilder {
    /// Use this gateway (wiremock, a gateway process) instead of an in-process mock.
    pub fn gateway_url(mut self, url: impl Into<String>) -> Self {
        self.gateway_url = Some(url.into());
        self
    }

    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.settings.lock_timeout = timeout;
        self
    }

    pub fn key_retention(mut self, retention: Duration) -> Self {
        self.settings.key_retention = retention;
        self
    }

    pub fn authorization_ttl(mut self, ttl: Duration) -> Self {
        self.settings.authorization_ttl = ttl;
        self
    }

    pub fn gateway_timeout(mut self, timeout: Duration) -> Self {
        self.settings.gateway_timeout = timeout;
        self
    }

    /// Adjusts the settings of the workers that [`TestApp::workers`] builds.
    /// The internal networks its webhooks may reach (by default `127.0.0.1` and `::1` alone).
    pub fn webhook_networks(mut self, networks: payments_service::webhooks::network::AllowedNetworks) -> Self {
        self.settings.webhook_networks = networks;
        self
    }

    pub fn workers(mut self, adjust: impl FnOnce(&mut WorkerSettings)) -> Self {
        adjust(&mut self.workers);
        self
    }

    /// Accept gateway events signed with any of these secrets.
    pub fn webhook_secrets(mut self, secrets: &[&str]) -> Self {
        self.settings.gateway_webhook_secrets =
            secrets.iter().map(|secret| payments_service::gateway::signature::WebhookSecret::new(*secret)).collect();
        self
    }

    /// Has the in-process mock gateway send its events to this app's own `POST /webhooks/gateway`,
    /// as `serve` has its own: signed under the app's webhook secrets, or under one made for it
    /// if none is set. Off by default, so that no other test's audit trail, row counts or
    /// completer timing depend on when an event happens to come.
    pub fn gateway_events(mut self) -> Self {
        self.gateway_events = true;
        self
    }

    pub fn fault_injection(mut self) -> Self {
        self.settings.fault_injection = true;
        self
    }

    /// Reach the database through this URL (a proxy in front of it) instead of directly.
    pub fn database_url(mut self, url: String) -> Self {
        self.database_url = Some(url);
        self
    }

    pub async fn spawn(self) -> TestApp {
        let database = TestDatabase::create().await;
        self.spawn_on(database).await
    }

    pub async fn spawn_on(self, database: TestDatabase) -> TestApp {
        let mut conn = AsyncPgConnection::establish(&database.url).await.expect("connecting to the test database");
        let (account, api_key) =
            payments_service::accounts::create(&mut conn, "test").await.expect("creating an account");
        self.start(database, account.id, api_key).await
    }

    /// Another app on `first`'s database, for its account and (unless told otherwise) through its
    /// gateway, with settings of its own: another process of the same deployment. `first` owns
    /// the database: it goes when `first` does.
    pub async fn spawn_beside(mut self, first: &TestApp) -> TestApp {
        self.gateway_url.get_or_insert_with(|| first.gateway_url.clone());
        self.start(first.database.alias(), first.account_id, first.api_key.clone()).await
    }

    async fn start(mut self, database: TestDatabase, account_id: Uuid, api_key: String) -> TestApp {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mock = match &self.gateway_url {
            Some(_) => None,
            None => Some(self.start_mock(&listener)),
        };
        let gateway_url = self.gateway_url.clone().unwrap_or_else(|| mock.as_ref().unwrap().url());
        let database_url = self.database_url.as_deref().unwrap_or(&database.url);
        let state = Arc::new(AppState::new(
            payments_service::db::pool(database_url, 10),
            Routing::new(database_url, 10),
            GatewayClient::new(&gateway_url.parse().unwrap(), self.settings.gateway_timeout).unwrap(),
            self.settings,
        ));
        let app = Application::build(state.clone(), listener, 2).unwrap();
        let (address, server) = (format!("http://{}", app.addr()), app.handle());
        tokio::spawn(app.run_until_stopped());
        let metrics = MetricsServer::start(state.clone(), TcpListener::bind("127.0.0.1:0").unwrap()).unwrap();
        let (metrics_address, metrics_server) = (format!("http://{}", metrics.addr()), metrics.handle());
        TestApp {
            address,
            metrics_address,
            api_key,
            account_id,
            http: reqwest::Client::new(),
            gateway: GatewayControl::new(&gateway_url),
            gateway_url,
            state,
            worker_settings: self.workers,
            server,
            metrics_server,
            mock,
            database,
        }
    }
}

impl TestAppBuilder {
    /// The in-process mock gateway, sending its events to the app that will listen on `api` if
    /// asked to (adding a secret made for it to the app's settings if they have none).
    fn start_mock(&mut self, api: &TcpListener) -> MockGateway {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        if !self.gateway_events {
            return MockGateway::start(listener, FaultPlan::none(), Controls::Served).unwrap();
        }
        let secrets = &mut self.settings.gateway_webhook_secrets;
        if secrets.is_empty() {
            secrets.push(WebhookSecret::new(new_webhook_secret()));
        }
        let url = format!("http://{}/webhooks/gateway", api.local_addr().unwrap()).parse().unwrap();
        let webhook = Webhook::new(url, secrets.clone());
        MockGateway::start_with_events(listener, FaultPlan::none(), Controls::Served, webhook).unwrap()
    }
}

/// A running application. Fields drop in order: the server and the gateway before the database.
pub struct TestApp {
    /// The API's base URL.
    pub address: String,
    /// The metrics listener's base URL (never the API's: see `startup::MetricsServer`).
    pub metrics_address: String,
    pub api_key: String,
    pub account_id: Uuid,
    pub http: reqwest::Client,
    /// Control of the in-process mock gateway (or whatever gateway the builder was given).
    pub gateway: GatewayControl,
    gateway_url: String,
    state: Arc<AppState>,
    worker_settings: WorkerSettings,
    server: ServerHandle,
    metrics_server: ServerHandle,
    mock: Option<MockGateway>,
    /// Must be the last field: dropping it drops the database.
    pub database: TestDatabase,
}

impl TestApp {
    pub fn builder() -> TestAppBuilder {
        TestAppBuilder {
            // Loopback's first address alone, so that a test shows a refused address with another
            // loopback one (`127.0.0.2`), and never reaches out of the machine.
            settings: Settings { webhook_networks: test_networks(), ..Settings::default() },
            workers: WorkerSettings::default(),
            gateway_url: None,
            database_url: None,
            gateway_events: false,
        }
    }

    /// An app with default settings and an in-process mock gateway.
    pub async fn spawn() -> TestApp {
        TestApp::builder().spawn().await
    }

    /// `POST /v1/payments` with a JSON body.
    pub async fn post_payment(&self, key: &str, body: &Value) -> Response {
        self.post_payment_with(key, body.to_string(), &[]).await
    }

    /// `POST /v1/payments` with a raw body and extra headers.
    pub async fn post_payment_with(&self, key: &str, body: String, headers: &[(&str, &str)]) -> Response {
        let mut all = vec![("Idempotency-Key", key), ("Content-Type", "application/json")];
        all.extend_from_slice(headers);
        self.post_payment_raw(Some(&self.api_key), &all, body).await
    }

    /// `POST /v1/payments` exactly as given: any API key (or none), any headers, any body.
    pub async fn post_payment_raw(&self, api_key: Option<&str>, headers: &[(&str, &str)], body: String) -> Response {
        let mut request = self.http.post(format!("{}/v1/payments", self.address)).body(body);
        if let Some(api_key) = api_key {
            request = request.bearer_auth(api_key);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send().await.expect("sending POST /v1/payments")
    }

    /// `POST /webhooks/gateway` with these exact bytes and this `Gateway-Signature`, if any.
    pub async fn post_event(&self, body: &[u8], signature: Option<&str>) -> Response {
        let mut request = self.http.post(format!("{}/webhooks/gateway", self.address)).body(body.to_vec());
        request = request.header("Content-Type", "application/json");
        if let Some(signature) = signature {
            request = request.header("Gateway-Signature", signature);
        }
        request.send().await.expect("sending POST /webhooks/gateway")
    }

    /// `POST /v1/refunds` with a JSON body.
    pub async fn post_refund(&self, key: &str, body: &Value) -> Response {
        self.post_refund_with(key, body, &[]).await
    }

    /// `POST /v1/refunds` with a JSON body and extra headers.
    pub async fn post_refund_with(&self, key: &str, body: &Value, headers: &[(&str, &str)]) -> Response {
        let mut request = self.http.post(format!("{}/v1/refunds", self.address)).bearer_auth(&self.api_key).json(body);
        request = request.header("Idempotency-Key", key);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send().await.expect("sending POST /v1/refunds")
    }

    /// A payment made with `source`, for `amount`: its JSON, once it succeeded.
    pub async fn paid(&self, amount: i64, source: &str) -> Value {
        let body = json!({ "amount": amount, "currency": "usd", "source": source });
        let response = self.post_payment(&new_key(), &body).await;
        assert_eq!(response.status(), reqwest::StatusCode::CREATED);
        response.json().await.unwrap()
    }

    /// Adds the app's per-account request counts to the database now (`serve` does every few seconds).
    pub async fn flush_request_counts(&self) {
        self.state.metrics.flush_tally(&self.state.db).await.unwrap();
    }

    /// `GET /metrics` on the metrics listener.
    pub async fn metrics(&self) -> super::Scrape {
        super::Scrape::of(&format!("{}/metrics", self.metrics_address)).await
    }

    /// `GET /v1/idempotency_keys?key=KEY` with the account's API key.
    pub async fn key_story(&self, key: &str) -> Response {
        self.key_story_as(&self.api_key, key).await
    }

    /// `GET /v1/idempotency_keys?key=KEY` with another API key.
    pub async fn key_story_as(&self, api_key: &str, key: &str) -> Response {
        let url = reqwest::Url::parse_with_params(&format!("{}/v1/idempotency_keys", self.address), [("key", key)]);
        self.http.get(url.unwrap()).bearer_auth(api_key).send().await.expect("GET /v1/idempotency_keys")
    }

    /// `GET <path>` with the account's key.
    pub async fn get(&self, path: &str) -> Response {
        self.get_as(&self.api_key, path).await
    }

    /// `GET <path>` with another API key.
    pub async fn get_as(&self, api_key: &str, path: &str) -> Response {
        self.http.get(format!("{}{path}", self.address)).bearer_auth(api_key).send().await.expect("GET")
    }

    /// Creates another account in the same database, and returns its API key.
    pub async fn create_account(&self, name: &str) -> String {
        payments_service::accounts::create(&mut self.db().await, name).await.unwrap().1
    }

    /// The gateway this app charges through.
    pub fn gateway_url(&self) -> &str {
        &self.gateway_url
    }

    /// Whether the app keeps the answer of this account's `key` in memory for replays.
    pub fn remembers_the_answer_of(&self, key: &str) -> bool {
        self.state.replays.holds(self.account_id, key)
    }

    /// Waits until the retention of `key` (made short by the test) ends, and the reaper has deleted
    /// its row: a late retry with it is then answered `410`.
    pub async fn wait_until_reaped(&self, key: &str) {
        // The answer kept in memory for replays goes first, then the row.
        super::wait_until(Duration::from_secs(10), "the retention ends", || async {
            !self.remembers_the_answer_of(key)
        })
        .await;
        super::wait_until(Duration::from_secs(10), "the key is reaped", || async {
            self.workers().reaper.run_once().await.unwrap();
            self.key_row(key).await.is_none()
        })
        .await;
    }

    /// The identity the app records for its gateway with each payment.
    pub async fn gateway_id(&self) -> std::sync::Arc<str> {
        self.state.gateway.id().await.expect("the gateway's identity")
    }

    /// The workers, on this app's database and settings but charging through another gateway.
    pub fn workers_at_gateway(&self, gateway_url: &str) -> Workers {
        self.workers_of(self.state_at_gateway(gateway_url))
    }

    /// What another process on this app's database and settings would hold, at another gateway
    /// (its metrics too: `Scrape::of_state`).
    pub fn state_at_gateway(&self, gateway_url: &str) -> Arc<AppState> {
        Arc::new(AppState::new(
            payments_service::db::pool(&self.database.url, 4),
            Routing::new(&self.database.url, 4),
            GatewayClient::new(&gateway_url.parse().unwrap(), self.state.settings.gateway_timeout).unwrap(),
            self.state.settings.clone(),
        ))
    }

    /// The workers of `state`, with this app's worker settings.
    pub fn workers_of(&self, state: Arc<AppState>) -> Workers {
        Workers::new(state, &self.worker_settings).unwrap()
    }

    /// The workers, on this app's state (database, gateway, settings): tests drain them with
    /// `run_once` instead of waiting for their loops.
    pub fn workers(&self) -> Workers {
        Workers::new(self.state.clone(), &self.worker_settings).unwrap()
    }

    /// A connection straight to the test database, for assertions.
    /// How the app's claims and phases reach their rows, for a test that runs them itself.
    pub fn routing(&self) -> &Routing {
        &self.state.routing
    }

    pub async fn db(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.database.url).await.expect("connecting to the test database")
    }

    /// The service's own connections that are idle now, each checked out once: what the
    /// service's statements were prepared on.
    pub async fn idle_service_connections(&self) -> Vec<payments_service::db::PooledConnection> {
        let idle = self.state.db.state().idle_connections;
        let mut connections = Vec::new();
        for _ in 0..idle {
            connections.push(payments_service::db::connect(&self.state.db).await.expect("an idle connection"));
        }
        connections
    }

    /// The key row of `key` in this app's account, if any.
    pub async fn key_row(&self, key: &str) -> Option<KeyRow> {
        idempotency_keys::table
            .filter(idempotency_keys::account_id.eq(self.account_id))
            .filter(idempotency_keys::idempotency_key.eq(key))
            .select(KeyRow::as_select())
            .get_result(&mut self.db().await)
            .await
            .optional()
            .unwrap()
    }

    /// Whether `condition`, an SQL expression, holds in the test database now (by its clock).
    pub async fn database_says(&self, condition: &str) -> bool {
        TestApp::database_says_on(&mut self.db().await, condition).await
    }

    /// Whether `condition`, an SQL expression, holds now in the database of `conn`.
    pub async fn database_says_on(conn: &mut AsyncPgConnection, condition: &str) -> bool {
        #[derive(QueryableByName)]
        struct Holds {
            #[diesel(sql_type = diesel::sql_types::Bool)]
            holds: bool,
        }
        let sql = format!("SELECT coalesce(({condition}), false) AS holds");
        let answer = diesel::sql_query(&sql).get_result::<Holds>(conn).await;
        answer.unwrap_or_else(|e| panic!("{sql}: {e}")).holds
    }

    /// Whether this account's `key` has expired, by the database's clock: its row is past the
    /// expiry recorded when it finished.
    pub async fn key_has_expired(&self, key: &str) -> bool {
        self.database_says(&format!(
            "SELECT expires_at <= now() FROM idempotency_keys WHERE account_id = '{}' AND idempotency_key = '{key}'",
            self.account_id
        ))
        .await
    }

    /// How many rows each table holds: (keys, payments, audit records, events).
    pub async fn row_counts(&self) -> (i64, i64, i64, i64) {
        let mut conn = self.db().await;
        let keys = idempotency_keys::table.count().get_result(&mut conn).await.unwrap();
        let payments = payments_table::table.count().get_result(&mut conn).await.unwrap();
        let audits = audit_records::table.count().get_result(&mut conn).await.unwrap();
        let events = events::table.count().get_result(&mut conn).await.unwrap();
        (keys, payments, audits, events)
    }

    /// Every audit record, oldest first: (action, actor).
    pub async fn audit_trail(&self) -> Vec<(String, String)> {
        audit_records::table
            .order(audit_records::id)
            .select((audit_records::action, audit_records::actor))
            .load(&mut self.db().await)
            .await
            .unwrap()
    }

    /// Runs SQL against the test database (to seed states the API cannot reach directly).
    pub async fn run_sql(&self, sql: &str) {
        diesel::sql_query(sql).execute(&mut self.db().await).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        // Stop accepting; in-flight tasks die with the test's runtime.
        drop(self.server.stop(false));
        drop(self.metrics_server.stop(false));
        drop(self.mock.take());
    }
}

/// A key row, as the tests look at it.
#[derive(Debug, Queryable, Selectable)]
#[diesel(table_name = idempotency_keys)]
pub struct KeyRow {
    pub id: Uuid,
    pub recovery_point: String,
    pub locked_until: Option<chrono::DateTime<chrono::Utc>>,
    pub lock_token: Option<Uuid>,
    pub response_status: Option<i16>,
    pub response_body: Option<Vec<u8>>,
    pub request_params: Value,
}

/// The networks a test's webhooks may reach: `127.0.0.1` and `::1`, and no other address.
pub fn test_networks() -> payments_service::webhooks::network::AllowedNetworks {
    payments_service::webhooks::network::AllowedNetworks::parse("127.0.0.1/32,::1/128").unwrap()
}

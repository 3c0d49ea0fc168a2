//! Seeding states that only a crash leaves behind: a key at a recovery point, with or without
//! its payment, locked or not. Built with the service's own canonicalisation, so a retry of the
//! same body matches the seeded fingerprint.

use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use payments_service::db::schema::{idempotency_keys, payments as payments_table};
use payments_service::idempotency::{Claim, Fingerprint, IdempotencyKey, KeyLock, NewKey, claim};
use payments_service::payments::CreatePaymentBody;
use payments_service::request_id::RequestId;
use serde_json::Value;
use uuid::Uuid;

use super::TestApp;

/// The writes of a phase run by a test: an audit record after the fenced key row (`audited`,
/// returning its id), the further CTEs `more` (each after a comma), and the key row's id as its
/// result, selected `FROM fence` and the further `from` items (such as `, x`).
pub fn audited_phase(more: &str, from: &str) -> TestWrites {
    let sql = format!(
        "audited AS (INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data) \
         SELECT account_id, 'payment.charge_recorded', 'payment', id, 'api', jsonb_build_object() FROM fence \
         RETURNING id){more} SELECT fence.id FROM fence{from}"
    );
    // A phase's SQL is a literal of the program's; a test's is made once, and kept.
    TestWrites { sql: Box::leak(sql.into_boxed_str()) }
}

/// A phase's writes and result as SQL text with no parameters, for
/// [`payments_service::idempotency::atomic_phase`].
pub struct TestWrites {
    sql: &'static str,
}

impl payments_service::idempotency::PhaseWrites for TestWrites {
    fn sql(&self) -> &'static str {
        self.sql
    }
}

impl payments_service::db::sql::Parameters for TestWrites {
    fn walk_parameter<'b>(
        &'b self,
        name: &str,
        _: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
    ) -> QueryResult<()> {
        Err(payments_service::db::sql::no_parameter(name))
    }
}

/// The result of [`audited_phase`].
#[derive(Debug, diesel::QueryableByName)]
pub struct KeyRowId {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub id: Uuid,
}

/// How the seeded key's lock looks.
#[derive(Debug, Clone, Copy)]
pub enum Lock {
    Free,
    /// Held, with a minute of its lease left.
    Live,
    /// Held, its lease over a second ago.
    Expired,
    /// Held by an owner whose lease ends in this many seconds.
    EndsIn(i64),
}

/// A new key and the payment request it is used with, for tests that drive the key store
/// themselves.
pub struct KeyRequest {
    account_id: Uuid,
    pub key: IdempotencyKey,
    params: Value,
    pub request_id: RequestId,
}

impl KeyRequest {
    pub fn new_key(&self) -> NewKey<'_> {
        NewKey {
            account_id: self.account_id,
            key: &self.key,
            endpoint: &payments_service::payments::ENDPOINT,
            fingerprint: Fingerprint::of(&self.params),
            params: &self.params,
            request_id: &self.request_id,
            actor: payments_service::audit::Actor::Api,
        }
    }

    /// Claims the key (which must be free to take) with a 60-second lock timeout, alone (no
    /// first phase with it).
    pub async fn claim(&self, app: &TestApp) -> KeyLock {
        let lease = std::time::Duration::from_secs(60);
        match claim::<TestWrites, KeyRowId>(&mut app.db().await, app.routing(), &self.new_key(), lease, None, None)
            .await
            .unwrap()
        {
            Claim::Acquired { lock, .. } => lock,
            other => panic!("the key was not acquired: {other:?}"),
        }
    }
}

impl TestApp {
    /// A fresh key for the usual payment body.
    pub fn key_request(&self) -> KeyRequest {
        let key = IdempotencyKey::parse(super::new_key().as_bytes()).unwrap();
        let request = serde_json::from_value::<CreatePaymentBody>(super::payment_body()).unwrap().validate().unwrap();
        KeyRequest { account_id: self.account_id, key, params: request.to_params(), request_id: RequestId::generate() }
    }

    /// Inserts a key row for `body` at `recovery_point`, and returns its id.
    pub async fn seed_key(&self, key: &str, body: &Value, recovery_point: &str, lock: Lock) -> Uuid {
        let request = serde_json::from_value::<CreatePaymentBody>(body.clone()).unwrap().validate().unwrap();
        let params = request.to_params();
        let id = Uuid::now_v7();
        let locked_until = match lock {
            Lock::Free => None,
            Lock::Live => Some(chrono::Utc::now() + chrono::Duration::seconds(60)),
            Lock::Expired => Some(chrono::Utc::now() - chrono::Duration::seconds(1)),
            Lock::EndsIn(seconds) => Some(chrono::Utc::now() + chrono::Duration::seconds(seconds)),
        };
        diesel::insert_into(idempotency_keys::table)
            .values((
                idempotency_keys::id.eq(id),
                idempotency_keys::account_id.eq(self.account_id),
                idempotency_keys::idempotency_key.eq(key),
                idempotency_keys::request_method.eq("POST"),
                idempotency_keys::request_path.eq("/v1/payments"),
                idempotency_keys::request_fingerprint.eq(Fingerprint::of(&params).as_bytes().to_vec()),
                idempotency_keys::request_params.eq(&params),
                idempotency_keys::recovery_point.eq(recovery_point),
                idempotency_keys::locked_until.eq(locked_until),
                idempotency_keys::lock_token.eq(locked_until.map(|_| Uuid::new_v4())),
            ))
            .execute(&mut self.db().await)
            .await
            .unwrap();
        id
    }

    /// Inserts the payment a key row made, in `status`, at this app's gateway, and returns its id.
    pub async fn seed_payment(&self, key_id: Uuid, key: &str, status: &str, charge_id: Option<&str>) -> Uuid {
        let gateway = self.gateway_id().await;
        let id = Uuid::now_v7();
        let failure = (status == "failed").then_some("card_declined");
        diesel::insert_into(payments_table::table)
            .values((
                payments_table::id.eq(id),
                payments_table::account_id.eq(self.account_id),
                payments_table::idempotency_key_id.eq(key_id),
                payments_table::idempotency_key.eq(key),
                payments_table::amount.eq(1000_i64),
                payments_table::currency.eq("usd"),
                payments_table::description.eq("Order #42"),
                payments_table::status.eq(status),
                payments_table::gateway_charge_id.eq(charge_id),
                payments_table::failure_code.eq(failure),
                payments_table::failure_message.eq(failure.map(|_| "Your card was declined.")),
                payments_table::gateway.eq(&*gateway),
            ))
            .execute(&mut self.db().await)
            .await
            .unwrap();
        // A payment that ended, as the phase that finished its key would have left it: what the
        // key made, for a retry after the key is reaped.
        if status != "pending" {
            let made = diesel::sql_query(
                "INSERT INTO key_resources (account_id, idempotency_key, request_method, request_path, resource_id)
                 VALUES ($1, $2, 'POST', '/v1/payments', $3) ON CONFLICT DO NOTHING",
            )
            .bind::<diesel::sql_types::Uuid, _>(self.account_id)
            .bind::<diesel::sql_types::Text, _>(key)
            .bind::<diesel::sql_types::Uuid, _>(id);
            made.execute(&mut self.db().await).await.unwrap();
        }
        id
    }

    /// The downstream key the service sends the gateway for one of this account's key rows.
    pub fn downstream_key(&self, key_id: Uuid) -> String {
        payments_service::gateway::downstream_key(self.account_id, key_id)
    }
}

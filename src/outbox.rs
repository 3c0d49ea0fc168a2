//! The transactional outbox: an event is staged in the same transaction that finishes the request
//! it announces, so it exists if and only if that request finished. A worker delivers it later.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::json;
use uuid::Uuid;

use crate::db::Prepare;
use crate::db::schema::staged_jobs;

/// An event about to be staged. Its id is fixed here, once, so every delivery attempt carries
/// the same id and receivers can de-duplicate.
#[derive(Debug, Insertable)]
#[diesel(table_name = staged_jobs)]
pub struct StagedEvent {
    account_id: Uuid,
    job_name: &'static str,
    job_args: serde_json::Value,
}

impl StagedEvent {
    /// An event of type `name` (such as `payment.succeeded`) about `object`.
    pub fn new(account_id: Uuid, name: &'static str, object: impl serde::Serialize) -> StagedEvent {
        let job_args = json!({ "id": Uuid::now_v7(), "type": name, "data": { "object": object } });
        StagedEvent { account_id, job_name: name, job_args }
    }

    /// Stages the event (inside the caller's transaction).
    pub async fn stage(&self, conn: &mut AsyncPgConnection) -> QueryResult<()> {
        diesel::insert_into(staged_jobs::table).values(self).prepared().execute(conn).await.map(drop)
    }
}

//! A `started` that may refuse: the first phase of an endpoint that decides against rows already
//! there whether it can do anything (a refund: is there money left? a capture: is the
//! authorization still open?), and in the same statement makes what it decided on, or says why
//! not. What differs between such endpoints is their statement and what they make; how the
//! phase's row is read, where it comes from (the claim or a run of its own) and how a refusal
//! becomes the key's answer are here, once.
//!
//! The phase's row carries either what it made (now, or found from an earlier run), in the
//! endpoint's own columns, or a `refusal` code and the `refusal_amount` that code names (what is
//! left to refund, what the authorization allows), the other side's columns NULL.

use diesel::deserialize;
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::AstPass;
use diesel::row::NamedRow;
use diesel::sql_types::{BigInt, Nullable, Text};
use uuid::Uuid;

use super::IdempotencyKey;
use super::driver::{DriveError, Run};
use super::phase::PhaseWrites;
use super::store::{NewKey, StoredResponse};
use crate::audit::{Actor, AuditRecord};
use crate::db::sql::Parameters;
use crate::request_id::RequestId;

/// Why an endpoint's `started` made nothing, read back from the code its statement returned.
pub trait Refusal: Sized + Send {
    /// The refusal `code` names, with the amount the row carries for it (`refusal_amount`). None:
    /// a code the endpoint's statement never returns.
    fn from_code(code: &str, amount: Option<i64>) -> Option<Self>;
}

/// An endpoint whose `started` may refuse (see the module's doc).
pub trait RefusableStart {
    /// What `started` made, read from the endpoint's own columns of the row.
    type Made: QueryableByName<Pg> + Send + 'static;
    type Refusal: Refusal;

    /// What `started` writes, for the key `by` names. It stays at `started`, and run again it
    /// finds what it made before instead of making it again.
    fn start_writes<'w>(&'w self, by: Starter<'w>) -> impl PhaseWrites + 'w;
}

/// Who starts a key: the key's account and the key, the actor driving it and its request (named
/// in the audit records `started` writes).
#[derive(Clone, Copy)]
pub struct Starter<'a> {
    pub account_id: Uuid,
    pub key: &'a IdempotencyKey,
    pub actor: Actor,
    pub request_id: &'a RequestId,
}

impl<'a> Starter<'a> {
    /// The request `new`, whose `started` the claim runs.
    pub fn of_new(new: &'a NewKey<'a>) -> Starter<'a> {
        Starter { account_id: new.account_id, key: new.key, actor: new.actor, request_id: new.request_id }
    }
}

/// What `started` left: what it made, or why it made nothing.
pub enum Started<M, R> {
    Made(M),
    Refused(R),
}

/// The row of a `started` that may refuse, as its statement returned it (see the module's doc):
/// the first phase's result ([`super::Phases::Started`]) of such an endpoint.
#[derive(Debug)]
pub struct StartedRow<M> {
    /// What was made, if the row carries it; else why the columns did not read as it.
    made: Result<M, String>,
    refusal: Option<String>,
    refusal_amount: Option<i64>,
}

impl<M: QueryableByName<Pg>> QueryableByName<Pg> for StartedRow<M> {
    fn build<'a>(row: &impl NamedRow<'a, Pg>) -> deserialize::Result<Self> {
        let refusal = NamedRow::get::<Nullable<Text>, Option<String>>(row, "refusal")?;
        let refusal_amount = NamedRow::get::<Nullable<BigInt>, Option<i64>>(row, "refusal_amount")?;
        // A refusal's row has NULL where what is made would be: it is not read as that.
        let made = match refusal {
            Some(_) => Err("a refusal".to_owned()),
            None => M::build(row).map_err(|error| error.to_string()),
        };
        Ok(StartedRow { made, refusal, refusal_amount })
    }
}

impl<M> StartedRow<M> {
    /// What the row says: made, or refused. A row that says neither is a bug.
    fn read<R: Refusal>(self) -> Result<Started<M, R>, DriveError> {
        match self.refusal {
            Some(code) => R::from_code(&code, self.refusal_amount)
                .map(Started::Refused)
                .ok_or_else(|| DriveError::inconsistent(format!("`started` refused for {code:?}"))),
            None => self
                .made
                .map(Started::Made)
                .map_err(|error| DriveError::inconsistent(format!("`started` made nothing that reads: {error}"))),
        }
    }
}

impl Run<'_> {
    /// `started` of `phases`, an endpoint's that may refuse: what it returned with the claim
    /// (`with_claim`), if it ran there, or else what it returns now, run on its own and staying at
    /// `started`, as on a resumed key.
    pub async fn start<P: RefusableStart>(
        &mut self,
        phases: &P,
        with_claim: Option<StartedRow<P::Made>>,
    ) -> Result<Started<P::Made, P::Refusal>, DriveError> {
        let row = match with_claim {
            Some(row) => row,
            None => {
                let (key, request_id) = (self.key().clone(), self.request_id().clone());
                let by = Starter {
                    account_id: self.lock().account_id,
                    key: &key,
                    actor: self.actor(),
                    request_id: &request_id,
                };
                self.phase(super::Transition::Stay, phases.start_writes(by)).await?
            }
        };
        row.read()
    }

    /// Stores a refusal's `response` as the key's answer, by a finishing phase that writes an
    /// audit record about the key (`action`, with `data`) and nothing else: nothing was made, and
    /// nothing asked of another system. `attention` is what the finish does to a flag on the key
    /// (see [`PhaseWrites::attention_on_finish`]).
    pub async fn refuse(
        &mut self,
        response: StoredResponse,
        action: &str,
        data: serde_json::Value,
        attention: &'static str,
    ) -> Result<(), DriveError> {
        let request_id = self.request_id().clone();
        let audit = AuditRecord {
            account_id: self.lock().account_id,
            action,
            resource_type: "idempotency_key",
            resource_id: self.lock().key_id,
            actor: self.actor(),
            data,
            request_id: Some(request_id.as_str()),
        };
        let _: Refused = self.finish(response, None, RefusalWrites { audit, attention }).await?;
        Ok(())
    }
}

/// The finishing phase of a refusal: the response stored by the fence, with an audit record.
struct RefusalWrites<'a> {
    audit: AuditRecord<'a>,
    attention: &'static str,
}

/// The result of [`RefusalWrites`]: a phase returns a row, and this one's is the key row's id.
#[derive(QueryableByName)]
struct Refused {
    #[expect(dead_code, reason = "a phase returns a row; nobody needs this one's")]
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    id: Uuid,
}

impl PhaseWrites for RefusalWrites<'_> {
    fn sql(&self) -> &'static str {
        "audited AS (
             INSERT INTO {audit_records} (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT {audit.account}, {audit.action}, {audit.resource_type}, {audit.resource_id}, {audit.actor},
                    {audit.data}, {audit.request_id}
             FROM fence
         )
         SELECT id FROM fence"
    }

    fn attention_on_finish(&self) -> &'static str {
        self.attention
    }
}

impl Parameters for RefusalWrites<'_> {
    fn walk_parameter<'b>(&'b self, name: &str, out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.audit.walk_parameter(name, out)
    }
}

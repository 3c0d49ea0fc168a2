//! The gateway's answers as it sends them, and what each means for a payment or a refund: the one
//! place where a status code and a body become a typed outcome.
//!
//! Every answer to a request that makes something (a charge, a refund) is read by the same rules
//! ([`read`]) before what it made is: a 2xx made it, a 402 is a decline, another 4xx about the
//! request is a definitive refusal, and everything else (a 5xx, a 408/409/425/429, an idempotency
//! conflict, a body we cannot read or record) leaves the outcome unknown. Look-ups by key are read
//! by one rule too ([`look_up`]).

use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::authorization::{Authorization, Changed};
use super::charge::{Charge, ChargeRequest, ChargeState, GatewayError};
use super::refund::{Refund, RefundRequest, RefundStatus};

/// What is recorded of a gateway's answer, and how long each may be (the columns' limits).
/// Longer text is cut and control characters dropped, so that a definitive answer is always
/// recorded; an id is never cut (it would name another charge or refund).
pub(super) const MAX_ID_CHARS: usize = 255;
const MAX_CODE_CHARS: usize = 100;
const MAX_MESSAGE_CHARS: usize = 500;

/// A charge as the gateway describes it, in a charge's answer or a look-up.
#[derive(Debug, Deserialize)]
struct ChargeObject {
    id: String,
    /// What the charge was made with: a look-up's charge is ours only if all three are.
    idempotency_key: Option<String>,
    amount: Option<i64>,
    currency: Option<String>,
    /// `succeeded`, `requires_capture` (authorized only), `canceled` (an authorization released),
    /// `failed` (declined) or `pending`. Absent in the shortest answers to a charge, where the 200
    /// itself says it was made as asked.
    status: Option<String>,
    /// Whether it took the money: `false` for an authorization not captured yet (which Stripe's
    /// charges show as `succeeded`).
    captured: Option<bool>,
    failure_code: Option<String>,
    failure_message: Option<String>,
    /// What it captured (of an authorization: what its capture took).
    amount_captured: Option<i64>,
}

impl ChargeObject {
    /// Where the charge stands, as an authorization, by what it says of itself. A success that
    /// says not how much it captured took `charged`, the amount asked for, where that is known.
    fn authorization(&self, charged: Option<i64>) -> Result<Authorization, GatewayError> {
        match (self.status.as_deref(), self.captured) {
            (Some("requires_capture"), _) | (Some("succeeded"), Some(false)) => Ok(Authorization::Open),
            (Some("succeeded"), _) => match self.amount_captured.or(self.amount).or(charged) {
                Some(amount) => Ok(Authorization::Captured { amount }),
                None => Err(GatewayError::Unavailable("a captured charge that says not how much".into())),
            },
            (Some("canceled"), _) => Ok(Authorization::Canceled),
            (Some("failed"), _) => Ok(Authorization::Failed),
            (status, _) => Err(not_settled("charge", status.unwrap_or("without a status"))),
        }
    }

    /// What the charge means for the payment that asked for `request` (none for a listed
    /// charge, which always says how it went): where it stands (authorized, captured, cancelled),
    /// a decline, or (pending, unknown, or an id it cannot store) an outcome not known yet. It is
    /// read for what it says, never for what was asked: `canceled` is an end, not "not settled".
    /// Only the shortest answer to a charge, a 200 with no status, says "made as asked"; asked to
    /// authorize only, it must still say whether it captured.
    fn outcome(self, request: Option<&ChargeRequest<'_>>) -> Result<Charge, GatewayError> {
        let stands = match (self.status.as_deref(), request) {
            (None, Some(request)) => match (self.captured, request.capture) {
                (Some(false), _) => Authorization::Open,
                (Some(true), _) | (None, true) => {
                    Authorization::Captured { amount: self.amount_captured.unwrap_or(request.amount) }
                }
                (None, false) => {
                    let unclear = "an authorization's answer that says neither how it went nor whether it captured";
                    return Err(GatewayError::Unavailable(unclear.into()));
                }
            },
            _ => self.authorization(request.map(|request| request.amount))?,
        };
        let state = match stands {
            Authorization::Open => ChargeState::Authorized,
            Authorization::Captured { amount } => ChargeState::Captured { amount },
            Authorization::Canceled => ChargeState::Canceled,
            Authorization::Failed => {
                let detail =
                    ErrorDetail { code: self.failure_code, message: self.failure_message, ..Default::default() };
                return Err(detail.decline());
            }
        };
        Ok(Charge { id: recordable_id(self.id, "charge")?, state })
    }

    /// Whether a listed charge is the one we asked for: made under our key, for our amount and
    /// currency.
    fn is_for(&self, idempotency_key: &str, request: &ChargeRequest<'_>) -> bool {
        self.idempotency_key.as_deref() == Some(idempotency_key)
            && self.amount == Some(request.amount)
            && self.currency.as_deref().is_some_and(|c| c.eq_ignore_ascii_case(request.currency))
    }
}

/// A refund as the gateway describes it, in a refund's answer, a look-up or a read by id.
#[derive(Debug, Deserialize)]
struct RefundObject {
    id: String,
    /// What the refund was made with: a look-up's refund is ours only if all three are.
    idempotency_key: Option<String>,
    charge: Option<String>,
    amount: Option<i64>,
    /// `pending`, `succeeded` or `failed` (Stripe also has `requires_action` and `canceled`).
    /// Unlike a charge's, never implied: a refund's 200 does not say it succeeded.
    status: Option<String>,
    failure_reason: Option<String>,
}

impl RefundObject {
    /// Where the refund stands, or (an unknown status, or an id it cannot store) not known yet.
    fn outcome(self) -> Result<Refund, GatewayError> {
        let id = recordable_id(self.id, "refund")?;
        let failed = |default: &str| RefundStatus::Failed {
            code: clean(self.failure_reason.as_deref(), MAX_CODE_CHARS).unwrap_or_else(|| default.into()),
        };
        let status = match self.status.as_deref() {
            Some("succeeded") => RefundStatus::Succeeded,
            Some("pending" | "requires_action") => RefundStatus::Pending,
            Some("failed") => failed("unknown"),
            Some("canceled") => failed("canceled"),
            Some(status) => return Err(not_settled("refund", status)),
            None => return Err(GatewayError::Unavailable("a refund that does not say how it went".into())),
        };
        Ok(Refund { id, status })
    }

    /// Whether a listed refund is the one we asked for: made under our key, of our charge and
    /// amount.
    fn is_for(&self, idempotency_key: &str, request: &RefundRequest<'_>) -> bool {
        self.idempotency_key.as_deref() == Some(idempotency_key)
            && self.charge.as_deref() == Some(request.charge)
            && self.amount == Some(request.amount)
    }
}

/// Whether an id from the gateway fits the column it is recorded in.
pub(super) fn recordable(id: &str) -> bool {
    (1..=MAX_ID_CHARS).contains(&id.chars().count()) && !id.chars().any(char::is_control)
}

/// The id of a charge or refund the gateway made, if it can be recorded. If not, money may have
/// moved: indeterminate, never a failure (a key that keeps getting this ends on the operator's
/// list).
fn recordable_id(id: String, what: &str) -> Result<String, GatewayError> {
    if recordable(&id) {
        return Ok(id);
    }
    Err(GatewayError::Unavailable(format!("a {what} id that cannot be recorded ({} characters)", id.chars().count())))
}

/// A status that says the outcome is not known yet (pending, or one we do not know).
fn not_settled(what: &str, status: &str) -> GatewayError {
    let status = clean(Some(status), MAX_CODE_CHARS).unwrap_or_default();
    GatewayError::Unavailable(format!("the {what} is {status}"))
}

/// The gateway's error body: `{"error": {"type", "code", "param", "message"}}`.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error: ErrorDetail,
}

#[derive(Debug, Default, Deserialize)]
struct ErrorDetail {
    #[serde(rename = "type")]
    kind: Option<String>,
    code: Option<String>,
    /// The request parameter the error is about.
    param: Option<String>,
    message: Option<String>,
}

impl ErrorDetail {
    fn of(body: &[u8]) -> ErrorDetail {
        serde_json::from_slice::<ErrorBody>(body).unwrap_or_default().error
    }

    fn decline(&self) -> GatewayError {
        let code = clean(self.code.as_deref(), MAX_CODE_CHARS).unwrap_or_else(|| "card_declined".into());
        GatewayError::Declined { code, message: self.message(|| "The card was declined.".into()) }
    }

    fn rejection(&self, status: u16) -> GatewayError {
        GatewayError::Rejected { status, message: self.message(|| format!("the gateway answered {status}")) }
    }

    fn message(&self, default: impl FnOnce() -> String) -> String {
        clean(self.message.as_deref(), MAX_MESSAGE_CHARS).unwrap_or_else(default)
    }
}

/// Text from the gateway, without control characters, cut to `max_chars`; none if nothing is left.
fn clean(text: Option<&str>, max_chars: usize) -> Option<String> {
    let cleaned: String = text?.chars().filter(|c| !c.is_control()).take(max_chars).collect();
    Some(cleaned.trim().to_owned()).filter(|text| !text.is_empty())
}

/// What an answer to a request that makes something says, by the rules every such answer shares.
enum Reading<'b> {
    /// A 2xx: the body is what was made.
    Made(&'b [u8]),
    /// A 402: the card was declined.
    Declined(ErrorDetail),
    /// Another 4xx, about the request itself: definitive, nothing was made.
    Refused { status: u16, error: ErrorDetail },
}

/// Reads an answer to a request that makes something; the error means the outcome is not known.
fn read(status: u16, body: &[u8]) -> Result<Reading<'_>, GatewayError> {
    match status {
        200..=299 => Ok(Reading::Made(body)),
        402 => Ok(Reading::Declined(ErrorDetail::of(body))),
        // Still processing this key, timed out, or throttling us: the outcome is not known.
        408 | 409 | 425 | 429 => Err(GatewayError::Unavailable(format!("the gateway answered {status}"))),
        400..=499 => {
            let error = ErrorDetail::of(body);
            // The gateway holds another request under this key: an earlier attempt of ours may
            // have made it. Never "nothing was made".
            if error.kind.as_deref() == Some("idempotency_error") {
                let message = error.message(|| format!("the gateway answered {status}"));
                let conflict = format!("the gateway reports an idempotency conflict for this key: {message}");
                return Err(GatewayError::Unavailable(conflict));
            }
            Ok(Reading::Refused { status, error })
        }
        _ => Err(GatewayError::Unavailable(format!("the gateway answered {status}"))),
    }
}

fn parse<T: DeserializeOwned>(status: u16, body: &[u8], what: &str) -> Result<T, GatewayError> {
    serde_json::from_slice(body)
        .map_err(|e| GatewayError::Unavailable(format!("unreadable {what} in a {status} answer: {e}")))
}

/// What the answer to a charge request means.
pub(super) fn charge_outcome(status: u16, body: &[u8], request: &ChargeRequest<'_>) -> Result<Charge, GatewayError> {
    match read(status, body)? {
        Reading::Made(body) => parse::<ChargeObject>(status, body, "charge")?.outcome(Some(request)),
        Reading::Declined(error) => Err(error.decline()),
        Reading::Refused { status, error } => match (status, error.code.as_deref(), error.param.as_deref()) {
            // Stripe's answer to a token it does not know: the client's mistake.
            (400, Some("resource_missing"), Some("source")) => {
                Err(GatewayError::UnknownSource { message: error.message(|| format!("the gateway answered {status}")) })
            }
            _ => Err(error.rejection(status)),
        },
    }
}

/// What the answer to a capture or a cancel of an authorized charge means: what it did, that the
/// charge was captured or cancelled before, or (a refusal: more than was authorized, an
/// authorization expired, a failed or unknown charge) nothing done, definitively.
pub(super) fn change_outcome(status: u16, body: &[u8]) -> Result<Changed, GatewayError> {
    match read(status, body)? {
        Reading::Made(body) => parse::<ChargeObject>(status, body, "charge")?.authorization(None).map(Changed::Now),
        Reading::Refused { error, .. }
            if matches!(error.code.as_deref(), Some("charge_already_captured" | "charge_canceled")) =>
        {
            Ok(Changed::Before)
        }
        Reading::Declined(error) | Reading::Refused { error, .. } => Err(error.rejection(status)),
    }
}

/// What the answer to a read of charge `id` (`GET /v1/charges/{id}`) means: where it stands, or
/// none if the gateway says it has no such charge. The error: no readable answer.
pub(super) fn charge_read(status: u16, body: &[u8], id: &str) -> Result<Option<Authorization>, GatewayError> {
    match status {
        200..=299 => {
            let charge = parse::<ChargeObject>(status, body, "charge")?;
            if charge.id != id {
                return Err(GatewayError::Unavailable("the gateway answered with another charge".into()));
            }
            charge.authorization(None).map(Some)
        }
        404 if ErrorDetail::of(body).code.as_deref() == Some("resource_missing") => Ok(None),
        _ => Err(GatewayError::Unavailable(format!("the charge's read answered {status}"))),
    }
}

/// What the answer to a refund request means: the refund as it stands, a refusal (more than the
/// charge has left, nothing left, an unknown charge: nothing was refunded), or not known.
pub(super) fn refund_outcome(status: u16, body: &[u8]) -> Result<Refund, GatewayError> {
    match read(status, body)? {
        Reading::Made(body) => parse::<RefundObject>(status, body, "refund")?.outcome(),
        Reading::Declined(error) | Reading::Refused { error, .. } => Err(error.rejection(status)),
    }
}

/// What the answer to a read of refund `id` (`GET /v1/refunds/{id}`) means: the refund as it
/// stands, or none if the gateway says it has no such refund (a `404` `resource_missing`; a `404`
/// that does not say so, as a proxy's, is no answer). The error: no readable answer.
pub(super) fn refund_read(status: u16, body: &[u8], id: &str) -> Result<Option<Refund>, GatewayError> {
    match status {
        200..=299 => {
            let refund = parse::<RefundObject>(status, body, "refund")?;
            if refund.id != id {
                return Err(GatewayError::Unavailable("the gateway answered with another refund".into()));
            }
            refund.outcome().map(Some)
        }
        404 if ErrorDetail::of(body).code.as_deref() == Some("resource_missing") => Ok(None),
        _ => Err(GatewayError::Unavailable(format!("the refund's read answered {status}"))),
    }
}

/// An object a look-up by key lists (a charge, a refund), and what it means.
trait Listed: DeserializeOwned {
    type Outcome;
    /// What it is called in messages.
    const NAME: &str;
    /// Whether it says how it went (a listed object must).
    fn has_status(&self) -> bool;
    fn outcome(self) -> Result<Self::Outcome, GatewayError>;
    /// Which outcome stands when several objects of ours are listed (the key was used again
    /// after the gateway forgot it): the lowest. `0`: money moved; `1`: not known yet; `2`:
    /// nothing moved.
    fn rank(outcome: &Result<Self::Outcome, GatewayError>) -> u8;
}

impl Listed for ChargeObject {
    type Outcome = Charge;
    const NAME: &str = "charge";

    fn has_status(&self) -> bool {
        self.status.is_some()
    }

    fn outcome(self) -> Result<Charge, GatewayError> {
        ChargeObject::outcome(self, None)
    }

    // A cancelled authorization holds nothing, as a decline: another charge of ours that holds
    // money, or may, stands before it.
    fn rank(outcome: &Result<Charge, GatewayError>) -> u8 {
        match outcome {
            Ok(Charge { state: ChargeState::Canceled, .. }) | Err(GatewayError::Declined { .. }) => 2,
            Ok(_) => 0,
            Err(_) => 1,
        }
    }
}

impl Listed for RefundObject {
    type Outcome = Refund;
    const NAME: &str = "refund";

    fn has_status(&self) -> bool {
        self.status.is_some()
    }

    fn outcome(self) -> Result<Refund, GatewayError> {
        RefundObject::outcome(self)
    }

    fn rank(outcome: &Result<Refund, GatewayError>) -> u8 {
        match outcome {
            Ok(Refund { status: RefundStatus::Succeeded, .. }) => 0,
            Ok(Refund { status: RefundStatus::Failed { .. }, .. }) => 2,
            Ok(Refund { status: RefundStatus::Pending, .. }) | Err(_) => 1,
        }
    }
}

/// The answer to a look-up by key: `{"object": "list", "data": [...]}`.
#[derive(Debug, Deserialize)]
struct List<T> {
    data: Vec<T>,
}

/// What the answer to a look-up by key means: the outcome of what was made under the key for
/// our request (see [`Listed::rank`] for which stands among several), or none.
///
/// Only an object that `is_ours` (our key, and our request's figures) and says how it went
/// counts. An empty list is the one answer that means "nothing was made": anything else that is
/// not a list, or a list with objects but none of them ours, is unreadable (the error).
fn look_up<T: Listed>(
    status: u16,
    body: &[u8],
    is_ours: impl Fn(&T) -> bool,
) -> Result<Option<Result<T::Outcome, GatewayError>>, GatewayError> {
    let what = T::NAME;
    if !(200..=299).contains(&status) {
        return Err(GatewayError::Unavailable(format!("the {what} look-up answered {status}")));
    }
    let list: List<T> = serde_json::from_slice(body)
        .map_err(|e| GatewayError::Unavailable(format!("unreadable {what} look-up: {e}")))?;
    let found = list.data.len();
    if found == 0 {
        return Ok(None);
    }
    let outcomes: Vec<_> = list
        .data
        .into_iter()
        .filter(is_ours)
        .map(|object| match object.has_status() {
            true => object.outcome(),
            false => Err(GatewayError::Unavailable(format!("a listed {what} that does not say how it went"))),
        })
        .collect();
    let moved = outcomes.iter().filter(|outcome| T::rank(outcome) == 0).count();
    if outcomes.len() != found || moved > 1 {
        tracing::error!(what, found, ours = outcomes.len(), moved, "the look-up by key found what it should not");
    }
    match outcomes.into_iter().min_by_key(T::rank) {
        Some(outcome) => Ok(Some(outcome)),
        None => Err(GatewayError::Unavailable(format!(
            "the look-up by key found {found} {what}(s), none made for our request under our key"
        ))),
    }
}

/// What a look-up of charges by key means for the charge made for `request` under
/// `idempotency_key`: where it stands, a decline, not known yet, or none. A charge that holds
/// money (captured or authorized) wins; then anything not known yet (a pending charge may still
/// succeed); a decline or a cancelled authorization only when no charge of ours holds money.
pub(super) fn charge_look_up(
    status: u16,
    body: &[u8],
    idempotency_key: &str,
    request: &ChargeRequest<'_>,
) -> Result<Option<Result<Charge, GatewayError>>, GatewayError> {
    look_up::<ChargeObject>(status, body, |charge| charge.is_for(idempotency_key, request))
}

/// What a look-up of refunds by key means for the refund made for `request` under
/// `idempotency_key`: where it stands, not known yet, or none. A success wins; then a pending
/// refund (or one not known); a failure only when every refund of ours failed.
pub(super) fn refund_look_up(
    status: u16,
    body: &[u8],
    idempotency_key: &str,
    request: &RefundRequest<'_>,
) -> Result<Option<Result<Refund, GatewayError>>, GatewayError> {
    look_up::<RefundObject>(status, body, |refund| refund.is_for(idempotency_key, request))
}

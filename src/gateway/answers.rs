//! The gateway's answers as it sends them, and what each means for a payment: the one place where
//! a status code and a body become a typed outcome.

use serde::Deserialize;

use super::charge::{Charge, ChargeRequest, GatewayError};

/// What a payment records of a gateway's answer, and how long each may be (the `payments`
/// columns' limits). Longer text is cut and control characters dropped, so that a definitive
/// answer is always recorded; a charge id is never cut (it would name another charge).
pub(super) const MAX_CHARGE_ID_CHARS: usize = 255;
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
    /// `succeeded`, `failed` (declined) or `pending`. Absent in the shortest answers to a charge,
    /// where the 200 itself says it succeeded.
    status: Option<String>,
    failure_code: Option<String>,
    failure_message: Option<String>,
}

impl ChargeObject {
    /// What the charge means for the payment: a success it can record, a decline, or (pending,
    /// unknown, or an id it cannot store) an outcome not known yet.
    fn outcome(self) -> Result<Charge, GatewayError> {
        if !recordable(&self.id) {
            // Money may have moved: indeterminate, never a failure. A key that keeps getting this
            // ends on the operator's list.
            return Err(GatewayError::Unavailable(format!(
                "a charge id the payment cannot record ({} characters)",
                self.id.chars().count()
            )));
        }
        match self.status.as_deref() {
            None | Some("succeeded") => Ok(Charge { id: self.id }),
            Some("failed") => {
                let detail =
                    ErrorDetail { code: self.failure_code, message: self.failure_message, ..Default::default() };
                Err(detail.decline())
            }
            Some(status) => Err(GatewayError::Unavailable(format!("the charge is {status}"))),
        }
    }

    /// Whether a listed charge is the one we asked for: made under our key, for our amount and
    /// currency.
    fn is_for(&self, idempotency_key: &str, request: &ChargeRequest<'_>) -> bool {
        self.idempotency_key.as_deref() == Some(idempotency_key)
            && self.amount == Some(request.amount)
            && self.currency.as_deref().is_some_and(|c| c.eq_ignore_ascii_case(request.currency))
    }
}

/// Whether an id from the gateway fits the column it is recorded in.
pub(super) fn recordable(id: &str) -> bool {
    (1..=MAX_CHARGE_ID_CHARS).contains(&id.chars().count()) && !id.chars().any(char::is_control)
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
    fn decline(&self) -> GatewayError {
        let code = clean(self.code.as_deref(), MAX_CODE_CHARS).unwrap_or_else(|| "card_declined".into());
        GatewayError::Declined { code, message: self.message(|| "The card was declined.".into()) }
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

/// What the answer to a charge request means.
pub(super) fn charge_outcome(status: u16, body: &[u8]) -> Result<Charge, GatewayError> {
    let error = || serde_json::from_slice::<ErrorBody>(body).unwrap_or_default().error;
    match status {
        200..=299 => serde_json::from_slice::<ChargeObject>(body)
            .map_err(|e| GatewayError::Unavailable(format!("unreadable charge in a {status} answer: {e}")))?
            .outcome(),
        402 => Err(error().decline()),
        // Still processing this key, timed out, or throttling us: the outcome is not known.
        408 | 409 | 425 | 429 => Err(GatewayError::Unavailable(format!("the gateway answered {status}"))),
        400..=499 => {
            let error = error();
            let message = error.message(|| format!("the gateway answered {status}"));
            match (status, error.kind.as_deref(), error.code.as_deref(), error.param.as_deref()) {
                // The gateway holds another request under this key: an earlier attempt of ours
                // may have charged. Never "nothing was charged".
                (_, Some("idempotency_error"), _, _) => Err(GatewayError::Unavailable(format!(
                    "the gateway reports an idempotency conflict for this key: {message}"
                ))),
                // Stripe's answer to a token it does not know: the client's mistake.
                (400, _, Some("resource_missing"), Some("source")) => Err(GatewayError::UnknownSource { message }),
                _ => Err(GatewayError::Rejected { status, message }),
            }
        }
        _ => Err(GatewayError::Unavailable(format!("the gateway answered {status}"))),
    }
}

/// The answer to a look-up by key: `{"object": "list", "data": [charge, ...]}`.
#[derive(Debug, Deserialize)]
struct ChargeList {
    data: Vec<ChargeObject>,
}

/// What the answer to a look-up by key means: the outcome of the charge made for `request` under
/// `idempotency_key` (a success, a decline, or not known yet), or none.
///
/// Only a charge that carries our key, amount and currency, and says how it went, is ours. A
/// success wins; then anything not known yet (a pending charge may still succeed); a decline only
/// when every charge of ours failed. An empty list is the one answer that means "nothing was
/// charged": anything else that is not a list, or a list with charges but none of them ours, is
/// unreadable (the error).
pub(super) fn look_up_outcome(
    status: u16,
    body: &[u8],
    idempotency_key: &str,
    request: &ChargeRequest<'_>,
) -> Result<Option<Result<Charge, GatewayError>>, GatewayError> {
    if !(200..=299).contains(&status) {
        return Err(GatewayError::Unavailable(format!("the charge look-up answered {status}")));
    }
    let list: ChargeList = serde_json::from_slice(body)
        .map_err(|e| GatewayError::Unavailable(format!("unreadable charge look-up: {e}")))?;
    let found = list.data.len();
    if found == 0 {
        return Ok(None);
    }
    let outcomes: Vec<_> = list
        .data
        .into_iter()
        .filter(|charge| charge.is_for(idempotency_key, request))
        .map(|charge| match charge.status {
            Some(_) => charge.outcome(),
            None => Err(GatewayError::Unavailable("a listed charge that does not say how it went".into())),
        })
        .collect();
    let succeeded = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
    if outcomes.len() != found || succeeded > 1 {
        tracing::error!(found, ours = outcomes.len(), succeeded, "the look-up by key found charges it should not");
    }
    let rank = |outcome: &Result<Charge, GatewayError>| match outcome {
        Ok(_) => 0,
        Err(GatewayError::Declined { .. }) => 2,
        Err(_) => 1,
    };
    match outcomes.into_iter().min_by_key(rank) {
        Some(outcome) => Ok(Some(outcome)),
        None => Err(GatewayError::Unavailable(format!(
            "the look-up by key found {found} charge(s), none with our key, amount and currency"
        ))),
    }
}

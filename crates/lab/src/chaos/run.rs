//! What each key's client asked for and saw: the record the load writes and the checks read.

use payments_client::{Answer, Attempt, Client, Finished, KeySeen, NewCancel, NewCapture, NewPayment, NewRefund};

/// What a key asked for.
#[derive(Debug, Clone)]
pub enum Request {
    Payment(NewPayment),
    Refund(NewRefund),
    Capture(NewCapture),
    Cancel(NewCancel),
}

/// One key's story, as its client saw it.
#[derive(Debug)]
pub struct KeyRun {
    pub key: String,
    pub request: Request,
    pub crash_point: Option<&'static str>,
    pub abandoned: bool,
    /// Every answer, in order (the final replay's included).
    pub answers: Vec<Answer>,
    /// The client stopped without a definitive answer (abandoned keys always do, unless their
    /// one try got one).
    pub gave_up: bool,
}

impl Request {
    /// Sends it through `client`, whichever endpoint it is for.
    pub async fn send(
        &self,
        client: &Client,
        key: &str,
        seen: KeySeen,
        first_attempt_headers: &[(&str, &str)],
        observe: impl FnMut(&Attempt),
    ) -> Finished {
        match self {
            Request::Payment(payment) => client.send_with(key, seen, payment, first_attempt_headers, observe).await,
            Request::Refund(refund) => client.send_with(key, seen, refund, first_attempt_headers, observe).await,
            Request::Capture(capture) => client.send_with(key, seen, capture, first_attempt_headers, observe).await,
            Request::Cancel(cancel) => client.send_with(key, seen, cancel, first_attempt_headers, observe).await,
        }
    }

    pub fn is_refund(&self) -> bool {
        matches!(self, Request::Refund(_))
    }

    /// A capture's or a cancel's: the payment it is of.
    pub fn changes(&self) -> Option<uuid::Uuid> {
        match self {
            Request::Capture(capture) => Some(capture.payment),
            Request::Cancel(cancel) => Some(cancel.payment),
            Request::Payment(_) | Request::Refund(_) => None,
        }
    }
}

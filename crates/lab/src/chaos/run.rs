//! What each key's client asked for and saw: the record the load writes and the checks read.

use payments_client::{Answer, Attempt, Client, Finished, KeySeen, NewPayment, NewRefund};

/// What a key asked for.
#[derive(Debug, Clone)]
pub enum Request {
    Payment(NewPayment),
    Refund(NewRefund),
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
        }
    }

    pub fn is_refund(&self) -> bool {
        matches!(self, Request::Refund(_))
    }
}

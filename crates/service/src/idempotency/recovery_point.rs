//! How far a request has got.

use crate::db::text_enum;

text_enum! {
    /// The last phase a request committed, stored on its key row. A request always resumes here.
    ///
    /// `started`: the key is claimed; its payment may exist (pending). Nothing is known about the
    /// gateway, so resuming calls it again with the same downstream key, which cannot charge twice.
    /// `charge_created`: the gateway's definitive answer is recorded on the payment.
    /// `refund_created`: the gateway's answer is recorded on the refund (which may still be
    /// pending there).
    /// `capture_created`, `cancel_created`: the gateway's answer to a capture or a cancel is
    /// recorded on the change and the payment.
    /// `finished`: the response is stored; every later request with the key replays it.
    pub enum RecoveryPoint {
        Started = "started",
        ChargeCreated = "charge_created",
        RefundCreated = "refund_created",
        CaptureCreated = "capture_created",
        CancelCreated = "cancel_created",
        Finished = "finished",
    }
}

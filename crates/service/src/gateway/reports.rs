//! What a key's gateway reported that a person must look at: an event that disagrees with what
//! the key recorded, or one that verified but could not be read. The key is flagged with one of
//! these codes first in its `attention_reason`, and stays flagged when its request finishes
//! ([`KEEPS_REPORTS`]): unlike a worker's giving up, which a finish makes moot, what the gateway
//! said about the money is for a person.

/// An event said otherwise than what the key recorded.
pub const DISAGREEMENT: &str = "gateway_disagreement";

/// An event about the key verified but could not be read.
pub const UNREADABLE_EVENT: &str = "gateway_unreadable_event";

/// How every code above begins, in SQL's `LIKE`.
pub const REPORTED_LIKE: &str = "gateway\\_%";

/// What a finishing phase does to a flag on its key (`SET` items): keeps a gateway's report, and
/// clears a worker's giving up. (Its `LIKE` is [`REPORTED_LIKE`].)
pub const KEEPS_REPORTS: &str = "needs_attention_at = CASE WHEN attention_reason LIKE 'gateway\\_%' THEN needs_attention_at END, \
                                 attention_reason = CASE WHEN attention_reason LIKE 'gateway\\_%' THEN attention_reason END";

/// The `attention_reason` of a key its gateway reported about (`code`, one of the codes above):
/// the code first, then what the gateway said.
pub fn reason(code: &str, detail: &str) -> String {
    debug_assert!(code.starts_with("gateway_"));
    format!("{code}: {detail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finish_keeps_exactly_the_codes_the_gateway_reports_with() {
        assert_eq!(KEEPS_REPORTS.matches(&format!("LIKE '{REPORTED_LIKE}'")).count(), 2);
        for code in [DISAGREEMENT, UNREADABLE_EVENT] {
            assert!(code.starts_with("gateway_"), "{code}");
        }
    }
}

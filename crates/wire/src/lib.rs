#![doc = include_str!("../README.md")]

pub mod problem;
pub mod retry_after;
pub mod signature;
pub mod standard_webhooks;

/// The header in which a gateway that knows who it is names itself on every answer (the mock
/// does). The service's gateway client holds the one rule that makes an answer's identity.
pub const IDENTITY_HEADER: &str = "Gateway-Account";

/// Unix seconds as a signer writes them: decimal digits, with no sign and no leading zero (but `0`
/// itself). A signature covers the timestamp as written, so `+N` or `0N` would be verified against
/// `N`'s signature: another text than the one the header carries. No sign at all, so no time
/// before 1970 either; and digits too many for an `i64` do not parse.
fn canonical_seconds(value: &str) -> Option<i64> {
    let canonical = !value.is_empty()
        && value.bytes().all(|byte| byte.is_ascii_digit())
        && (value == "0" || !value.starts_with('0'));
    canonical.then(|| value.parse::<i64>().ok()).flatten()
}

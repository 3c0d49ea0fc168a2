#![doc = include_str!("../README.md")]

pub mod problem;
pub mod signature;
pub mod standard_webhooks;

/// The header in which a gateway that knows who it is names itself on every answer (the mock
/// does). The service's gateway client holds the one rule that makes an answer's identity.
pub const IDENTITY_HEADER: &str = "Gateway-Account";

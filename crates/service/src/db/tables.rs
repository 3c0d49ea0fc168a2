//! How the schema's tables spread over Citus: each table is in one of two lists, and
//! [`super::distribute`] refuses a table in neither. The statements that run under a key mark
//! each table of [`BY_ACCOUNT`] where they name it (see [`super::sql`]).

/// The tables copied to every node: `accounts`, which every table's foreign key names, and the
/// events nobody could read, which may belong to no account.
pub const REFERENCE_TABLES: [&str; 2] = ["accounts", "unreadable_gateway_events"];

/// The tables distributed by `account_id`, colocated: every other table of the schema. A statement
/// that runs under a key marks each of them where it names it (`{payments}`, see
/// [`super::sql`]), so that on Citus it runs against the account's shard of each.
pub const BY_ACCOUNT: [&str; 14] = [
    "idempotency_keys",
    "key_resources",
    "payments",
    "refunds",
    "payment_changes",
    "open_authorizations",
    "audit_records",
    "events",
    "staged_jobs",
    "gateway_events",
    "key_request_counts",
    "webhook_endpoints",
    "webhook_deliveries",
    "webhook_attempts",
];

/// The table every table of [`BY_ACCOUNT`] is colocated with: its shard of an account is on the
/// node where all of that account's rows are.
pub const COLOCATED_WITH: &str = "idempotency_keys";

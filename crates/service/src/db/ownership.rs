//! Who may write to a distributed database. On Citus every statement that writes under a key goes
//! through [`delegate::FUNCTION`], which takes each shard's metadata lock as Citus does for its own
//! writes (and gives a shard its identity defaults, an `ALTER TABLE`): Citus lets only a table's
//! owner do either. A role with every grant a service needs on one PostgreSQL (`SELECT`, `INSERT`,
//! `UPDATE`, `DELETE`) starts, and then fails every write (`must be owner of table ...`). So
//! `serve` and `worker` ask first, and refuse to start as such a role, saying how to fix it.

use diesel::QueryableByName;
use diesel::sql_types::{Bool, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::delegate;

/// A distributed table the connection's role cannot act as the owner of.
#[derive(Debug, QueryableByName)]
struct NotOwned {
    #[diesel(sql_type = Text)]
    table_name: String,
    #[diesel(sql_type = Text)]
    owner: String,
    #[diesel(sql_type = Text)]
    role: String,
}

/// Why a role cannot write to a distributed database, and what to do about it.
#[derive(Debug, thiserror::Error)]
#[error(
    "the database role {role} does not own the distributed tables {tables} (their owner is {owners}): on Citus \
     every write goes through {function}, which takes each shard's metadata lock as Citus's own writes do, and \
     Citus lets only a table's owner take it, so every request that writes would fail. Run the service as the \
     role that owns the tables (the one `payments migrate --distribute` ran as), or make {role} a member of it \
     (`GRANT {owner} TO {role}`); grants of SELECT, INSERT, UPDATE and DELETE alone are not enough (see \
     docs/operating.md, \"The database role\")"
)]
pub struct NotOwner {
    role: String,
    tables: String,
    owners: String,
    /// The first owner, for the `GRANT` to name.
    owner: String,
    function: &'static str,
}

/// The refusal, if the connection's role cannot write where statements are delegated; none on a
/// database that does not delegate them (one PostgreSQL, or Citus before `--distribute`).
pub async fn not_owner(conn: &mut AsyncPgConnection) -> diesel::QueryResult<Option<NotOwner>> {
    #[derive(QueryableByName)]
    struct Delegates {
        #[diesel(sql_type = Bool)]
        delegates: bool,
    }
    let delegates: Delegates = diesel::sql_query("SELECT to_regprocedure($1) IS NOT NULL AS delegates")
        .bind::<Text, _>(delegate::FUNCTION)
        .get_result(conn)
        .await?;
    if !delegates.delegates {
        return Ok(None);
    }
    // A member of the owner acts as the owner, as PostgreSQL's own ownership checks allow.
    let not_owned: Vec<NotOwned> = diesel::sql_query(
        "SELECT c.relname::text AS table_name, pg_get_userbyid(c.relowner)::text AS owner, current_user::text AS role
         FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid
         WHERE p.partmethod = 'h' AND NOT pg_has_role(current_user, c.relowner, 'USAGE')
         ORDER BY c.relname",
    )
    .load(conn)
    .await?;
    // (Indexed, as diesel's `first` would shadow the slice's.)
    if not_owned.is_empty() {
        return Ok(None);
    }
    let first = &not_owned[0];
    let mut owners: Vec<&str> = not_owned.iter().map(|table| table.owner.as_str()).collect();
    owners.sort();
    owners.dedup();
    Ok(Some(NotOwner {
        role: first.role.clone(),
        tables: not_owned.iter().map(|table| table.table_name.as_str()).collect::<Vec<_>>().join(", "),
        owners: owners.join(", "),
        owner: first.owner.clone(),
        function: delegate::FUNCTION,
    }))
}

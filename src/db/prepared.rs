//! Keeping our INSERTs and UPDATEs prepared, once per connection.

use diesel::QueryResult;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};

/// A statement that diesel may keep prepared on its connection.
///
/// diesel declines to cache any INSERT or UPDATE, because in general their SQL can vary with the
/// values (a `DEFAULT` per absent field, a column list per changeset), and then every execution
/// pays an extra round trip to prepare. Ours have one SQL text per call site (insertables bind
/// `NULL` rather than `DEFAULT`). The cache is keyed by the SQL text and bind types, never by a
/// type id we choose, so marking a statement safe cannot make the cache run the wrong one; and
/// the number of distinct texts is the number of call sites, so the cache stays bounded.
#[derive(Debug, Clone, Copy)]
pub struct Prepared<Q>(Q);

/// `.prepared()` on any statement.
pub trait Prepare: Sized {
    fn prepared(self) -> Prepared<Self> {
        Prepared(self)
    }
}

impl<Q: QueryFragment<Pg>> Prepare for Q {}

impl<Q: QueryFragment<Pg>> QueryFragment<Pg> for Prepared<Q> {
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.0.walk_ast(pass)
    }

    fn is_safe_to_cache_prepared(&self, _: &Pg) -> QueryResult<bool> {
        Ok(true)
    }
}

/// No static id: the statement cache keys it by its SQL text.
impl<Q> QueryId for Prepared<Q> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q: Query> Query for Prepared<Q> {
    type SqlType = Q::SqlType;
}

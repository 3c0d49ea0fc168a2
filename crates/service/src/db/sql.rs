//! Statements written as SQL, whole, with named placeholders: `{name}` in the text is the
//! parameter `name`, which the statement's [`Parameters`] binds where it stands. A reader sees a
//! statement as it runs, in one literal, and its values beside it; the text is the same on every
//! run, so each statement is prepared once per connection.
//!
//! The same braces mark each table distributed by account (see [`BY_ACCOUNT`]) where a statement
//! names it: `{payments}`, or `{payments p}` with an alias. The walker knows a table from a
//! parameter by that list, and writes a marked table schema-qualified and always with its alias:
//! `{payments}` as `public.payments AS payments`, `{payments p}` as `public.payments AS p`. That
//! text is plain SQL, which one PostgreSQL runs as it is; on Citus, [`super::delegate`]'s
//! `run_on_shard` finds each marked table by that exact text (`public.<table> AS `) and puts the
//! account's shard in its place, the alias kept, so that `payments.amount` or `p.amount` still
//! names it. The rule for a statement that runs under a key: every distributed table it names is
//! marked, and nothing else is written `public.<table> AS `. A test on one PostgreSQL holds every
//! such statement to it (`tests/api/routing.rs`).

use diesel::pg::Pg;
use diesel::query_builder::AstPass;
use diesel::result::{Error, QueryResult};

use super::tables::BY_ACCOUNT;

/// What a statement's placeholders stand for.
pub trait Parameters {
    /// Binds the parameter `name` (or writes a fixed piece of SQL for it, such as a list of
    /// columns); an error for a name it does not know.
    fn walk_parameter<'b>(&'b self, name: &str, out: AstPass<'_, 'b, Pg>) -> QueryResult<()>;
}

/// Walks `sql`, with each `{name}` in it bound by `parameters` and each `{table}` or
/// `{table alias}` of a table in [`BY_ACCOUNT`] written marked (see the module's documentation).
/// The text has no other braces.
pub fn walk_sql<'b>(
    sql: &'static str,
    parameters: &'b impl Parameters,
    mut out: AstPass<'_, 'b, Pg>,
) -> QueryResult<()> {
    let mut rest = sql;
    while let Some((before, after)) = rest.split_once('{') {
        let (name, after) = after.split_once('}').ok_or_else(|| unknown(format!("an unclosed `{{` in {sql}")))?;
        out.push_sql(before);
        match table_marker(name) {
            Some((table, alias)) => {
                out.push_sql(&marked_prefix(table));
                out.push_sql(alias);
            }
            None => parameters.walk_parameter(name, out.reborrow())?,
        }
        rest = after;
    }
    out.push_sql(rest);
    Ok(())
}

/// The table and alias a marker (`table` or `table alias`, `table` one of [`BY_ACCOUNT`]) names,
/// its alias its own name unless it has one; none for a parameter's name.
fn table_marker(name: &str) -> Option<(&str, &str)> {
    let (table, alias) = name.split_once(' ').unwrap_or((name, name));
    BY_ACCOUNT.contains(&table).then_some((table, alias))
}

/// The text a marked table begins with, up to its alias: what `run_on_shard` replaces.
pub fn marked_prefix(table: &str) -> String {
    format!("public.{table} AS ")
}

/// Writes `text` where a placeholder stands: a fixed piece of SQL, such as a list of columns.
pub fn walk_text<'b>(text: &'static str, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
    out.push_sql(text);
    Ok(())
}

/// The error of a parameter `name` that a statement does not bind: a bug, which every test of the
/// statement finds.
pub fn no_parameter(name: &str) -> Error {
    unknown(format!("no parameter `{name}`"))
}

fn unknown(what: String) -> Error {
    Error::QueryBuilderError(what.into())
}

/// `sql` cut where its last part begins: the first `SELECT` outside every parenthesis, after a
/// list of CTEs (`name AS (...), ...`). A phase's text is its CTEs and then its result, and the
/// claim runs the CTEs in its own statement and wraps the result.
pub fn split_result(sql: &str) -> Option<(&str, &str)> {
    let mut depth = 0_i32;
    for (at, c) in sql.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            'S' if depth == 0 && sql[at..].starts_with("SELECT") => return Some((&sql[..at], &sql[at..])),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statements_result_is_its_first_select_outside_its_ctes() {
        let sql = "a AS (INSERT INTO t (x) SELECT 1 FROM f), b AS (SELECT 2)\n SELECT x FROM a UNION ALL SELECT 3";
        assert_eq!(
            split_result(sql),
            Some((
                "a AS (INSERT INTO t (x) SELECT 1 FROM f), b AS (SELECT 2)\n ",
                "SELECT x FROM a UNION ALL SELECT 3"
            ))
        );
        assert_eq!(split_result("a AS (SELECT 1)"), None);
    }

    #[test]
    fn a_distributed_table_is_marked_with_its_alias_and_a_parameter_is_not() {
        assert_eq!(table_marker("payments"), Some(("payments", "payments")));
        assert_eq!(table_marker("payments p"), Some(("payments", "p")));
        assert_eq!(marked_prefix("payments"), "public.payments AS ");
        assert_eq!(table_marker("payment.id"), None);
        assert_eq!(table_marker("account"), None);
    }
}

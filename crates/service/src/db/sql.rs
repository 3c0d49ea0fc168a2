//! Statements written as SQL, whole, with named placeholders: `{name}` in the text is the
//! parameter `name`, which the statement's [`Parameters`] binds where it stands. A reader sees a
//! statement as it runs, in one literal, and its values beside it; the text is the same on every
//! run, so each statement is prepared once per connection.

use diesel::pg::Pg;
use diesel::query_builder::AstPass;
use diesel::result::{Error, QueryResult};

/// What a statement's placeholders stand for.
pub trait Parameters {
    /// Binds the parameter `name` (or writes a fixed piece of SQL for it, such as a list of
    /// columns); an error for a name it does not know.
    fn walk_parameter<'b>(&'b self, name: &str, out: AstPass<'_, 'b, Pg>) -> QueryResult<()>;
}

/// Walks `sql`, with each `{name}` in it bound by `parameters`. The text has no other braces.
pub fn walk_sql<'b>(
    sql: &'static str,
    parameters: &'b impl Parameters,
    mut out: AstPass<'_, 'b, Pg>,
) -> QueryResult<()> {
    let mut rest = sql;
    while let Some((before, after)) = rest.split_once('{') {
        let (name, after) = after.split_once('}').ok_or_else(|| unknown(format!("an unclosed `{{` in {sql}")))?;
        out.push_sql(before);
        parameters.walk_parameter(name, out.reborrow())?;
        rest = after;
    }
    out.push_sql(rest);
    Ok(())
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
}

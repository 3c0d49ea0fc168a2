//! What PostgreSQL plans for a statement: `EXPLAIN (FORMAT JSON)`, flattened to its nodes, so a
//! test can assert which tables are read how (no `Seq Scan` of a table that may grow, say).

use diesel::QueryableByName;
use diesel::sql_types::Json;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

/// One node of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanNode {
    /// `Seq Scan`, `Index Only Scan`, `Bitmap Heap Scan`, `Limit`, ...
    pub node_type: String,
    /// The table it reads, if it reads one.
    pub relation: Option<String>,
    /// The index it reads, if it reads one.
    pub index: Option<String>,
}

#[derive(QueryableByName)]
struct Explained {
    #[diesel(sql_type = Json, column_name = "QUERY PLAN")]
    plan: Value,
}

/// Every node of the plan of `statement` (anything `EXPLAIN` takes: a query, `EXECUTE name(..)`),
/// subplans and init plans included.
pub async fn plan_nodes(conn: &mut AsyncPgConnection, statement: &str) -> Vec<PlanNode> {
    let mut nodes = Vec::new();
    collect(&explain(conn, "FORMAT JSON", statement).await, &mut nodes);
    nodes
}

/// The plan of `statement` as `EXPLAIN (options)` gives it in JSON (options must include
/// `FORMAT JSON`): its top node, whose `Plans` hold the rest.
pub async fn explain(conn: &mut AsyncPgConnection, options: &str, statement: &str) -> Value {
    let explained: Explained = diesel::sql_query(format!("EXPLAIN ({options}) {statement}"))
        .get_result(conn)
        .await
        .unwrap_or_else(|e| panic!("EXPLAIN {statement}: {e}"));
    explained.plan[0]["Plan"].clone()
}

fn collect(plan: &Value, nodes: &mut Vec<PlanNode>) {
    let text = |field: &str| plan[field].as_str().map(str::to_owned);
    nodes.push(PlanNode {
        node_type: text("Node Type").expect("every node has a type"),
        relation: text("Relation Name"),
        index: text("Index Name"),
    });
    for child in plan["Plans"].as_array().into_iter().flatten() {
        collect(child, nodes);
    }
}

/// The SQL of a statement as the recorder saw it run (`statements`), without the binds diesel
/// appends to its text.
pub fn sql_of(recorded: &str) -> &str {
    recorded.split_once(" -- binds: ").map_or(recorded, |(sql, _)| sql)
}

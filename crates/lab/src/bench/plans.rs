//! The plans of the statements a scenario spent its time on, as PostgreSQL ran them: the
//! benchmark's own cluster has `auto_explain` write a sample of the statements it runs to its log
//! with their actual times, rows and buffers (what `EXPLAIN (ANALYZE, BUFFERS)` shows), one
//! statement in 200 by default (`--explain-every`). A scenario's report shows, for each of its costliest
//! statements, the sampled run of median duration. Only the sampled runs pay for the timing.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use serde::Serialize;
use serde_json::Value;

use super::statement_name;

/// How many of a scenario's costliest statements have their plans shown.
pub const PLANS_SHOWN: usize = 3;

/// A statement's plan as it ran once.
#[derive(Debug, Serialize)]
pub struct StatementPlan {
    /// The statement, named as in the per-statement table.
    pub statement: String,
    /// How many of its runs the scenario sampled; the plan is that of median duration.
    pub sampled: usize,
    pub duration_ms: f64,
    /// The plan, one node per line, indented under its parent: each node's actual time (total,
    /// per loop), rows and buffers; then the triggers that ran (foreign-key checks).
    pub plan: Vec<String>,
}

/// The server's log, read from a position on.
pub struct ServerLog {
    path: PathBuf,
}

impl ServerLog {
    pub fn new(path: PathBuf) -> ServerLog {
        ServerLog { path }
    }

    /// Where the log ends now.
    pub fn position(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    /// The plans logged since `from`, of the statements named in `statements`, in that order.
    pub fn plans_since(&self, from: u64, statements: &[&str]) -> anyhow::Result<Vec<StatementPlan>> {
        let mut text = String::new();
        let mut file = File::open(&self.path)?;
        file.seek(SeekFrom::Start(from))?;
        file.read_to_string(&mut text)?;
        Ok(median_plans(sampled_runs(&text), statements))
    }
}

/// One explained run found in the log.
struct Sampled {
    statement: String,
    duration_ms: f64,
    plan: Value,
}

/// Every explained run in `log`: a line `... LOG:  duration: 0.512 ms  plan:` followed by its
/// JSON, each line of which the server starts with a tab.
fn sampled_runs(log: &str) -> Vec<Sampled> {
    let mut runs = Vec::new();
    let mut lines = log.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(duration_ms) = line
            .split_once("LOG:  duration: ")
            .and_then(|(_, rest)| rest.strip_suffix(" ms  plan:"))
            .and_then(|ms| ms.parse::<f64>().ok())
        else {
            continue;
        };
        let mut json = String::new();
        while let Some(body) = lines.peek().and_then(|next| next.strip_prefix('\t')) {
            json.push_str(body);
            json.push('\n');
            lines.next();
        }
        let Ok(explained) = serde_json::from_str::<Value>(&json) else { continue };
        let Some(query) = explained["Query Text"].as_str() else { continue };
        runs.push(Sampled { statement: statement_name(query), duration_ms, plan: explained });
    }
    runs
}

/// For each of `statements` that was sampled, its run of median duration, rendered.
fn median_plans(runs: Vec<Sampled>, statements: &[&str]) -> Vec<StatementPlan> {
    statements
        .iter()
        .filter_map(|&statement| {
            let mut runs: Vec<&Sampled> = runs.iter().filter(|run| run.statement == statement).collect();
            runs.sort_by(|a, b| a.duration_ms.total_cmp(&b.duration_ms));
            let median = runs.get(runs.len() / 2)?;
            let mut plan = Vec::new();
            render(&median.plan["Plan"], 0, &mut plan);
            for trigger in median.plan["Triggers"].as_array().into_iter().flatten() {
                plan.push(format!(
                    "Trigger {} on {}: {:.3} ms, {} calls",
                    text(trigger, "Trigger Name"),
                    text(trigger, "Relation"),
                    trigger["Time"].as_f64().unwrap_or(0.0),
                    trigger["Calls"].as_u64().unwrap_or(0),
                ));
            }
            Some(StatementPlan {
                statement: statement.to_owned(),
                sampled: runs.len(),
                duration_ms: median.duration_ms,
                plan,
            })
        })
        .collect()
}

fn text<'a>(node: &'a Value, field: &str) -> &'a str {
    node[field].as_str().unwrap_or("")
}

/// One line per node, as `EXPLAIN` names it (`Insert on payments`, `Index Scan using ... on
/// ...`, `CTE Scan on fence`), with its actual figures, then its children indented.
fn render(node: &Value, depth: usize, out: &mut Vec<String>) {
    let mut line = "  ".repeat(depth);
    if let Some(subplan) = node["Subplan Name"].as_str() {
        line.push_str(&format!("{subplan}: "));
    }
    let kind = match (text(node, "Node Type"), node["Operation"].as_str()) {
        ("ModifyTable", Some(operation)) => operation.to_owned(),
        (kind, _) => kind.to_owned(),
    };
    line.push_str(&kind);
    if let Some(index) = node["Index Name"].as_str() {
        line.push_str(&format!(" using {index}"));
    }
    if let Some(relation) = node["Relation Name"].as_str() {
        line.push_str(&format!(" on {relation}"));
    } else if let Some(cte) = node["CTE Name"].as_str() {
        line.push_str(&format!(" on {cte}"));
    }
    let loops = node["Actual Loops"].as_u64().unwrap_or(1);
    let per_loop_ms = node["Actual Total Time"].as_f64().unwrap_or(0.0);
    line.push_str(&format!(" ({:.3} ms", per_loop_ms * loops as f64));
    if loops > 1 {
        line.push_str(&format!(" in {loops} loops"));
    }
    line.push_str(&format!(", rows {}", node["Actual Rows"].as_u64().unwrap_or(0) * loops.max(1)));
    for (field, label) in [
        ("Shared Hit Blocks", "hit"),
        ("Shared Read Blocks", "read"),
        ("Shared Dirtied Blocks", "dirtied"),
        ("Shared Written Blocks", "written"),
    ] {
        match node[field].as_u64() {
            Some(blocks) if blocks > 0 => line.push_str(&format!(", {label} {blocks}")),
            _ => {}
        }
    }
    line.push(')');
    out.push(line);
    for child in node["Plans"].as_array().into_iter().flatten() {
        render(child, depth + 1, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "2026-12-07 15:20:01.123 UTC [1234] LOG:  duration: 0.250 ms  plan:
\t{
\t  \"Query Text\": \"WITH fence AS (UPDATE k SET a = 1 RETURNING id), audited AS (INSERT INTO a SELECT id FROM fence) SELECT id FROM fence\",
\t  \"Plan\": {
\t    \"Node Type\": \"CTE Scan\", \"CTE Name\": \"fence\", \"Actual Total Time\": 0.2, \"Actual Rows\": 1, \"Actual Loops\": 1,
\t    \"Shared Hit Blocks\": 9, \"Shared Dirtied Blocks\": 1,
\t    \"Plans\": [
\t      {\"Node Type\": \"ModifyTable\", \"Operation\": \"Update\", \"Relation Name\": \"k\", \"Subplan Name\": \"CTE fence\",
\t       \"Actual Total Time\": 0.1, \"Actual Rows\": 1, \"Actual Loops\": 1, \"Shared Hit Blocks\": 4,
\t       \"Plans\": [{\"Node Type\": \"Index Scan\", \"Index Name\": \"k_pkey\", \"Relation Name\": \"k\",
\t                   \"Actual Total Time\": 0.01, \"Actual Rows\": 1, \"Actual Loops\": 2, \"Shared Hit Blocks\": 3}]}
\t    ]
\t  },
\t  \"Triggers\": [{\"Trigger Name\": \"RI_ConstraintTrigger_c_1\", \"Relation\": \"k\", \"Time\": 0.04, \"Calls\": 1}]
\t}
2026-12-07 15:20:01.200 UTC [1234] LOG:  checkpoint starting: time
2026-12-07 15:20:02.123 UTC [1235] LOG:  duration: 0.100 ms  plan:
\t{\"Query Text\": \"WITH fence AS (UPDATE k SET a = 2 RETURNING id), audited AS (SELECT 1) SELECT id FROM fence\",
\t \"Plan\": {\"Node Type\": \"Result\", \"Actual Total Time\": 0.1, \"Actual Rows\": 1, \"Actual Loops\": 1}}
2026-12-07 15:20:03.123 UTC [1235] LOG:  duration: 0.900 ms  plan:
\t{\"Query Text\": \"WITH fence AS (UPDATE k SET a = 3 RETURNING id), audited AS (SELECT 1) SELECT id FROM fence\",
\t \"Plan\": {\"Node Type\": \"Result\", \"Actual Total Time\": 0.9, \"Actual Rows\": 1, \"Actual Loops\": 1}}
";

    #[test]
    fn each_statement_shows_its_sampled_run_of_median_duration_node_by_node() {
        let plans = median_plans(sampled_runs(LOG), &["WITH fence, audited", "SELECT never sampled"]);
        assert_eq!(plans.len(), 1, "{plans:#?}");
        let plan = &plans[0];
        assert_eq!((plan.statement.as_str(), plan.sampled, plan.duration_ms), ("WITH fence, audited", 3, 0.25));
        assert_eq!(
            plan.plan,
            [
                "CTE Scan on fence (0.200 ms, rows 1, hit 9, dirtied 1)",
                "  CTE fence: Update on k (0.100 ms, rows 1, hit 4)",
                "    Index Scan using k_pkey on k (0.020 ms in 2 loops, rows 2, hit 3)",
                "Trigger RI_ConstraintTrigger_c_1 on k: 0.040 ms, 1 calls",
            ]
        );
    }
}

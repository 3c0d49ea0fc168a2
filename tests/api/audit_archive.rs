//! The guide's way of archiving the audit trail (`docs/operating.md`), run as it is printed there:
//! old records move, batch by batch, into the archive table; recent ones stay; no batch reads the
//! whole table.

use diesel_async::RunQueryDsl;

use crate::helpers::{TestApp, new_key, payment_body, plan_nodes};

const OPERATING: &str = include_str!("../../docs/operating.md");

/// The statements of the guide's `sql` block that archives the trail, in order.
fn archiving_statements() -> Vec<String> {
    let block = OPERATING
        .split("```sql\n")
        .skip(1)
        .map(|rest| rest.split_once("```").expect("a closed block").0)
        .find(|block| block.contains("audit_records_archive"))
        .expect("docs/operating.md shows how to archive the audit trail");
    block.split(";\n").map(str::trim).filter(|sql| !sql.is_empty()).map(str::to_owned).collect()
}

/// How many records `table` holds older than 400 days, and how many newer.
async fn ages(app: &TestApp, table: &str) -> (i64, i64) {
    #[derive(diesel::QueryableByName)]
    struct Ages {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        old: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        recent: i64,
    }
    let sql = format!(
        "SELECT count(*) FILTER (WHERE created_at < now() - interval '400 days') AS old,
                count(*) FILTER (WHERE created_at >= now() - interval '400 days') AS recent
         FROM {table}"
    );
    let ages: Ages = diesel::sql_query(sql).get_result(&mut app.db().await).await.unwrap();
    (ages.old, ages.recent)
}

#[tokio::test]
async fn the_guides_archiving_moves_old_audit_records_in_batches_through_an_index() {
    let app = TestApp::spawn().await;
    app.post_payment(&new_key(), &payment_body()).await;
    let (_, written) = ages(&app, "audit_records").await;
    // Two years of an earlier trail: 24,000 records from 401 to 730 days old, and 6,000 newer.
    app.run_sql(&format!(
        "INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data, created_at)
         SELECT '{}', 'payment.created', 'payment', gen_random_uuid(), 'api', '{{}}',
                now() - (CASE WHEN i <= 24000 THEN 401 + i % 330 ELSE i % 399 END) * interval '1 day'
         FROM generate_series(1, 30000) i",
        app.account_id
    ))
    .await;
    let statements = archiving_statements();
    let [create_index, create_archive, move_batch] = statements.as_slice() else {
        panic!("three statements: {statements:#?}")
    };

    let mut conn = app.db().await;
    diesel::sql_query(create_index).execute(&mut conn).await.unwrap();
    diesel::sql_query(create_archive).execute(&mut conn).await.unwrap();
    diesel::sql_query("ANALYZE audit_records").execute(&mut conn).await.unwrap();
    let plan = plan_nodes(&mut conn, move_batch).await;
    let trail: Vec<_> = plan.iter().filter(|node| node.relation.as_deref() == Some("audit_records")).collect();
    assert!(trail.iter().all(|node| node.node_type != "Seq Scan"), "no batch reads the whole trail: {plan:#?}");
    assert!(trail.iter().any(|node| node.index.as_deref() == Some("audit_records_created_at_idx")), "{plan:#?}");

    // Until a batch moves nothing: five of 5,000 and one of 4,000, then none.
    let mut batches = Vec::new();
    loop {
        let moved = diesel::sql_query(move_batch).execute(&mut conn).await.unwrap();
        batches.push(moved);
        if moved == 0 {
            break;
        }
    }
    assert_eq!(batches, [5000, 5000, 5000, 5000, 4000, 0]);
    assert_eq!(ages(&app, "audit_records").await, (0, 6000 + written), "recent records stay");
    assert_eq!(ages(&app, "audit_records_archive").await, (24000, 0), "old ones are in the archive");
}

//! Helpers for the engine's own tests: a large store in a throwaway schema, and the plans the
//! server makes for a statement, read the way workers or operators run it.

use serde_json::Value;

use super::sql::Sql;
use super::PgStore;
use crate::store::prelude::*;
use crate::store::{Namespace, StoreOptions};

pub(crate) fn database_url() -> String {
    crate::test_servers::postgres_url()
}

impl PgStore {
    pub(crate) async fn exec(&self, sql: &str) {
        let conn = self.pool.get().await.unwrap();
        conn.client
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{e:?}: {sql}"));
    }

    pub(crate) async fn drop(self) {
        self.exec(&format!("DROP SCHEMA {} CASCADE", self.ns.schema()))
            .await;
    }
}

/// A store with `events` events, every other one keyed (1,000 keys), each with deliveries for
/// `h1` and `h2`; one in a hundred dead (`sql/fixtures/large-store.sql`).
pub(crate) async fn large_store(name: &str, events: u32) -> PgStore {
    let schema = format!("t{}_{name}", std::process::id());
    let store = PgStore::open(
        Some(&database_url()),
        Namespace::new(&schema, "relaybus_").unwrap(),
        StoreOptions::admin(),
    )
    .unwrap();
    store
        .exec(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .await;
    store.setup(false).await.unwrap();
    let fixture = include_str!("../../../sql/fixtures/large-store.sql");
    store
        .exec(
            &store
                .ns
                .render(fixture)
                .replace("{{events}}", &events.to_string()),
        )
        .await;
    store
}

/// How a statement is planned in production.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Planning {
    /// As a worker's tuned session does: one generic plan, no sequential scans, no JIT.
    Worker,
    /// As an operator's one-shot command does: for the values given, with the server's settings.
    Operator,
}

/// The plan of `sql` with `args` (SQL literals) as `planning` makes it; `analyze` runs it too
/// (for statements that only read).
async fn explain(
    store: &PgStore,
    sql: &Sql,
    args: &str,
    planning: Planning,
    analyze: bool,
) -> Value {
    let client = store.pool.options().connect().await.unwrap();
    let settings = match planning {
        Planning::Worker => {
            "SET plan_cache_mode = force_generic_plan; SET jit = off; SET enable_seqscan = off"
        }
        Planning::Operator => "SET plan_cache_mode = force_custom_plan",
    };
    let types: Vec<&str> = sql.types.iter().map(|t| t.name()).collect();
    client
        .batch_execute(&format!(
            "{settings}; PREPARE q ({}) AS {}",
            types.join(", "),
            sql.text
        ))
        .await
        .unwrap_or_else(|e| panic!("{e:?}: {}", sql.name));
    let options = if analyze { "ANALYZE, BUFFERS, " } else { "" };
    let plan: Value = client
        .query_one(
            &format!("EXPLAIN ({options}FORMAT JSON) EXECUTE q ({args})"),
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("{e:?}: {}", sql.name))
        .get(0);
    plan[0]["Plan"].clone()
}

/// The reads of deliveries and events in a worker's plan of `sql` with `args` (SQL literals)
/// that are not bounded by an index condition: sequential scans, and index scans that walk a
/// whole index (with sequential scans ruled out, a missing index shows as one).
pub(crate) async fn unbounded_scans(store: &PgStore, sql: &Sql, args: &str) -> Vec<String> {
    let plan = explain(store, sql, args, Planning::Worker, false).await;
    let tables = [
        store.ns.table_name("deliveries"),
        store.ns.table_name("events"),
    ];
    let mut found = vec![];
    walk(&plan, &tables, &mut found);
    found
}

/// The pages an operator's read-only statement touches, run once with `args` as an operator's
/// command plans it: for those values, with the server's settings.
pub(crate) async fn pages_read(store: &PgStore, sql: &Sql, args: &str) -> i64 {
    let plan = explain(store, sql, args, Planning::Operator, true).await;
    let count = |k: &str| plan[k].as_i64().unwrap_or(0);
    count("Shared Hit Blocks") + count("Shared Read Blocks")
}

fn walk(node: &Value, tables: &[String], found: &mut Vec<String>) {
    let text = |k: &str| node[k].as_str().unwrap_or("");
    let kind = text("Node Type");
    let of_table = |name: &str| {
        tables
            .iter()
            .any(|t| name == t || name.starts_with(&format!("{t}_")))
    };
    let relation = text("Relation Name");
    let index = text("Index Name");
    if kind == "Seq Scan" && of_table(relation) {
        found.push(format!("Seq Scan on {relation}"));
    }
    let index_scan = matches!(kind, "Index Scan" | "Index Only Scan" | "Bitmap Index Scan");
    if index_scan && of_table(index) && node.get("Index Cond").is_none() {
        found.push(format!("{kind} of all of {index}"));
    }
    for child in node["Plans"].as_array().into_iter().flatten() {
        walk(child, tables, found);
    }
}

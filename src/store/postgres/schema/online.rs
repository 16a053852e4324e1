//! The online 0.1 -> 0.2 conversion (`upgrade --online`): events and deliveries stay readable
//! and writable while their rows are filled in short transactions; the first and the last step
//! take ACCESS EXCLUSIVE for catalog changes only. Every step does what is left of it, so the
//! conversion can be killed anywhere and run again. `docs/design/online-upgrade.md` says why
//! each step is safe beside a 0.1 publisher.

use std::time::Duration;

use tokio_postgres::Client;

use super::super::conn::db;
use super::super::sql::{sql_file, Sql};
use super::super::PgStore;
use super::drift::IndexDrift;
use super::render::{index_statement, render, INSTALL, PRELUDE};
use crate::store::{
    Locks, Namespace, Result, SchemaStatus, SetupOutcome, StoreError, UpgradeCounts,
    UpgradeProgress, UpgradeStep,
};

const BEGIN: &str = sql_file!("online/begin");
const VALIDATE: &str = sql_file!("online/validate");
const FINISH: &str = sql_file!("online/finish");
const EXPAND: &str = sql_file!("online/expand");

/// Rows a backfill transaction fills: each holds its rows' locks for tens of milliseconds.
const BATCH: i32 = 5_000;

/// How long a step waits for its table lock before it lets go and tries again: while it
/// waits, the application's statements on the table queue behind it, so this bounds their wait.
pub(super) const LOCK_WAIT: Duration = Duration::from_millis(500);
pub(super) const LOCK_TRIES: u32 = 120;

/// How long the finish holds its lock, rounded up: catalog changes and the install's lane
/// rows. No publisher transaction took over 108 ms across the online conversion of 1,000,000
/// deliveries (`docs/design/online-upgrade.md`).
const FINISH_SECONDS: f64 = 0.2;

/// The steps of the online conversion, as planned and reported, with the indexes the `indexes`
/// step creates and drops.
pub(super) fn online_steps(
    ns: &Namespace,
    counts: &UpgradeCounts,
    drift: &IndexDrift,
) -> Vec<UpgradeStep> {
    let (create, drop) = concurrent(ns, drift);
    let mut indexes = "create the 0.2 indexes and drop the 0.1 ones with CONCURRENTLY, which \
                       lets writes go on"
        .to_owned();
    if !create.is_empty() {
        indexes.push_str(&format!("; creates {}", create.join(", ")));
    }
    if !drop.is_empty() {
        indexes.push_str(&format!("; drops {}", drop.join(", ")));
    }
    let step = |name: &str, description: &str, rows| UpgradeStep {
        name: name.into(),
        description: description.into(),
        rows,
    };
    vec![
        step(
            "begin",
            "add events.handlers, deliveries.lane and claims, their rules as constraints that \
             hold for new rows, and triggers that give rows written meanwhile their lane and \
             handlers (catalog changes only)",
            None,
        ),
        step(
            "events-handlers",
            "fill events.handlers from every delivery, completed ones included, 5,000 events \
             to a transaction",
            Some(counts.events),
        ),
        step(
            "deliveries-lanes",
            "fill each delivery's lane and turn processing deliveries into pending with their \
             attempts kept, 5,000 to a transaction",
            Some(counts.deliveries),
        ),
        step(
            "validate",
            "prove the new constraints for every row (reads both tables; writes go on)",
            None,
        ),
        step("indexes", &indexes, None),
        step(
            "finish",
            "drop the triggers and the lease columns, set NOT NULL (proved by the constraints, \
             so without a scan), take the 0.2 status rule, install the rest (lanes, tables, \
             version), and leave the store expanded: a trigger gives a 0.1 publisher's \
             deliveries their lane and handlers until `relaybus upgrade --contract`",
            None,
        ),
    ]
}

/// What the online conversion locks.
pub(super) fn online_locks(ns: &Namespace) -> Locks {
    Locks {
        what: format!(
            "{events} and {deliveries} stay readable and writable; the first and the last step \
             take ACCESS EXCLUSIVE on both for catalog changes only, the last about \
             {FINISH_SECONDS} s; each waits at most {} ms for it (the application's statements \
             queue behind a waiting lock) and then tries again. 0.1 publishers may go on \
             publishing throughout and after it, until `relaybus upgrade --contract`; 0.1 \
             workers must be stopped",
            LOCK_WAIT.as_millis(),
            events = ns.table("events"),
            deliveries = ns.table("deliveries"),
        ),
        expected_seconds: Some(FINISH_SECONDS),
    }
}

/// The 0.2 indexes of the two converted tables to create concurrently, and the indexes to drop
/// concurrently: 0.1's, copies, and 0.2's left invalid by an interrupted build. A 0.2 name
/// defined otherwise is left to the finish, which drops and creates it under its lock:
/// dropping the unique index first would leave publishers without it.
fn concurrent(ns: &Namespace, drift: &IndexDrift) -> (Vec<String>, Vec<String>) {
    let converted = [ns.table_name("events"), ns.table_name("deliveries")];
    let on_converted = |name: &String| converted.iter().any(|t| name.starts_with(t.as_str()));
    let redefined = |name: &String| drift.dropped.contains(name) && !drift.invalid.contains(name);
    let create = drift
        .created
        .iter()
        .filter(|n| !redefined(n) && on_converted(n))
        .cloned()
        .collect();
    let drop = drift
        .dropped
        .iter()
        .filter(|n| !drift.created.contains(n) || drift.invalid.contains(n))
        .cloned()
        .collect();
    (create, drop)
}

pub(super) fn is_lock_timeout(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
}

impl PgStore {
    pub(super) async fn upgrade_online(
        &self,
        force: bool,
        progress: &(dyn Fn(UpgradeProgress) + Sync),
    ) -> Result<SetupOutcome> {
        let client = self.setup_session().await?;
        let before = self.detect(&client).await?;
        if before != SchemaStatus::V01 {
            return Ok(SetupOutcome {
                after: before.clone(),
                before,
            });
        }
        self.live_leases(&client).await?.refuse_unless(force)?;
        self.refuse_foreign_objects(&client).await?;
        let blocking: Vec<String> = self
            .index_drift(&client)
            .await?
            .foreign
            .into_iter()
            .filter(|i| i.blocks)
            .map(|i| i.drop_statement)
            .collect();
        if !blocking.is_empty() {
            return Err(StoreError::BlockingIndexes {
                statements: blocking.join(" "),
            });
        }
        let step = |number: usize| move |rows| progress(UpgradeProgress { step: number, rows });
        step(1)(0);
        let begin = render(&self.ns, PRELUDE) + "\n" + &render(&self.ns, BEGIN);
        self.locked(&client, "begin", &begin).await?;
        self.backfill(&client, &self.sql.online_events, &step(2))
            .await?;
        self.backfill(&client, &self.sql.online_deliveries, &step(3))
            .await?;
        step(4)(0);
        for statement in render(&self.ns, VALIDATE).split_inclusive(";\n") {
            self.retried(&client, "validate", statement).await?;
        }
        step(5)(0);
        self.concurrent_indexes(&client).await?;
        step(6)(0);
        let finish = [FINISH, INSTALL, EXPAND]
            .map(|sql| render(&self.ns, sql))
            .join("\n");
        self.locked(&client, "finish", &finish).await?;
        Ok(SetupOutcome {
            before,
            after: self.detect(&client).await?,
        })
    }

    /// A script in one transaction that waits at most `LOCK_WAIT` for each lock, tried again
    /// until it gets them.
    pub(super) async fn locked(&self, client: &Client, step: &str, script: &str) -> Result<()> {
        let timeout = LOCK_WAIT.as_millis();
        let transaction = format!(
            "BEGIN; SET LOCAL lock_timeout = {timeout}; SET LOCAL enable_seqscan = on;\n{script}\nCOMMIT;"
        );
        self.retried(client, step, &transaction).await
    }

    /// Runs `sql`, and again after a pause each time it gave up waiting for a lock.
    async fn retried(&self, client: &Client, step: &str, sql: &str) -> Result<()> {
        self.lock_wait(client, LOCK_WAIT).await?;
        let mut tries = 0;
        loop {
            match client.batch_execute(sql).await {
                Ok(()) => return Ok(()),
                Err(e) if is_lock_timeout(&e) && tries < LOCK_TRIES => {
                    tries += 1;
                    // An aborted transaction block stays open until it is ended.
                    let _ = client.batch_execute("ROLLBACK").await;
                    tokio::time::sleep(LOCK_WAIT).await;
                }
                Err(e) => {
                    let _ = client.batch_execute("ROLLBACK").await;
                    return Err(db(format!(
                        "the upgrade step `{step}` failed; run `relaybus upgrade --online` again \
                         to go on from where it stopped"
                    ))(e));
                }
            }
        }
    }

    /// Walks a table in id order a batch at a time, each batch its own transaction, reporting
    /// the rows walked.
    async fn backfill(
        &self,
        client: &Client,
        batch: &Sql,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<()> {
        let mut after = String::new();
        let mut walked = 0u64;
        progress(walked);
        loop {
            let row = client
                .query_typed_one(&batch.text, &batch.typed(&[&after, &BATCH]))
                .await
                .map_err(db(
                    "a backfill batch failed; run `relaybus upgrade --online` again to go on",
                ))?;
            let Some(last) = row.get::<_, Option<String>>(0) else {
                return Ok(());
            };
            walked += row.get::<_, i64>(1) as u64;
            progress(walked);
            after = last;
        }
    }

    /// Creates the missing 0.2 indexes and drops 0.1's, each with CONCURRENTLY (outside a
    /// transaction). An interrupted build leaves an invalid index, which the drift lists for
    /// dropping, so a rerun builds it again.
    async fn concurrent_indexes(&self, client: &Client) -> Result<()> {
        let drift = self.index_drift(client).await?;
        let (create, drop) = concurrent(&self.ns, &drift);
        let install = render(&self.ns, INSTALL);
        for name in &drop {
            let statement = format!(
                "DROP INDEX CONCURRENTLY IF EXISTS {}",
                self.ns.qualified(name)
            );
            self.retried(client, "indexes", &statement).await?;
        }
        // A concurrent build that gave up waiting would leave an invalid index behind, and its
        // lock (SHARE UPDATE EXCLUSIVE) holds up no reader or writer: it waits as long as it must.
        for name in &create {
            let statement = index_statement(&install, name)
                .expect("the install creates every 0.2 index")
                .replacen(
                    " INDEX IF NOT EXISTS ",
                    " INDEX CONCURRENTLY IF NOT EXISTS ",
                    1,
                );
            self.lock_wait(client, Duration::ZERO).await?;
            client.batch_execute(&statement).await.map_err(db(
                "the upgrade step `indexes` failed; run `relaybus upgrade --online` again to go \
                 on from where it stopped",
            ))?;
        }
        Ok(())
    }

    /// Sets how long the session's statements wait for a lock (zero: as long as it takes).
    pub(super) async fn lock_wait(&self, client: &Client, wait: Duration) -> Result<()> {
        client
            .batch_execute(&format!("SET lock_timeout = {}", wait.as_millis()))
            .await
            .map_err(db("could not set the lock timeout"))
    }
}

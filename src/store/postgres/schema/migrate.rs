//! Installing and converting a store: what is installed, `setup`, the conversion plan and
//! `upgrade`. Every change runs in one transaction under the setup lock, with the lock timeout
//! set, so a change that cannot get its locks fails having changed nothing.

use tokio_postgres::{Client, GenericClient, Transaction};

use super::super::conn::db;
use super::super::PgStore;
use super::drift::IndexDrift;
use super::locks::setup_lock_key;
use super::online::{online_locks, online_steps};
use super::render::{
    conversion_steps, function_bodies, names_after, render, script, INSTALL, PRELUDE,
};
use std::time::Duration;

use crate::store::{
    ContractPlan, Conversion, Expansion, LiveLeases, Locks, Namespace, Result, Schema,
    SchemaStatus, Script, SetupOutcome, StoreError, UpgradeCounts, UpgradePlan, UpgradeProgress,
    UpgradeStep, SCHEMA_VERSION,
};

/// Setup, the conversion and its plan read and rewrite whole tables, for which a sequential
/// scan is the right plan; a worker's tuned session rules them out for the delivery path and
/// would otherwise walk every index instead.
const WHOLE_TABLE_SCANS: &str = "SET LOCAL enable_seqscan = on";

/// The conversion's steps that rewrite rows report how many they have done with
/// `RAISE DEBUG 'relaybus progress: N'`, which psql, at its default level, does not show.
const PROGRESS_PREFIX: &str = "relaybus progress: ";
const HEAR_PROGRESS: &str = "SET LOCAL client_min_messages = debug1";

/// `description; verb a, b, c`, or the description alone when nothing is named.
fn naming(description: &str, verb: &str, names: &[String]) -> String {
    if names.is_empty() {
        description.to_owned()
    } else {
        format!("{description}; {verb} {}", names.join(", "))
    }
}

impl PgStore {
    pub(in crate::store::postgres) async fn detect(
        &self,
        client: &impl GenericClient,
    ) -> Result<SchemaStatus> {
        let row = client
            .query_typed_one(&self.sql.detect.text, &[])
            .await
            .map_err(db("could not read the installed schema"))?;
        let (has_deliveries, is_01, has_version, has_handlers, expanded): (
            bool,
            bool,
            bool,
            bool,
            bool,
        ) = (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
        let functions: Vec<String> = row.get(5);
        let has_functions = function_bodies(&self.ns)
            .iter()
            .all(|(name, body)| functions.contains(&format!("{name}\n{body}")));
        if is_01 {
            return Ok(SchemaStatus::V01);
        }
        let version: Option<String> = if has_version {
            client
                .query_typed_opt(&self.sql.version.text, &[])
                .await
                .map_err(db("could not read the schema version"))?
                .map(|r| r.get(0))
        } else {
            None
        };
        Ok(match version.as_deref() {
            Some(SCHEMA_VERSION)
                if !has_handlers
                    || !has_functions
                    || !self.index_drift(client).await?.is_exact() =>
            {
                SchemaStatus::Incomplete
            }
            Some(SCHEMA_VERSION) if expanded => {
                SchemaStatus::Expanded(self.expansion(client).await?)
            }
            Some(SCHEMA_VERSION) => SchemaStatus::Current,
            Some(v) => SchemaStatus::Newer { version: v.into() },
            None if has_deliveries || has_version => SchemaStatus::Incomplete,
            None => SchemaStatus::NotInstalled,
        })
    }

    /// What 0.1 publishers have written to an expanded store.
    pub(in crate::store::postgres) async fn expansion(
        &self,
        client: &impl GenericClient,
    ) -> Result<Expansion> {
        let row = client
            .query_typed_one(&self.sql.legacy_writes.text, &[])
            .await
            .map_err(db("could not read the 0.1 publishers' writes"))?;
        Ok(Expansion {
            legacy_rows: row.get(0),
            last_legacy_write: row.get(1),
        })
    }

    /// Opens a transaction holding the setup lock, with the lock timeout set. The setup lock is
    /// waited for as long as it takes: it queues setups and upgrades of one schema behind each
    /// other, and a long conversion must not fail the ones behind it. The lock timeout guards
    /// the tables, whose locks others (workers, a DBA's session) hold.
    pub(in crate::store::postgres) async fn begin_locked<'c>(
        &self,
        client: &'c mut Client,
    ) -> Result<Transaction<'c>> {
        let tx = client
            .transaction()
            .await
            .map_err(db("could not begin a transaction"))?;
        tx.batch_execute(WHOLE_TABLE_SCANS)
            .await
            .map_err(db("could not allow sequential scans"))?;
        tx.execute_typed(
            &self.sql.setup_lock.text,
            &self.sql.setup_lock.typed(&[&setup_lock_key(&self.ns)]),
        )
        .await
        .map_err(db("could not take the setup lock"))?;
        let timeout_ms = self.lock_timeout.as_millis().max(1);
        tx.batch_execute(&format!("SET LOCAL lock_timeout = {timeout_ms}"))
            .await
            .map_err(db("could not set the lock timeout"))?;
        Ok(tx)
    }

    /// Refuses to install over objects of the relaybus names that are not relaybus's.
    pub(super) async fn refuse_foreign_objects(&self, client: &impl GenericClient) -> Result<()> {
        let found: Vec<String> = client
            .query_typed(&self.sql.foreign_objects.text, &[])
            .await
            .map_err(db("could not look at the schema's objects"))?
            .iter()
            .map(|r| {
                format!(
                    "`{}.{}` ({})",
                    self.ns.schema(),
                    r.get::<_, String>(0),
                    r.get::<_, String>(1)
                )
            })
            .collect();
        if found.is_empty() {
            return Ok(());
        }
        Err(StoreError::ForeignObjects {
            found: found.join(", "),
        })
    }

    /// Whether this role may create objects in the schema (and so repair a store).
    async fn may_create(&self, client: &impl GenericClient) -> Result<bool> {
        Ok(client
            .query_typed_one(&self.sql.may_create.text, &[])
            .await
            .map_err(db("could not read this role's privileges"))?
            .get(0))
    }

    pub(super) async fn live_leases(&self, client: &impl GenericClient) -> Result<LiveLeases> {
        let row = client
            .query_typed_one(&self.sql.live_leases_0_1.text, &[])
            .await
            .map_err(db("could not count live 0.1 leases"))?;
        Ok(LiveLeases {
            count: row.get(0),
            until: row.get(1),
        })
    }

    async fn setup_locked(&self, force: bool) -> Result<SetupOutcome> {
        let mut conn = self.pool.get().await?;
        let tx = self.begin_locked(&mut conn.client).await?;
        let before = self.detect(&tx).await?;
        // A runtime role (DML grants only) may check that the store is current, and must not
        // be refused for lacking the privileges a repair would need.
        if before.is_current() && !self.may_create(&tx).await? {
            return Ok(SetupOutcome {
                after: before.clone(),
                before,
            });
        }
        self.refuse_foreign_objects(&tx).await?;
        let script = match &before {
            SchemaStatus::Newer { .. } => {
                return Err(before
                    .error(&self.ns)
                    .expect("a newer schema is not current"))
            }
            SchemaStatus::V01 => {
                self.live_leases(&tx).await?.refuse_unless(force)?;
                script(&self.ns, &Script::ConvertFrom01)
            }
            _ => script(&self.ns, &Script::Install),
        };
        tx.batch_execute(&script)
            .await
            .map_err(db("the schema script failed; nothing was changed"))?;
        let after = self.detect(&tx).await?;
        tx.commit()
            .await
            .map_err(db("could not commit the schema change"))?;
        Ok(SetupOutcome { before, after })
    }

    /// The conversion's steps, with the rows each rewrites and the objects it drops and creates.
    async fn plan_steps(
        &self,
        tx: &Transaction<'_>,
        counts: &UpgradeCounts,
    ) -> Result<Vec<UpgradeStep>> {
        let existing: Vec<String> = tx
            .query_typed(&self.sql.existing_objects.text, &[])
            .await
            .map_err(db("could not list the existing tables and indexes"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let absent = |script: &str, marker: &str| -> Vec<String> {
            names_after(&render(&self.ns, script), marker)
                .into_iter()
                .filter(|n| !existing.contains(n))
                .collect()
        };
        let IndexDrift {
            dropped,
            created: indexes,
            ..
        } = self.index_drift(tx).await?;
        let created: Vec<String> = [
            indexes,
            absent(INSTALL, "CREATE TABLE IF NOT EXISTS "),
            absent(PRELUDE, "CREATE TABLE IF NOT EXISTS "),
        ]
        .concat();
        Ok(conversion_steps(&self.ns)
            .into_iter()
            .map(|s| UpgradeStep {
                rows: match s.name.as_str() {
                    "events-handlers" => Some(counts.events),
                    "deliveries-lanes" => Some(counts.deliveries),
                    _ => None,
                },
                description: match s.name.as_str() {
                    "install" => naming(
                        &naming(&s.description, "drops", &dropped),
                        "creates",
                        &created,
                    ),
                    _ => s.description,
                },
                name: s.name,
            })
            .collect())
    }

    async fn upgrade_locked(
        &self,
        force: bool,
        progress: &(dyn Fn(UpgradeProgress) + Sync),
    ) -> Result<SetupOutcome> {
        let (mut client, mut reports) =
            self.pool.options().connect_hearing(PROGRESS_PREFIX).await?;
        let tx = self.begin_locked(&mut client).await?;
        let before = self.detect(&tx).await?;
        if before != SchemaStatus::V01 {
            return Ok(SetupOutcome {
                after: before.clone(),
                before,
            });
        }
        self.live_leases(&tx).await?.refuse_unless(force)?;
        self.refuse_foreign_objects(&tx).await?;
        tx.batch_execute(HEAR_PROGRESS)
            .await
            .map_err(db("could not ask for the conversion's progress"))?;
        for (i, step) in conversion_steps(&self.ns).iter().enumerate() {
            let step_progress = |rows| progress(UpgradeProgress { step: i + 1, rows });
            step_progress(0);
            let run = tx.batch_execute(&step.sql);
            tokio::pin!(run);
            let ran = loop {
                tokio::select! {
                    ran = &mut run => break ran,
                    Some(report) = reports.recv() => {
                        if let Ok(rows) = report.trim().parse() {
                            step_progress(rows);
                        }
                    }
                }
            };
            ran.map_err(db(format!(
                "the upgrade step `{}` failed; nothing was changed",
                step.name
            )))?;
        }
        let after = self.detect(&tx).await?;
        tx.commit()
            .await
            .map_err(db("could not commit the upgrade"))?;
        Ok(SetupOutcome { before, after })
    }
}

/// Event and delivery rows a conversion rewrites per second: 200,000 events with 200,000
/// deliveries took 10.3 s, 50,000 with 50,000 took 2.3 s (`upgrade --yes` on the 2-core test
/// server).
const CONVERTED_ROWS_PER_SECOND: f64 = 40_000.0;

/// The conversion is one transaction that holds its tables from the first step to the commit.
fn conversion_locks(ns: &Namespace, counts: &UpgradeCounts) -> Locks {
    let seconds = (counts.events + counts.deliveries) as f64 / CONVERTED_ROWS_PER_SECOND;
    let hold = match seconds {
        s if s < 1.0 => "under a second".into(),
        s if s < 120.0 => format!("about {s:.0} s"),
        s => format!("about {:.0} min", s / 60.0),
    };
    Locks {
        what: format!(
            "ACCESS EXCLUSIVE on {} and {} from the first step to the commit (one transaction): \
             every read and write of them waits until it ends, {hold} for these rows at the \
             rate of a 2-core server (a busy or slow server takes longer)",
            ns.table("events"),
            ns.table("deliveries"),
        ),
        expected_seconds: Some((seconds * 10.0).round() / 10.0),
    }
}

impl Schema for PgStore {
    async fn schema_status(&self) -> Result<SchemaStatus> {
        let conn = self.pool.get().await?;
        self.detect(&conn.client).await
    }

    async fn setup(&self, force: bool) -> Result<SetupOutcome> {
        match self.setup_locked(force).await {
            Err(e) => Err(self.explain_lock_timeout(e).await),
            ok => ok,
        }
    }

    async fn contract_plan(&self) -> Result<Option<ContractPlan>> {
        self.plan_contract().await
    }

    async fn contract(&self, quiet_for: Duration, force: bool) -> Result<Option<Expansion>> {
        self.contract_expansion(quiet_for, force).await
    }

    async fn upgrade_plan(&self, how: Conversion) -> Result<UpgradePlan> {
        let mut conn = self.pool.get().await?;
        let tx = conn
            .client
            .build_transaction()
            .read_only(true)
            .start()
            .await
            .map_err(db("could not begin a read-only transaction"))?;
        tx.batch_execute(WHOLE_TABLE_SCANS)
            .await
            .map_err(db("could not allow sequential scans"))?;
        let found = self.detect(&tx).await?;
        if found != SchemaStatus::V01 {
            return Ok(UpgradePlan::nothing_due(found));
        }
        let row = tx
            .query_typed_one(&self.sql.counts_0_1.text, &[])
            .await
            .map_err(db("could not count the rows to convert"))?;
        let counts = UpgradeCounts {
            events: row.get(0),
            deliveries: row.get(1),
            pending: row.get(2),
            processing: row.get(3),
            completed: row.get(4),
            dead: row.get(5),
        };
        let live_leases = self.live_leases(&tx).await?;
        let (steps, locks) = match how {
            Conversion::Offline => (
                self.plan_steps(&tx, &counts).await?,
                conversion_locks(&self.ns, &counts),
            ),
            Conversion::Online => (
                online_steps(&self.ns, &counts, &self.index_drift(&tx).await?),
                online_locks(&self.ns),
            ),
        };
        Ok(UpgradePlan {
            found,
            steps,
            locks,
            counts,
            live_leases,
            foreign_indexes: self.index_drift(&tx).await?.foreign,
        })
    }

    async fn upgrade(
        &self,
        how: Conversion,
        force: bool,
        progress: &(dyn Fn(UpgradeProgress) + Sync),
    ) -> Result<SetupOutcome> {
        let upgraded = match how {
            Conversion::Offline => self.upgrade_locked(force, progress).await,
            Conversion::Online => self.upgrade_online(force, progress).await,
        };
        match upgraded {
            Err(e) => Err(self.explain_lock_timeout(e).await),
            ok => ok,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::testing::large_store;

    /// A worker's session rules sequential scans out; the setup transaction, which reads whole
    /// tables, allows them again, and only for itself.
    #[tokio::test]
    async fn setup_transactions_allow_sequential_scans() {
        let store = large_store("setup_scans", 0).await;
        let mut conn = store.pool.get().await.unwrap();
        let setting = "SELECT current_setting('enable_seqscan')";
        conn.client
            .batch_execute("SET enable_seqscan = off")
            .await
            .unwrap();
        let mut seen = vec![];
        {
            let tx = store.begin_locked(&mut conn.client).await.unwrap();
            seen.push(
                tx.query_one(setting, &[])
                    .await
                    .unwrap()
                    .get::<_, String>(0),
            );
            tx.rollback().await.unwrap();
        }
        seen.push(conn.client.query_one(setting, &[]).await.unwrap().get(0));
        drop(conn);
        store.drop().await;
        assert_eq!(seen, ["on", "off"]);
    }

    #[test]
    fn the_expected_hold_grows_with_the_rows_and_reads_in_seconds_or_minutes() {
        let ns = Namespace::new("s", "relaybus_").unwrap();
        let said = |events, deliveries| {
            let counts = UpgradeCounts {
                events,
                deliveries,
                ..Default::default()
            };
            let locks = conversion_locks(&ns, &counts);
            let hold = locks.what.split(", ").nth(1).unwrap_or_default().to_owned();
            (hold, locks.expected_seconds.unwrap())
        };
        let hold = |text: &str| {
            format!("{text} for these rows at the rate of a 2-core server (a busy or slow server takes longer)")
        };
        assert_eq!(said(6, 9), (hold("under a second"), 0.0));
        assert_eq!(said(200_000, 200_000), (hold("about 10 s"), 10.0));
        assert_eq!(said(1_000_000, 1_000_000), (hold("about 50 s"), 50.0));
        assert_eq!(said(10_000_000, 20_000_000), (hold("about 12 min"), 750.0));
    }
}

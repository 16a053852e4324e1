//! Install, check and convert the PostgreSQL schema. The SQL lives in `sql/postgres/` and is
//! embedded; `schema-sql` prints exactly what `setup` and `upgrade` run, so a DBA applying the
//! script by hand gets the same store.

use tokio_postgres::{GenericClient, Transaction};

use super::PgStore;
use crate::store::lane::fnv1a_32;
use crate::store::{
    Namespace, Result, SchemaStatus, SetupOutcome, StoreError, UpgradeCounts, UpgradePlan,
    UpgradeStep, SCHEMA_VERSION,
};

const PRELUDE: &str = include_str!("../../../sql/postgres/00_prelude.sql");
const CONVERT_0_1: &str = include_str!("../../../sql/postgres/10_convert_0_1.sql");
const INSTALL: &str = include_str!("../../../sql/postgres/20_install.sql");

/// The advisory lock that serialises `setup`, `upgrade` and a rendered script in one schema.
/// Per schema, not per prefix, because `CREATE SCHEMA IF NOT EXISTS` races across prefixes.
pub(crate) fn setup_lock_key(ns: &Namespace) -> i64 {
    let hi = fnv1a_32(b"relaybus:setup");
    let lo = fnv1a_32(ns.schema().as_bytes());
    ((u64::from(hi) << 32) | u64::from(lo)) as i64
}

fn header(ns: &Namespace, what: &str) -> String {
    format!(
        "-- relaybus {} schema {SCHEMA_VERSION}: {what}\n\
         -- schema \"{}\", prefix \"{}\"; rendered by `relaybus schema-sql`.\n\
         -- Apply in one transaction, with every relaybus worker of an older version stopped:\n\
         --   psql -v ON_ERROR_STOP=1 --single-transaction -f FILE\n\
         -- Applying it again changes nothing.\n\n\
         -- Serialises with `relaybus setup` and `relaybus upgrade` on the same schema.\n\
         SELECT pg_advisory_xact_lock({});\n\n",
        env!("CARGO_PKG_VERSION"),
        ns.schema(),
        ns.prefix(),
        setup_lock_key(ns)
    )
}

/// The complete install script for an empty database.
pub fn install_script(ns: &Namespace) -> String {
    header(ns, "install") + &ns.render(PRELUDE) + "\n" + &ns.render(INSTALL)
}

/// The 0.1 -> 0.2 conversion script, followed by the install script it ends with.
/// Setup, the conversion and its plan read and rewrite whole tables, for which a sequential scan
/// is the right plan; prepared connections rule sequential scans out for the delivery path's
/// statements, and would otherwise walk every index instead.
const WHOLE_TABLE_SCANS: &str = "SET LOCAL enable_seqscan = on";

pub fn conversion_script(ns: &Namespace) -> String {
    header(ns, "in-place conversion from 0.1")
        + &ns.render(PRELUDE)
        + "\n"
        + &ns.render(CONVERT_0_1)
        + "\n"
        + &ns.render(INSTALL)
}

/// A runnable part of the conversion, with the description its header comment gives.
struct ScriptStep {
    name: String,
    description: String,
    sql: String,
}

/// The steps `upgrade` runs, in order: the prelude, each `-- step` block of the conversion, the
/// install. One source for the script and the command.
fn conversion_steps(ns: &Namespace) -> Vec<ScriptStep> {
    let mut steps = vec![ScriptStep {
        name: "prelude".into(),
        description: "schema, version table and lane function".into(),
        sql: ns.render(PRELUDE),
    }];
    for block in ns.render(CONVERT_0_1).split("\n-- step ").skip(1) {
        let (head, body) = block.split_once("\n").unwrap_or((block, ""));
        let mut description = head.to_owned();
        let mut sql = String::new();
        for line in body.lines() {
            match line.strip_prefix("-- ") {
                Some(more) if sql.is_empty() => {
                    description.push(' ');
                    description.push_str(more);
                }
                _ => {
                    sql.push_str(line);
                    sql.push('\n');
                }
            }
        }
        let (name, description) = description
            .split_once(": ")
            .unwrap_or(("step", description.as_str()));
        steps.push(ScriptStep {
            name: name.to_owned(),
            description: description.to_owned(),
            sql,
        });
    }
    steps.push(ScriptStep {
        name: "install".into(),
        description: "create the 0.2 indexes and tables, seed the 256 lanes, record the version"
            .into(),
        sql: ns.render(INSTALL),
    });
    steps
}

/// Object names a script creates or drops, read from its own text.
fn names_after(script: &str, marker: &str) -> Vec<String> {
    script
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix(marker))
        .filter_map(|rest| rest.rsplit('"').nth(1).map(str::to_owned))
        .collect()
}

fn is_lock_timeout(e: &StoreError) -> bool {
    match e {
        StoreError::Database { cause, .. } => {
            cause.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
        }
        _ => false,
    }
}

impl PgStore {
    pub(crate) async fn detect(&self, client: &impl GenericClient) -> Result<SchemaStatus> {
        let deliveries = self.ns.table("deliveries");
        let version_table = self.ns.table("schema");
        let row = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL, \
                        EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) \
                                AND attname = 'lease_token' AND NOT attisdropped), \
                        to_regclass($2) IS NOT NULL",
                &[&deliveries, &version_table],
            )
            .await
            .map_err(StoreError::db("could not read the installed schema"))?;
        let (has_deliveries, is_01, has_version): (bool, bool, bool) =
            (row.get(0), row.get(1), row.get(2));
        if is_01 {
            return Ok(SchemaStatus::V01);
        }
        let version: Option<String> = if has_version {
            client
                .query_opt(&format!("SELECT version FROM {version_table}"), &[])
                .await
                .map_err(StoreError::db("could not read the schema version"))?
                .map(|r| r.get(0))
        } else {
            None
        };
        Ok(match version.as_deref() {
            Some(SCHEMA_VERSION) => SchemaStatus::Current,
            Some(v) => SchemaStatus::Newer { version: v.into() },
            None if has_deliveries || has_version => SchemaStatus::Incomplete,
            None => SchemaStatus::NotInstalled,
        })
    }

    /// Opens a transaction with the lock timeout set and the setup lock held.
    async fn begin_locked<'c>(
        &self,
        client: &'c mut tokio_postgres::Client,
    ) -> Result<Transaction<'c>> {
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::db("could not begin a transaction"))?;
        let timeout_ms = self.pool.options().lock_timeout.as_millis().max(1);
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = {timeout_ms}; {WHOLE_TABLE_SCANS}"
        ))
        .await
        .map_err(StoreError::db("could not set the lock timeout"))?;
        tx.execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&setup_lock_key(&self.ns)],
        )
        .await
        .map_err(StoreError::db("could not take the setup lock"))?;
        Ok(tx)
    }

    async fn live_leases(&self, client: &impl GenericClient) -> Result<(i64, Option<String>)> {
        let row = client
            .query_one(
                &format!(
                    "SELECT count(*), max(lease_expires_at)::text FROM {} \
                     WHERE status = 'processing' AND lease_expires_at > now()",
                    self.ns.table("deliveries")
                ),
                &[],
            )
            .await
            .map_err(StoreError::db("could not count live 0.1 leases"))?;
        Ok((row.get(0), row.get(1)))
    }

    async fn refuse_live_leases(&self, client: &impl GenericClient) -> Result<()> {
        match self.live_leases(client).await? {
            (0, _) => Ok(()),
            (count, until) => Err(StoreError::LiveLeases {
                count,
                until: until.unwrap_or_default(),
            }),
        }
    }

    /// Turns a lock timeout into an error naming the sessions that held the locks.
    async fn explain_lock_timeout(&self, e: StoreError) -> StoreError {
        if !is_lock_timeout(&e) {
            return e;
        }
        let timeout = humantime::format_duration(self.pool.options().lock_timeout).to_string();
        let blockers = match self.blocking_sessions().await {
            Ok(b) if !b.is_empty() => b,
            _ => "another session".into(),
        };
        StoreError::LockTimeout { timeout, blockers }
    }

    async fn blocking_sessions(&self) -> Result<String> {
        let conn = self.pool.get().await?;
        let key = setup_lock_key(&self.ns) as u64;
        let rows = conn
            .client
            .query(
                "SELECT a.pid, coalesce(a.usename, '?'), coalesce(a.application_name, ''), \
                        coalesce(a.state, '?'), \
                        coalesce(date_trunc('second', now() - a.xact_start)::text, '?'), \
                        left(regexp_replace(coalesce(a.query, ''), '\\s+', ' ', 'g'), 120) \
                   FROM pg_stat_activity a \
                  WHERE a.pid <> pg_backend_pid() AND a.pid IN ( \
                        SELECT l.pid FROM pg_locks l \
                         WHERE l.granted AND ( \
                           (l.locktype = 'relation' AND l.relation IN ( \
                              SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                               WHERE n.nspname = $1)) \
                           OR (l.locktype = 'advisory' AND l.classid::bigint = $2 \
                               AND l.objid::bigint = $3 AND l.objsubid = 1))) \
                  ORDER BY a.xact_start",
                &[
                    &self.ns.schema(),
                    &((key >> 32) as i64),
                    &((key & 0xffff_ffff) as i64),
                ],
            )
            .await
            .map_err(StoreError::db("could not list the blocking sessions"))?;
        Ok(rows
            .iter()
            .map(|r| {
                let pid: i32 = r.get(0);
                let user: String = r.get(1);
                let app: String = r.get(2);
                let state: String = r.get(3);
                let age: String = r.get(4);
                let query: String = r.get(5);
                format!("pid {pid} (user {user}, application `{app}`, {state} for {age}, last statement `{query}`)")
            })
            .collect::<Vec<_>>()
            .join(", "))
    }

    pub(crate) async fn setup_impl(&self, force: bool) -> Result<SetupOutcome> {
        let result = self.setup_locked(force).await;
        match result {
            Err(e) => Err(self.explain_lock_timeout(e).await),
            ok => ok,
        }
    }

    async fn setup_locked(&self, force: bool) -> Result<SetupOutcome> {
        let mut conn = self.pool.get().await?;
        let tx = self.begin_locked(&mut conn.client).await?;
        let before = self.detect(&tx).await?;
        let script = match &before {
            SchemaStatus::Newer { version } => {
                return Err(StoreError::TooNew {
                    found: version.clone(),
                    supported: SCHEMA_VERSION.into(),
                })
            }
            SchemaStatus::V01 => {
                if !force {
                    self.refuse_live_leases(&tx).await?;
                }
                conversion_script(&self.ns)
            }
            _ => install_script(&self.ns),
        };
        tx.batch_execute(&script).await.map_err(StoreError::db(
            "the schema script failed; nothing was changed",
        ))?;
        let after = self.detect(&tx).await?;
        tx.commit()
            .await
            .map_err(StoreError::db("could not commit the schema change"))?;
        Ok(SetupOutcome { before, after })
    }

    pub(crate) async fn upgrade_plan_impl(&self) -> Result<UpgradePlan> {
        let mut conn = self.pool.get().await?;
        let tx = conn
            .client
            .build_transaction()
            .read_only(true)
            .start()
            .await
            .map_err(StoreError::db("could not begin a read-only transaction"))?;
        tx.batch_execute(WHOLE_TABLE_SCANS)
            .await
            .map_err(StoreError::db("could not allow sequential scans"))?;
        let found = self.detect(&tx).await?;
        let mut plan = UpgradePlan {
            found: found.clone(),
            steps: vec![],
            counts: UpgradeCounts::default(),
            indexes_dropped: vec![],
            indexes_created: vec![],
            tables_created: vec![],
            live_leases: 0,
            live_leases_until: None,
        };
        if found != SchemaStatus::V01 {
            return Ok(plan);
        }
        let events: i64 = tx
            .query_one(
                &format!("SELECT count(*) FROM {}", self.ns.table("events")),
                &[],
            )
            .await
            .map_err(StoreError::db("could not count events"))?
            .get(0);
        let row = tx
            .query_one(
                &format!(
                    "SELECT count(*), count(*) FILTER (WHERE status = 'pending'), \
                            count(*) FILTER (WHERE status = 'processing'), \
                            count(*) FILTER (WHERE status = 'completed'), \
                            count(*) FILTER (WHERE status = 'dead') FROM {}",
                    self.ns.table("deliveries")
                ),
                &[],
            )
            .await
            .map_err(StoreError::db("could not count deliveries"))?;
        plan.counts = UpgradeCounts {
            events,
            deliveries: row.get(0),
            pending: row.get(1),
            processing: row.get(2),
            completed: row.get(3),
            dead: row.get(4),
        };
        (plan.live_leases, plan.live_leases_until) = self.live_leases(&tx).await?;

        let existing: Vec<String> = tx
            .query(
                "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                  WHERE n.nspname = $1 AND c.relkind IN ('r', 'i')",
                &[&self.ns.schema()],
            )
            .await
            .map_err(StoreError::db("could not list the existing tables and indexes"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let convert = self.ns.render(CONVERT_0_1);
        let install = self.ns.render(INSTALL);
        let absent = |names: Vec<String>| -> Vec<String> {
            names
                .into_iter()
                .filter(|n| !existing.contains(n))
                .collect()
        };
        plan.indexes_dropped = names_after(&convert, "DROP INDEX IF EXISTS ")
            .into_iter()
            .filter(|n| existing.contains(n))
            .collect();
        let mut created = absent(names_after(&install, "CREATE INDEX IF NOT EXISTS "));
        created.splice(
            0..0,
            absent(names_after(&install, "CREATE UNIQUE INDEX IF NOT EXISTS ")),
        );
        plan.indexes_created = created;
        plan.tables_created = absent(names_after(&install, "CREATE TABLE IF NOT EXISTS "))
            .into_iter()
            .chain(absent(names_after(
                &self.ns.render(PRELUDE),
                "CREATE TABLE IF NOT EXISTS ",
            )))
            .collect();
        plan.steps = conversion_steps(&self.ns)
            .into_iter()
            .map(|s| UpgradeStep {
                rows: match s.name.as_str() {
                    "events-handlers" => Some(plan.counts.events),
                    "deliveries-lanes" => Some(plan.counts.deliveries),
                    _ => None,
                },
                name: s.name,
                description: s.description,
            })
            .collect();
        Ok(plan)
    }

    pub(crate) async fn upgrade_impl(
        &self,
        force: bool,
        progress: &(dyn Fn(&UpgradeStep, usize, usize) + Sync),
    ) -> Result<SetupOutcome> {
        match self.upgrade_locked(force, progress).await {
            Err(e) => Err(self.explain_lock_timeout(e).await),
            ok => ok,
        }
    }

    async fn upgrade_locked(
        &self,
        force: bool,
        progress: &(dyn Fn(&UpgradeStep, usize, usize) + Sync),
    ) -> Result<SetupOutcome> {
        let mut conn = self.pool.get().await?;
        let tx = self.begin_locked(&mut conn.client).await?;
        let before = self.detect(&tx).await?;
        if before != SchemaStatus::V01 {
            return Ok(SetupOutcome {
                after: before.clone(),
                before,
            });
        }
        if !force {
            self.refuse_live_leases(&tx).await?;
        }
        let steps = conversion_steps(&self.ns);
        let total = steps.len();
        for (i, step) in steps.iter().enumerate() {
            progress(
                &UpgradeStep {
                    name: step.name.clone(),
                    description: step.description.clone(),
                    rows: None,
                },
                i + 1,
                total,
            );
            tx.batch_execute(&step.sql)
                .await
                .map_err(StoreError::db(format!(
                    "the upgrade step `{}` failed; nothing was changed",
                    step.name
                )))?;
        }
        let after = self.detect(&tx).await?;
        tx.commit()
            .await
            .map_err(StoreError::db("could not commit the upgrade"))?;
        Ok(SetupOutcome { before, after })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::testing::{drop_store, large_store};

    /// The session rules sequential scans out for the delivery path; the setup transaction, which
    /// reads whole tables, allows them again, and only for itself.
    #[tokio::test]
    async fn setup_transactions_allow_sequential_scans() {
        let store = large_store("setup_scans", 0).await;
        let mut conn = store.pool.get().await.unwrap();
        let setting = "SELECT current_setting('enable_seqscan')";
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
        drop_store(store).await;
        assert_eq!(seen, ["on", "off"]);
    }

    #[test]
    fn steps_come_from_the_script() {
        let ns = Namespace::new("public", "relaybus_").unwrap();
        let names: Vec<String> = conversion_steps(&ns).into_iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "prelude",
                "events-handlers",
                "deliveries-lanes",
                "lease-columns",
                "indexes",
                "install"
            ]
        );
        let dropped = names_after(&ns.render(CONVERT_0_1), "DROP INDEX IF EXISTS ");
        assert_eq!(dropped.len(), 8);
        assert_eq!(dropped[0], "relaybus_deliveries_due_idx");
    }
}

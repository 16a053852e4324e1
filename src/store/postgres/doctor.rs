//! `doctor` on PostgreSQL. Drift is found against the real thing: the install script of this
//! version is applied to a scratch schema inside a transaction that is rolled back, and the
//! catalogs of the two are compared (columns, storage parameters), with the indexes compared by
//! definition and the lane and version rows counted. Each finding carries the statements that
//! repair it, taken from the install script where it has them. Health comes from the server's
//! statistics: dead tuples, the cleanup horizon, HOT lane updates, and the settings a worker
//! behind a pooler inherits.

use std::collections::BTreeMap;

use tokio_postgres::GenericClient;

use super::conn::db;
use super::schema::{index_statement, install_script};
use super::PgStore;
use crate::store::doctor::{Check, Verdict};
use crate::store::{Doctor, Namespace, Result, SCHEMA_VERSION};

/// A dead-tuple count worth a warning: this many, and this share of the table.
const DEAD_TUPLES: i64 = 10_000;
const DEAD_SHARE: f64 = 0.2;
/// A snapshot held longer than this holds back cleanup worth a warning.
const HORIZON_SECONDS: f64 = 300.0;

/// A column as the catalog defines it: type, NOT NULL, default.
type Column = (String, bool, Option<String>);

/// The statements of a rendered script that create or fill `table`: its CREATE TABLE, CREATE
/// INDEX, INSERT, UPDATE and DO statements, found by the first schema-qualified name each one
/// names. A DO block ends at the line that closes its body (`$tag$;`).
fn statements_of(script: &str, ns: &Namespace, table: &str) -> String {
    let qualified = format!("\"{}\".\"", ns.schema());
    let wanted = ns.table_name(table);
    let mut out = String::new();
    let mut statement = String::new();
    let mut block_end: Option<String> = None;
    for line in script.lines() {
        if statement.is_empty() {
            let starts = [
                "CREATE TABLE",
                "CREATE INDEX",
                "CREATE UNIQUE INDEX",
                "INSERT INTO",
                "UPDATE",
                "DO $",
            ]
            .iter()
            .any(|k| line.starts_with(k));
            if !starts {
                continue;
            }
            block_end = line
                .strip_prefix("DO ")
                .map(|tag| format!("{};", tag.trim_end()));
        }
        statement.push_str(line);
        statement.push('\n');
        let ended = match &block_end {
            Some(end) => line.trim_end() == end,
            None => line.trim_end().ends_with(';'),
        };
        if ended {
            let target = statement.find(&qualified).and_then(|at| {
                let name = &statement[at + qualified.len()..];
                name.find('"').map(|end| &name[..end])
            });
            if target == Some(wanted.as_str()) {
                out.push_str(&statement);
            }
            statement.clear();
        }
    }
    out
}

/// The tables of a schema: their columns, and their storage parameters.
struct Catalog {
    columns: BTreeMap<String, BTreeMap<String, Column>>,
    storage: BTreeMap<String, Vec<String>>,
}

/// A column of 0.2 as the store has it, with the statements that make it 0.2's.
fn column_check(
    table: &str,
    name: &str,
    column: &str,
    (kind, not_null, default): &Column,
    found: Option<&Column>,
) -> Option<Check> {
    let subject = format!("{name}.{column}");
    let with_default = default
        .as_deref()
        .map(|d| format!(" DEFAULT {d}"))
        .unwrap_or_default();
    let Some((have_kind, have_not_null, have_default)) = found else {
        let not_null = if *not_null && default.is_some() {
            " NOT NULL"
        } else {
            ""
        };
        return Some(
            Check::fail("column", subject, "missing", "add it").with_fix(format!(
                "ALTER TABLE {table} ADD COLUMN \"{column}\" {kind}{not_null}{with_default};\n"
            )),
        );
    };
    let alter = format!("ALTER TABLE {table} ALTER COLUMN \"{column}\"");
    let mut fix = String::new();
    let mut differences = vec![];
    if have_kind != kind {
        differences.push(format!("type {have_kind}, not {kind}"));
        fix.push_str(&format!(
            "{alter} TYPE {kind} USING \"{column}\"::{kind};\n"
        ));
    }
    if have_default != default {
        differences.push(format!(
            "default {}, not {}",
            have_default.as_deref().unwrap_or("none"),
            default.as_deref().unwrap_or("none")
        ));
        fix.push_str(&match default {
            Some(d) => format!("{alter} SET DEFAULT {d};\n"),
            None => format!("{alter} DROP DEFAULT;\n"),
        });
    }
    if have_not_null != not_null {
        let (found, verb) = if *not_null {
            ("nullable, not NOT NULL", "SET")
        } else {
            ("NOT NULL, not nullable", "DROP")
        };
        differences.push(found.to_owned());
        fix.push_str(&format!("{alter} {verb} NOT NULL;\n"));
    }
    (!fix.is_empty()).then(|| {
        Check::fail(
            "column",
            subject,
            differences.join("; "),
            "redefine it as 0.2 does",
        )
        .with_fix(fix)
    })
}

fn extra_column(table: &str, name: &str, column: &str) -> Check {
    Check::warn(
        "column",
        format!("{name}.{column}"),
        "not a column of 0.2",
        "drop it",
    )
    .with_fix(format!("ALTER TABLE {table} DROP COLUMN \"{column}\";\n"))
}

/// A table's storage parameters, when they are not 0.2's, with the statements that set them.
fn storage_check(table: &str, name: &str, want: &[String], have: &[String]) -> Option<Check> {
    if want == have {
        return None;
    }
    let set = if want.is_empty() {
        String::new()
    } else {
        format!("ALTER TABLE {table} SET ({});\n", want.join(", "))
    };
    let extra: Vec<&str> = have
        .iter()
        .filter_map(|o| o.split_once('=').map(|(k, _)| k))
        .filter(|k| !want.iter().any(|w| w.starts_with(&format!("{k}="))))
        .collect();
    let reset = if extra.is_empty() {
        String::new()
    } else {
        format!("ALTER TABLE {table} RESET ({});\n", extra.join(", "))
    };
    Some(
        Check::fail(
            "storage",
            name,
            format!("({}), not ({})", have.join(", "), want.join(", ")),
            "set the storage parameters 0.2 sets",
        )
        .with_fix(set + &reset),
    )
}

impl PgStore {
    async fn columns(
        &self,
        client: &impl GenericClient,
        schema: &str,
    ) -> Result<BTreeMap<String, BTreeMap<String, Column>>> {
        let mut tables: BTreeMap<String, BTreeMap<String, Column>> = BTreeMap::new();
        for r in client
            .query_typed(
                &self.sql.doctor_columns.text,
                &self.sql.doctor_columns.typed(&[&schema]),
            )
            .await
            .map_err(db("could not read the catalog"))?
        {
            tables
                .entry(r.get(0))
                .or_default()
                .insert(r.get(1), (r.get(2), r.get(3), r.get(4)));
        }
        Ok(tables)
    }

    async fn storage(
        &self,
        client: &impl GenericClient,
        schema: &str,
    ) -> Result<BTreeMap<String, Vec<String>>> {
        Ok(client
            .query_typed(
                &self.sql.doctor_storage.text,
                &self.sql.doctor_storage.typed(&[&schema]),
            )
            .await
            .map_err(db("could not read the storage parameters"))?
            .iter()
            .map(|r| {
                let mut options: Vec<String> = r.get(1);
                options.sort();
                (r.get(0), options)
            })
            .collect())
    }

    /// The installed schema against a fresh install of this version.
    async fn drift(&self, client: &mut tokio_postgres::Client) -> Result<Vec<Check>> {
        let (want, have) = self.catalogs(client).await?;
        let script = install_script(&self.ns);
        let mut checks = vec![];
        for (name, columns) in &want.columns {
            let Some(found) = have.columns.get(name) else {
                checks.push(
                    Check::fail("table", name, "missing", "create it (and its indexes)").with_fix(
                        statements_of(&script, &self.ns, &name[self.ns.prefix().len()..]),
                    ),
                );
                continue;
            };
            let table = self.ns.table(&name[self.ns.prefix().len()..]);
            checks.extend(columns.iter().filter_map(|(column, column_wanted)| {
                column_check(&table, name, column, column_wanted, found.get(column))
            }));
            checks.extend(
                found
                    .keys()
                    .filter(|c| !columns.contains_key(*c))
                    .map(|column| extra_column(&table, name, column)),
            );
            let have_options = have.storage.get(name).cloned().unwrap_or_default();
            checks.extend(storage_check(
                &table,
                name,
                &want.storage[name],
                &have_options,
            ));
        }
        for name in have
            .columns
            .keys()
            .filter(|t| !want.columns.contains_key(*t))
        {
            checks.push(
                Check::warn(
                    "table",
                    name,
                    "not a table of 0.2",
                    "drop it, or choose another --prefix",
                )
                .with_fix(format!(
                    "DROP TABLE {};\n",
                    self.ns.table(&name[self.ns.prefix().len()..])
                )),
            );
        }
        if checks
            .iter()
            .all(|c| c.check != "table" && c.check != "column" && c.check != "storage")
        {
            checks.push(Check::ok(
                "table",
                "tables",
                format!(
                    "{} tables, their columns and storage as 0.2 installs them",
                    want.columns.len()
                ),
            ));
        }
        checks.extend(self.object_checks(client, &script, &want, &have).await?);
        Ok(checks)
    }

    /// The catalog this version installs (applied to a scratch schema in a transaction that is
    /// rolled back) and the store's.
    async fn catalogs(&self, client: &mut tokio_postgres::Client) -> Result<(Catalog, Catalog)> {
        let reference = Namespace::new(
            &format!("relaybus_doctor_{:08x}", rand::random::<u32>()),
            self.ns.prefix(),
        )?;
        let tx = client
            .transaction()
            .await
            .map_err(db("could not begin a transaction"))?;
        tx.batch_execute(&install_script(&reference))
            .await
            .map_err(db(
                "could not install the reference schema in a scratch transaction; \
                         doctor needs the CREATE privilege on the database to compare",
            ))?;
        let mut catalogs = vec![];
        for schema in [reference.schema(), self.ns.schema()] {
            catalogs.push(Catalog {
                columns: self.columns(&tx, schema).await?,
                storage: self.storage(&tx, schema).await?,
            });
        }
        tx.rollback()
            .await
            .map_err(db("could not roll back the scratch transaction"))?;
        let have = catalogs.pop().expect("two catalogs");
        Ok((catalogs.pop().expect("two catalogs"), have))
    }

    /// The indexes, lane rows and version row, of the tables that exist (a missing table's
    /// indexes come with it).
    async fn object_checks(
        &self,
        client: &mut tokio_postgres::Client,
        script: &str,
        want: &Catalog,
        have: &Catalog,
    ) -> Result<Vec<Check>> {
        let mut checks = vec![];
        if have.columns.contains_key(&self.ns.table_name("deliveries")) {
            let missing: Vec<String> = want
                .columns
                .keys()
                .filter(|t| !have.columns.contains_key(*t))
                .map(|t| self.ns.table(&t[self.ns.prefix().len()..]))
                .collect();
            checks.extend(
                self.index_checks(client, script)
                    .await?
                    .into_iter()
                    .filter(|c| {
                        !c.fix
                            .as_ref()
                            .is_some_and(|f| missing.iter().any(|t| f.contains(t.as_str())))
                    }),
            );
        }
        if have.columns.contains_key(&self.ns.table_name("lanes")) {
            checks.push(self.lane_check(client, script).await?);
        }
        if have.columns.contains_key(&self.ns.table_name("schema")) {
            checks.push(self.version_check(client, script).await?);
        }
        Ok(checks)
    }

    async fn index_checks(&self, client: &impl GenericClient, script: &str) -> Result<Vec<Check>> {
        let drift = self.index_drift(client).await?;
        let (dropped, created) = (&drift.dropped, &drift.created);
        let mut checks = vec![];
        for name in dropped {
            let mut fix = format!("DROP INDEX {};\n", self.ns.qualified(name));
            let recreated = created.contains(name);
            if recreated {
                fix.push_str(&index_statement(script, name).unwrap_or_default());
            }
            checks.push(
                Check::fail(
                    "index",
                    name,
                    if recreated {
                        "defined otherwise than 0.2 defines it"
                    } else {
                        "not an index of 0.2 (a 0.1 index, or a copy of a 0.2 one)"
                    },
                    if recreated { "recreate it" } else { "drop it" },
                )
                .with_fix(fix),
            );
        }
        for name in created.iter().filter(|n| !dropped.contains(n)) {
            checks.push(
                Check::fail("index", name, "missing", "create it")
                    .with_fix(index_statement(script, name).unwrap_or_default()),
            );
        }
        if checks.is_empty() {
            checks.push(Check::ok(
                "index",
                "indexes",
                if drift.foreign.is_empty() {
                    "every 0.2 index, by definition, and no other"
                } else {
                    "every 0.2 index, by definition"
                },
            ));
        }
        checks.extend(drift.foreign.iter().map(|i| self.foreign_index_check(i)));
        Ok(checks)
    }

    /// An index of the application's on a relaybus table: kept, with a warning of its cost.
    fn foreign_index_check(&self, i: &crate::store::ForeignIndex) -> Check {
        if i.blocks {
            Check::warn(
                "index",
                &i.name,
                format!(
                    "not relaybus's, and names the 0.1 status `processing`, which 0.2 never \
                     writes: {}",
                    i.definition
                ),
                "drop it",
            )
            .with_fix(format!("{}\n", i.drop_statement))
        } else if let Some(by) = &i.covered_by {
            Check::warn(
                "index",
                &i.name,
                format!(
                    "not relaybus's: {}; its columns are all in relaybus's {by}",
                    i.definition
                ),
                "relaybus keeps it; if no query of the application needs it, drop it (the \
                 fix script has the statement, commented out)",
            )
            .with_fix(format!(
                "-- Covered by {by}; uncomment to drop it, outside a transaction:\n\
                 -- DROP INDEX CONCURRENTLY {};\n",
                self.ns.qualified(&i.name)
            ))
        } else {
            Check::warn(
                "index",
                &i.name,
                format!("not relaybus's: {}", i.definition),
                "relaybus keeps it; it slows every write of the table it indexes",
            )
        }
    }

    async fn lane_check(&self, client: &impl GenericClient, script: &str) -> Result<Check> {
        let r = client
            .query_typed_one(&self.sql.doctor_lanes.text, &[])
            .await
            .map_err(db("could not count the lanes"))?;
        let (inside, outside): (i64, i64) = (r.get(0), r.get(1));
        let lanes = self.ns.table("lanes");
        Ok(match (inside, outside) {
            (256, 0) => Check::ok(
                "lanes",
                self.ns.table_name("lanes"),
                "256 lane rows, 0..255",
            ),
            _ => {
                // The install's seeding of the lanes, without the table's creation.
                let mut fix = statements_of(script, &self.ns, "lanes")
                    .lines()
                    .skip_while(|l| !l.starts_with("DO $"))
                    .collect::<Vec<_>>()
                    .join("\n")
                    + "\n";
                if outside > 0 {
                    fix.push_str(&format!(
                        "DELETE FROM {lanes} WHERE lane NOT BETWEEN 0 AND 255;\n"
                    ));
                }
                Check::fail(
                    "lanes",
                    self.ns.table_name("lanes"),
                    format!("{inside} of the 256 lane rows, {outside} outside 0..255"),
                    "restore exactly the lanes 0..255",
                )
                .with_fix(fix)
            }
        })
    }

    async fn version_check(&self, client: &impl GenericClient, script: &str) -> Result<Check> {
        let version: Option<String> = client
            .query_typed_opt(&self.sql.version.text, &[])
            .await
            .map_err(db("could not read the schema version"))?
            .map(|r| r.get(0));
        let subject = self.ns.table_name("schema");
        Ok(match version.as_deref() {
            Some(SCHEMA_VERSION) => {
                Check::ok("version", subject, format!("version {SCHEMA_VERSION}"))
            }
            other => Check::fail(
                "version",
                subject,
                format!("version row says {}", other.unwrap_or("nothing")),
                "record the version",
            )
            .with_fix(statements_of(script, &self.ns, "schema")),
        })
    }

    async fn health(&self, client: &impl GenericClient) -> Result<Vec<Check>> {
        let mut checks = vec![];
        for r in client
            .query_typed(&self.sql.doctor_vacuum.text, &[])
            .await
            .map_err(db("could not read the table statistics"))?
        {
            let (name, live, dead, vacuumed, updated, hot): (
                String,
                i64,
                i64,
                Option<String>,
                i64,
                i64,
            ) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
            let last = vacuumed.unwrap_or_else(|| "never".into());
            let share = dead as f64 / (live + dead).max(1) as f64;
            checks.push(if dead > DEAD_TUPLES && share > DEAD_SHARE {
                Check::warn(
                    "vacuum",
                    &name,
                    format!("{dead} dead tuples ({:.0}% of the table), last vacuum {last}", share * 100.0),
                    format!("run VACUUM (ANALYZE) on it; if autovacuum falls behind, lower autovacuum_vacuum_cost_delay on {name}"),
                )
            } else {
                Check::ok("vacuum", &name, format!("{dead} dead tuples, last vacuum {last}"))
            });
            if name == self.ns.table_name("lanes") {
                let cold = updated - hot;
                checks.push(if updated > 100 && cold * 100 > updated {
                    Check::warn(
                        "hot",
                        &name,
                        format!("{cold} of {updated} lane updates since the statistics reset were not HOT"),
                        "an index on the lanes, a fillfactor other than 50, or in-flight lists too long for a page (a smaller --batch-size) each turn HOT updates off",
                    )
                } else {
                    Check::ok("hot", &name, format!("{hot} of {updated} lane updates HOT"))
                });
            }
        }
        checks.push(self.horizon_check(client).await?);
        checks.push(self.session_check(client).await?);
        Ok(checks)
    }

    /// What a failover would keep: the standbys streaming from this server, and whether a
    /// commit waits for one of them.
    async fn replication_check(&self, client: &impl GenericClient) -> Result<Check> {
        let r = client
            .query_typed_one(&self.sql.doctor_replication.text, &[])
            .await
            .map_err(db("could not read the replication state"))?;
        let (standby, commit, standbys, synchronous, streaming): (
            bool,
            String,
            Vec<String>,
            bool,
            bool,
        ) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        let waits = synchronous && !["off", "local"].contains(&commit.as_str());
        Ok(match standbys.len() {
            _ if standby => Check::fail(
                "replication",
                "cluster",
                "this server is a standby: it refuses every write relaybus makes, and doctor's \
                 comparison with a scratch install",
                "connect to the primary: give every host, with target_session_attrs=read-write",
            ),
            0 => Check::ok(
                "replication",
                "cluster",
                "no standby streams from this server",
            ),
            n => {
                let found = format!(
                    "{n} {}: {}; synchronous_commit = {commit}",
                    if n == 1 { "standby" } else { "standbys" },
                    standbys.join("; ")
                );
                let keeps = if waits {
                    "a promoted synchronous standby has every commit"
                } else {
                    "asynchronous: a promotion may lose the last commits (published events, and \
                     completions, whose deliveries then run again)"
                };
                if streaming {
                    Check::ok("replication", "cluster", format!("{found}; {keeps}"))
                } else {
                    Check::warn(
                        "replication",
                        "cluster",
                        format!("{found}; {keeps}"),
                        "a standby that is not streaming is behind: a promotion now loses more",
                    )
                }
            }
        })
    }

    /// The oldest snapshot in the cluster, which holds back every cleanup.
    async fn horizon_check(&self, client: &impl GenericClient) -> Result<Check> {
        let horizon = client
            .query_typed_opt(&self.sql.doctor_horizon.text, &[])
            .await
            .map_err(db("could not read the sessions"))?;
        Ok(match horizon {
            Some(r) if r.get::<_, Option<f64>>(2).unwrap_or(0.0) > HORIZON_SECONDS => {
                let (pid, app, age, state, query): (
                    i32,
                    Option<String>,
                    Option<f64>,
                    Option<String>,
                    Option<String>,
                ) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
                Check::warn(
                    "cleanup",
                    "cluster",
                    format!(
                        "session {pid} ({}) has held a snapshot for {}s, {}: {}",
                        app.filter(|a| !a.is_empty()).unwrap_or_else(|| "no application name".into()),
                        age.unwrap_or(0.0).round(),
                        state.unwrap_or_default(),
                        query.unwrap_or_default().trim()
                    ),
                    format!("no dead tuple newer than it can be cleaned up; end that transaction (SELECT pg_terminate_backend({pid}) if it is stuck)"),
                )
            }
            _ => Check::ok(
                "cleanup",
                "cluster",
                "no snapshot older than 5 minutes holds back cleanup",
            ),
        })
    }

    /// The settings that workers without prepared statements inherit from the role.
    async fn session_check(&self, client: &impl GenericClient) -> Result<Check> {
        let r = client
            .query_typed_one(&self.sql.doctor_settings.text, &[])
            .await
            .map_err(db("could not read the session settings"))?;
        let (role, jit, plan_cache): (String, String, String) = (r.get(0), r.get(1), r.get(2));
        Ok(match (self.pool.prepared_statements(), jit.as_str()) {
            (true, _) => Check::ok(
                "session",
                &role,
                "workers with prepared statements set jit = off and plan each statement once for their own sessions",
            ),
            (false, "on") => Check::warn(
                "session",
                &role,
                format!("jit = on, plan_cache_mode = {plan_cache}: workers with --no-prepared-statements inherit the role's settings, and a claim compiles before it runs"),
                format!("ALTER ROLE \"{role}\" SET jit = off"),
            ),
            (false, _) => Check::ok("session", &role, format!("jit = {jit}, plan_cache_mode = {plan_cache}")),
        })
    }
}

impl Doctor for PgStore {
    async fn doctor(&self) -> Result<Vec<Check>> {
        let mut conn = self.pool.get().await?;
        let replication = self.replication_check(&conn.client).await?;
        if replication.verdict == Verdict::Fail {
            // A standby: nothing else can be checked there.
            return Ok(vec![replication]);
        }
        let mut checks = self.drift(&mut conn.client).await?;
        checks.extend(self.health(&conn.client).await?);
        checks.push(replication);
        Ok(checks)
    }
}

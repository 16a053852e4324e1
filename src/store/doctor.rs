//! `doctor`: whether a store is healthy, and what to do when it is not. Each engine checks its
//! installed schema against what this version installs (drift, with the statements that repair
//! it) and what only it can see (vacuum, the cleanup horizon, HOT updates on PostgreSQL;
//! stranded parked deliveries on MongoDB); the checks every engine shares (lag, dead letters,
//! expired leases) are made here, through the `Store` trait. Nothing here changes the store.

use std::time::Duration;

use serde::Serialize;

use super::{
    Engine, HandlerStats, LaneRow, Namespace, Result, SchemaStatus, Store, SCHEMA_VERSION,
};

/// How far behind a handler may fall before `doctor` warns.
pub const LAG_WARNING: Duration = Duration::from_secs(300);

/// A check's outcome, worst last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

/// One check of `doctor`.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// What kind of check: `table`, `column`, `index`, `storage`, `lanes`, `version`, `vacuum`,
    /// `cleanup`, `hot`, `session`, `leases`, `lag`, `dead`, `parking`, `expanded`, `publish`.
    pub check: &'static str,
    /// What it looked at: a table, a handler, a setting.
    pub subject: String,
    pub verdict: Verdict,
    /// What it found.
    pub found: String,
    /// One line of what to do; empty when all is well.
    pub advice: String,
    /// The statements (SQL, or mongosh on MongoDB) that repair the drift it found.
    pub fix: Option<String>,
}

impl Check {
    pub fn ok(check: &'static str, subject: impl Into<String>, found: impl Into<String>) -> Self {
        Self {
            check,
            subject: subject.into(),
            verdict: Verdict::Ok,
            found: found.into(),
            advice: String::new(),
            fix: None,
        }
    }

    pub fn warn(
        check: &'static str,
        subject: impl Into<String>,
        found: impl Into<String>,
        advice: impl Into<String>,
    ) -> Self {
        Self {
            verdict: Verdict::Warn,
            advice: advice.into(),
            ..Self::ok(check, subject, found)
        }
    }

    pub fn fail(
        check: &'static str,
        subject: impl Into<String>,
        found: impl Into<String>,
        advice: impl Into<String>,
    ) -> Self {
        Self {
            verdict: Verdict::Fail,
            ..Self::warn(check, subject, found, advice)
        }
    }

    pub fn with_fix(self, fix: impl Into<String>) -> Self {
        Self {
            fix: Some(fix.into()),
            ..self
        }
    }
}

fn human(seconds: f64) -> String {
    humantime::format_duration(Duration::from_secs(seconds.max(0.0) as u64)).to_string()
}

/// Every check of a store: the engine's, then lag, dead letters and expired leases.
pub async fn examine<S: Store>(store: &S) -> Result<Vec<Check>> {
    let status = store.schema_status().await?;
    if matches!(
        status,
        SchemaStatus::NotInstalled | SchemaStatus::V01 | SchemaStatus::Newer { .. }
    ) {
        return Ok(vec![Check::fail(
            "version",
            store.namespace().place(),
            format!("the schema is {}", status.describe()),
            status.advice(),
        )]);
    }
    let mut checks = store.doctor().await?;
    if let SchemaStatus::Expanded(expansion) = &status {
        checks.push(expansion_check(store.namespace(), expansion));
    }
    if checks
        .iter()
        .any(|c| ["table", "column"].contains(&c.check) && c.verdict == Verdict::Fail)
    {
        // Lag, dead letters and leases are read from tables that are not as 0.2 defines them.
        return Ok(checks);
    }
    let (stats, lanes) = match (store.stats().await, store.lanes().await) {
        (Ok(stats), Ok(lanes)) => (stats, lanes),
        (Err(e), _) | (_, Err(e)) => {
            checks.push(Check::fail(
                "stats",
                store.namespace().place(),
                format!("could not be read: {e:#}"),
                "repair the schema first",
            ));
            return Ok(checks);
        }
    };
    checks.extend(stats.iter().flat_map(handler_checks));
    checks.push(lease_check(lanes));
    Ok(checks)
}

/// A handler's lag and dead letters.
fn handler_checks(h: &HandlerStats) -> [Check; 2] {
    let lag = match h.lag_seconds {
        Some(lag) if lag > LAG_WARNING.as_secs_f64() => Check::warn(
            "lag",
            &h.handler,
            format!("the oldest due delivery has waited {}", human(lag)),
            format!(
                "start more workers for `{}`, or look for a slow handler (`relaybus stats`)",
                h.handler
            ),
        ),
        Some(lag) => Check::ok("lag", &h.handler, format!("oldest due {}", human(lag))),
        None => Check::ok("lag", &h.handler, "nothing due"),
    };
    let dead = match h.dead {
        0 => Check::ok("dead", &h.handler, "no dead letters"),
        n => Check::warn(
            "dead",
            &h.handler,
            format!("{n} dead letters"),
            format!(
                "see why with `relaybus dead list --handler {}`, then requeue or purge them",
                h.handler
            ),
        ),
    };
    [lag, dead]
}

/// An expanded store: while 0.1 publishers still write, the rest of the application is to roll
/// to 0.2; once they have not for `Expansion::QUIET_FOR`, the expansion is to end.
fn expansion_check(ns: &Namespace, e: &super::Expansion) -> Check {
    let (found, advice) = if e.recent(super::Expansion::QUIET_FOR, chrono::Utc::now()) {
        (
            format!("{}; 0.1 publishers are still writing", e.describe()),
            "roll the rest of the application to 0.2; then run `relaybus upgrade --contract`",
        )
    } else {
        (
            format!(
                "{}; none in the last {}",
                e.describe(),
                humantime::format_duration(super::Expansion::QUIET_FOR)
            ),
            "no 0.1 publisher is left: run `relaybus upgrade --contract --dry-run`, then              `relaybus upgrade --contract`",
        )
    };
    Check::warn("expanded", ns.place(), found, advice)
}

/// Lanes still held by leases that expired: their workers died or froze. And lanes whose
/// takeover could not charge its deliveries yet (MongoDB): another transaction still writes
/// them.
fn lease_check(lanes: Vec<LaneRow>) -> Check {
    let waiting: Vec<String> = lanes
        .iter()
        .filter(|l| l.uncharged > 0)
        .map(|l| format!("{} ({})", l.lane, l.uncharged))
        .collect();
    if !waiting.is_empty() {
        return Check::warn(
            "leases",
            "lanes",
            format!(
                "lanes taken over wait for another transaction to end before their deliveries \
                 run: lane (deliveries) {}",
                waiting.join(", ")
            ),
            "a worker died inside a transaction that the server keeps for up to its \
             transactionLifetimeLimitSeconds (60 s by default); nothing to do but wait, or \
             lower that limit",
        );
    }
    let expired: Vec<_> = lanes
        .into_iter()
        .filter(|l| l.owner.is_some() && l.expired)
        .collect();
    if expired.is_empty() {
        Check::ok("leases", "lanes", "no expired lease is held")
    } else {
        let mut owners: Vec<&str> = expired.iter().filter_map(|l| l.owner.as_deref()).collect();
        owners.sort_unstable();
        owners.dedup();
        Check::warn(
            "leases",
            "lanes",
            format!(
                "{} lanes are held by expired leases of {}",
                expired.len(),
                owners.join(", ")
            ),
            "their workers died or froze; the next claim takes the lanes over and charges one \
             attempt to each delivery they had in flight",
        )
    }
}

/// The repairs of every finding, as one script for the engine's own tool: SQL for `psql`, or a
/// `mongosh` script.
pub fn fix_script(engine: Engine, ns: &Namespace, checks: &[Check]) -> String {
    let (comment, apply, preamble) = match engine {
        Engine::Postgres => (
            "--",
            "psql -v ON_ERROR_STOP=1 --single-transaction -f FILE",
            String::new(),
        ),
        Engine::Mongo => (
            "//",
            "mongosh \"mongodb://HOST/?replicaSet=NAME\" --file FILE",
            format!(
                "const rb = db.getSiblingDB({});\n",
                serde_json::to_string(ns.schema()).expect("a string serialises")
            ),
        ),
    };
    let mut out = format!(
        "{comment} relaybus {} doctor: repairs for {} to schema {SCHEMA_VERSION}\n\
         {comment} Apply: {apply}\n{preamble}",
        env!("CARGO_PKG_VERSION"),
        ns.place()
    );
    let mut any = false;
    for c in checks {
        if let Some(fix) = &c.fix {
            any = true;
            out.push_str(&format!(
                "\n{comment} {} {}: {}\n{fix}",
                c.check, c.subject, c.found
            ));
        }
    }
    if !any {
        out.push_str(&format!("\n{comment} nothing to repair\n"));
    }
    out
}

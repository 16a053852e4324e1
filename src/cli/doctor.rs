//! `relaybus doctor`: whether the store is healthy, and what to do.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use serde_json::json;

use super::{GlobalArgs, Output};
use crate::store::doctor::{examine, fix_script, Verdict};
use crate::store::prelude::*;
use crate::store::StoreOptions;

/// Check the store's schema and health, and say what to do about each finding.
///
/// Drift: the installed schema against what this version installs, compared by
/// definition (tables and columns, indexes, storage parameters, the 256 lanes, the
/// version row; on MongoDB the collections, indexes, lane and version documents).
/// Health: dead tuples and the last vacuum, a snapshot holding back cleanup, HOT
/// lane updates, the session settings a worker with --no-prepared-statements
/// inherits, keys whose head is parked (MongoDB), lag and dead letters per handler,
/// expired leases still held. Nothing is changed.
///
///   relaybus doctor
///   relaybus doctor --fix-sql > fix.sql
///   psql -v ON_ERROR_STOP=1 --single-transaction -f fix.sql
///
/// Exit codes: 0 every check ok, 3 warnings only, 1 a check failed (--fix-sql exits
/// 0 once it has printed the script).
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct DoctorArgs {
    /// Print only the statements that repair the drift found (SQL, or mongosh on MongoDB).
    #[arg(long)]
    pub fix_sql: bool,
}

pub(super) async fn run(g: &GlobalArgs, out: &Output, args: DoctorArgs) -> Result<ExitCode> {
    let store = g.open(StoreOptions::admin())?;
    let checks = examine(&store).await?;
    if args.fix_sql {
        out.line(fix_script(store.engine(), store.namespace(), &checks).trim_end())?;
        return Ok(ExitCode::SUCCESS);
    }
    let count = |v: Verdict| checks.iter().filter(|c| c.verdict == v).count();
    let (ok, warnings, failures) = (
        count(Verdict::Ok),
        count(Verdict::Warn),
        count(Verdict::Fail),
    );
    if out.json {
        out.print_json(&json!({
            "checks": checks,
            "ok": ok,
            "warnings": warnings,
            "failures": failures,
        }))?;
    } else {
        let rows: Vec<Vec<String>> = checks
            .iter()
            .map(|c| {
                let status = match c.verdict {
                    Verdict::Ok => "ok",
                    Verdict::Warn => "warn",
                    Verdict::Fail => "FAIL",
                };
                let found = if c.advice.is_empty() {
                    c.found.clone()
                } else {
                    format!("{}; {}", c.found, c.advice)
                };
                vec![status.into(), c.check.into(), c.subject.clone(), found]
            })
            .collect();
        out.table_wrapping(&[3], &["STATUS", "CHECK", "SUBJECT", "FOUND"], &rows)?;
        let repair = if checks.iter().any(|c| c.fix.is_some()) {
            "; `relaybus doctor --fix-sql` prints the repair"
        } else {
            ""
        };
        out.line(format!(
            "{} checks: {ok} ok, {warnings} warnings, {failures} failures{repair}",
            checks.len()
        ))?;
    }
    // 0 all ok, 3 warnings only, 1 a failure.
    Ok(ExitCode::from(
        match checks.iter().map(|c| c.verdict).max() {
            Some(Verdict::Fail) => super::exit::FAILURE,
            Some(Verdict::Warn) => super::exit::WARNINGS,
            _ => 0,
        },
    ))
}

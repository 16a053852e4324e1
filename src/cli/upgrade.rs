//! `relaybus upgrade`: the in-place 0.1 -> 0.2 conversion, planned, confirmed, then applied.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use clap::Args;
use serde_json::json;

use super::output::{confirm, declined};
use super::{GlobalArgs, Output};
use crate::store::prelude::*;
use crate::store::{
    schema_script, AnyStore, Conversion, Engine, SchemaStatus, Script, SetupOutcome, StoreOptions,
    UpgradePlan, UpgradeProgress,
};

/// Convert a 0.1 store to 0.2 in place.
///
/// Prints the plan first (the version found, each step with the rows and objects it changes, what
/// it locks), then asks for confirmation on a terminal (--yes in scripts) and applies it: in one
/// transaction that holds the tables throughout, or with --online in short transactions while
/// the application keeps reading and writing. With --dry-run it stops after the plan, having
/// written nothing. Stop every 0.1 worker first: the upgrade refuses while 0.1 deliveries hold
/// unexpired leases unless --force is given. There is no down migration; take a backup. On a
/// current store it says so and exits 0.
#[derive(Debug, Args)]
pub struct UpgradeArgs {
    /// Print the plan and stop; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run, also print the conversion as the script `schema-sql --from 0.1` renders
    /// (SQL, or mongosh on MongoDB).
    #[arg(long, requires = "dry_run")]
    pub show_sql: bool,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Convert even while 0.1 deliveries hold unexpired leases (their workers must be stopped).
    #[arg(long)]
    pub force: bool,
    /// Convert while the application reads and writes: rows are filled in batches of 5,000,
    /// indexes built concurrently, and the tables are locked only for catalog changes, at the
    /// start and for a fraction of a second at the end. Killed anywhere, run it again. 0.1
    /// publishers may publish until the end. MongoDB conversions are always online.
    #[arg(long, conflicts_with = "show_sql")]
    pub online: bool,
}

impl UpgradeArgs {
    fn conversion(&self) -> Conversion {
        if self.online {
            Conversion::Online
        } else {
            Conversion::Offline
        }
    }
}

fn print_plan(out: &Output, plan: &UpgradePlan) -> Result<()> {
    let c = &plan.counts;
    out.line(format!("found: schema {}", plan.found.describe()))?;
    out.paragraph(
        format!(
            "rows: {} events, {} deliveries ({} pending, {} processing -> pending, {} completed \
             kept, {} dead)",
            c.events, c.deliveries, c.pending, c.processing, c.completed, c.dead
        ),
        2,
    )?;
    out.line("steps:")?;
    for (i, s) in plan.steps.iter().enumerate() {
        let rows = s.rows.map(|r| format!(" [{r} rows]")).unwrap_or_default();
        let number = format!("  {}. ", i + 1);
        out.paragraph(
            format!("{number}{}: {}{}", s.name, s.description, rows),
            number.len(),
        )?;
    }
    for i in &plan.foreign_indexes {
        let line = if i.blocks {
            format!(
                "index {} blocks the conversion: {}; drop it first: {}",
                i.name, i.definition, i.drop_statement
            )
        } else {
            format!("index {} (not relaybus's, kept): {}", i.name, i.definition)
        };
        out.paragraph(line, 2)?;
    }
    if plan.live_leases.count > 0 {
        out.line(format!(
            "live 0.1 leases: {} (until {})",
            plan.live_leases.count,
            plan.live_leases.until.as_deref().unwrap_or("?")
        ))?;
    }
    Ok(())
}

pub(super) async fn run(g: &GlobalArgs, out: &Output, args: UpgradeArgs) -> Result<ExitCode> {
    let store = g.open(StoreOptions::admin())?;
    let ns = store.namespace().clone();
    let plan = store.upgrade_plan(args.conversion()).await?;
    match &plan.found {
        SchemaStatus::V01 => {}
        SchemaStatus::Current => {
            if out.json {
                out.print_json(&json!({"found": "0.2", "applied": false, "plan": null}))?;
            } else {
                out.line("relaybus schema is already 0.2; nothing to upgrade")?;
            }
            return Ok(ExitCode::SUCCESS);
        }
        other => {
            return Err(other
                .error(&ns)
                .expect("only a current store has no error")
                .into())
        }
    }
    let (locks, hold) = (&plan.locks.what, plan.locks.expected_seconds);
    if !out.json {
        print_plan(out, &plan)?;
        out.paragraph(format!("locks: {locks}"), 2)?;
    }
    if args.dry_run {
        let script = args
            .show_sql
            .then(|| schema_script(store.engine(), &ns, &Script::ConvertFrom01))
            .transpose()?;
        if out.json {
            out.print_json(&json!({"dry_run": true, "applied": false, "plan": plan, "locks": locks, "expected_lock_seconds": hold, "sql": script}))?;
        } else {
            if let Some(script) = script {
                out.line(script.trim_end())?;
            }
            out.line("dry run: nothing was written")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    plan.live_leases.refuse_unless(args.force)?;
    plan.refuse_blocking_indexes()?;
    let started = Instant::now();
    let Some(outcome) = convert(out, &store, &plan, &args).await? else {
        return declined();
    };
    let seconds = started.elapsed().as_secs_f64();
    // Another upgrade may have held the setup lock and converted the store meanwhile.
    let applied = outcome.before == SchemaStatus::V01;
    if out.json {
        out.print_json(&json!({
            "dry_run": false,
            "applied": applied,
            "before": outcome.before.describe(),
            "after": outcome.after.describe(),
            "seconds": seconds,
            "plan": plan,
        }))?;
    } else if !applied {
        out.line(format!(
            "relaybus schema is {} now: another session converted it while this one waited for \
             the setup lock; nothing was changed",
            outcome.before.describe()
        ))?;
    } else {
        out.line(format!(
            "upgraded {} \"{}\" from {} to {} in {seconds:.1}s",
            ns.container(),
            ns.schema(),
            outcome.before.describe(),
            outcome.after.describe()
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Asks, then converts with a bar over the rows the steps rewrite; None when not confirmed.
async fn convert(
    out: &Output,
    store: &AnyStore,
    plan: &UpgradePlan,
    args: &UpgradeArgs,
) -> Result<Option<SetupOutcome>> {
    let ns = store.namespace();
    let backup = match store.engine() {
        Engine::Postgres => "pg_dump",
        Engine::Mongo => "mongodump",
    };
    // The warning goes on a line of its own, so that the question fits a terminal's line: a
    // wrapped prompt is redrawn only in part once answered.
    if !args.yes {
        eprintln!("There is no down migration: take a backup first ({backup}).");
    }
    let question = format!(
        "Convert {} from 0.1 to 0.2 in place{}?",
        ns.place(),
        if args.online { ", online" } else { "" }
    );
    if !confirm(&question, args.yes)? {
        return Ok(None);
    }
    // One bar over the rows the steps rewrite; a step that rewrites none shows its name.
    let rows: Vec<u64> = plan
        .steps
        .iter()
        .map(|s| s.rows.map_or(0, |n| n.max(0) as u64))
        .collect();
    let bar = out.progress(Some(rows.iter().sum()), "rows");
    let progress = |at: UpgradeProgress| {
        let done: u64 = rows[..at.step - 1].iter().sum();
        bar.set_position(done + at.rows.min(rows[at.step - 1]));
        bar.set_message(format!(
            "step {}/{} {}",
            at.step,
            rows.len(),
            plan.steps[at.step - 1].name
        ));
    };
    let outcome = store
        .upgrade(args.conversion(), args.force, &progress)
        .await;
    bar.finish_and_clear();
    Ok(Some(outcome?))
}

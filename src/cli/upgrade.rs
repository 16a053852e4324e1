//! `relaybus upgrade`: the in-place 0.1 -> 0.2 conversion, planned, confirmed, then applied.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use clap::Args;
use serde_json::json;

use super::output::{confirm, declined};
use super::{human, within, GlobalArgs, Output};
use crate::bounds::Bounds;
use crate::store::prelude::*;
use crate::store::{
    schema_script, AnyStore, Conversion, Engine, Expansion, Namespace, SchemaStatus, Script,
    SetupOutcome, StoreOptions, UpgradePlan, UpgradeProgress,
};

/// Convert a 0.1 store to 0.2 in place.
///
/// Prints the plan first (the version found, each step with the rows and
/// objects it changes, what it locks), then asks for confirmation on a
/// terminal (--yes in scripts) and applies it: in one transaction that holds
/// the tables throughout, or with --online in short transactions while the
/// application keeps reading and writing. With --dry-run it stops after the
/// plan, having written nothing. Stop every 0.1 worker first: the upgrade
/// refuses while 0.1 deliveries hold unexpired leases unless --force is given.
/// There is no down migration; take a backup. On a current store it says so
/// and exits 0.
///
/// A rolling deploy: stop the 0.1 workers, `upgrade --online` (the store ends
/// expanded: 0.2 workers run on it, and 0.1 and 0.2 publishers both write to
/// it), start 0.2 workers, roll the application to 0.2, then
/// `upgrade --contract` (after 10 minutes without a 0.1 write).
///
///   relaybus upgrade --online --dry-run
///   relaybus upgrade --online --yes
///   relaybus upgrade --contract --dry-run
///   relaybus upgrade --contract --yes
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
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
    /// End the expansion an online conversion leaves: drop what only 0.1 publishers needed, so
    /// that the store is exactly a fresh 0.2 install. Refuses, writing nothing, while a 0.1
    /// publisher wrote within --quiet-for; --force contracts anyway (a 0.1 publisher's next
    /// write then fails). Locks for milliseconds, waiting at most 500 ms at a time.
    #[arg(long, conflicts_with_all = ["online", "show_sql"])]
    pub contract: bool,
    /// With --contract: how long no 0.1 publisher may have written.
    #[arg(long, requires = "contract", default_value = human(Expansion::QUIET_FOR), value_parser = within(Bounds::UP_TO_A_MONTH), value_name = "DURATION")]
    pub quiet_for: std::time::Duration,
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
        } else if let Some(by) = &i.covered_by {
            format!(
                "index {} (not relaybus's, kept): {}; its columns are all in 0.2's {by}, so it \
                 may be redundant (`doctor --fix-sql` has its DROP INDEX CONCURRENTLY, commented \
                 out)",
                i.name, i.definition
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
    if args.contract {
        return contract(out, &store, &args).await;
    }
    let ns = store.namespace().clone();
    let plan = store.upgrade_plan(args.conversion()).await?;
    match &plan.found {
        SchemaStatus::V01 => {}
        // A conversion that stopped in its last step (MongoDB): the plan finishes it.
        SchemaStatus::Incomplete if !plan.steps.is_empty() => {}
        found @ (SchemaStatus::Current | SchemaStatus::Expanded(_)) => {
            return nothing_to_upgrade(out, found);
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
    print_upgraded(out, &ns, &outcome, seconds, &plan)?;
    Ok(ExitCode::SUCCESS)
}

/// The store is already 0.2, expanded or not.
fn nothing_to_upgrade(out: &Output, found: &SchemaStatus) -> Result<ExitCode> {
    if out.json {
        out.print_json(&json!({"found": found.describe(), "applied": false, "plan": null, "next": found.advice()}))?;
    } else if let SchemaStatus::Expanded(_) = found {
        out.paragraph(
            format!(
                "relaybus schema is {}; nothing to upgrade. Next: {}",
                found.describe(),
                found.advice()
            ),
            0,
        )?;
    } else {
        out.line("relaybus schema is already 0.2; nothing to upgrade")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What a conversion did.
fn print_upgraded(
    out: &Output,
    ns: &Namespace,
    outcome: &SetupOutcome,
    seconds: f64,
    plan: &UpgradePlan,
) -> Result<()> {
    // Another upgrade may have held the setup lock and converted the store meanwhile.
    let applied = outcome.before != outcome.after;
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
        let (after, expanded) = match &outcome.after {
            SchemaStatus::Expanded(_) => (
                SchemaStatus::Current.describe(),
                "; the store is expanded: 0.1 publishers may go on writing until `relaybus \
                 upgrade --contract`",
            ),
            other => (other.describe(), ""),
        };
        out.paragraph(
            format!(
                "upgraded {} \"{}\" from {} to {after} in {seconds:.1}s{expanded}",
                ns.container(),
                ns.schema(),
                outcome.before.describe(),
            ),
            0,
        )?;
    }
    Ok(())
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

/// `upgrade --contract`: the plan, then, confirmed, the end of the expansion.
async fn contract(out: &Output, store: &AnyStore, args: &UpgradeArgs) -> Result<ExitCode> {
    let Some(plan) = store.contract_plan().await? else {
        let found = store.schema_status().await?;
        if out.json {
            out.print_json(&json!({"contracted": false, "found": found.describe()}))?;
        } else {
            out.line(format!(
                "nothing to contract: relaybus schema is {}",
                found.describe()
            ))?;
        }
        return Ok(ExitCode::SUCCESS);
    };
    if !out.json {
        out.paragraph(format!("found: {}", plan.expansion.describe()), 2)?;
        out.line("drops:")?;
        for d in &plan.drops {
            out.paragraph(format!("  {d}"), 4)?;
        }
        out.paragraph(format!("locks: {}", plan.locks.what), 2)?;
    }
    let recent = plan.expansion.recent(args.quiet_for, chrono::Utc::now());
    if args.dry_run {
        if out.json {
            out.print_json(&json!({"dry_run": true, "contracted": false, "plan": plan, "refused": recent && !args.force}))?;
        } else {
            if recent && !args.force {
                out.line(format!(
                    "would refuse: a 0.1 publisher wrote within --quiet-for {}",
                    humantime::format_duration(args.quiet_for)
                ))?;
            }
            out.line("dry run: nothing was written")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    // Refused before the question; the store checks again under its lock.
    if recent && !args.force {
        store.contract(args.quiet_for, false).await?;
    }
    let question = format!(
        "Contract {}? A 0.1 publisher's writes fail from then on",
        store.namespace().place()
    );
    if !confirm(&question, args.yes)? {
        return declined();
    }
    let ended = store.contract(args.quiet_for, args.force).await?;
    if out.json {
        out.print_json(&json!({"dry_run": false, "contracted": ended.is_some(), "ended": ended}))?;
    } else if let Some(e) = ended {
        out.line(format!(
            "contracted: relaybus schema is 0.2 as a fresh install has it; {} rows came from 0.1 \
             publishers",
            e.legacy_rows
        ))?;
    } else {
        out.line("nothing to contract: another session contracted it meanwhile")?;
    }
    Ok(ExitCode::SUCCESS)
}

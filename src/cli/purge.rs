//! `relaybus purge`: retention for dead letters, completed rows and orphan events.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use serde_json::json;

use super::deliveries::show_sample;
use super::output::{confirm, declined};
use super::{within, GlobalArgs, Output};
use crate::store::prelude::*;
use crate::store::{
    purge, DeliveryFilter, DeliveryStatus, PurgeCounts, PurgeOptions, StoreOptions,
};

/// Delete what retention allows, in bounded batches.
///
///   relaybus purge --dead-older-than 30d --completed-older-than 7d --dry-run
///   relaybus purge --completed-older-than 7d --yes
///
/// --dead-older-than deletes dead deliveries last updated longer ago.
/// --completed-older-than deletes completed rows kept from 0.1, completion history,
/// and events older than that with no delivery left (keep it longer than your
/// longest redelivery window: a republish after the purge is a new event). Pending
/// deliveries and their events are never touched. Each batch is its own short
/// statement; progress goes to stderr on a terminal.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct PurgeArgs {
    /// Completed rows kept from 0.1, completion history, and events without deliveries, older
    /// than this (7d, 12h).
    #[arg(long, value_parser = within(PurgeOptions::AGE_BOUNDS), value_name = "DURATION")]
    pub completed_older_than: Option<Duration>,
    /// Dead deliveries last updated longer ago than this (30d).
    #[arg(long, value_parser = within(PurgeOptions::AGE_BOUNDS), value_name = "DURATION")]
    pub dead_older_than: Option<Duration>,
    /// Rows per statement.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub batch_size: i64,
    /// Only count what would be deleted.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// The kinds of rows that go, without those of which none go: the question and the summary fit a
/// terminal's line in the common case.
fn what_goes(c: &PurgeCounts) -> String {
    let kinds = [
        (c.dead, "dead deliveries"),
        (c.completed, "completed deliveries"),
        (c.history, "completion history entries"),
        (c.events, "events"),
    ];
    let named: Vec<String> = kinds
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, kind)| format!("{n} {kind}"))
        .collect();
    match named.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => "nothing".into(),
    }
}

pub(super) async fn run(g: &GlobalArgs, out: &Output, args: PurgeArgs) -> Result<ExitCode> {
    if args.completed_older_than.is_none() && args.dead_older_than.is_none() {
        super::usage!("nothing to purge: give --completed-older-than and/or --dead-older-than");
    }
    let store = g.open(StoreOptions::admin())?;
    store.require_current().await?;
    let options = PurgeOptions {
        completed_older_than: args.completed_older_than,
        dead_older_than: args.dead_older_than,
        batch: args.batch_size,
    };
    let planned = store.purge_count(&options).await?;
    if args.dry_run {
        if out.json {
            out.print_json(&json!({"dry_run": true, "would_delete": planned}))?;
        } else {
            out.paragraph(
                format!(
                    "would delete {}; dry run, nothing deleted",
                    what_goes(&planned)
                ),
                0,
            )?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    if planned == PurgeCounts::default() {
        if out.json {
            out.print_json(&json!({"dry_run": false, "deleted": planned}))?;
        } else {
            out.line("nothing to purge")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(age) = args.dead_older_than.filter(|_| {
        planned.dead > 0 && !args.yes && out.terminal() && std::io::stdin().is_terminal()
    }) {
        let before = chrono::Utc::now() - chrono::Duration::from_std(age)?;
        let filter = DeliveryFilter {
            status: Some(DeliveryStatus::Dead),
            ..Default::default()
        };
        show_sample(&store, out, filter, |d| {
            d.updated_at.is_some_and(|t| t < before)
        })
        .await?;
    }
    if !confirm(&format!("Delete {}?", what_goes(&planned)), args.yes)? {
        return declined();
    }
    let total = planned.dead + planned.completed + planned.history + planned.events;
    let bar = out.progress(Some(total as u64), "rows");
    bar.set_message("purging");
    let deleted = purge(&store, &options, |so_far| {
        bar.set_position((so_far.dead + so_far.completed + so_far.history + so_far.events) as u64);
    })
    .await?;
    bar.finish_and_clear();
    if out.json {
        out.print_json(&json!({"dry_run": false, "deleted": deleted}))?;
    } else {
        out.line(format!("deleted {}", what_goes(&deleted)))?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::what_goes;
    use crate::store::PurgeCounts;

    #[test]
    fn the_question_names_only_what_goes() {
        let counts = |dead, completed, history, events| PurgeCounts {
            dead,
            completed,
            history,
            events,
        };
        assert_eq!(
            what_goes(&counts(100_000, 0, 0, 0)),
            "100000 dead deliveries"
        );
        assert_eq!(
            what_goes(&counts(2, 0, 1, 2)),
            "2 dead deliveries, 1 completion history entries and 2 events"
        );
        assert_eq!(what_goes(&counts(0, 3, 0, 0)), "3 completed deliveries");
    }
}

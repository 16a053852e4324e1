//! `relaybus dead`: the dead letters, and putting them back to work.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};
use serde_json::json;

use super::deliveries::{print_deliveries, show_sample, Listing, Page};
use super::names::{check_filters, whole_id};
use super::output::{confirm, declined};
use super::{GlobalArgs, Output};
use crate::store::prelude::*;
use crate::store::{DeliveryFilter, DeliveryStatus, Record, RequeueSelector, StoreOptions};

/// List and requeue dead deliveries (those buried after their last attempt, exit 65 or HTTP 410).
#[derive(Debug, Args)]
pub struct DeadArgs {
    #[command(subcommand)]
    pub command: DeadCommand,
}

#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// List dead deliveries with their last error.
    List {
        /// Only this handler's.
        #[arg(long, value_name = "NAME")]
        handler: Option<String>,
        #[command(flatten)]
        page: Page,
    },
    /// Give dead deliveries a fresh attempt budget, due now.
    ///
    ///   relaybus dead requeue --handler billing --error-contains 'HTTP 503' --dry-run
    ///   relaybus dead requeue --id 0190... --id 0191...
    ///   relaybus dead requeue --all --yes
    ///
    /// The criteria combine; --all selects every dead delivery. It reports how many
    /// match, asks on a terminal (--yes in scripts), then requeues them in one
    /// transaction. Only dead deliveries are ever touched.
    #[command(verbatim_doc_comment)]
    Requeue(RequeueArgs),
}

#[derive(Debug, Args)]
#[command(
    override_usage = "relaybus dead requeue <--id <ID>|--handler <NAME>|--type <TYPE>|\n       \
                      --error-contains <TEXT>|--all> [OPTIONS]"
)]
#[command(group(
    clap::ArgGroup::new("selection")
        .required(true)
        .multiple(true)
        .args(["ids", "handler", "event_type", "error_contains", "all"])
))]
pub struct RequeueArgs {
    /// Delivery id (repeatable).
    #[arg(long = "id", value_name = "ID")]
    pub ids: Vec<String>,
    /// Handler of the dead deliveries.
    #[arg(long, value_name = "NAME")]
    pub handler: Option<String>,
    /// Event type.
    #[arg(long = "type", value_name = "TYPE")]
    pub event_type: Option<String>,
    /// Text the last error contains.
    #[arg(long, value_name = "TEXT")]
    pub error_contains: Option<String>,
    /// Every dead delivery.
    #[arg(long, conflicts_with_all = ["ids", "handler", "event_type", "error_contains"])]
    pub all: bool,
    /// Only count what would be requeued.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

pub(super) async fn run(g: &GlobalArgs, out: &Output, args: DeadArgs) -> Result<ExitCode> {
    let store = g.open(StoreOptions::admin())?;
    store.require_current().await?;
    match args.command {
        DeadCommand::List { handler, page } => {
            check_filters(&store, handler.as_deref(), None).await?;
            let rows = store
                .list_deliveries(&DeliveryFilter {
                    status: Some(DeliveryStatus::Dead),
                    handler,
                    after: page.after.clone(),
                    limit: page.limit + 1,
                    ..Default::default()
                })
                .await?;
            let how = Listing {
                empty: "no dead deliveries",
                dead: true,
                page: Some(&page),
            };
            print_deliveries(out, rows, &how)?;
        }
        DeadCommand::Requeue(a) => {
            check_filters(&store, a.handler.as_deref(), a.event_type.as_deref()).await?;
            let mut ids = Vec::with_capacity(a.ids.len());
            for id in &a.ids {
                ids.push(whole_id(&store, Record::Delivery, id).await?);
            }
            let selector = RequeueSelector {
                ids,
                handler: a.handler,
                event_type: a.event_type,
                error_contains: a.error_contains,
                all: a.all,
            };
            let matched = store.count_dead(&selector).await?;
            if a.dry_run || matched == 0 {
                if out.json {
                    out.print_json(
                        &json!({"matched": matched, "requeued": 0, "dry_run": a.dry_run}),
                    )?;
                } else if matched == 0 {
                    out.line("no dead deliveries match; nothing requeued")?;
                } else {
                    out.line(format!(
                        "{matched} dead deliveries match; dry run, nothing requeued"
                    ))?;
                    sample(&store, out, &selector).await?;
                }
                return Ok(ExitCode::SUCCESS);
            }
            if !a.yes && out.terminal() && std::io::stdin().is_terminal() {
                sample(&store, out, &selector).await?;
            }
            if !confirm(&format!("Requeue {matched} dead deliveries?"), a.yes)? {
                return declined();
            }
            let requeued = store.requeue(&selector).await?;
            if out.json {
                out.print_json(&json!({"matched": matched, "requeued": requeued.len(), "ids": requeued, "dry_run": false}))?;
            } else {
                out.line(format!(
                    "requeued {} of {matched} matching dead deliveries",
                    requeued.len()
                ))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Shows up to five of the dead deliveries a requeue selects.
async fn sample(store: &impl Store, out: &Output, selector: &RequeueSelector) -> Result<()> {
    let ids = &selector.ids;
    let text = selector.error_contains.as_deref();
    let filter = DeliveryFilter {
        status: Some(DeliveryStatus::Dead),
        handler: selector.handler.clone(),
        event_type: selector.event_type.clone(),
        ..Default::default()
    };
    show_sample(store, out, filter, |d| {
        (ids.is_empty() || d.id.as_ref().is_some_and(|id| ids.contains(id)))
            && text.is_none_or(|text| d.last_error.as_deref().is_some_and(|e| e.contains(text)))
    })
    .await
}

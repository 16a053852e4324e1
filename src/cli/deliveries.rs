//! `relaybus deliveries`: find what is pending, running, dead or done.

use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{Args, Subcommand, ValueEnum};

use super::names::{check_filters, whole_id};
use super::output::{cell, short_id, time, when};
use super::{GlobalArgs, Output};
use crate::store::prelude::*;
use crate::store::{
    DeliveryDetail, DeliveryFilter, DeliveryRow, DeliveryStatus, Record, StoreOptions,
};

/// List and inspect deliveries.
#[derive(Debug, Args)]
pub struct DeliveriesArgs {
    #[command(subcommand)]
    pub command: DeliveriesCommand,
}

#[derive(Debug, Subcommand)]
pub enum DeliveriesCommand {
    /// List deliveries in creation order (completed ones newest first).
    ///
    ///   relaybus deliveries list --status processing
    ///   relaybus deliveries list --handler billing --key order-7
    ///
    /// `processing` is derived: a pending delivery that its lane lists in flight
    /// under a live lease. `completed` lists completed rows kept from 0.1 and the
    /// completion history (run workers with --completion-history to keep one).
    #[command(verbatim_doc_comment)]
    List(ListArgs),
    /// Show one delivery: its state, attempts, last error, lane and lease.
    Show {
        /// Delivery id.
        id: String,
    },
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only deliveries in this state.
    #[arg(long, value_enum)]
    pub status: Option<Status>,
    /// Only deliveries of this handler.
    #[arg(long, value_name = "NAME")]
    pub handler: Option<String>,
    /// Ordering key.
    #[arg(long)]
    pub key: Option<String>,
    /// Event id.
    #[arg(long, value_name = "ID")]
    pub event: Option<String>,
    /// Event type.
    #[arg(long = "type", value_name = "TYPE")]
    pub event_type: Option<String>,
    #[command(flatten)]
    pub page: Page,
}

/// Which part of a listing to show, and how.
#[derive(Debug, Clone, Args)]
pub struct Page {
    /// At most this many; when there are more, stderr says how to see the next page.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub limit: i64,
    /// The next page: deliveries created after this one (the last id of the previous page;
    /// `next_after` in JSON).
    #[arg(long, value_name = "ID")]
    pub after: Option<String>,
    /// Whole ids and every column, however wide the terminal.
    #[arg(long)]
    pub wide: bool,
}

/// A delivery's state, as `--status` takes it.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Status {
    Pending,
    Processing,
    Dead,
    Completed,
}

impl From<Status> for DeliveryStatus {
    fn from(s: Status) -> Self {
        match s {
            Status::Pending => DeliveryStatus::Pending,
            Status::Processing => DeliveryStatus::Processing,
            Status::Dead => DeliveryStatus::Dead,
            Status::Completed => DeliveryStatus::Completed,
        }
    }
}

/// What a listing shows besides its rows.
pub(crate) struct Listing<'a> {
    /// What to say when nothing matches.
    pub(crate) empty: &'a str,
    /// Dead letters: no status column (it is always dead), and when they died instead of when
    /// they are due.
    pub(crate) dead: bool,
    pub(crate) page: Option<&'a Page>,
}

/// Prints a listing. With a page, the rows were fetched one beyond its limit: that one tells
/// whether there is a next page, and is not shown.
/// How many deliveries a confirmation shows.
const SAMPLE: usize = 5;

/// A few of the deliveries a change would touch, printed before its question so that the person
/// asked sees what they agree to: those of the first 1,000 that `filter` lists and `keep`
/// accepts (what the listing cannot filter by, such as error text or age).
pub(crate) async fn show_sample(
    store: &impl Store,
    out: &Output,
    filter: DeliveryFilter,
    keep: impl Fn(&DeliveryRow) -> bool,
) -> Result<()> {
    let dead = filter.status == Some(DeliveryStatus::Dead);
    let rows = store
        .list_deliveries(&DeliveryFilter {
            limit: 1000,
            ..filter
        })
        .await?;
    let sample: Vec<_> = rows.into_iter().filter(|d| keep(d)).take(SAMPLE).collect();
    if sample.is_empty() {
        return Ok(());
    }
    eprintln!("for instance:");
    let how = Listing {
        empty: "",
        dead,
        page: None,
    };
    print_deliveries(out, sample, &how)
}

pub(crate) fn print_deliveries(
    out: &Output,
    mut rows: Vec<DeliveryRow>,
    how: &Listing,
) -> Result<()> {
    let limit = how.page.map_or(rows.len(), |p| p.limit as usize);
    let more = rows.len() > limit;
    rows.truncate(limit);
    let next_after = more
        .then(|| rows.last().and_then(|r| r.id.clone()))
        .flatten();
    if out.json {
        return out.print_json(&serde_json::json!({"deliveries": rows, "next_after": next_after}));
    }
    if rows.is_empty() {
        return out.line(how.empty);
    }
    let wide = how.page.is_some_and(|p| p.wide) || !out.terminal();
    let mut headers = vec!["ID", "EVENT", "HANDLER"];
    if !how.dead {
        headers.push("STATUS");
    }
    headers.extend(["ATTEMPTS", "KEY", if how.dead { "DIED" } else { "DUE" }]);
    if wide {
        headers.push("CREATED");
    }
    headers.push("LAST ERROR");
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|d| {
            let mut row = vec![
                d.id.as_deref()
                    .map_or_else(|| "-".into(), |id| short_id(id, wide)),
                short_id(&d.event_id, wide),
                d.handler.clone(),
            ];
            if !how.dead {
                row.push(d.status.clone());
            }
            row.extend([d.attempts.to_string(), cell(d.key.as_deref()), {
                let at = if how.dead {
                    d.updated_at
                } else {
                    d.available_at
                };
                if wide {
                    time(at)
                } else {
                    when(at)
                }
            }]);
            if wide {
                row.push(time(d.created_at));
            }
            row.push(cell(d.last_error.as_deref()));
            row
        })
        .collect();
    // The key and the last error wrap; nothing is cut.
    let last = headers.len() - 1;
    let key = headers
        .iter()
        .position(|h| *h == "KEY")
        .expect("a KEY column");
    out.table_wrapping(&[key, last], &headers, &table)?;
    if let Some(after) = next_after {
        eprintln!("showing the first {limit}; the next page: --after {after}");
    }
    Ok(())
}

pub(super) async fn run(g: &GlobalArgs, out: &Output, args: DeliveriesArgs) -> Result<ExitCode> {
    let store = g.open(StoreOptions::admin())?;
    store.require_current().await?;
    match args.command {
        DeliveriesCommand::List(a) => {
            check_filters(&store, a.handler.as_deref(), a.event_type.as_deref()).await?;
            let event = match a.event {
                Some(e) => Some(whole_id(&store, Record::Event, &e).await?),
                None => None,
            };
            let filter = DeliveryFilter {
                status: a.status.map(Into::into),
                handler: a.handler,
                key: a.key,
                event_id: event,
                event_type: a.event_type,
                after: a.page.after.clone(),
                limit: a.page.limit + 1,
            };
            if filter.after.is_some() && filter.status == Some(DeliveryStatus::Completed) {
                super::usage!("--after pages listings in creation order; completed deliveries are listed newest first");
            }
            let rows = store.list_deliveries(&filter).await?;
            let how = Listing {
                empty: "no deliveries match",
                dead: false,
                page: Some(&a.page),
            };
            print_deliveries(out, rows, &how)?;
        }
        DeliveriesCommand::Show { id } => {
            let id = whole_id(&store, Record::Delivery, &id).await?;
            let Some(d) = store.show_delivery(&id).await? else {
                bail!("no delivery has the id `{id}`, nor one that begins or ends with it; a completed delivery is deleted (`relaybus deliveries list --status completed` lists the history, kept by workers run with --completion-history)");
            };
            if out.json {
                out.print_json(&d)?;
            } else {
                for (k, v) in detail_lines(&d) {
                    out.paragraph(format!("{k:<12} {v}"), 13)?;
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A delivery's fields as `deliveries show` prints them, label and value.
pub(super) fn detail_lines(d: &DeliveryDetail) -> [(&'static str, String); 14] {
    let r = &d.delivery;
    [
        ("id", r.id.clone().unwrap_or_default()),
        ("event", format!("{} ({})", r.event_id, r.event_type)),
        ("handler", r.handler.clone()),
        ("status", r.status.clone()),
        ("attempts", r.attempts.to_string()),
        (
            "key",
            r.key
                .clone()
                .map(|k| format!("{k} (sequence {})", r.sequence.unwrap_or(0)))
                .unwrap_or_else(|| "-".into()),
        ),
        ("due", time(r.available_at)),
        ("created", time(r.created_at)),
        ("updated", time(r.updated_at)),
        (
            "last error",
            r.last_error.clone().unwrap_or_else(|| "-".into()),
        ),
        (
            "lane",
            format!("{} (epoch {})", r.lane.unwrap_or(0), d.lane_epoch),
        ),
        (
            "lane owner",
            d.lane_owner.clone().unwrap_or_else(|| "-".into()),
        ),
        ("lease until", time(d.lease_expires_at)),
        (
            "lease token",
            d.lease_token.clone().unwrap_or_else(|| "-".into()),
        ),
    ]
}

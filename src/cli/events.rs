//! `relaybus events`: the events as history. `list` shows what a filter selects, `show` one
//! event, and `replay` gives a handler the selected events' deliveries again (or for the first
//! time), once each.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Result};
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use clap::{Args, Subcommand};
use serde_json::json;

use super::deliveries::{print_deliveries, Listing};
use super::names::{check_filters, known_handler, whole_id};
use super::output::{can_ask, cell, confirm, declined, short_id, time};
use super::{usage, GlobalArgs, Output};
use crate::store::prelude::*;
use crate::store::{
    replay, EventFilter, EventPosition, EventRow, Record, ReplayOptions, ReplayTally, StoreOptions,
    MAX_NAME_BYTES,
};

/// List, inspect and replay events.
#[derive(Debug, Args)]
pub struct EventsArgs {
    #[command(subcommand)]
    pub command: EventsCommand,
}

#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// List events in publish order: what `events replay` takes with the same filters.
    ///
    ///   relaybus events list --type 'order.*' --since 2026-12-01
    ///   relaybus events list --handler billing --since 24h --limit 20
    ///   relaybus events list --key order-7 --json
    ///
    /// Publish order is creation time, then id. --since, --until, --event and
    /// --after take a short id as tables show it.
    #[command(verbatim_doc_comment)]
    List(ListArgs),
    /// Show one event: its payload, every handler it ever had, and its remaining deliveries.
    Show {
        /// Event id.
        id: String,
    },
    /// Give a handler a delivery of each selected event, from history, once.
    ///
    ///   relaybus events replay --handler search-index --new --dry-run
    ///   relaybus events replay --handler search-index --new --yes
    ///   relaybus events replay --handler billing --again --type 'invoice.*' \
    ///       --since '2026-12-01 00:00:00' --until '2026-12-02 00:00:00'
    ///
    /// Each selected event gets one delivery for the handler as a publish would
    /// have made it: the lane of its key, and a place in its key's order after
    /// every delivery of that key already in the store. Events are taken in
    /// publish order, a batch per transaction; workers keep running.
    ///
    /// Skipped and counted: an event whose delivery for the handler is pending,
    /// scheduled or dead (`dead requeue` brings a dead one back), and one the
    /// handler was ever published for (its delivery completed) unless --again
    /// is given. So a replay run twice, or run again after it was interrupted,
    /// creates nothing twice. A handler the store has not seen is refused as a
    /// typo unless --new is given.
    ///
    /// Handlers that start from now need no replay: events name them when the
    /// application publishes them for them.
    #[command(verbatim_doc_comment)]
    Replay(ReplayArgs),
}

/// Which events a listing or a replay takes; the options combine with AND.
#[derive(Debug, Args)]
pub struct Selection {
    /// Only events of this type; `*` stands for any text (`order.*`). Repeat for several.
    #[arg(long = "type", value_name = "TYPE")]
    pub types: Vec<String>,
    /// Only events of this ordering key.
    #[arg(long)]
    pub key: Option<String>,
    /// From here on, inclusive: a time in UTC (`2026-12-01`, `2026-12-01 08:00:00`, RFC 3339),
    /// an age (`36h`: that long ago), or an event id.
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,
    /// Up to here, inclusive: a time, an age or an event id, as --since.
    #[arg(long, value_name = "WHEN")]
    pub until: Option<String>,
    /// Only this event. Repeat for several.
    #[arg(long = "event", value_name = "ID")]
    pub events: Vec<String>,
    /// Only events after this one: the next page of a listing (`next_after` in JSON), or
    /// where an interrupted replay stopped.
    #[arg(long, value_name = "ID")]
    pub after: Option<String>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub selection: Selection,
    /// Only events published for this handler.
    #[arg(long, value_name = "NAME")]
    pub handler: Option<String>,
    /// At most this many; when there are more, stderr says how to see the next page.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub limit: i64,
    /// Whole ids, however wide the terminal.
    #[arg(long)]
    pub wide: bool,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The handler that gets the deliveries, as workers name it.
    #[arg(long, value_name = "NAME")]
    pub handler: String,
    #[command(flatten)]
    pub selection: Selection,
    /// Also replay events whose delivery for the handler completed: for a handler that was
    /// wrong. Run again after an interruption, continue with --after the event it names.
    #[arg(long)]
    pub again: bool,
    /// A handler the store has not seen yet (no event, delivery or row of the handlers table names it), on
    /// purpose. Without it, an unknown name is refused as a typo.
    #[arg(long)]
    pub new: bool,
    /// Only count: by type, the first and the last event, what is skipped and why, the lanes
    /// touched. Nothing is written.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Events per transaction: each batch holds its events' and keys' row locks until it
    /// commits.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..=50_000))]
    pub batch_size: i64,
}

/// A time as typed: RFC 3339, a date or a date and time in UTC (as tables show them), or an
/// age. None when it is none of these (an event id, perhaps).
fn parse_time(text: &str, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Some(t.with_timezone(&Utc));
    }
    if let Ok(t) = NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S") {
        return Some(t.and_utc());
    }
    if let Ok(d) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Some(d.and_hms_opt(0, 0, 0)?.and_utc());
    }
    let age = humantime::parse_duration(text).ok()?;
    Some(now - chrono::Duration::from_std(age).ok()?)
}

/// The event `given` (a whole or short id) as a position in publish order; none when the store
/// has no such event.
async fn event_position<S: Store>(store: &S, given: &str) -> Result<Option<EventPosition>> {
    let id = whole_id(store, Record::Event, given).await?;
    Ok(store.show_event(&id).await?.map(|e| EventPosition {
        at: e.created_at,
        id: Some(e.id),
    }))
}

/// The bound an option names: a usage error when it is neither a time nor an event.
async fn bound_at<S: Store>(store: &S, option: &str, given: &str) -> Result<EventPosition> {
    match event_position(store, given).await? {
        Some(position) => Ok(position),
        None => usage!(
            "{option} `{given}` is neither a time (2026-12-01, 2026-12-01 08:00:00, \
             2026-12-01T08:00:00Z), an age (36h) nor an event of this store"
        ),
    }
}

impl Selection {
    /// The filter, with times and short ids resolved; a usage error names what is not there.
    async fn resolve<S: Store>(&self, store: &S, handler: Option<String>) -> Result<EventFilter> {
        let now = Utc::now();
        let mut bounds = [None, None];
        for (bound, (option, given)) in bounds
            .iter_mut()
            .zip([("--since", &self.since), ("--until", &self.until)])
        {
            let Some(given) = given else { continue };
            *bound = Some(match parse_time(given, now) {
                Some(at) => EventPosition { at, id: None },
                None => bound_at(store, option, given).await?,
            });
        }
        let after = match &self.after {
            Some(given) => Some(bound_at(store, "--after", given).await?),
            None => None,
        };
        let mut ids = Vec::with_capacity(self.events.len());
        for given in &self.events {
            match event_position(store, given).await? {
                Some(EventPosition { id: Some(id), .. }) => ids.push(id),
                _ => usage!("--event `{given}`: no event has this id (purged, or never published)"),
            }
        }
        for t in &self.types {
            if !t.contains('*') {
                check_filters(store, None, Some(t)).await?;
            }
        }
        let [since, until] = bounds;
        Ok(EventFilter {
            types: self.types.clone(),
            key: self.key.clone(),
            handler,
            ids,
            since,
            until,
            after,
        })
    }
}

pub(super) async fn run(g: &GlobalArgs, out: &Output, args: EventsArgs) -> Result<ExitCode> {
    let store = g.open(StoreOptions::admin())?;
    store.require_current().await?;
    match args.command {
        EventsCommand::List(a) => list(&store, out, a).await,
        EventsCommand::Show { id } => show(&store, out, &id).await,
        EventsCommand::Replay(a) => replay_events(&store, out, a).await,
    }
}

async fn list<S: Store>(store: &S, out: &Output, a: ListArgs) -> Result<ExitCode> {
    if let Some(h) = &a.handler {
        known_handler(store, h).await?;
    }
    let filter = a.selection.resolve(store, a.handler.clone()).await?;
    let mut rows = store.events(&filter, a.limit + 1, None).await?;
    let more = rows.len() as i64 > a.limit;
    rows.truncate(a.limit as usize);
    let next_after = more.then(|| rows.last().map(|r| r.id.clone())).flatten();
    if out.json {
        out.print_json(&json!({"events": rows, "next_after": next_after}))?;
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        out.line("no events match")?;
        return Ok(ExitCode::SUCCESS);
    }
    let wide = a.wide || !out.terminal();
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|e: &EventRow| {
            vec![
                short_id(&e.id, wide),
                e.event_type.clone(),
                cell(e.key.as_deref()),
                time(Some(e.created_at)),
                e.handlers.join(", "),
            ]
        })
        .collect();
    out.table_wrapping(
        &[2, 4],
        &["ID", "TYPE", "KEY", "CREATED", "HANDLERS"],
        &table,
    )?;
    if let Some(after) = next_after {
        eprintln!(
            "showing the first {}; the next page: --after {after}",
            a.limit
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn show<S: Store>(store: &S, out: &Output, id: &str) -> Result<ExitCode> {
    let id = whole_id(store, Record::Event, id).await?;
    let Some(e) = store.show_event(&id).await? else {
        bail!("no event has the id `{id}`, nor one that begins or ends with it (purged, or never published)");
    };
    if out.json {
        return out.print_json(&e).map(|_| ExitCode::SUCCESS);
    }
    out.line(format!("id          {}", e.id))?;
    out.line(format!("type        {}", e.event_type))?;
    out.line(format!("key         {}", e.key.as_deref().unwrap_or("-")))?;
    out.line(format!("created     {}", time(Some(e.created_at))))?;
    out.line(format!("handlers    {}", e.handlers.join(", ")))?;
    out.paragraph(format!("headers     {}", e.headers), 12)?;
    out.paragraph(format!("payload     {}", e.payload), 12)?;
    out.line("")?;
    let how = Listing {
        empty: "no deliveries left: every handler completed",
        dead: false,
        page: None,
    };
    print_deliveries(out, e.deliveries, &how)?;
    Ok(ExitCode::SUCCESS)
}

/// What a replay did or would do, in a sentence or two.
fn summary(handler: &str, t: &ReplayTally, dry_run: bool) -> String {
    let mut text = match (t.replayed, dry_run) {
        (0, true) => format!("would replay no event to `{handler}`"),
        (0, false) => format!("replayed no event to `{handler}`"),
        (n, dry) => format!(
            "{} {n} events to `{handler}` ({} to {}, {} {})",
            if dry { "would replay" } else { "replayed" },
            t.first_event.as_deref().unwrap_or("-"),
            t.last_event.as_deref().unwrap_or("-"),
            t.lanes.len(),
            if t.lanes.len() == 1 { "lane" } else { "lanes" }
        ),
    };
    let skipped = [
        (t.skipped_pending, "pending"),
        (t.skipped_scheduled, "scheduled"),
        (t.skipped_dead, "dead (`dead requeue` revives them)"),
        (
            t.skipped_delivered,
            "delivered before (--again replays them)",
        ),
    ];
    let named: Vec<String> = skipped
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, why)| format!("{n} {why}"))
        .collect();
    if !named.is_empty() {
        text.push_str(&format!(
            "; skipped {} of {} matching events: {}",
            t.matched - t.replayed,
            t.matched,
            named.join(", ")
        ));
    }
    text
}

fn print_tally(
    out: &Output,
    handler: &str,
    t: &ReplayTally,
    dry_run: bool,
    interrupted: bool,
) -> Result<()> {
    if out.json {
        return out.print_json(&json!({
            "handler": handler,
            "dry_run": dry_run,
            "interrupted": interrupted,
            "matched": t.matched,
            "replayed": t.replayed,
            "skipped": {
                "pending": t.skipped_pending,
                "scheduled": t.skipped_scheduled,
                "dead": t.skipped_dead,
                "delivered": t.skipped_delivered,
            },
            "by_type": t.by_type,
            "first_event": t.first_event,
            "last_event": t.last_event,
            "lanes": t.lanes.len(),
            "stopped_after": interrupted.then(|| t.position.as_ref().and_then(|p| p.id.clone())).flatten(),
        }));
    }
    out.paragraph(summary(handler, t, dry_run), 2)?;
    if dry_run && t.replayed > 0 {
        let table: Vec<Vec<String>> = t
            .by_type
            .iter()
            .map(|(kind, n)| vec![kind.clone(), n.to_string()])
            .collect();
        out.table_wrapping(&[0], &["TYPE", "EVENTS"], &table)?;
    }
    Ok(())
}

async fn replay_events<S: Store>(store: &S, out: &Output, a: ReplayArgs) -> Result<ExitCode> {
    let handler = a.handler.clone();
    if handler.trim().is_empty() || handler.len() > MAX_NAME_BYTES || handler.contains('\0') {
        usage!("--handler must be a name of 1 to {MAX_NAME_BYTES} bytes without NUL characters");
    }
    if !a.new {
        known_handler(store, &handler).await?;
    }
    let filter = a.selection.resolve(store, None).await?;
    let options = ReplayOptions {
        handler: handler.clone(),
        filter,
        again: a.again,
        batch: a.batch_size,
        dry_run: true,
    };
    let total = store.count_events(&options.filter).await?;
    let walk = |verb: &str, options: ReplayOptions, stop: Arc<AtomicBool>| {
        let bar = out.progress(Some(total as u64), "events");
        bar.set_message(verb.to_owned());
        async move {
            let tally = replay(store, &options, |t| {
                bar.set_position(t.matched as u64);
                !stop.load(Ordering::Relaxed)
            })
            .await;
            bar.finish_and_clear();
            tally
        }
    };
    let never = Arc::new(AtomicBool::new(false));
    if a.dry_run || (!a.yes && can_ask()) {
        let planned = walk("counting", options.clone(), never).await?;
        if a.dry_run {
            print_tally(out, &handler, &planned, true, false)?;
            return Ok(ExitCode::SUCCESS);
        }
        if planned.replayed == 0 {
            print_tally(out, &handler, &planned, false, false)?;
            return Ok(ExitCode::SUCCESS);
        }
        eprintln!("{}", summary(&handler, &planned, true));
    }
    let question = format!("Replay the selected events to `{handler}`?");
    if !confirm(&question, a.yes)? {
        return declined();
    }
    // Ctrl-C stops the walk after the batch in hand: every batch before it stays committed.
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let listener = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            flag.store(true, Ordering::Relaxed);
        }
    });
    let done = walk(
        "replaying",
        ReplayOptions {
            dry_run: false,
            ..options
        },
        stop.clone(),
    )
    .await;
    listener.abort();
    let done = done?;
    let interrupted = stop.load(Ordering::Relaxed);
    print_tally(out, &handler, &done, false, interrupted)?;
    if interrupted {
        eprintln!("{}", how_to_go_on(&done, a.again));
        return Ok(ExitCode::from(super::exit::INTERRUPTED));
    }
    Ok(ExitCode::SUCCESS)
}

/// What to run after a replay stopped by Ctrl-C.
fn how_to_go_on(done: &ReplayTally, again: bool) -> String {
    let at = done.position.as_ref().and_then(|p| p.id.as_deref());
    format!(
        "interrupted after event {}: run the same command again to replay the rest{}",
        at.unwrap_or("-"),
        if again {
            format!(" (with --again, add --after {})", at.unwrap_or("-"))
        } else {
            String::new()
        }
    )
}

#[cfg(test)]
mod tests {
    use super::parse_time;
    use chrono::{TimeZone, Utc};

    #[test]
    fn times_are_read_as_tables_show_them_and_ages_count_back_from_now() {
        let now = Utc.with_ymd_and_hms(2026, 12, 7, 12, 0, 0).unwrap();
        let at = |y, mo, d, h, mi, s| Some(Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap());
        assert_eq!(parse_time("2026-12-01", now), at(2026, 12, 1, 0, 0, 0));
        assert_eq!(
            parse_time("2026-12-01 08:30:05", now),
            at(2026, 12, 1, 8, 30, 5)
        );
        assert_eq!(
            parse_time("2026-12-01T08:30:05+01:00", now),
            at(2026, 12, 1, 7, 30, 5)
        );
        assert_eq!(parse_time("36h", now), at(2026, 12, 6, 0, 0, 0));
        assert_eq!(parse_time("01JEXAMPLE", now), None);
    }
}

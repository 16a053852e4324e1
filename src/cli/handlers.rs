//! `relaybus handlers`: pausing and resuming a handler in every worker of the store, and each
//! handler's state with its circuit breaker.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Result;
use chrono::Utc;
use clap::{Args, Subcommand};
use serde::Serialize;
use serde_json::json;

use super::names::known_handler;
use super::output::{age, time, when};
use super::{usage, GlobalArgs, Output};
use crate::store::handlers::{Breaker, BreakerPolicy, HandlerRow, HandlerState};
use crate::store::prelude::*;
use crate::store::{HandlerStats, StoreOptions};

/// Pause and resume handlers in every worker of the store, and see their state.
///
///   relaybus handlers pause billing --reason 'INC-4312: ledger is read-only'
///   relaybus handlers list
///   relaybus handlers resume billing
///   relaybus handlers close-breaker crm
///   relaybus handlers pause --new search-index --reason 'not before the backfill'
///   relaybus handlers forget old-audit
///
/// A paused handler's deliveries stay pending: running workers stop claiming
/// them within a second (deliveries already running finish), and claim them
/// again within a second of the resume. No attempt is charged and nothing is
/// lost. `list` also shows each webhook's circuit breaker (`run
/// --breaker-threshold`).
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct HandlersArgs {
    #[command(subcommand)]
    pub command: HandlersCommand,
}

#[derive(Debug, Subcommand)]
pub enum HandlersCommand {
    /// Every handler with deliveries or a row: paused since, by whom and why, due, dead,
    /// lag, and its circuit breaker.
    List,
    /// Stop every worker of the store from claiming a handler's deliveries.
    Pause {
        /// The handler, as workers name it (`run --handler NAME`, or a `[handlers.NAME]` table).
        name: String,
        /// Why, for whoever looks next (`handlers list`, the workers' logs).
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        /// Who pauses it [default: $USER@host].
        #[arg(long, value_name = "NAME")]
        by: Option<String>,
        /// Pause a handler the store has not seen yet (no event names it), on purpose: its
        /// first deliveries then wait. Without it, an unknown name is refused as a typo.
        #[arg(long)]
        new: bool,
    },
    /// Let workers claim a paused handler's deliveries again.
    Resume {
        /// The handler.
        name: String,
    },
    /// Close a webhook handler's open circuit breaker now, without waiting for its probe: for
    /// an endpoint known to be back.
    CloseBreaker {
        /// The handler.
        name: String,
    },
    /// Remove a handler's row (its pause, its breaker) once it has no delivery left, so
    /// that `handlers list` and `stats` stop showing it.
    Forget {
        /// The handler.
        name: String,
    },
}

pub(super) async fn run(g: &GlobalArgs, out: &Output, args: HandlersArgs) -> Result<ExitCode> {
    let store = g.open(StoreOptions::admin())?;
    store.require_current().await?;
    match args.command {
        HandlersCommand::List => list(&store, out).await,
        HandlersCommand::Pause {
            name,
            reason,
            by,
            new,
        } => pause(&store, out, &name, reason.as_deref(), by, new).await,
        HandlersCommand::Forget { name } => forget(&store, out, &name).await,
        HandlersCommand::Resume { name } => {
            known_handler(&store, checked(&name)?).await?;
            let changed = store
                .change_handler(checked(&name)?, &|c| c.resume())
                .await?;
            let said = match &changed {
                Some(_) => format!(
                    "resumed handler `{name}`: workers claim its deliveries again within a second"
                ),
                None => format!("handler `{name}` is not paused; nothing changed"),
            };
            report(out, &name, changed, &said)
        }
        HandlersCommand::CloseBreaker { name } => {
            known_handler(&store, checked(&name)?).await?;
            let changed = store
                .change_handler(checked(&name)?, &|c| c.close_breaker())
                .await?;
            let said = match &changed {
                Some(_) => format!(
                    "closed the circuit breaker of `{name}`: workers send to its endpoint again \
                     within a second"
                ),
                None => format!("the circuit breaker of `{name}` is closed; nothing changed"),
            };
            report(out, &name, changed, &said)
        }
    }
}

/// `handlers pause`: `new` pauses a handler no delivery names yet.
async fn pause<S: Store>(
    store: &S,
    out: &Output,
    name: &str,
    reason: Option<&str>,
    by: Option<String>,
    new: bool,
) -> Result<ExitCode> {
    if !new {
        known_handler(store, checked(name)?).await?;
    }
    let by = by.unwrap_or_else(operator);
    let now = Utc::now();
    let since = std::sync::Mutex::new(None);
    let changed = store
        .change_handler(checked(name)?, &|c| {
            *since.lock().expect("since lock") = c.paused_at;
            c.pause(&by, reason, now)
        })
        .await?;
    let since = since.into_inner().expect("since lock");
    let said = match (&changed, since) {
        (Some(_), None) => format!(
            "paused handler `{name}`: workers stop claiming its deliveries within a \
             second; those running finish"
        ),
        (Some(_), Some(at)) => format!(
            "handler `{name}` was paused already, since {}; now by {by}{}",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            reason.map(|r| format!(", for: {r}")).unwrap_or_default()
        ),
        (None, _) => {
            format!("handler `{name}` was paused already, by {by}, for that reason")
        }
    };
    report(out, name, changed, &said)
}

/// `handlers forget`: only a handler no delivery names any more.
async fn forget<S: Store>(store: &S, out: &Output, name: &str) -> Result<ExitCode> {
    known_handler(store, checked(name)?).await?;
    let left = store
        .stats()
        .await?
        .into_iter()
        .find(|s| s.handler == name)
        .map_or(0, |s| s.due + s.scheduled + s.processing + s.dead);
    if left > 0 {
        usage!(
            "handler `{name}` still has {left} deliveries (due, scheduled, running or \
             dead); forget it once none is left"
        );
    }
    let forgot = store.forget_handler(name).await?;
    if out.json {
        out.print_json(&json!({"handler": name, "changed": forgot}))?;
    } else if forgot {
        out.line(format!("forgot handler `{name}`: its row is gone"))?;
    } else {
        out.line(format!("handler `{name}` has no row; nothing changed"))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn checked(name: &str) -> Result<&str> {
    if name.trim().is_empty() {
        usage!("a handler name must not be empty");
    }
    Ok(name)
}

/// Who runs the command, for a pause's record.
pub(super) fn operator() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    format!("{user}@{}", crate::identity::hostname())
}

fn report(out: &Output, name: &str, changed: Option<HandlerRow>, said: &str) -> Result<ExitCode> {
    if out.json {
        out.print_json(&json!({"handler": name, "changed": changed.is_some(), "row": changed}))?;
    } else {
        out.line(said)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One row of `handlers list`.
#[derive(Serialize)]
struct Listed {
    handler: String,
    state: HandlerState,
    paused: bool,
    paused_at: Option<chrono::DateTime<Utc>>,
    paused_by: Option<String>,
    pause_reason: Option<String>,
    due: i64,
    dead: i64,
    lag_seconds: Option<f64>,
    breaker: Breaker,
    /// Requests that failed in a row.
    failures: i32,
    open_until: Option<chrono::DateTime<Utc>>,
    breaker_policy: BreakerPolicy,
}

/// Every handler's statistics beside its row, by name.
pub(super) async fn states<S: Store>(store: &S) -> Result<Vec<(HandlerStats, HandlerRow)>> {
    let mut by_name: BTreeMap<String, (HandlerStats, HandlerRow)> = BTreeMap::new();
    for s in store.stats().await? {
        let c = HandlerRow::new(&s.handler);
        by_name.insert(s.handler.clone(), (s, c));
    }
    for c in store.handler_rows().await? {
        let entry = by_name
            .entry(c.handler.clone())
            .or_insert_with(|| (HandlerStats::empty(&c.handler), HandlerRow::new(&c.handler)));
        entry.1 = c;
    }
    Ok(by_name.into_values().collect())
}

async fn list<S: Store>(store: &S, out: &Output) -> Result<ExitCode> {
    let now = Utc::now();
    let states: Vec<Listed> = states(store)
        .await?
        .into_iter()
        .map(|(s, c)| Listed {
            state: c.state(now),
            paused: c.paused(),
            breaker: c.breaker(now),
            handler: s.handler,
            paused_at: c.paused_at,
            paused_by: c.paused_by,
            pause_reason: c.pause_reason,
            due: s.due,
            dead: s.dead,
            lag_seconds: s.lag_seconds,
            failures: c.failures,
            open_until: c.open_until,
            breaker_policy: c.breaker_policy,
        })
        .collect();
    if out.json {
        out.print_json(&states)?;
        return Ok(ExitCode::SUCCESS);
    }
    if states.is_empty() {
        out.line("no handler has deliveries or a row")?;
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = states
        .iter()
        .map(|h| {
            vec![
                h.handler.clone(),
                h.state.name().into(),
                if out.terminal() {
                    when(h.paused_at)
                } else {
                    time(h.paused_at)
                },
                h.paused_by.clone().unwrap_or_else(|| "-".into()),
                h.due.to_string(),
                h.dead.to_string(),
                h.lag_seconds.map(age).unwrap_or_else(|| "-".into()),
                breaker(h),
                h.pause_reason.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    // The reason and who paused are free text; the rest stays on one line.
    out.table_wrapping(
        &[3, 8],
        &[
            "HANDLER", "STATE", "PAUSED", "BY", "DUE", "DEAD", "LAG", "BREAKER", "REASON",
        ],
        &rows,
    )?;
    Ok(ExitCode::SUCCESS)
}

/// A breaker for a table: `closed`, `closed (3 of 10 failures)`, `open until 14:02:11`,
/// `probe due`.
fn breaker(h: &Listed) -> String {
    match (h.breaker, h.open_until) {
        (Breaker::Closed, _) if h.failures > 0 => format!(
            "closed ({} of {} failures)",
            h.failures, h.breaker_policy.threshold
        ),
        (Breaker::Open, Some(until)) => format!("open until {}", until.format("%H:%M:%S")),
        (b, _) => b.name().into(),
    }
}

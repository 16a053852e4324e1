//! `relaybus publish`: one event from flags, or NDJSON on stdin in atomic batches.

use std::io::{BufRead, IsTerminal};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Map, Value};

use super::{GlobalArgs, Output};
use crate::store::{EventLimits, NewEvent, Store, StoreError, StoreOptions};

/// Publish events: one from flags, or many as NDJSON on standard input.
///
/// With --type, publishes one event built from the flags. Without it, reads one JSON object per
/// line from stdin, `{"id", "type", "key", "payload", "headers", "handlers"}` (`id` generated
/// when absent, `handlers` defaulting to --handler), and publishes them in atomic batches.
/// A bad line stops the command naming the line; nothing of its batch is written, earlier
/// batches stay published. Publishing an event id again adds deliveries only for handlers it
/// never had. Prints the event ids, or a summary with --json.
///
///   relaybus publish --type order.paid --key order-7 --handler billing --data '{"total": 42}'
///   cat events.ndjson | relaybus publish --handler billing
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct PublishArgs {
    /// Event type (publishes one event from flags).
    #[arg(long = "type", value_name = "TYPE")]
    pub event_type: Option<String>,
    /// Ordering key: deliveries of one key are handled in publish order, per handler.
    #[arg(long)]
    pub key: Option<String>,
    /// Event id (generated when absent). Publishing an existing id is idempotent.
    #[arg(long)]
    pub id: Option<String>,
    /// Handler that gets a delivery of the event (repeatable).
    #[arg(long = "handler", value_name = "NAME")]
    pub handlers: Vec<String>,
    /// Header `k=v` (repeatable).
    #[arg(long = "header", value_name = "K=V", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    /// Payload as JSON, or @FILE to read it from a file.
    #[arg(long, value_name = "JSON|@FILE")]
    pub data: Option<String>,
    /// Events per transaction when reading stdin.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u16).range(1..=500))]
    pub batch_size: u16,
    /// Largest payload accepted, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_payload_bytes: usize,
}

fn parse_header(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("`{s}` is not k=v")),
    }
}

fn from_flags(args: &PublishArgs, event_type: &str, limits: &EventLimits) -> Result<NewEvent> {
    let payload = match args.data.as_deref() {
        None => Value::Object(Map::new()),
        Some(data) => {
            let (text, origin) = match data.strip_prefix('@') {
                Some(path) => (
                    std::fs::read_to_string(path)
                        .with_context(|| format!("could not read --data file `{path}`"))?,
                    format!("file `{path}`"),
                ),
                None => (data.to_owned(), "--data".to_owned()),
            };
            serde_json::from_str(&text).with_context(|| format!("{origin} is not valid JSON"))?
        }
    };
    let headers = args
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let id = args
        .id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    NewEvent::new(
        id,
        event_type.to_owned(),
        args.key.clone(),
        payload,
        headers,
        args.handlers.clone(),
        limits,
    )
    .map_err(|reason| {
        StoreError::InvalidEvent {
            position: "from flags".into(),
            reason,
        }
        .into()
    })
}

struct Tally {
    ids: Vec<String>,
    events: usize,
    deliveries: usize,
}

async fn publish_batch(
    store: &impl Store,
    batch: &mut Vec<NewEvent>,
    tally: &mut Tally,
) -> Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    let created = store.publish(batch).await?;
    tally.events += batch.len();
    tally.deliveries += created.len();
    tally.ids.extend(batch.drain(..).map(|e| e.id));
    Ok(())
}

pub(super) async fn run(g: &GlobalArgs, out: &Output, args: PublishArgs) -> Result<ExitCode> {
    let limits = EventLimits {
        max_payload_bytes: args.max_payload_bytes,
    };
    let store = g.open(StoreOptions::publisher())?;
    let mut tally = Tally {
        ids: vec![],
        events: 0,
        deliveries: 0,
    };
    match args.event_type.as_deref() {
        Some(event_type) => {
            let mut batch = vec![from_flags(&args, event_type, &limits)?];
            store.require_current().await?;
            publish_batch(&store, &mut batch, &mut tally).await?;
        }
        None => {
            if args.key.is_some()
                || args.id.is_some()
                || args.data.is_some()
                || !args.headers.is_empty()
            {
                bail!("--key, --id, --data and --header describe one event and need --type; NDJSON lines carry their own fields");
            }
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                bail!(
                    "nothing to publish: give --type (one event), or pipe NDJSON events to stdin"
                );
            }
            store.require_current().await?;
            let mut batch = Vec::with_capacity(args.batch_size.into());
            for (n, line) in stdin.lock().lines().enumerate() {
                let line = line.context("could not read stdin")?;
                if line.trim().is_empty() {
                    continue;
                }
                let event = serde_json::from_str::<Value>(&line)
                    .map_err(|e| format!("invalid JSON: {e}"))
                    .and_then(|v| NewEvent::from_json(v, &args.handlers, &limits));
                match event {
                    Ok(e) => batch.push(e),
                    Err(reason) => {
                        let err = StoreError::InvalidEvent {
                            position: format!("on line {}", n + 1),
                            reason,
                        };
                        return Err(anyhow::anyhow!(
                            "{err} ({} events of earlier batches were published)",
                            tally.events
                        ));
                    }
                }
                if batch.len() == usize::from(args.batch_size) {
                    publish_batch(&store, &mut batch, &mut tally).await?;
                }
            }
            publish_batch(&store, &mut batch, &mut tally).await?;
        }
    }
    if tally.deliveries > 0 {
        // The events are published; a lost wake-up only delays them until the workers' poll.
        if let Err(e) = store.flush_wake_ups().await {
            eprintln!("warning: {e:#}");
        }
    }
    if out.json {
        out.print_json(&json!({
            "events": tally.events,
            "deliveries": tally.deliveries,
            "ids": tally.ids,
        }))?;
    } else {
        for id in &tally.ids {
            out.line(id)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

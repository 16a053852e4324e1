//! `relaybus publish`: one event from flags, or NDJSON on stdin in atomic batches.

use std::collections::HashSet;
use std::io::{BufRead, IsTerminal};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Map, Value};

use super::{GlobalArgs, Output};
use crate::store::prelude::*;
use crate::store::{EventLimits, NewEvent, StoreError, StoreOptions};

/// Publish events: one from flags, or many as NDJSON on standard input.
///
/// With --type, publishes one event built from the flags. Without it, reads one
/// JSON object per line from stdin, `{"id", "type", "key", "payload", "headers",
/// "handlers"}` (`id` generated when absent, `handlers` defaulting to --handler),
/// and publishes them in atomic batches. A bad line stops the command naming the
/// line; nothing of its batch is written, earlier batches stay published, and the
/// message says from which line to go on. Publishing an event id again adds
/// deliveries only for handlers it never had, and only with the same type, key,
/// payload and headers: another content is refused. Prints the event ids, or a
/// summary with --json.
///
///   relaybus publish --type order.paid --key order-7 --handler billing \
///     --data '{"total": 42}'
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
    /// Event id (generated when absent: a ULID). Publishing an existing id is idempotent.
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
    #[arg(long, default_value_t = crate::store::DEFAULT_MAX_PAYLOAD_BYTES)]
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
    let id = args.id.clone().unwrap_or_else(crate::store::new_id);
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

/// What was published so far.
#[derive(Default)]
struct Tally {
    /// Every event id, once, in input order.
    ids: Vec<String>,
    seen: HashSet<String>,
    deliveries: usize,
    /// The last input line whose batch was committed.
    committed_through: usize,
}

impl Tally {
    fn published(&mut self, batch: &[NewEvent], deliveries: usize) {
        for e in batch {
            if self.seen.insert(e.id.clone()) {
                self.ids.push(e.id.clone());
            }
        }
        self.deliveries += deliveries;
    }

    /// What a failure must add: how much of the input is already published, and where to go on.
    fn committed(&self, first_line: usize) -> String {
        match self.committed_through {
            0 => "nothing of the input was published".into(),
            through => format!(
                "{} events of earlier batches (lines 1-{through}) were published; to go on, \
                 publish the input from line {first_line}",
                self.ids.len()
            ),
        }
    }
}

/// NDJSON events, one per line, published in atomic batches. Every failure names its line (or
/// the batch's lines) and what earlier batches committed.
async fn publish_lines(
    store: &impl Store,
    args: &PublishArgs,
    limits: &EventLimits,
    mut input: impl BufRead,
    tally: &mut Tally,
) -> Result<()> {
    let mut batch: Vec<NewEvent> = Vec::with_capacity(args.batch_size.into());
    let mut batch_start = 1;
    let mut number = 0;
    let mut raw = Vec::new();
    loop {
        raw.clear();
        let ended = input
            .read_until(b'\n', &mut raw)
            .context("could not read stdin")?
            == 0;
        if !ended {
            number += 1;
        }
        let event = if ended {
            None
        } else {
            let parsed = std::str::from_utf8(&raw)
                .map_err(|_| "the line is not valid UTF-8".to_owned())
                .and_then(|line| match line.trim() {
                    "" => Ok(None),
                    text => serde_json::from_str::<Value>(text)
                        .map_err(|e| format!("invalid JSON: {e}"))
                        .and_then(|v| NewEvent::from_json(v, &args.handlers, limits))
                        .map(Some),
                });
            match parsed {
                Ok(event) => event,
                Err(reason) => {
                    let err = StoreError::InvalidEvent {
                        position: format!("on line {number}"),
                        reason,
                    };
                    // The batch this line would have joined goes too; it starts here if empty.
                    let resume = if batch.is_empty() {
                        number
                    } else {
                        batch_start
                    };
                    bail!("{err}; {}", tally.committed(resume));
                }
            }
        };
        if let Some(e) = event {
            if batch.is_empty() {
                batch_start = number;
            }
            batch.push(e);
        }
        if !batch.is_empty() && (ended || batch.len() == usize::from(args.batch_size)) {
            let created = store.publish(&batch).await.map_err(|e| {
                anyhow::anyhow!(
                    "could not publish the events of lines {batch_start}-{number}: {e:#}; {}",
                    tally.committed(batch_start)
                )
            })?;
            tally.published(&batch, created.len());
            tally.committed_through = number;
            batch.clear();
        }
        if ended {
            return Ok(());
        }
    }
}

pub(super) async fn run(g: &GlobalArgs, out: &Output, args: PublishArgs) -> Result<ExitCode> {
    let limits = EventLimits {
        max_payload_bytes: args.max_payload_bytes,
    };
    let store = g.open(StoreOptions::publisher())?;
    let mut tally = Tally::default();
    match args.event_type.as_deref() {
        Some(event_type) => {
            let event = from_flags(&args, event_type, &limits)?;
            store.require_current().await?;
            let created = store.publish(std::slice::from_ref(&event)).await?;
            tally.published(&[event], created.len());
        }
        None => {
            if args.key.is_some()
                || args.id.is_some()
                || args.data.is_some()
                || !args.headers.is_empty()
            {
                super::usage!("--key, --id, --data and --header describe one event and need --type; NDJSON lines carry their own fields");
            }
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                super::usage!(
                    "nothing to publish: give --type (one event), or pipe NDJSON events to stdin"
                );
            }
            store.require_current().await?;
            // A file redirected to stdin has a size, so the bar can show how much is left.
            let size = std::os::fd::AsFd::as_fd(&stdin)
                .try_clone_to_owned()
                .ok()
                .and_then(|fd| std::fs::File::from(fd).metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len());
            let bar = out.progress(size, "bytes");
            bar.set_message("publishing");
            let input = bar.wrap_read(stdin.lock());
            let published = publish_lines(&store, &args, &limits, input, &mut tally).await;
            bar.finish_and_clear();
            published?;
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
            "events": tally.ids.len(),
            "deliveries": tally.deliveries,
            "ids": tally.ids,
        }))?;
    } else {
        for id in &tally.ids {
            out.line(id)?;
        }
        if tally.deliveries == 0 && !tally.ids.is_empty() {
            eprintln!(
                "nothing new: every event was published before with these handlers; no delivery \
                 was added"
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

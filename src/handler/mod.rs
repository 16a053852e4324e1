//! Handlers: what runs a delivery. Both kinds get the same JSON envelope and report how the
//! attempt ended; the dispatcher turns that into completion, reschedule, burial, or (when the
//! handler could not even be started) a release without an attempt.

mod shell;
mod webhook;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::Serialize;
use serde_json::value::RawValue;

pub use shell::{raise_open_files_limit, ShellHandler};
pub use webhook::{WebhookHandler, WebhookSecret};

use crate::store::ClaimedDelivery;

/// The one JSON object every handler receives.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Envelope<'a> {
    pub id: &'a str,
    #[serde(rename = "type")]
    pub event_type: &'a str,
    pub key: Option<&'a str>,
    pub payload: &'a RawValue,
    pub headers: &'a RawValue,
    pub created_at: String,
    pub handler: &'a str,
    pub delivery_id: &'a str,
    /// Counts from 1; a redelivery after a lost lease has a higher number.
    pub attempt: i32,
}

impl<'a> Envelope<'a> {
    pub fn of(d: &'a ClaimedDelivery) -> Self {
        Envelope {
            id: &d.event_id,
            event_type: &d.event_type,
            key: d.key.as_deref(),
            payload: &d.payload,
            headers: &d.headers,
            created_at: d
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            handler: &d.handler,
            delivery_id: &d.token.delivery_id,
            attempt: d.attempts + 1,
        }
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    /// A failed attempt: retried with backoff (or after `retry_after`), buried at the last one.
    Failed {
        error: String,
        retry_after: Option<Duration>,
    },
    /// A failed attempt whose endpoint did not answer, or answered with a server error: retried
    /// like `Failed`, and counted by the handler's circuit breaker.
    Unavailable {
        error: String,
        retry_after: Option<Duration>,
    },
    /// The handler says retrying cannot help (exit 65, HTTP 410): buried at once.
    Rejected {
        error: String,
    },
    /// The handler could not be started for lack of resources (no process or file descriptor
    /// left): no attempt was made, and none is charged.
    NotStarted {
        error: String,
    },
}

pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

pub trait Handler: Send + Sync {
    /// Runs one attempt. Dropping the future aborts it (the shell handler kills its process
    /// group).
    fn handle<'a>(&'a self, delivery: &'a ClaimedDelivery) -> HandlerFuture<'a>;
}

/// Completes every delivery without running anything: the cost of relaybus and the store alone,
/// for benchmarks, or to discard a handler's backlog on purpose.
pub struct NoopHandler;

impl Handler for NoopHandler {
    fn handle<'a>(&'a self, _: &'a ClaimedDelivery) -> HandlerFuture<'a> {
        Box::pin(std::future::ready(Outcome::Completed))
    }
}

/// The last `max` bytes of a text, cut at a character boundary.
pub(crate) fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

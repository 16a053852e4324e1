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
    /// The gate said no at the last moment: nothing left the worker (a process started for it
    /// was killed before it got its envelope). The dispatcher asks the store before it tries
    /// again.
    Withheld,
}

pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Outcome> + Send + 'a>>;

/// Asked by a handler at the last moment before a delivery leaves the worker (before its
/// envelope is written to the started process, before its request is sent): false when the
/// worker cannot vouch for the delivery's lease by its own clock any more (the process was
/// stopped meanwhile, or starting the command took long), and the handler then withholds it.
pub type Gate<'a> = &'a (dyn Fn() -> bool + Send + Sync);

pub trait Handler: Send + Sync {
    /// Runs one attempt, after asking `gate`. Dropping the future aborts it (the shell handler
    /// kills its process group).
    fn handle<'a>(&'a self, delivery: &'a ClaimedDelivery, gate: Gate<'a>) -> HandlerFuture<'a>;
}

/// Completes every delivery without running anything: the cost of relaybus and the store alone,
/// for benchmarks, or to discard a handler's backlog on purpose.
pub struct NoopHandler;

impl Handler for NoopHandler {
    fn handle<'a>(&'a self, _: &'a ClaimedDelivery, gate: Gate<'a>) -> HandlerFuture<'a> {
        let outcome = if gate() {
            Outcome::Completed
        } else {
            Outcome::Withheld
        };
        Box::pin(std::future::ready(outcome))
    }
}

/// The last bytes of an output a handler produces, however much it produces: a handler's stderr
/// or an endpoint's error body becomes `last_error` and the logs, and only its end is kept, so a
/// handler that writes gigabytes costs the worker a few kilobytes.
pub(crate) struct Tail {
    keep: usize,
    bytes: Vec<u8>,
}

impl Tail {
    pub(crate) fn new(keep: usize) -> Self {
        Self {
            keep,
            bytes: Vec::new(),
        }
    }

    /// Appends `more`, dropping what falls out of the kept end (in steps, so that a stream of
    /// small writes does not shift the buffer at each).
    pub(crate) fn push(&mut self, more: &[u8]) {
        let more = &more[more.len().saturating_sub(self.keep)..];
        self.bytes.extend_from_slice(more);
        if self.bytes.len() > 2 * self.keep {
            self.bytes.drain(..self.bytes.len() - self.keep);
        }
    }

    /// The kept end as text, trimmed: at most `keep` bytes, from a character's first byte.
    pub(crate) fn text(&self) -> String {
        let mut start = self.bytes.len().saturating_sub(self.keep);
        while self.bytes.get(start).is_some_and(|b| b & 0xC0 == 0x80) {
            start += 1;
        }
        String::from_utf8_lossy(&self.bytes[start..])
            .trim()
            .to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::Tail;

    #[test]
    fn a_tail_keeps_the_last_bytes_from_a_character_s_start() {
        let mut tail = Tail::new(9);
        for piece in ["first line\n", "é", "tail end\n"] {
            tail.push(piece.as_bytes());
        }
        assert_eq!(tail.text(), "tail end");
        let mut tail = Tail::new(4);
        tail.push("xéé".as_bytes());
        // The last 4 bytes are "éé"; one more would cut the first é.
        assert_eq!(tail.text(), "éé");
        tail.push(b"abc");
        // "é" is 2 bytes: of "\xA9abc" the continuation byte is skipped.
        assert_eq!(tail.text(), "abc");
        let mut big = Tail::new(3);
        big.push(&[b'x'; 10_000]);
        assert_eq!(big.bytes.len(), 3);
    }
}

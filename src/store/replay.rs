//! Replay, the same on every store: a keyset walk over the events in publish order (creation
//! time, then id) gives each matching event one delivery for a handler, a batch per transaction.
//! The rules live here; each engine reads a page (`History::events`) and writes a batch
//! (`History::replay_events`), re-checking in its transaction what the page said, so a
//! concurrent publish or replay never makes two deliveries of one event for one handler.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{Result, Store};

/// Which events a listing or a replay takes; the criteria combine with AND.
#[derive(Clone, Debug, Default)]
pub struct EventFilter {
    /// Types, each a pattern where `*` stands for any text; any of them matches.
    pub types: Vec<String>,
    pub key: Option<String>,
    /// Only events published for this handler.
    pub handler: Option<String>,
    /// Only these events.
    pub ids: Vec<String>,
    /// From this position on, inclusive.
    pub since: Option<EventPosition>,
    /// Up to this position, inclusive.
    pub until: Option<EventPosition>,
    /// Strictly after this position: the next page, or where an interrupted walk stopped.
    pub after: Option<EventPosition>,
}

/// A place in publish order: an event (its creation time and id), or a time, which stands for
/// every event created at it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventPosition {
    pub at: DateTime<Utc>,
    pub id: Option<String>,
}

/// One event as listed, with the state of its delivery for the handler a replay looks at.
#[derive(Clone, Debug, Serialize)]
pub struct EventRow {
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub key: Option<String>,
    pub created_at: DateTime<Utc>,
    /// Every handler the event ever had a delivery for.
    pub handlers: Vec<String>,
    #[serde(skip)]
    pub target: TargetState,
}

impl EventRow {
    pub fn position(&self) -> EventPosition {
        EventPosition {
            at: self.created_at,
            id: Some(self.id.clone()),
        }
    }
}

/// An event's delivery for one handler, as stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TargetState {
    /// No delivery row.
    #[default]
    Absent,
    /// Pending and due (or running).
    Pending,
    /// Pending, due later.
    Scheduled,
    Dead,
    /// A completed row kept from 0.1.
    Completed,
}

/// What a replay does, and how.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub handler: String,
    pub filter: EventFilter,
    /// Also events the handler had a delivery for that completed.
    pub again: bool,
    /// Events per transaction.
    pub batch: i64,
    /// Count only; write nothing.
    pub dry_run: bool,
}

/// What a replay did (or, dry, would do) so far.
#[derive(Clone, Debug, Default)]
pub struct ReplayTally {
    /// Events the filters matched and the walk read.
    pub matched: i64,
    /// Events given a delivery for the handler (dry: that would be).
    pub replayed: i64,
    /// Events skipped because their delivery for the handler is pending and due or running, is
    /// due later, or is dead (`dead requeue` brings it back).
    pub skipped_pending: i64,
    pub skipped_scheduled: i64,
    pub skipped_dead: i64,
    /// Events skipped because the handler had a delivery for them that completed (`--again`
    /// replays them).
    pub skipped_delivered: i64,
    /// Replayed events by type.
    pub by_type: BTreeMap<String, i64>,
    /// The first and the last event replayed, in publish order.
    pub first_event: Option<String>,
    pub last_event: Option<String>,
    /// The lanes the new deliveries go to.
    pub lanes: BTreeSet<i16>,
    /// Where the walk is: the last event it read.
    pub position: Option<EventPosition>,
}

/// Whether an event in state `target`, published for the handler or not (`named`), gets a
/// delivery.
fn takes(target: TargetState, named: bool, again: bool) -> bool {
    match target {
        TargetState::Absent => again || !named,
        TargetState::Completed => again,
        TargetState::Pending | TargetState::Scheduled | TargetState::Dead => false,
    }
}

impl ReplayTally {
    fn skip(&mut self, target: TargetState) {
        match target {
            TargetState::Pending => self.skipped_pending += 1,
            TargetState::Scheduled => self.skipped_scheduled += 1,
            TargetState::Dead => self.skipped_dead += 1,
            TargetState::Absent | TargetState::Completed => self.skipped_delivered += 1,
        }
    }

    fn replayed(&mut self, e: &EventRow) {
        self.replayed += 1;
        *self.by_type.entry(e.event_type.clone()).or_default() += 1;
        self.first_event.get_or_insert_with(|| e.id.clone());
        self.last_event = Some(e.id.clone());
        self.lanes
            .insert(super::lane::lane_of(e.key.as_deref(), &e.id));
    }
}

/// Runs a replay (or counts one, dry). After every batch `go_on` sees the totals so far; when it
/// returns false the walk stops there, every batch before it committed.
pub async fn replay<S: Store>(
    store: &S,
    options: &ReplayOptions,
    mut go_on: impl FnMut(&ReplayTally) -> bool,
) -> Result<ReplayTally> {
    let mut tally = ReplayTally::default();
    let mut filter = options.filter.clone();
    let handler = options.handler.as_str();
    loop {
        let page = store.events(&filter, options.batch, Some(handler)).await?;
        let Some(last) = page.last() else {
            return Ok(tally);
        };
        filter.after = Some(last.position());
        let chosen: Vec<EventRow> = page
            .iter()
            .filter(|e| {
                let named = e.handlers.iter().any(|h| h == handler);
                takes(e.target, named, options.again) || {
                    tally.skip(e.target);
                    false
                }
            })
            .cloned()
            .collect();
        let given: BTreeSet<String> = if options.dry_run || chosen.is_empty() {
            chosen.iter().map(|e| e.id.clone()).collect()
        } else {
            store
                .replay_events(handler, &chosen, options.again)
                .await?
                .into_iter()
                .collect()
        };
        for e in &chosen {
            if given.contains(&e.id) {
                tally.replayed(e);
            } else {
                // A live delivery appeared since the page was read: another publish or replay
                // gave the event its delivery first.
                tally.skip(TargetState::Pending);
            }
        }
        tally.matched += page.len() as i64;
        tally.position = filter.after.clone();
        if (page.len() as i64) < options.batch || !go_on(&tally) {
            return Ok(tally);
        }
    }
}

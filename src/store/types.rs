//! Domain types shared by every store and by the commands.

use serde::Serialize;
use serde_json::{Map, Value};

use super::StoreError;

/// A new event or delivery id: a time-ordered UUIDv7 written as a ULID (26 characters of
/// Crockford base32: digits and upper-case letters, in creation order wherever digits sort
/// before letters and letters alphabetically). Shorter than the UUID's 36 characters, it keeps
/// delivery rows, their key and lanes' in-flight lists smaller.
pub fn new_id() -> String {
    ulid::Ulid::from(uuid::Uuid::now_v7()).to_string()
}

/// A JSON document kept as its text.
pub type RawJson = Box<serde_json::value::RawValue>;

/// The longest id, type, key or handler name: every index entry of a delivery must fit in a
/// third of a page.
pub const MAX_NAME_BYTES: usize = 1024;

/// The largest payload `publish` accepts unless told otherwise (`--max-payload-bytes`), and the
/// limit of the SQL publish functions: bytes of its compact JSON text.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1 << 20;

fn holds_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
        _ => false,
    }
}

/// An event to publish, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    pub id: String,
    pub event_type: String,
    pub key: Option<String>,
    pub payload: Value,
    pub headers: Map<String, Value>,
    pub handlers: Vec<String>,
}

/// Why a republish was refused, for an event published before.
pub const CONFLICT_WITH_STORED: &str = "was published before with another type, key, payload or \
     headers (publish it again only with the same content, to add handlers; or use a new id)";

impl NewEvent {
    /// Whether two events with one id say the same: a republish may add handlers, nothing else.
    pub fn same_content(&self, other: &NewEvent) -> bool {
        (&self.event_type, &self.key, &self.payload, &self.headers)
            == (
                &other.event_type,
                &other.key,
                &other.payload,
                &other.headers,
            )
    }

    /// A batch with each event once: an event named twice with the same content stands once with
    /// the handlers of both, as a republish would add them; with other content it is refused.
    pub fn unite(events: &[NewEvent]) -> Result<Vec<NewEvent>, StoreError> {
        let mut united: Vec<NewEvent> = Vec::with_capacity(events.len());
        let mut index = std::collections::HashMap::with_capacity(events.len());
        for e in events {
            match index.get(&e.id) {
                Some(&i) => {
                    let first: &mut NewEvent = &mut united[i];
                    if !first.same_content(e) {
                        return Err(StoreError::ConflictingEvent {
                            id: e.id.clone(),
                            why: "appears twice in the batch with different content",
                        });
                    }
                    for h in &e.handlers {
                        if !first.handlers.contains(h) {
                            first.handlers.push(h.clone());
                        }
                    }
                }
                None => {
                    index.insert(e.id.clone(), united.len());
                    united.push(e.clone());
                }
            }
        }
        Ok(united)
    }
}

/// A delivery created by a publish (handlers the event already had create none).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PublishedDelivery {
    pub event_id: String,
    pub handler: String,
    pub delivery_id: String,
}

/// Limits applied to events before they are published.
#[derive(Clone, Debug)]
pub struct EventLimits {
    /// Largest payload, in bytes of its JSON text.
    pub max_payload_bytes: usize,
}

impl NewEvent {
    /// Validates one event given as JSON: `{"id", "type", "key", "payload", "headers",
    /// "handlers"}`. A missing `id` is generated (time-ordered UUID); missing `handlers` take
    /// `default_handlers`. The error says what is wrong, without position (the caller adds it).
    pub fn from_json(
        value: Value,
        default_handlers: &[String],
        limits: &EventLimits,
    ) -> Result<NewEvent, String> {
        let Value::Object(mut obj) = value else {
            return Err("expected a JSON object".into());
        };
        for field in obj.keys() {
            if !["id", "type", "key", "payload", "headers", "handlers"].contains(&field.as_str()) {
                return Err(format!(
                    "unknown field `{field}` (expected id, type, key, payload, headers, handlers)"
                ));
            }
        }
        let text = |obj: &mut Map<String, Value>, field: &str| -> Result<Option<String>, String> {
            match obj.remove(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s.is_empty() => Err(format!("`{field}` is empty")),
                Some(Value::String(s)) => Ok(Some(s)),
                Some(_) => Err(format!("`{field}` must be a string")),
            }
        };
        let id = text(&mut obj, "id")?.unwrap_or_else(new_id);
        let event_type = text(&mut obj, "type")?.ok_or("missing `type`")?;
        let key = text(&mut obj, "key")?;
        let payload = obj.remove("payload").unwrap_or(Value::Null);
        let headers = match obj.remove("headers") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m,
            Some(_) => return Err("`headers` must be an object".into()),
        };
        let handlers = match obj.remove("handlers") {
            None | Some(Value::Null) => default_handlers.to_vec(),
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|h| match h {
                    Value::String(s) if !s.is_empty() => Ok(s),
                    _ => Err("`handlers` must hold non-empty strings".to_owned()),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("`handlers` must be an array of strings".into()),
        };
        NewEvent::new(id, event_type, key, payload, headers, handlers, limits)
    }

    /// Checks an event's fields and builds it.
    pub fn new(
        id: String,
        event_type: String,
        key: Option<String>,
        payload: Value,
        headers: Map<String, Value>,
        mut handlers: Vec<String>,
        limits: &EventLimits,
    ) -> Result<NewEvent, String> {
        if handlers.is_empty() {
            return Err("no handlers: give `handlers` (or --handler)".into());
        }
        let mut seen = std::collections::HashSet::new();
        handlers.retain(|h| seen.insert(h.clone()));
        // What the database would reject, named before anything is sent: a NUL character, which
        // text and jsonb cannot hold, and a name too long for an index entry.
        let names = [
            ("id", Some(&id)),
            ("type", Some(&event_type)),
            ("key", key.as_ref()),
        ];
        let handler_names = handlers.iter().map(|h| ("handler", Some(h)));
        for (field, value) in names.into_iter().chain(handler_names) {
            let Some(value) = value else { continue };
            if value.len() > MAX_NAME_BYTES {
                return Err(format!(
                    "`{field}` is {} bytes, over the limit of {MAX_NAME_BYTES}",
                    value.len()
                ));
            }
            if value.contains('\0') {
                return Err(format!(
                    "`{field}` holds a NUL character, which PostgreSQL cannot store"
                ));
            }
        }
        let headers_value = Value::Object(headers);
        for (field, value) in [("payload", &payload), ("headers", &headers_value)] {
            if holds_nul(value) {
                return Err(format!(
                    "`{field}` holds a NUL character (\\u0000), which PostgreSQL cannot store"
                ));
            }
        }
        let Value::Object(headers) = headers_value else {
            unreachable!("made from an object just above")
        };
        let size = serde_json::to_vec(&payload).map(|v| v.len()).unwrap_or(0);
        if size > limits.max_payload_bytes {
            return Err(format!(
                "payload is {size} bytes, over the limit of {} (--max-payload-bytes)",
                limits.max_payload_bytes
            ));
        }
        Ok(NewEvent {
            id,
            event_type,
            key,
            payload,
            headers,
            handlers,
        })
    }
}

/// The fencing token of one claimed delivery: `lane:epoch:claims`. Every state change checks
/// that the lane still has this epoch and lists the delivery in flight, and that the delivery's
/// claims counter is unchanged, so an older attempt's lease can never touch a newer one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeaseToken {
    pub delivery_id: String,
    pub lane: i16,
    pub epoch: i64,
    pub claims: i32,
    /// Where the claim found the delivery's row, in the store's terms (PostgreSQL: its tuple
    /// id), so that completing it needs no index lookup. Not part of the fence: the row found
    /// there must still be the delivery, with these claims. None where the store has no such
    /// address or the token was not made by a claim.
    #[serde(skip)]
    pub row: Option<u64>,
}

impl std::fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.lane, self.epoch, self.claims)
    }
}

/// A delivery handed to a worker, with its event.
#[derive(Clone, Debug)]
pub struct ClaimedDelivery {
    pub token: LeaseToken,
    pub handler: String,
    /// Attempts already spent; this one is `attempts + 1`.
    pub attempts: i32,
    pub event_id: String,
    pub event_type: String,
    pub key: Option<String>,
    /// The event's payload and headers as JSON text: a worker passes them on to its handlers
    /// and never looks inside.
    pub payload: RawJson,
    pub headers: RawJson,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// What a claim asks for.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// The worker instance: unique per process start, so a restarted worker never adopts the
    /// live lanes of its dead predecessor.
    pub owner: String,
    pub handlers: Vec<String>,
    /// Per handler (same order): a takeover that charges the last attempt buries the delivery.
    pub max_attempts: Vec<i32>,
    pub batch: i64,
    /// How many free or expired lanes to take at most in this claim; more when the lanes it
    /// holds have no room for the whole batch (PostgreSQL caps a lane's in-flight list), as
    /// many as the rest of the batch needs.
    pub new_lanes: i64,
    pub lease: std::time::Duration,
    /// Deliveries of earlier claims the worker still has: running, or waiting for their
    /// completion to commit. The rest of its lanes' in-flight lists is dropped.
    pub outstanding: Vec<String>,
    /// The lanes this claim holds and takes: a worker's claim streams each keep to their own.
    pub lanes: LaneShare,
    /// The lanes of the share this worker holds, as the previous claim reported them
    /// (`ClaimStats::held`), so that the store reads only those; `None` (the first claim, one
    /// after a failure, whose outcome is unknown, and one every tenth of the lease, at least a
    /// second apart) makes it find them by owner, and take over the lanes a dead worker left
    /// with deliveries in flight and nothing due, which PostgreSQL looks for only then.
    pub held: Option<Vec<i16>>,
}

/// The lanes whose number is `index` modulo `count`: one claim stream's share of a worker's
/// lanes. A stream alone writes the in-flight lists of its lanes, so its claims never wait for
/// another stream's and never drop what another stream has just claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneShare {
    pub count: i16,
    pub index: i16,
}

impl LaneShare {
    /// Every lane: a worker with one stream.
    pub const ALL: LaneShare = LaneShare { count: 1, index: 0 };

    pub fn holds(&self, lane: i32) -> bool {
        lane % i32::from(self.count) == i32::from(self.index)
    }
}

/// What a claim found, beyond the deliveries.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ClaimStats {
    /// Deliveries charged one attempt because their lane was taken over.
    pub charged: i64,
    /// Free or expired lanes taken by this claim.
    pub lanes_taken: i64,
    /// The lanes of the share the worker holds once the claim is recorded, for the next claim;
    /// `None` from a store that reads every lane anyway.
    pub held: Option<Vec<i16>>,
}

/// A failed attempt, as the dispatcher reports it. The store decides what follows: the last
/// attempt of a handler is buried wherever it ends (a failure, or a takeover after a crash), so
/// the rule lives with the store, once.
#[derive(Clone, Debug)]
pub enum Failure {
    /// Due again after `delay`, unless this was attempt `max_attempts`: then buried.
    Retry {
        delay: std::time::Duration,
        max_attempts: i32,
    },
    /// The handler says retrying cannot help: buried at once.
    Reject,
    /// No attempt was made (the handler could not be started): due again after `delay`, and no
    /// attempt is charged.
    Postpone { delay: std::time::Duration },
}

impl Failure {
    /// What the failure adds to the delivery's attempts, the most it may have before it is
    /// buried, whether it is buried whatever its attempts, and when it is due again.
    pub fn terms(&self) -> (i32, i32, bool, std::time::Duration) {
        match *self {
            Failure::Retry {
                delay,
                max_attempts,
            } => (1, max_attempts, false, delay),
            Failure::Reject => (1, i32::MAX, true, std::time::Duration::ZERO),
            Failure::Postpone { delay } => (0, i32::MAX, false, delay),
        }
    }
}

/// How a failed attempt was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailOutcome {
    Rescheduled,
    /// Dead letter: never claimed again until requeued.
    Buried,
    /// The token was no longer valid (the lane was taken over): nothing was written.
    LeaseLost,
}

/// How a handler's statement ended, run in the transaction that completes its delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatementOutcome {
    /// The statement ran and the delivery was completed: both committed.
    Completed,
    /// The statement failed, with the database's message: nothing of it committed, and the
    /// delivery is still in flight for its failed attempt to be recorded.
    Failed(String),
    /// The token was no longer valid: nothing ran.
    LeaseLost,
}

/// Statements (or operations) a store sent, and how many of them the server had to parse.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientCounts {
    pub statements: u64,
    pub parses: u64,
}

/// A delivery's state as operators see it. `processing` is derived: a pending delivery listed
/// in its lane's in-flight set under a live lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    Pending,
    Processing,
    Dead,
    Completed,
}

/// What an id names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    Delivery,
    Event,
}

impl Record {
    pub fn name(self) -> &'static str {
        match self {
            Record::Delivery => "delivery",
            Record::Event => "event",
        }
    }
}

/// A name an event may carry: a handler it was published for, or its type.
#[derive(Clone, Copy, Debug)]
pub enum EventName<'a> {
    Handler(&'a str),
    Type(&'a str),
}

/// What `deliveries list` selects.
#[derive(Clone, Debug, Default)]
pub struct DeliveryFilter {
    pub status: Option<DeliveryStatus>,
    pub handler: Option<String>,
    pub key: Option<String>,
    pub event_id: Option<String>,
    pub event_type: Option<String>,
    /// Only deliveries created after this one (by id, which is creation order): the next page.
    pub after: Option<String>,
    pub limit: i64,
}

impl DeliveryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Processing => "processing",
            DeliveryStatus::Dead => "dead",
            DeliveryStatus::Completed => "completed",
        }
    }
}

/// One delivery as listed. Completion-history entries have no delivery id.
#[derive(Clone, Debug, Serialize)]
pub struct DeliveryRow {
    pub id: Option<String>,
    pub event_id: String,
    pub event_type: String,
    pub handler: String,
    pub status: String,
    pub attempts: i32,
    pub key: Option<String>,
    pub sequence: Option<i64>,
    pub lane: Option<i16>,
    pub available_at: Option<chrono::DateTime<chrono::Utc>>,
    pub last_error: Option<String>,
    pub created_at: Option<chrono::DateTime<chrono::Utc>>,
    pub updated_at: Option<chrono::DateTime<chrono::Utc>>,
    pub completed_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// A delivery with its lane and, while it runs, its lease.
#[derive(Clone, Debug, Serialize)]
pub struct DeliveryDetail {
    #[serde(flatten)]
    pub delivery: DeliveryRow,
    pub claims: i32,
    pub lane_owner: Option<String>,
    pub lane_epoch: i64,
    pub lease_expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// `lane:epoch:claims` (a `LeaseToken`) while the delivery is processing.
    pub lease_token: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct EventDetail {
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub key: Option<String>,
    pub payload: Value,
    pub headers: Value,
    /// Every handler the event ever had a delivery for.
    pub handlers: Vec<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// What is left: deliveries not completed yet (and 0.1 completed rows).
    pub deliveries: Vec<DeliveryRow>,
}

/// Which dead deliveries a requeue selects; the criteria combine with AND.
#[derive(Clone, Debug, Default)]
pub struct RequeueSelector {
    pub ids: Vec<String>,
    pub handler: Option<String>,
    pub event_type: Option<String>,
    pub error_contains: Option<String>,
    /// Select every dead delivery (required when nothing else is given).
    pub all: bool,
}

#[derive(Clone, Debug)]
pub struct PurgeOptions {
    /// Completed rows kept from 0.1, completion history and events without deliveries older
    /// than this.
    pub completed_older_than: Option<std::time::Duration>,
    /// Dead deliveries last updated longer ago than this.
    pub dead_older_than: Option<std::time::Duration>,
    /// Rows per statement, so no statement holds its locks for long.
    pub batch: i64,
}

impl PurgeOptions {
    pub const AGE_BOUNDS: crate::bounds::Bounds = crate::bounds::Bounds::UP_TO_A_CENTURY;
}

#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct PurgeCounts {
    pub dead: i64,
    pub completed: i64,
    pub history: i64,
    pub events: i64,
}

impl PurgeCounts {
    pub fn of_mut(&mut self, kind: PurgeKind) -> &mut i64 {
        match kind {
            PurgeKind::Dead => &mut self.dead,
            PurgeKind::Completed => &mut self.completed,
            PurgeKind::History => &mut self.history,
            PurgeKind::Events => &mut self.events,
        }
    }
}

/// A database session that holds what one of the store's sessions waits for, as the server
/// describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockingSession {
    pub pid: i32,
    pub user: String,
    pub application: String,
    pub state: String,
    /// How long its transaction has been open.
    pub age: String,
    /// Its last statement, shortened.
    pub query: String,
}

impl std::fmt::Display for BlockingSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            pid,
            user,
            application,
            state,
            age,
            query,
        } = self;
        write!(
            f,
            "pid {pid} (user {user}, application `{application}`, {state} for {age}, last \
             statement `{query}`)"
        )
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct LaneRow {
    pub lane: i16,
    pub owner: Option<String>,
    pub epoch: i64,
    pub lease_expires_at: Option<chrono::DateTime<chrono::Utc>>,
    pub expired: bool,
    pub in_flight: i64,
    /// Deliveries a takeover moved out of flight whose attempt it has not charged yet: on
    /// MongoDB, another transaction (a dead worker's) still writes them, and they wait until the
    /// server ends it. Always 0 on PostgreSQL, whose takeover charges in the same statement.
    pub uncharged: i64,
    pub pending: i64,
    pub oldest_due: Option<chrono::DateTime<chrono::Utc>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct HandlerStats {
    pub handler: String,
    /// Pending and due now (not running).
    pub due: i64,
    /// Pending, due later (backoff or Retry-After).
    pub scheduled: i64,
    pub processing: i64,
    pub dead: i64,
    /// From the completion history and 0.1 completed rows; 0 without history.
    pub completed: i64,
    /// Age of the oldest due delivery, in seconds.
    pub lag_seconds: Option<f64>,
}

impl HandlerStats {
    /// A handler without deliveries.
    pub fn empty(handler: &str) -> Self {
        Self {
            handler: handler.to_owned(),
            due: 0,
            scheduled: 0,
            processing: 0,
            dead: 0,
            completed: 0,
            lag_seconds: None,
        }
    }
}

/// What holds one handler back: its dead letters, newest first, and its keys with the most
/// pending deliveries (a key's deliveries run one at a time, so a long one is a queue of its
/// own).
#[derive(Clone, Debug, Default, Serialize)]
pub struct HandlerBacklog {
    pub dead: Vec<DeliveryRow>,
    pub keys: Vec<KeyBacklog>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KeyBacklog {
    pub key: String,
    pub pending: i64,
    /// When the oldest of them was due.
    pub oldest_due: Option<chrono::DateTime<chrono::Utc>>,
}

/// One purge batch: rows deleted, and whether another batch may find more.
#[derive(Clone, Copy, Debug)]
pub struct PurgeBatch {
    pub deleted: i64,
    pub more: bool,
}

/// What one purge batch deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PurgeKind {
    Dead,
    Completed,
    History,
    Events,
}

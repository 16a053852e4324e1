//! One benchmark process: a publisher, a dispatcher, a preloader, or a raw-SQL floor. The
//! coordinator starts them all with the same start time, so their windows line up; each prints
//! one JSON report on stdout and writes what it handled (or published, in mixed load) to a file,
//! outside the database, so checking exactness adds no database writes.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};
use tokio_postgres::types::Type;

use super::cells::{Config, Keys};
use crate::dispatch::report::{LogFormat, Reporter};
use crate::dispatch::{self, Backoff, DispatchOptions, HandlerSpec, Shutdown};
use crate::handler::{Handler, HandlerFuture, Outcome};
use crate::store::lane::lane_of;
use crate::store::postgres::{ConnectOptions, PgStore, StoreOptions};
use crate::store::{ClaimedDelivery, NewEvent, Store, StoreError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Publish,
    MixedPublish,
    Dispatch,
    FloorPublish,
    FloorDispatch,
}

/// The store a worker connects to: the coordinator's global options, so `--prefix` and the
/// statement mode reach every process.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoreTarget {
    /// None: the libpq variables the worker inherits.
    pub database_url: Option<String>,
    pub schema: String,
    pub prefix: String,
    pub prepared_statements: bool,
}

/// What one worker process does. The coordinator writes it as JSON to the worker's stdin (never
/// in its command line, where a password in the URL would be visible to every user).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerPlan {
    pub target: StoreTarget,
    pub role: Role,
    /// Unix milliseconds at which the warm-up starts; the window follows it.
    pub start_at_ms: u64,
    pub warmup: Duration,
    pub window: Duration,
    /// Distinguishes publishers, so their event ids never collide.
    pub index: u32,
    pub batch: u32,
    pub handlers: u32,
    pub keys: Keys,
    pub config: Config,
    /// Events per second, for a mixed publisher.
    pub events: u64,
    /// Where in the interval between its events a mixed publisher starts, as a fraction: the
    /// publishers of a cell are spread over it, so that together they offer an even stream
    /// instead of bursts of one event each.
    pub phase: f64,
    pub records: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WorkerReport {
    /// Events published or deliveries handled inside the window.
    pub units_window: u64,
    pub units_total: u64,
    /// Statements and parses this process sent.
    pub statements: u64,
    pub parses: u64,
    /// Publish call latencies inside the window, microseconds (publishers only).
    pub latencies_us: Vec<u64>,
    /// How far into the window a floor dispatcher's backlog lasted, when it ran out early: its
    /// rate is taken over the time it had work, so the floor needs no backlog for the whole
    /// window.
    #[serde(default)]
    pub ran_out_after_us: Option<u64>,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The benchmark's event: 160 bytes of payload, like the seed's.
pub fn event(id: String, n: u64, handlers: u32, keys: Keys) -> NewEvent {
    NewEvent {
        id,
        event_type: "bench.event".into(),
        key: keys.key(n),
        payload: serde_json::json!({ "pad": "x".repeat(150) }),
        headers: Default::default(),
        handlers: (0..handlers).map(|h| format!("h{h}")).collect(),
    }
}

struct Window {
    start_us: u64,
    end_us: u64,
}

impl WorkerPlan {
    fn window(&self) -> Window {
        let start = self.start_at_ms * 1000 + self.warmup.as_micros() as u64;
        Window {
            start_us: start,
            end_us: start + self.window.as_micros() as u64,
        }
    }

    async fn wait_for_start(&self) {
        let start = self.start_at_ms * 1000;
        let now = now_us();
        if start > now {
            tokio::time::sleep(Duration::from_micros(start - now)).await;
        }
    }
}

fn report(store: &PgStore, mut r: WorkerReport) -> WorkerReport {
    (r.statements, r.parses) = store.statement_counts();
    r
}

pub async fn run(store: PgStore, plan: WorkerPlan) -> Result<WorkerReport, StoreError> {
    match plan.role {
        Role::Publish => publish(store, plan).await,
        Role::MixedPublish => mixed_publish(store, plan).await,
        Role::Dispatch => dispatch_worker(store, plan).await,
        Role::FloorPublish => floor_publish(store, plan).await,
        Role::FloorDispatch => floor_dispatch(store, plan).await,
    }
}

/// Publishes batches back to back until the window ends.
async fn publish(store: PgStore, plan: WorkerPlan) -> Result<WorkerReport, StoreError> {
    let w = plan.window();
    let mut r = WorkerReport::default();
    plan.wait_for_start().await;
    let mut n = 0u64;
    while now_us() < w.end_us {
        let batch: Vec<NewEvent> = (n..n + u64::from(plan.batch))
            .map(|i| event(format!("p{}-{i}", plan.index), i, plan.handlers, plan.keys))
            .collect();
        n += u64::from(plan.batch);
        let t0 = now_us();
        store.publish(&batch).await?;
        let t1 = now_us();
        r.units_total += batch.len() as u64;
        if t1 >= w.start_us && t1 < w.end_us {
            r.units_window += batch.len() as u64;
            r.latencies_us.push(t1 - t0);
        }
    }
    Ok(report(&store, r))
}

/// Publishes one event per transaction at a fixed rate and records each commit time, and
/// whether the commit fell inside the window.
async fn mixed_publish(store: PgStore, plan: WorkerPlan) -> Result<WorkerReport, StoreError> {
    let w = plan.window();
    let store = Arc::new(store);
    let committed = Arc::new(Mutex::new(Vec::new()));
    plan.wait_for_start().await;
    let interval = Duration::from_secs_f64(1.0 / plan.events.max(1) as f64);
    tokio::time::sleep(interval.mul_f64(plan.phase)).await;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = tokio::task::JoinSet::new();
    let mut n = 0u64;
    while now_us() < w.end_us {
        ticker.tick().await;
        let e = event(format!("m{}-{n}", plan.index), n, 1, Keys::None);
        n += 1;
        let (store, committed) = (Arc::clone(&store), Arc::clone(&committed));
        tasks.spawn(async move {
            let id = e.id.clone();
            let result = store.publish(&[e]).await;
            if result.is_ok() {
                committed.lock().expect("records").push((id, now_us()));
            }
            result.map(|_| ())
        });
        while let Some(done) = tasks.try_join_next() {
            done.expect("publish task")?;
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("publish task")?;
    }
    let committed = std::mem::take(&mut *committed.lock().expect("records"));
    let in_window = |t: u64| t >= w.start_us && t < w.end_us;
    let r = WorkerReport {
        units_total: committed.len() as u64,
        units_window: committed.iter().filter(|(_, t)| in_window(*t)).count() as u64,
        ..Default::default()
    };
    if let Some(path) = &plan.records {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        for (id, t) in &committed {
            writeln!(f, "{id}\t{t}\t{}", u8::from(in_window(*t))).map_err(io)?;
        }
        f.flush().map_err(io)?;
    }
    Ok(report(&store, r))
}

fn io(e: std::io::Error) -> StoreError {
    StoreError::InvalidEvent {
        position: "in the benchmark's records file".into(),
        reason: e.to_string(),
    }
}

/// A no-op handler that remembers what it handled and when, for the exactness check.
struct Recording {
    seen: Mutex<Vec<(String, String, i32, u64)>>,
}

impl Handler for Recording {
    fn handle<'a>(&'a self, d: &'a ClaimedDelivery) -> HandlerFuture<'a> {
        self.seen.lock().expect("records").push((
            d.event_id.clone(),
            d.handler.clone(),
            d.attempts + 1,
            now_us(),
        ));
        Box::pin(std::future::ready(Outcome::Completed))
    }
}

/// A dispatcher with the cell's configuration, stopped gracefully when the window ends.
async fn dispatch_worker(store: PgStore, plan: WorkerPlan) -> Result<WorkerReport, StoreError> {
    let w = plan.window();
    let (concurrency, batch, _, poll_ms) = plan.config.settings();
    let recording = Arc::new(Recording {
        seen: Mutex::new(Vec::new()),
    });
    let handlers: Vec<HandlerSpec> = (0..plan.handlers)
        .map(|h| HandlerSpec {
            name: format!("h{h}"),
            handler: Arc::clone(&recording) as Arc<dyn Handler>,
            max_attempts: 25,
            backoff: Backoff {
                base: Duration::from_secs(1),
                max: Duration::from_secs(3600),
            },
        })
        .collect();
    let store = Arc::new(store);
    let reporter = Arc::new(Reporter::quiet(LogFormat::Text));
    let (tx, rx) = watch::channel(Shutdown::Running);
    let wake = Arc::new(Notify::new());
    let listener = tokio::spawn(dispatch::listen::listen(
        store.connect_options().clone(),
        store.channel(),
        Arc::clone(&wake),
        Arc::clone(&reporter),
        rx.clone(),
    ));
    plan.wait_for_start().await;
    let end = w.end_us;
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_micros(end.saturating_sub(now_us()))).await;
        let _ = tx.send(Shutdown::Graceful);
    });
    let options = DispatchOptions {
        owner: dispatch::worker_name(),
        concurrency: concurrency as usize,
        batch_size: batch as usize,
        poll_interval: Duration::from_millis(poll_ms),
        lease_duration: Duration::from_secs(30),
        completion_window: Duration::from_millis(2),
        shutdown_grace: Duration::from_secs(10),
        drain: false,
        completion_history: false,
    };
    dispatch::run(Arc::clone(&store), options, handlers, reporter, wake, rx).await?;
    listener.abort();
    let seen = std::mem::take(&mut *recording.seen.lock().expect("records"));
    let r = WorkerReport {
        units_total: seen.len() as u64,
        units_window: seen
            .iter()
            .filter(|s| s.3 >= w.start_us && s.3 < w.end_us)
            .count() as u64,
        ..Default::default()
    };
    if let Some(path) = &plan.records {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        for (event, handler, attempt, t) in &seen {
            writeln!(f, "{event}\t{handler}\t{attempt}\t{t}").map_err(io)?;
        }
        f.flush().map_err(io)?;
    }
    Ok(report(&store, r))
}

async fn floor_connection(store: &PgStore) -> Result<tokio_postgres::Client, StoreError> {
    let opts: &ConnectOptions = store.connect_options();
    let (client, conn) = opts
        .config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(|cause| StoreError::Connect {
            target: opts.target.clone(),
            cause,
        })?;
    tokio::spawn(conn);
    Ok(client)
}

/// The same rows as a publish, written by the plainest statement: one multi-row insert of
/// events and deliveries per batch, prepared once.
async fn floor_publish(store: PgStore, plan: WorkerPlan) -> Result<WorkerReport, StoreError> {
    let ns = store.namespace();
    let client = floor_connection(&store).await?;
    let statement = client
        .prepare_typed(
            &format!(
                "WITH e AS (INSERT INTO {events} (id, type, key, payload, handlers) \
                   SELECT id, 'bench.event', key, payload, $5 \
                     FROM unnest($1::text[], $2::text[], $3::jsonb[]) AS t(id, key, payload)) \
                 INSERT INTO {deliveries} (id, event_id, handler, lane, key) \
                 SELECT d.id, d.event_id, d.handler, d.lane, d.key \
                   FROM unnest($4::text[], $6::text[], $7::text[], $8::int2[], $9::text[]) \
                        AS d(id, event_id, handler, lane, key)",
                events = ns.table("events"),
                deliveries = ns.table("deliveries")
            ),
            &[
                Type::TEXT_ARRAY,
                Type::TEXT_ARRAY,
                Type::JSONB_ARRAY,
                Type::TEXT_ARRAY,
                Type::TEXT_ARRAY,
                Type::TEXT_ARRAY,
                Type::TEXT_ARRAY,
                Type::INT2_ARRAY,
                Type::TEXT_ARRAY,
            ],
        )
        .await
        .map_err(StoreError::db("floor: prepare"))?;
    let w = plan.window();
    let mut r = WorkerReport::default();
    let handlers: Vec<String> = (0..plan.handlers).map(|h| format!("h{h}")).collect();
    plan.wait_for_start().await;
    let mut n = 0u64;
    while now_us() < w.end_us {
        let events: Vec<NewEvent> = (n..n + u64::from(plan.batch))
            .map(|i| event(format!("f{}-{i}", plan.index), i, plan.handlers, plan.keys))
            .collect();
        n += u64::from(plan.batch);
        let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
        let keys: Vec<Option<&str>> = events.iter().map(|e| e.key.as_deref()).collect();
        let payloads: Vec<&serde_json::Value> = events.iter().map(|e| &e.payload).collect();
        let (mut d_ids, mut d_events, mut d_handlers, mut d_lanes, mut d_keys) =
            (vec![], vec![], vec![], vec![], vec![]);
        for e in &events {
            for h in &handlers {
                d_ids.push(uuid::Uuid::now_v7().to_string());
                d_events.push(e.id.as_str());
                d_handlers.push(h.as_str());
                d_lanes.push(lane_of(e.key.as_deref(), &e.id));
                d_keys.push(e.key.as_deref());
            }
        }
        let t0 = now_us();
        client
            .execute(
                &statement,
                &[
                    &ids,
                    &keys,
                    &payloads,
                    &d_ids,
                    &handlers,
                    &d_events,
                    &d_handlers,
                    &d_lanes,
                    &d_keys,
                ],
            )
            .await
            .map_err(StoreError::db("floor: insert"))?;
        let t1 = now_us();
        r.units_total += events.len() as u64;
        if t1 >= w.start_us && t1 < w.end_us {
            r.units_window += events.len() as u64;
            r.latencies_us.push(t1 - t0);
        }
    }
    r.statements = r.units_total / u64::from(plan.batch.max(1));
    r.parses = 1;
    Ok(r)
}

/// The same deliveries deleted by the plainest statement: a batch picked with SKIP LOCKED.
async fn floor_dispatch(store: PgStore, plan: WorkerPlan) -> Result<WorkerReport, StoreError> {
    let deliveries = store.namespace().table("deliveries");
    let client = floor_connection(&store).await?;
    let statement = client
        .prepare_typed(
            &format!(
                "DELETE FROM {deliveries} WHERE id IN (SELECT id FROM {deliveries} \
                  WHERE status = 'pending' LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
            &[Type::INT8],
        )
        .await
        .map_err(StoreError::db("floor: prepare"))?;
    let (_, batch, _, _) = plan.config.settings();
    let batch = i64::from(batch);
    let w = plan.window();
    let mut r = WorkerReport::default();
    plan.wait_for_start().await;
    while now_us() < w.end_us {
        let deleted = client
            .execute(&statement, &[&batch])
            .await
            .map_err(StoreError::db("floor: delete"))?;
        let t = now_us();
        r.statements += 1;
        r.units_total += deleted;
        if t >= w.start_us && t < w.end_us {
            r.units_window += deleted;
        }
        if deleted == 0 {
            r.ran_out_after_us = Some(t.clamp(w.start_us, w.end_us) - w.start_us);
            break;
        }
    }
    r.parses = 1;
    Ok(r)
}

/// Store options of a worker: a publisher publishes on one connection, a dispatcher has the
/// cell's pool.
pub fn store_options(plan: &WorkerPlan) -> StoreOptions {
    let (_, _, pool, _) = plan.config.settings();
    match plan.role {
        Role::Dispatch => StoreOptions {
            pool_size: pool as usize,
            notify: false,
        },
        Role::MixedPublish => StoreOptions {
            pool_size: 8,
            notify: true,
        },
        // A second connection for the coalesced wake-up, which must not hold up the next
        // publish, as with `relaybus publish`.
        _ => StoreOptions {
            pool_size: 2,
            notify: true,
        },
    }
}

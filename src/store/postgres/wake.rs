//! Wake-ups over LISTEN/NOTIFY. Publishing: PostgreSQL holds a database-wide lock from the
//! commit of a notifying transaction until it is flushed, so publishing transactions never
//! notify themselves; after a publish commits, the store sends at most one notification per
//! `NOTIFY_INTERVAL`, in a transaction of its own, and a publish inside the interval schedules
//! one trailing notification at its end. Listening: a connection of its own LISTENs on the
//! namespace's channel and feeds a `WakeUps` stream; a lost connection (or one whose server
//! stops answering its periodic check) is re-established with back-off. Polling stays the correctness path; a lost wake-up only costs latency.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;

use super::conn::{db, describe, ConnectOptions, Pool};
use super::sql::Sql;
use super::PgStore;
use crate::backoff::{Backoff, Retries};
use crate::store::lane::fnv1a_32;
use crate::store::{Namespace, Result, StoreError, Wake, WakeUp, WakeUps};

/// At most one notification per store per interval.
pub(crate) const NOTIFY_INTERVAL: Duration = Duration::from_millis(10);

/// PostgreSQL's longest identifier, and so the longest channel name.
const MAX_CHANNEL: usize = 63;

/// The channel of a namespace: `schema.prefixwakeup`, as other relaybus 0.2 workers name it, or
/// a name derived from it when that would pass 63 bytes (the server refuses longer names).
pub(crate) fn channel(ns: &Namespace) -> String {
    let name = ns.render("{{schema}}.{{prefix}}wakeup");
    if name.len() <= MAX_CHANNEL {
        return name;
    }
    let (schema, prefix) = (
        fnv1a_32(ns.schema().as_bytes()),
        fnv1a_32(ns.prefix().as_bytes()),
    );
    format!("relaybus_wakeup_{schema:08x}{prefix:08x}")
}

pub(crate) struct Notifier {
    pool: Arc<Pool>,
    sql: Sql,
    channel: String,
    enabled: bool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    last: Option<Instant>,
    trailing: bool,
    /// Why a wake-up sent in the background failed, until someone is told.
    failed: Option<StoreError>,
}

impl Notifier {
    pub(crate) fn new(pool: Arc<Pool>, sql: Sql, channel: String, enabled: bool) -> Arc<Self> {
        Arc::new(Self {
            pool,
            sql,
            channel,
            enabled,
            state: Mutex::new(State::default()),
        })
    }

    /// Called after a publish that created deliveries has committed.
    pub(crate) fn published(self: &Arc<Self>) {
        if !self.enabled {
            return;
        }
        let delay = {
            let mut state = self.state.lock().expect("notifier lock");
            let now = Instant::now();
            match state.last {
                _ if state.trailing => return,
                Some(t) if now.duration_since(t) < NOTIFY_INTERVAL => {
                    state.trailing = true;
                    NOTIFY_INTERVAL - now.duration_since(t)
                }
                _ => {
                    state.last = Some(now);
                    Duration::ZERO
                }
            }
        };
        let this = Arc::clone(self);
        tokio::spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
                let mut state = this.state.lock().expect("notifier lock");
                state.trailing = false;
                state.last = Some(Instant::now());
            }
            if let Err(e) = this.send().await {
                this.state.lock().expect("notifier lock").failed = Some(e);
            }
        });
    }

    /// Sends one notification now, for callers that are about to exit; fails if it, or one
    /// sent in the background since the last call, could not be sent.
    pub(crate) async fn flush(&self) -> Result<()> {
        let earlier = self.state.lock().expect("notifier lock").failed.take();
        self.send().await?;
        earlier.map_or(Ok(()), Err)
    }

    async fn send(&self) -> Result<()> {
        let mut conn = self.pool.get().await?;
        conn.execute(&self.sql, &[&self.channel])
            .await
            .map_err(db("could not send the wake-up notification; idle workers find the new work at their next poll"))?;
        Ok(())
    }
}

const RECONNECT: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
/// How often the listener asks the server whether it still answers, and how long it waits: a
/// frozen server or a half-open connection sends no error, only silence, and a worker that
/// polls rarely would wait for its poll.
const CHECK_EVERY: Duration = Duration::from_secs(10);
const CHECK_WITHIN: Duration = Duration::from_secs(5);

/// Subscribes to the namespace's channel.
pub(crate) fn listen(opts: ConnectOptions, channel: String) -> WakeUps {
    let (tx, rx) = WakeUps::channel();
    let task = tokio::spawn(async move {
        let mut retries = RECONNECT.retries();
        loop {
            let error = listen_once(&opts, &channel, &tx, &mut retries).await;
            let retry_in = retries.next_delay();
            if tx.send(WakeUp::Lost { error, retry_in }).await.is_err() {
                return;
            }
            tokio::time::sleep(retry_in).await;
        }
    });
    WakeUps::new(rx, task)
}

/// Listens until the connection fails; returns why.
async fn listen_once(
    opts: &ConnectOptions,
    channel: &str,
    tx: &mpsc::Sender<WakeUp>,
    retries: &mut Retries,
) -> String {
    let (client, mut connection) = match opts.connect_raw().await {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
    let statement = format!("LISTEN \"{channel}\"");
    let listen = client.batch_execute(&statement);
    tokio::pin!(listen);
    let mut listening = false;
    // A full channel already holds a signal; one stands for any number.
    let signal = || {
        let _ = tx.try_send(WakeUp::Signal);
    };
    let check = async {
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            match tokio::time::timeout(CHECK_WITHIN, client.batch_execute("SELECT 1")).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return describe(&e),
                Err(_) => {
                    return format!(
                        "the server did not answer a check within {}",
                        humantime::format_duration(CHECK_WITHIN)
                    )
                }
            }
        }
    };
    tokio::pin!(check);
    loop {
        tokio::select! {
            error = &mut check => return error,
            done = &mut listen, if !listening => match done {
                Ok(()) => {
                    listening = true;
                    retries.reset();
                    // Whatever was published while not listening is due now.
                    signal();
                }
                Err(e) => return describe(&e),
            },
            message = messages.next() => match message {
                Some(Ok(AsyncMessage::Notification(_))) => signal(),
                Some(Ok(_)) => {}
                Some(Err(e)) => return describe(&e),
                None => return "the server closed the connection".into(),
            },
        }
    }
}

impl Wake for PgStore {
    async fn flush_wake_ups(&self) -> Result<()> {
        self.notifier.flush().await
    }

    fn wake_ups(&self) -> Option<WakeUps> {
        Some(listen(self.pool.options().clone(), channel(&self.ns)))
    }

    fn wake_up_delay(&self) -> Duration {
        NOTIFY_INTERVAL
    }
}

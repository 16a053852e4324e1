//! Wake-ups over LISTEN/NOTIFY. Publishing: PostgreSQL holds a database-wide lock from the
//! commit of a notifying transaction until it is flushed, so publishing transactions never
//! notify themselves; after a publish commits, the store sends at most one notification per
//! `NOTIFY_INTERVAL`, in a transaction of its own, and a publish inside the interval schedules
//! one trailing notification at its end. Listening: a connection of its own LISTENs on the
//! namespace's channel and feeds a `WakeUps` stream; a lost connection is re-established with
//! back-off. Polling stays the correctness path; a lost wake-up only costs latency.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;

use super::conn::{describe, ConnectOptions, Pool};
use super::sql::Sql;
use crate::backoff::{Backoff, Retries};
use crate::store::{Namespace, WakeUp, WakeUps};

/// At most one notification per store per interval.
pub(crate) const NOTIFY_INTERVAL: Duration = Duration::from_millis(10);

/// The channel of a namespace, as `delivery/notify.sql` names it.
pub(crate) fn channel(ns: &Namespace) -> String {
    ns.render("{{schema}}.{{prefix}}wakeup")
}

pub(crate) struct Notifier {
    pool: Arc<Pool>,
    sql: Sql,
    enabled: bool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    last: Option<Instant>,
    trailing: bool,
}

impl Notifier {
    pub(crate) fn new(pool: Arc<Pool>, sql: Sql, enabled: bool) -> Arc<Self> {
        Arc::new(Self {
            pool,
            sql,
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
            this.send().await;
        });
    }

    /// Sends one notification now, for callers that are about to exit.
    pub(crate) async fn send(&self) {
        if let Ok(mut conn) = self.pool.get().await {
            let _ = conn.execute(&self.sql, &[]).await;
        }
    }
}

const RECONNECT: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));

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
    loop {
        tokio::select! {
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

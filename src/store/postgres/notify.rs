//! Coalesced wake-up notifications. PostgreSQL holds a database-wide lock from the commit of a
//! notifying transaction until it is flushed, so publishing transactions never notify
//! themselves: after a publish commits, the store sends at most one `pg_notify` per 10 ms, in a
//! transaction of its own. A publish inside the interval schedules one trailing notification at
//! its end. Polling stays the correctness path; a lost wake-up only costs latency.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::conn::{Pool, Sql};
use crate::store::NOTIFY_INTERVAL;

/// The channel workers LISTEN on, one per namespace.
pub(crate) const CHANNEL: &str = "{{schema}}.{{prefix}}wakeup";

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
    pub fn new(pool: Arc<Pool>, sql: Sql, enabled: bool) -> Arc<Self> {
        Arc::new(Self {
            pool,
            sql,
            enabled,
            state: Mutex::new(State::default()),
        })
    }

    /// Called after a publish that created deliveries has committed.
    pub fn published(self: &Arc<Self>) {
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
    pub async fn send(&self) {
        if let Ok(mut conn) = self.pool.get().await {
            let _ = conn.execute(&self.sql, &[]).await;
        }
    }
}

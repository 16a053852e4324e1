//! Completion batching: completions that finish within the window are deleted by one statement.
//! Handlers hand their token over and wait for the verdict (deleted, or the lease was lost).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::store::{LeaseToken, Store};

/// The most completions one statement carries.
const MAX_BATCH: usize = 1000;
/// A failed completion statement is retried this many times before the deliveries are left to
/// lease expiry (they then run again: at-least-once).
const RETRIES: u32 = 3;

type Reply = oneshot::Sender<Result<bool, String>>;

#[derive(Clone)]
pub(crate) struct Completer {
    tx: mpsc::UnboundedSender<(LeaseToken, Reply)>,
}

impl Completer {
    pub fn start<S: Store>(
        store: Arc<S>,
        window: Duration,
        history: bool,
    ) -> (Completer, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(store, rx, window, history));
        (Completer { tx }, task)
    }

    /// True when the delivery was deleted; false when its lease was lost first.
    pub async fn complete(&self, token: LeaseToken) -> Result<bool, String> {
        let (reply, verdict) = oneshot::channel();
        self.tx
            .send((token, reply))
            .map_err(|_| "the completer has stopped".to_owned())?;
        verdict
            .await
            .unwrap_or_else(|_| Err("the completer has stopped".into()))
    }
}

async fn run<S: Store>(
    store: Arc<S>,
    mut rx: mpsc::UnboundedReceiver<(LeaseToken, Reply)>,
    window: Duration,
    history: bool,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + window;
        while batch.len() < MAX_BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(next)) => batch.push(next),
                _ => break,
            }
        }
        let tokens: Vec<LeaseToken> = batch.iter().map(|(t, _)| t.clone()).collect();
        let mut attempt = 0;
        let verdict = loop {
            match store.complete(&tokens, history).await {
                Ok(ids) => break Ok(ids.into_iter().collect::<HashSet<String>>()),
                Err(e) if attempt + 1 >= RETRIES => break Err(format!("{e:#}")),
                Err(_) => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                }
            }
        };
        for (token, reply) in batch {
            let _ = reply.send(match &verdict {
                Ok(deleted) => Ok(deleted.contains(&token.delivery_id)),
                Err(e) => Err(e.clone()),
            });
        }
    }
}

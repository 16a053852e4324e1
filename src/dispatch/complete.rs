//! Completion batching: completions that finish within the window are deleted by one statement.
//! Handlers hand their token over and wait for the verdict (deleted, or the lease was lost). The
//! window closes early once no handler is running any more: nothing else can arrive, and waiting
//! would only add latency.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};

use crate::store::{LeaseToken, Store};

/// The most completions one statement carries.
const MAX_BATCH: usize = 1000;
/// A failed completion statement is retried this many times before the deliveries are left to
/// lease expiry (they then run again: at-least-once).
const RETRIES: u32 = 3;

type Reply = oneshot::Sender<Result<bool, String>>;

/// How many claimed deliveries have not handed over their outcome yet, counted from the claim (a
/// task that has not started yet counts too). A task hands its completion over before it stops
/// counting, so when the count is zero every completion is already queued.
#[derive(Default)]
pub(crate) struct Running {
    count: AtomicUsize,
    idle: Notify,
}

/// Counts one claimed delivery until dropped.
pub(crate) struct RunningGuard(Arc<Running>);

impl Running {
    pub fn enter(self: &Arc<Self>) -> RunningGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        RunningGuard(Arc::clone(self))
    }

    fn none(&self) -> bool {
        self.count.load(Ordering::SeqCst) == 0
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_one();
        }
    }
}

/// A completion handed over, waiting for its verdict.
pub(crate) struct Pending(oneshot::Receiver<Result<bool, String>>);

impl Pending {
    /// True when the delivery was deleted; false when its lease was lost first.
    pub async fn verdict(self) -> Result<bool, String> {
        self.0
            .await
            .unwrap_or_else(|_| Err("the completer has stopped".into()))
    }
}

#[derive(Clone)]
pub(crate) struct Completer {
    tx: mpsc::UnboundedSender<(LeaseToken, Reply)>,
}

impl Completer {
    pub fn start<S: Store>(
        store: Arc<S>,
        running: Arc<Running>,
        window: Duration,
        history: bool,
    ) -> (Completer, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(store, running, rx, window, history));
        (Completer { tx }, task)
    }

    /// Queues a completion; its verdict comes with the batch it lands in.
    pub fn submit(&self, token: LeaseToken) -> Pending {
        let (reply, verdict) = oneshot::channel();
        if let Err(mpsc::error::SendError((_, reply))) = self.tx.send((token, reply)) {
            let _ = reply.send(Err("the completer has stopped".into()));
        }
        Pending(verdict)
    }
}

async fn run<S: Store>(
    store: Arc<S>,
    running: Arc<Running>,
    mut rx: mpsc::UnboundedReceiver<(LeaseToken, Reply)>,
    window: Duration,
    history: bool,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + window;
        loop {
            while let Ok(next) = rx.try_recv() {
                batch.push(next);
            }
            if batch.len() >= MAX_BATCH || running.none() {
                break;
            }
            tokio::select! {
                next = rx.recv() => match next {
                    Some(next) => batch.push(next),
                    None => break,
                },
                _ = tokio::time::sleep_until(deadline) => break,
                _ = running.idle.notified() => {}
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

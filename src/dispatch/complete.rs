//! Completion batching: completions that finish within the window are deleted by one statement.
//! Handlers hand their token over and wait for the verdict (deleted, or the lease was lost). The
//! window closes early once no handler is running any more: nothing else can arrive, and waiting
//! would only add latency.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};

use crate::backoff::Backoff;
use crate::store::{LeaseToken, Store};

/// The most completions one statement carries.
const MAX_BATCH: usize = 1000;
/// A failed completion statement is tried this many times before the deliveries are left to
/// lease expiry (they then run again: at-least-once).
const ATTEMPTS: u32 = 3;
const RETRY: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));

type Reply = oneshot::Sender<Result<bool, String>>;

/// How many claimed deliveries have not handed over their outcome yet, counted from the claim (a
/// task that has not started yet counts too). A task hands its completion over before it stops
/// counting, so when the count is zero every completion is already queued.
#[derive(Default)]
pub(super) struct Running {
    count: AtomicUsize,
    idle: Notify,
}

/// Counts one claimed delivery until dropped.
pub(super) struct RunningGuard(Arc<Running>);

impl Running {
    pub(super) fn enter(self: &Arc<Self>) -> RunningGuard {
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
pub(super) struct Pending(oneshot::Receiver<Result<bool, String>>);

impl Pending {
    /// True when the delivery was deleted; false when its lease was lost first.
    pub(super) async fn verdict(self) -> Result<bool, String> {
        self.0
            .await
            .unwrap_or_else(|_| Err("the completer has stopped".into()))
    }
}

#[derive(Clone)]
pub(super) struct Completer {
    tx: mpsc::UnboundedSender<(LeaseToken, Reply)>,
}

impl Completer {
    pub(super) fn start<S: Store>(
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
    pub(super) fn submit(&self, token: LeaseToken) -> Pending {
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
        let mut retries = RETRY.retries();
        let verdict = loop {
            match store.complete(&tokens, history).await {
                Ok(ids) => break Ok(ids.into_iter().collect::<HashSet<String>>()),
                Err(e) if retries.count() + 1 >= ATTEMPTS => break Err(format!("{e:#}")),
                Err(_) => tokio::time::sleep(retries.next_delay()).await,
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

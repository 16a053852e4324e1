//! Completion batching: completions that finish within the window are deleted by one statement.
//! Handlers hand their token over and wait for the verdict (deleted, or the lease was lost). The
//! window closes early once no handler is running any more: nothing else can arrive, and waiting
//! would only add latency. A statement that fails (the database is away) is retried until it is
//! recorded: meanwhile its deliveries stay in flight, so nothing runs them again; only a stopping
//! worker gives up.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch, Notify};

use super::Reporter;
use crate::backoff::Backoff;
use crate::store::{LeaseToken, Store};

/// The most completions one statement carries.
const MAX_BATCH: usize = 1000;
/// How a statement that could not be recorded is retried: at most 2 s apart, so that once the
/// database takes outcomes again the worker knows within seconds and claims again.
pub(super) const RETRY: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));

type Reply = oneshot::Sender<Result<bool, String>>;

/// How many claimed deliveries have not handed over their outcome yet, counted from the claim (a
/// task that has not started yet counts too). A task hands its completion over before it stops
/// counting, so when the count is zero every completion is already queued.
#[derive(Default)]
pub(super) struct Running {
    count: AtomicUsize,
    idle: Notify,
}

/// Counts one claimed delivery in the worker's count and its claim stream's until dropped.
pub(super) struct RunningGuard([Arc<Running>; 2]);

impl Running {
    pub(super) fn enter(worker: &Arc<Running>, stream: &Arc<Running>) -> RunningGuard {
        for running in [worker, stream] {
            running.count.fetch_add(1, Ordering::SeqCst);
        }
        RunningGuard([Arc::clone(worker), Arc::clone(stream)])
    }

    fn none(&self) -> bool {
        self.count() == 0
    }

    pub(super) fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        for running in &self.0 {
            if running.count.fetch_sub(1, Ordering::SeqCst) == 1 {
                running.idle.notify_one();
            }
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

/// What the completer is told at start.
pub(super) struct Settings {
    pub(super) window: Duration,
    pub(super) history: bool,
    pub(super) reporter: Arc<Reporter>,
    /// Set once the worker stops: from then on a statement that fails is given up.
    pub(super) stopping: watch::Receiver<bool>,
}

/// The completer's loop, ready to start: it records what the `Completer` queues.
pub(super) struct Recording<S> {
    store: Arc<S>,
    running: Arc<Running>,
    rx: mpsc::UnboundedReceiver<(LeaseToken, Reply)>,
    settings: Settings,
}

impl<S: Store> Recording<S> {
    pub(super) fn start(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(run(self.store, self.running, self.rx, self.settings))
    }
}

impl Completer {
    pub(super) fn new<S: Store>(
        store: Arc<S>,
        running: Arc<Running>,
        settings: Settings,
    ) -> (Completer, Recording<S>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let recording = Recording {
            store,
            running,
            rx,
            settings,
        };
        (Completer { tx }, recording)
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

/// What recording an outcome needs: where to report.
pub(super) struct Recorder<'a> {
    pub(super) reporter: &'a Reporter,
}

impl Recorder<'_> {
    /// Runs `op`, reported stalled once it waits past the bound (`background::watchdog`). A
    /// guard rather than a timer of its own: a timer per claim and per completion cost a tenth of
    /// the throughput of a worker with the defaults (`bench dispatch --cell disp-1i-defaults`).
    pub(super) async fn watched<T>(
        &self,
        operation: &'static str,
        op: impl std::future::Future<Output = T>,
    ) -> T {
        let _in_progress = self.reporter.health.begin(operation);
        op.await
    }

    /// Runs `op` until it succeeds: the database may be away for a while (a restart, a
    /// failover), and what `op` records is lost if it gives up. The first failure is logged,
    /// and from then until `op` succeeds the worker claims nothing new (`Health::unrecorded`).
    /// Once the worker is `stopping`, a failure is final.
    pub(super) async fn until_recorded<T, F, Fut>(
        &self,
        operation: &'static str,
        what: &str,
        stopping: &mut watch::Receiver<bool>,
        mut op: F,
    ) -> Result<T, String>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = crate::store::Result<T>>,
    {
        let reporter = self.reporter;
        let mut retries = RETRY.retries();
        let mut unrecorded = None;
        loop {
            match self.watched(operation, op()).await {
                Ok(done) => return Ok(done),
                Err(e) if *stopping.borrow() => {
                    reporter.metrics.database_error(operation);
                    return Err(format!("{e:#}"));
                }
                Err(e) => {
                    reporter.metrics.database_error(operation);
                    let retry_in = retries.next_delay();
                    if retries.count() == 1 {
                        tracing::warn!(
                            error = %format!("{e:#}"),
                            retry_in = %humantime::format_duration(retry_in),
                            "could not record {what}; retrying until the database answers"
                        );
                    }
                    unrecorded.get_or_insert_with(|| reporter.health.unrecorded());
                    tokio::select! {
                        _ = tokio::time::sleep(retry_in) => {}
                        _ = stopping.wait_for(|s| *s) => {}
                    }
                }
            }
        }
    }
}

async fn run<S: Store>(
    store: Arc<S>,
    running: Arc<Running>,
    mut rx: mpsc::UnboundedReceiver<(LeaseToken, Reply)>,
    mut settings: Settings,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + settings.window;
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
        let what = format!("{} completions", tokens.len());
        let reporter = &settings.reporter;
        let recorder = Recorder { reporter };
        let history = settings.history;
        let verdict = recorder
            .until_recorded("complete", &what, &mut settings.stopping, || {
                let started = tokio::time::Instant::now();
                let complete = store.complete(&tokens, history);
                async move {
                    let deleted = complete.await?;
                    reporter.metrics.completed(started.elapsed());
                    Ok(deleted)
                }
            })
            .await
            .map(|ids| ids.into_iter().collect::<HashSet<String>>());
        for (token, reply) in batch {
            let _ = reply.send(match &verdict {
                Ok(deleted) => Ok(deleted.contains(&token.delivery_id)),
                Err(e) => Err(e.clone()),
            });
        }
    }
}

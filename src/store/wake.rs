//! Wake-ups: a store that can tell its workers when new work was published hands them a stream
//! of signals. Only a hint: polling stays the correctness path, so a worker without wake-ups (or
//! with a lost subscription) is slower to react, never wrong.

use std::time::Duration;

use tokio::sync::mpsc;

/// What a wake-up subscription reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WakeUp {
    /// Work was published (or may have been, while not subscribed): claim now.
    Signal,
    /// The subscription was lost; it is renewed after `retry_in`, and work is polled meanwhile.
    Lost { error: String, retry_in: Duration },
}

/// A live subscription. Dropping it ends the subscription.
pub struct WakeUps {
    rx: mpsc::Receiver<WakeUp>,
    task: tokio::task::JoinHandle<()>,
}

impl WakeUps {
    /// A stream fed by `task` through the sender of `channel()`.
    pub(crate) fn new(rx: mpsc::Receiver<WakeUp>, task: tokio::task::JoinHandle<()>) -> Self {
        Self { rx, task }
    }

    /// The channel a subscription task reports into. Signals are coalesced: one waiting signal
    /// stands for any number.
    pub(crate) fn channel() -> (mpsc::Sender<WakeUp>, mpsc::Receiver<WakeUp>) {
        mpsc::channel(4)
    }

    /// The next report; never resolves once the subscription has ended.
    pub async fn next(&mut self) -> WakeUp {
        match self.rx.recv().await {
            Some(w) => w,
            None => std::future::pending().await,
        }
    }
}

impl Drop for WakeUps {
    fn drop(&mut self) {
        self.task.abort();
    }
}

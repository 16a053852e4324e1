//! How a worker is asked to stop, and the waits on it.

use tokio::sync::watch;

/// How the dispatcher is asked to stop: the first signal drains, the second cancels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    Running,
    /// Stop claiming, let running handlers finish within the grace period, release the rest.
    Graceful,
    /// Abort running handlers now, release them and hand the lanes back.
    Immediate,
}

/// Resolves when the shutdown state changes. A dropped sender sends nothing more, so it never
/// resolves then (a closed channel must not read as a signal).
pub async fn next_signal(shutdown: &mut watch::Receiver<Shutdown>) {
    if shutdown.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Resolves once the shutdown state is `state` (or further along), never on a dropped sender.
pub async fn signalled(shutdown: &mut watch::Receiver<Shutdown>, state: Shutdown) {
    let reached = |s: &Shutdown| match state {
        Shutdown::Running => true,
        Shutdown::Graceful => *s != Shutdown::Running,
        Shutdown::Immediate => *s == Shutdown::Immediate,
    };
    if shutdown.wait_for(reached).await.is_err() {
        std::future::pending::<()>().await;
    }
}

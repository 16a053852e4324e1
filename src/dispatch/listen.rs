//! The wake-up listener: a connection of its own that LISTENs on the store's channel and wakes
//! the claim loop when a publish commits, so an idle worker reacts within milliseconds instead of
//! a poll interval. Only a hint: polling stays the correctness path. A lost connection is
//! re-established with backoff while the worker keeps running.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{watch, Notify};
use tokio_postgres::{AsyncMessage, NoTls};

use super::report::Reporter;
use super::{signalled, Shutdown};
use crate::store::postgres::ConnectOptions;

const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Listens until shutdown, waking `wake` on every notification.
pub async fn listen(
    opts: ConnectOptions,
    channel: String,
    wake: Arc<Notify>,
    reporter: Arc<Reporter>,
    mut shutdown: watch::Receiver<Shutdown>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let error = tokio::select! {
            e = listen_once(&opts, &channel, &wake, &mut backoff) => e,
            _ = signalled(&mut shutdown, Shutdown::Graceful) => return,
        };
        reporter.log(
            "warn",
            "wake-up connection lost; polling until it is back",
            &[
                ("error", &error),
                ("retry_in", &humantime::format_duration(backoff)),
            ],
        );
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = signalled(&mut shutdown, Shutdown::Graceful) => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Listens until the connection fails; returns why.
async fn listen_once(
    opts: &ConnectOptions,
    channel: &str,
    wake: &Notify,
    backoff: &mut Duration,
) -> String {
    let (client, mut connection) = match opts.config.connect(NoTls).await {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
    let statement = format!("LISTEN \"{channel}\"");
    let listen = client.batch_execute(&statement);
    tokio::pin!(listen);
    let mut listening = false;
    loop {
        tokio::select! {
            done = &mut listen, if !listening => match done {
                Ok(()) => {
                    listening = true;
                    *backoff = Duration::from_millis(100);
                    // Whatever was published while not listening is due now.
                    wake.notify_one();
                }
                Err(e) => return e.to_string(),
            },
            message = messages.next() => match message {
                Some(Ok(AsyncMessage::Notification(_))) => wake.notify_one(),
                Some(Ok(_)) => {}
                Some(Err(e)) => return e.to_string(),
                None => return "the server closed the connection".into(),
            },
        }
    }
}

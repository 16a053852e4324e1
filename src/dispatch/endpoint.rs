//! The `/metrics`, `/healthz` and `/readyz` endpoints of `run --metrics-addr`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::oneshot;

use super::Reporter;
use crate::store::Store;

struct Endpoint<S> {
    reporter: Arc<Reporter>,
    store: Arc<S>,
    handlers: Vec<String>,
}

/// Connections the metrics endpoint keeps open at once. A connection beyond them closes the
/// oldest, so connections that sit idle (a misbehaving scraper, a port scan) can never keep a
/// health probe out, and the endpoint never holds more than a few of the worker's file
/// descriptors (its handlers need them).
const MAX_CONNECTIONS: usize = 32;
/// A connection that sends no request for this long is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection closed to make room may take to finish a request in progress.
const EVICTED_GRACE: Duration = Duration::from_millis(500);
/// How long the endpoint pauses after an accept fails (the process is out of descriptors).
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// The open connections, oldest first, each with the sender that asks it to close.
#[derive(Default)]
struct Connections {
    next: u64,
    open: BTreeMap<u64, oneshot::Sender<()>>,
}

impl Connections {
    /// Counts a new connection in, asking the oldest to close when the endpoint is full.
    fn admit(&mut self) -> (u64, oneshot::Receiver<()>) {
        if self.open.len() >= MAX_CONNECTIONS {
            if let Some((_, oldest)) = self.open.pop_first() {
                let _ = oldest.send(());
            }
        }
        let (close, closing) = oneshot::channel();
        let id = self.next;
        self.next += 1;
        self.open.insert(id, close);
        (id, closing)
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the process ends: at most
/// `MAX_CONNECTIONS` connections, each closed after `IDLE_TIMEOUT` without a request, and the
/// oldest closed when a new one comes and the endpoint is full.
pub async fn serve<S: Store>(
    listener: tokio::net::TcpListener,
    reporter: Arc<Reporter>,
    store: Arc<S>,
    handlers: Vec<String>,
) -> std::io::Result<()> {
    let endpoint = Arc::new(Endpoint {
        reporter,
        store,
        handlers,
    });
    let app = axum::Router::new()
        .route("/metrics", get(metrics::<S>))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready::<S>))
        .with_state(endpoint);
    let connections = Arc::new(Mutex::new(Connections::default()));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "the metrics endpoint could not accept a connection");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let (id, closing) = connections.lock().expect("connections lock").admit();
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let connections = Arc::clone(&connections);
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(IDLE_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                Ok(()) = closing => {
                    // Closed at once when idle; a request in progress may finish first.
                    connection.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(EVICTED_GRACE, connection).await;
                }
            }
            connections
                .lock()
                .expect("connections lock")
                .open
                .remove(&id);
        });
    }
}

async fn metrics<S: Store>(State(e): State<Arc<Endpoint<S>>>) -> impl IntoResponse {
    let m = &e.reporter.metrics;
    m.sample_lag(&*e.store, &e.handlers).await;
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
}

async fn ready<S: Store>(State(e): State<Arc<Endpoint<S>>>) -> impl IntoResponse {
    match e.reporter.metrics.readiness(&e.reporter.health) {
        Ok(None) => (StatusCode::OK, "ready\n".to_owned()),
        Ok(Some(note)) => (StatusCode::OK, format!("ready: {note}\n")),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

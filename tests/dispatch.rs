//! The dispatcher as a library: driven by a shutdown channel, as a test or an embedding program
//! drives it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use relaybus::dispatch::{
    DispatchOptions, Dispatcher, HandlerSpec, Reporter, RetryPolicy, Runner, Shutdown,
};
use relaybus::handler::{Gate, Handler, HandlerFuture, Outcome};
use relaybus::store::prelude::*;
use relaybus::store::{ClaimedDelivery, EventLimits, NewEvent, StoreOptions};

use crate::common::{open_store, TestSchema};

/// A shutdown sender that is dropped after asking for a graceful stop must not read as a
/// second signal: running deliveries finish and complete, none is released.
#[test]
fn a_dropped_shutdown_sender_is_not_a_cancel() {
    /// Counts the handlers started, so the stop comes once all five run, however loaded the
    /// machine (a fixed 100 ms once stopped one of them before it was claimed).
    struct Slow(Arc<AtomicUsize>);
    impl Handler for Slow {
        fn handle<'a>(&'a self, _: &'a ClaimedDelivery, _: Gate<'a>) -> HandlerFuture<'a> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Outcome::Completed
            })
        }
    }
    let started = Arc::new(AtomicUsize::new(0));

    let s = TestSchema::installed("dropped_sender");
    let store = Arc::new(open_store(&s, StoreOptions::worker(4)));
    let summary = crate::common::block_on(async {
        let limits = EventLimits {
            max_payload_bytes: 1024,
        };
        let events: Vec<NewEvent> = (0..5)
            .map(|i| {
                NewEvent::new(
                    format!("e{i}"),
                    "t".into(),
                    None,
                    serde_json::json!({}),
                    Default::default(),
                    vec!["h".into()],
                    &limits,
                )
                .unwrap()
            })
            .collect();
        store.publish(&events).await.unwrap();
        let (tx, rx) = tokio::sync::watch::channel(Shutdown::Running);
        let running = started.clone();
        tokio::spawn(async move {
            while running.load(Ordering::SeqCst) < 5 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let _ = tx.send(Shutdown::Graceful);
        });
        let options = DispatchOptions {
            poll_interval: Duration::from_millis(20),
            wake_ups: false,
            ..DispatchOptions::new("w".into())
        };
        let handlers = vec![HandlerSpec {
            name: "h".into(),
            runner: Runner::Handler(Arc::new(Slow(started.clone()))),
            retry: RetryPolicy::default(),
            breaker: None,
        }];
        let reporter = Arc::new(Reporter::new());
        Dispatcher::new(store, options, handlers, reporter)
            .run(rx)
            .await
    });
    assert_eq!((summary.handled, summary.released), (5, 0));
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        0
    );
}

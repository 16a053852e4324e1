//! The lease token at the store level: a takeover fences out the previous holder.

use std::time::Duration;

use relaybus::store::postgres::{ConnectOptions, PgStore, StoreOptions};
use relaybus::store::{ClaimRequest, EventLimits, Failure, Namespace, NewEvent, Store};

use crate::common::{database_url, runtime, TestSchema};

fn store(s: &TestSchema) -> PgStore {
    let config = ConnectOptions::resolve(Some(&database_url())).unwrap();
    PgStore::new(
        ConnectOptions::new(config, true, Duration::from_secs(10)),
        Namespace::new(&s.name, "relaybus_").unwrap(),
        StoreOptions::default(),
    )
}

fn request(owner: &str) -> ClaimRequest {
    ClaimRequest {
        owner: owner.into(),
        handlers: vec!["h".into()],
        max_attempts: vec![25],
        batch: 10,
        new_lanes: 4,
        lease: Duration::from_secs(30),
        outstanding: vec![],
    }
}

#[test]
fn a_stale_token_changes_nothing_after_a_takeover() {
    let s = TestSchema::installed("fencing");
    let store = store(&s);
    let rt = runtime();
    let old = rt.block_on(async {
        let limits = EventLimits {
            max_payload_bytes: 1024,
        };
        let e = NewEvent::new(
            "e1".into(),
            "t".into(),
            None,
            serde_json::json!({}),
            Default::default(),
            vec!["h".into()],
            &limits,
        )
        .unwrap();
        store.publish(&[e]).await.unwrap();
        let (first, _) = store.claim(&request("worker-a")).await.unwrap();
        assert_eq!(first.len(), 1);
        let old = first[0].token.clone();
        assert_eq!((old.epoch, old.claims, first[0].attempts), (1, 0, 0));
        // Another claimer sees nothing while the lease is live.
        let (none, stats) = store.claim(&request("worker-b")).await.unwrap();
        assert_eq!((none.len(), stats.charged, stats.lanes_taken), (0, 0, 0));
        old
    });
    s.exec(&format!(
        "UPDATE {} SET lease_expires_at = now() - interval '1 second' WHERE lane = {}",
        s.table("lanes"),
        old.lane
    ));
    rt.block_on(async {
        let (none, stats) = store.claim(&request("worker-b")).await.unwrap();
        assert_eq!((none.len(), stats.charged, stats.lanes_taken), (0, 1, 1));
        // The old holder's completion, failure and release all lose.
        assert!(store
            .complete(std::slice::from_ref(&old), false)
            .await
            .unwrap()
            .is_empty());
        assert!(!store.fail(&old, &Failure::Bury, "late").await.unwrap());
        store
            .release("worker-a", std::slice::from_ref(&old))
            .await
            .unwrap();
    });
    assert_eq!(
        s.rows(&format!(
            "SELECT status, attempts, claims, last_error FROM {}",
            s.table("deliveries")
        )),
        [format!(
            "pending|1|1|lease lost: the worker holding lane {} stopped without completing",
            old.lane
        )]
    );
    rt.block_on(async {
        let (again, _) = store.claim(&request("worker-b")).await.unwrap();
        assert_eq!(again.len(), 1);
        let new = again[0].token.clone();
        assert_eq!(
            (new.lane, new.epoch, new.claims, again[0].attempts),
            (old.lane, 2, 1, 1)
        );
        assert_eq!(
            store
                .complete(&[old.clone(), new.clone()], false)
                .await
                .unwrap(),
            vec![new.delivery_id]
        );
    });
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        0
    );
}

/// A shutdown sender that is dropped after asking for a graceful stop must not read as a
/// second signal: running deliveries finish and complete, none is released.
#[test]
fn a_dropped_shutdown_sender_is_not_a_cancel() {
    use relaybus::dispatch::report::{LogFormat, Reporter};
    use relaybus::dispatch::{self, Backoff, DispatchOptions, HandlerSpec, Shutdown};
    use relaybus::handler::{Handler, HandlerFuture, Outcome};
    use relaybus::store::ClaimedDelivery;
    use std::sync::Arc;

    struct Slow;
    impl Handler for Slow {
        fn handle<'a>(&'a self, _: &'a ClaimedDelivery) -> HandlerFuture<'a> {
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Outcome::Completed
            })
        }
    }

    let s = TestSchema::installed("dropped_sender");
    let store = Arc::new(store(&s));
    let summary = runtime().block_on(async {
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
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = tx.send(Shutdown::Graceful);
        });
        let options = DispatchOptions {
            owner: "w".into(),
            concurrency: 10,
            batch_size: 10,
            poll_interval: Duration::from_millis(20),
            lease_duration: Duration::from_secs(30),
            completion_window: Duration::from_millis(2),
            shutdown_grace: Duration::from_secs(10),
            drain: false,
            completion_history: false,
        };
        let handlers = vec![HandlerSpec {
            name: "h".into(),
            handler: Arc::new(Slow),
            max_attempts: 3,
            backoff: Backoff {
                base: Duration::from_secs(1),
                max: Duration::from_secs(1),
            },
        }];
        let reporter = Arc::new(Reporter::quiet(LogFormat::Text));
        dispatch::run(
            store,
            options,
            handlers,
            reporter,
            Arc::new(tokio::sync::Notify::new()),
            rx,
        )
        .await
        .unwrap()
    });
    assert_eq!((summary.handled, summary.released), (5, 0));
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("deliveries"))),
        0
    );
}

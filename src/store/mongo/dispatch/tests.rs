use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::store::mongo::MongoStore;
use crate::store::prelude::*;
use crate::store::{ClaimRequest, EventLimits, Namespace, NewEvent, StoreOptions};

/// Where a paused completion tells it has read (or, `after_writes`, written), and waits to
/// be let go.
pub(in crate::store::mongo) struct Pause {
    reached: Arc<Notify>,
    resume: Arc<Notify>,
    pub(in crate::store::mongo) after_writes: bool,
}

impl Pause {
    pub(in crate::store::mongo) async fn hold(self) {
        self.reached.notify_one();
        self.resume.notified().await;
    }
}

fn store(database: &str) -> MongoStore {
    let url = crate::test_servers::mongodb_url();
    let ns = Namespace::for_mongo(database, "relaybus_").unwrap();
    MongoStore::open(&url, ns, StoreOptions::worker(2)).unwrap()
}

fn request(owner: &str, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        owner: owner.into(),
        handlers: vec!["h".into()],
        max_attempts: vec![25],
        batch: 10,
        new_lanes: 256,
        lease,
        outstanding: vec![],
        lanes: crate::store::LaneShare::ALL,
        held: None,
    }
}

/// The seed's case: a completion whose transaction read the lane and the delivery before a
/// takeover committed loses to it, runs again, finds the new epoch and reports the lease
/// lost; the delivery runs again under the new holder, charged one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_started_before_a_takeover_reports_the_lease_lost() {
    let database = format!("u{}_completion_vs_takeover", std::process::id());
    let first = Arc::new(store(&database));
    let second = store(&database);
    first.setup(false).await.unwrap();
    let e1 = NewEvent::new(
        "e1".into(),
        "t".into(),
        None,
        serde_json::json!({}),
        Default::default(),
        vec!["h".into()],
        &EventLimits {
            max_payload_bytes: 1000,
        },
    )
    .unwrap();
    first.publish(&[e1]).await.unwrap();
    let (claimed, _) = first
        .claim(&request("w1", Duration::from_millis(300)))
        .await
        .unwrap();
    let token = claimed[0].token.clone();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (reached, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    *first.completion_pause.lock().unwrap() = Some(Pause {
        reached: Arc::clone(&reached),
        resume: Arc::clone(&resume),
        after_writes: false,
    });
    let completion = tokio::spawn({
        let (first, token) = (Arc::clone(&first), token.clone());
        async move { first.complete(&[token], false).await.unwrap() }
    });
    reached.notified().await;
    let (none, stats) = second
        .claim(&request("w2", Duration::from_secs(30)))
        .await
        .unwrap();
    resume.notify_one();
    let completed = completion.await.unwrap();
    let (again, _) = second
        .claim(&request("w2", Duration::from_secs(30)))
        .await
        .unwrap();
    let tokens: Vec<_> = again
        .iter()
        .map(|d| (d.token.epoch, d.token.claims, d.attempts))
        .collect();
    let done = second
        .complete(&[again[0].token.clone()], false)
        .await
        .unwrap();
    first.conn.database().await.unwrap().drop().await.unwrap();
    assert_eq!((none.len(), stats.charged, stats.lanes_taken), (0, 1, 1));
    assert_eq!(completed, Vec::<String>::new());
    assert_eq!(tokens, [(token.epoch + 1, 1, 1)]);
    assert_eq!(done, [token.delivery_id]);
}

/// A worker dies inside a completion transaction (kill -9 after its deletes, before its
/// commit): the server keeps the transaction, and what it wrote, until its lifetime ends
/// (60 s). The next worker's takeover cannot charge that lane's deliveries meanwhile; it
/// charges and runs the other lanes' at once and keeps the conflicting losses for a later
/// claim, which settles them once the dead transaction is gone.
/// Events `e1` and `e2` for handler `h`, which lie in two lanes.
fn two_events_in_two_lanes() -> Vec<NewEvent> {
    let ids = ["e1", "e2"];
    assert_ne!(
        crate::store::lane::lane_of(None, ids[0]),
        crate::store::lane::lane_of(None, ids[1])
    );
    let limits = EventLimits {
        max_payload_bytes: 1000,
    };
    ids.iter()
        .map(|id| {
            let handlers = vec!["h".into()];
            NewEvent::new(
                id.to_string(),
                "t".into(),
                None,
                serde_json::json!({}),
                Default::default(),
                handlers,
                &limits,
            )
            .unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_worker_s_open_transaction_holds_up_only_its_own_lane() {
    let database = format!("u{}_dead_transaction", std::process::id());
    let dead = Arc::new(store(&database));
    let next = store(&database);
    dead.setup(false).await.unwrap();
    let events = two_events_in_two_lanes();
    dead.publish(&events).await.unwrap();
    let lease = Duration::from_millis(300);
    let (claimed, _) = dead.claim(&request("w1", lease)).await.unwrap();
    assert_eq!(claimed.len(), 2);
    let e1 = claimed
        .iter()
        .find(|d| d.event_id == "e1")
        .unwrap()
        .token
        .clone();
    let (reached, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    *dead.completion_pause.lock().unwrap() = Some(Pause {
        reached: Arc::clone(&reached),
        resume: Arc::clone(&resume),
        after_writes: true,
    });
    let dying = tokio::spawn({
        let dead = Arc::clone(&dead);
        async move { dead.complete(&[e1], false).await }
    });
    reached.notified().await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let started = std::time::Instant::now();
    let (none, stats) = next
        .claim(&request("w2", Duration::from_secs(30)))
        .await
        .unwrap();
    let took = started.elapsed();
    let (first, _) = next
        .claim(&request("w2", Duration::from_secs(30)))
        .await
        .unwrap();
    // e2 runs on while e1's lane waits for its charge.
    let running = ClaimRequest {
        outstanding: first.iter().map(|d| d.token.delivery_id.clone()).collect(),
        ..request("w2", Duration::from_secs(30))
    };
    let first: Vec<_> = first
        .iter()
        .map(|d| (d.event_id.clone(), d.attempts))
        .collect();
    // The dead worker's transaction ends (the server would end it after its lifetime).
    dying.abort();
    let _ = dying.await;
    let mut settled = None;
    for _ in 0..50 {
        let (again, stats) = next.claim(&running).await.unwrap();
        if !again.is_empty() {
            settled = Some((stats.charged, again[0].event_id.clone(), again[0].attempts));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    next.conn.database().await.unwrap().drop().await.unwrap();
    assert!(took < Duration::from_secs(5), "the takeover took {took:?}");
    assert_eq!((none.len(), stats.charged, stats.lanes_taken), (0, 1, 2));
    assert_eq!(first, [("e2".to_owned(), 1)]);
    assert_eq!(settled, Some((1, "e1".to_owned(), 1)));
}

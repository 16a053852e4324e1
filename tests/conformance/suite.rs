//! The story every store must tell, through the `Store` trait alone. Each function starts on an
//! empty namespace.

use std::time::Duration;

use relaybus::store::lane::lane_of;
use relaybus::store::prelude::*;
use relaybus::store::{
    purge, replay, ClaimRequest, ClaimedDelivery, Conversion, DeliveryFilter, DeliveryRow,
    DeliveryStatus, EventFilter, EventLimits, EventPosition, FailOutcome, Failure, LeaseToken,
    LiveLeases, NewEvent, PublishedDelivery, PurgeCounts, PurgeOptions, ReplayOptions, ReplayTally,
    RequeueSelector, SchemaStatus, StoreError, TargetState,
};
use serde_json::json;

use crate::common::claim_request as request;

fn event(id: &str, event_type: &str, key: Option<&str>, handlers: &[&str]) -> NewEvent {
    let limits = EventLimits {
        max_payload_bytes: 1 << 20,
    };
    let headers = json!({"trace": id}).as_object().unwrap().clone();
    NewEvent::new(
        id.into(),
        event_type.into(),
        key.map(Into::into),
        json!({"id": id, "n": [1, 2]}),
        headers,
        handlers.iter().map(|h| h.to_string()).collect(),
        &limits,
    )
    .unwrap()
}

fn order(id: &str, key: Option<&str>, handlers: &[&str]) -> NewEvent {
    event(id, "order.paid", key, handlers)
}

async fn installed<S: Store>(s: &S) {
    s.setup(false).await.unwrap();
}

async fn publish<S: Store>(s: &S, events: &[NewEvent]) -> Vec<(String, String)> {
    let mut new: Vec<(String, String)> = s
        .publish(events)
        .await
        .unwrap()
        .into_iter()
        .map(
            |PublishedDelivery {
                 event_id, handler, ..
             }| (event_id, handler),
        )
        .collect();
    new.sort();
    new
}

async fn claim<S: Store>(s: &S, req: &ClaimRequest) -> Vec<ClaimedDelivery> {
    s.claim(req).await.unwrap().0
}

fn events_of(claimed: &[ClaimedDelivery]) -> Vec<String> {
    let mut ids: Vec<String> = claimed.iter().map(|d| d.event_id.clone()).collect();
    ids.sort();
    ids
}

async fn list<S: Store>(s: &S, filter: DeliveryFilter) -> Vec<DeliveryRow> {
    s.list_deliveries(&DeliveryFilter {
        limit: 100,
        ..filter
    })
    .await
    .unwrap()
}

fn rows(listed: &[DeliveryRow]) -> Vec<String> {
    listed
        .iter()
        .map(|d| format!("{} {} {}", d.event_id, d.handler, d.status))
        .collect()
}

fn with_status(status: DeliveryStatus) -> DeliveryFilter {
    DeliveryFilter {
        status: Some(status),
        ..Default::default()
    }
}

fn retry(delay: Duration, max_attempts: i32) -> Failure {
    Failure::Retry {
        delay,
        max_attempts,
    }
}

pub(crate) async fn setup_installs_once_and_reports_what_it_found<S: Store>(s: &S) {
    let ns = s.namespace().clone();
    assert_eq!(s.schema_status().await.unwrap(), SchemaStatus::NotInstalled);
    assert_eq!(
        s.require_current().await.unwrap_err().to_string(),
        format!(
            "relaybus is not installed in {} \"{}\" with prefix \"{}\"; run `relaybus setup`",
            ns.container(),
            ns.schema(),
            ns.prefix()
        )
    );
    let first = s.setup(false).await.unwrap();
    assert_eq!(
        (first.before, first.after),
        (SchemaStatus::NotInstalled, SchemaStatus::Current)
    );
    let again = s.setup(false).await.unwrap();
    assert_eq!(
        (again.before, again.after),
        (SchemaStatus::Current, SchemaStatus::Current)
    );
    s.require_current().await.unwrap();
    let plan = s.upgrade_plan(Conversion::Offline).await.unwrap();
    assert_eq!(plan.found, SchemaStatus::Current);
    assert!(plan.steps.is_empty());
    assert_eq!(plan.live_leases, LiveLeases::default());
    let upgraded = s
        .upgrade(Conversion::Offline, false, &|_| {
            panic!("no step runs on a current store")
        })
        .await
        .unwrap();
    assert_eq!(
        (upgraded.before, upgraded.after),
        (SchemaStatus::Current, SchemaStatus::Current)
    );
    let lanes = s.lanes().await.unwrap();
    assert_eq!(lanes.len(), 256);
    assert!(lanes
        .iter()
        .enumerate()
        .all(|(i, l)| l.lane == i as i16 && l.owner.is_none() && l.epoch == 0 && l.pending == 0));
}

pub(crate) async fn publish_adds_deliveries_only_for_handlers_an_event_never_had<S: Store>(s: &S) {
    installed(s).await;
    let e1 = |handlers: &[&str]| order("e1", None, handlers);
    assert_eq!(
        publish(s, &[e1(&["a", "b"])]).await,
        [("e1".into(), "a".into()), ("e1".into(), "b".into())]
    );
    assert_eq!(publish(s, &[e1(&["a", "b"])]).await, []);
    // `a` completes, so its delivery is gone; a redelivery of the event must not run it again.
    let claimed = claim(s, &request("w", &["a"])).await;
    assert_eq!(events_of(&claimed), ["e1"]);
    let done = s
        .complete(&[claimed[0].token.clone()], false)
        .await
        .unwrap();
    assert_eq!(done, [claimed[0].token.delivery_id.clone()]);
    assert_eq!(
        publish(s, &[e1(&["a", "b", "c"])]).await,
        [("e1".into(), "c".into())]
    );
    let shown = s.show_event("e1").await.unwrap().unwrap();
    assert_eq!(shown.handlers, ["a", "b", "c"]);
    assert_eq!(
        (shown.event_type.as_str(), &shown.payload, &shown.headers),
        (
            "order.paid",
            &json!({"id": "e1", "n": [1, 2]}),
            &json!({"trace": "e1"})
        )
    );
    assert_eq!(rows(&shown.deliveries), ["e1 b pending", "e1 c pending"]);
    assert!(s.show_event("nope").await.unwrap().is_none());
}

/// A republish says the same as the first publish when its numbers have the same value,
/// however they are written (`1.5`, `1.50`): as JSON, and as PostgreSQL's jsonb compares them.
pub(crate) async fn a_republish_with_a_number_written_otherwise_is_the_same_event<S: Store>(s: &S) {
    installed(s).await;
    let priced = |price: &str, handlers: &[&str]| {
        let payload = serde_json::from_str(&format!(r#"{{"price": {price}, "qty": [1e1]}}"#));
        NewEvent::new(
            "e1".into(),
            "order.paid".into(),
            None,
            payload.unwrap(),
            Default::default(),
            handlers.iter().map(|h| h.to_string()).collect(),
            &EventLimits {
                max_payload_bytes: 1 << 20,
            },
        )
        .unwrap()
    };
    assert_eq!(
        publish(s, &[priced("1.50", &["a"])]).await,
        [("e1".into(), "a".into())]
    );
    let again = NewEvent {
        payload: json!({"qty": [10], "price": 1.5}),
        ..priced("1.5", &["a", "b"])
    };
    assert_eq!(publish(s, &[again]).await, [("e1".into(), "b".into())]);
    let refused = s.publish(&[priced("1.51", &["a"])]).await.unwrap_err();
    assert!(
        matches!(&refused, StoreError::ConflictingEvent { id, .. } if id == "e1"),
        "{refused}"
    );
}
pub(crate) async fn keyed_events_get_gapless_sequences_in_publish_order_and_their_key_s_lane<
    S: Store,
>(
    s: &S,
) {
    installed(s).await;
    publish(
        s,
        &[
            order("e1", Some("k1"), &["h"]),
            order("e2", Some("k1"), &["h"]),
        ],
    )
    .await;
    publish(
        s,
        &[
            order("e3", Some("k1"), &["h"]),
            order("e4", Some("k2"), &["h"]),
            order("u1", None, &["h"]),
        ],
    )
    .await;
    let of = |listed: Vec<DeliveryRow>| -> Vec<(String, Option<i64>, Option<i16>)> {
        listed
            .into_iter()
            .map(|d| (d.event_id, d.sequence, d.lane))
            .collect()
    };
    let key = |k: &str| DeliveryFilter {
        key: Some(k.into()),
        ..Default::default()
    };
    let k1 = Some(lane_of(Some("k1"), ""));
    assert_eq!(
        of(list(s, key("k1")).await),
        [
            ("e1".into(), Some(1), k1),
            ("e2".into(), Some(2), k1),
            ("e3".into(), Some(3), k1)
        ]
    );
    assert_eq!(
        of(list(s, key("k2")).await),
        [("e4".into(), Some(1), Some(lane_of(Some("k2"), "")))]
    );
    let event = |id: &str| DeliveryFilter {
        event_id: Some(id.into()),
        ..Default::default()
    };
    assert_eq!(
        of(list(s, event("u1")).await),
        [("u1".into(), None, Some(lane_of(None, "u1")))]
    );
}

pub(crate) async fn a_claim_leases_due_deliveries_to_one_worker<S: Store>(s: &S) {
    installed(s).await;
    publish(
        s,
        &[
            order("e1", None, &["h"]),
            order("e2", None, &["h"]),
            order("e3", None, &["h"]),
            order("x1", None, &["other"]),
        ],
    )
    .await;
    let (claimed, stats) = s.claim(&request("w1", &["h"])).await.unwrap();
    assert_eq!(events_of(&claimed), ["e1", "e2", "e3"]);
    assert_eq!(stats.charged, 0);
    assert!(stats.lanes_taken >= 1, "{stats:?}");
    for d in &claimed {
        assert_eq!(
            (
                d.token.epoch,
                d.token.claims,
                d.attempts,
                d.handler.as_str()
            ),
            (1, 0, 0, "h")
        );
        assert_eq!(d.token.lane, lane_of(None, &d.event_id));
        assert_eq!(
            (d.event_type.as_str(), d.key.as_deref()),
            ("order.paid", None)
        );
        let parsed = |raw: &serde_json::value::RawValue| {
            serde_json::from_str::<serde_json::Value>(raw.get()).unwrap()
        };
        assert_eq!(parsed(&d.payload), json!({"id": d.event_id, "n": [1, 2]}));
        assert_eq!(parsed(&d.headers), json!({"trace": d.event_id}));
    }
    assert_eq!(claim(s, &request("w2", &["h"])).await.len(), 0);
    assert_eq!(
        rows(&list(s, with_status(DeliveryStatus::Processing)).await),
        ["e1 h processing", "e2 h processing", "e3 h processing"]
    );
    assert_eq!(
        rows(&list(s, with_status(DeliveryStatus::Pending)).await),
        ["x1 other pending"]
    );
    let shown = s
        .show_delivery(&claimed[0].token.delivery_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (shown.lane_owner.as_deref(), shown.lease_token),
        (Some("w1"), Some(claimed[0].token.to_string()))
    );
}

pub(crate) async fn a_key_runs_one_delivery_at_a_time_in_sequence_order<S: Store>(s: &S) {
    installed(s).await;
    publish(
        s,
        &[
            order("e1", Some("k"), &["h"]),
            order("e2", Some("k"), &["h"]),
            order("e3", Some("k"), &["h"]),
        ],
    )
    .await;
    let first = claim(s, &request("w1", &["h"])).await;
    assert_eq!(events_of(&first), ["e1"]);
    let running = ClaimRequest {
        outstanding: vec![first[0].token.delivery_id.clone()],
        ..request("w1", &["h"])
    };
    assert_eq!(claim(s, &running).await.len(), 0, "e2 waits while e1 runs");
    s.complete(&[first[0].token.clone()], false).await.unwrap();
    let second = claim(s, &request("w1", &["h"])).await;
    assert_eq!(events_of(&second), ["e2"]);
}

pub(crate) async fn a_stale_token_changes_nothing_after_a_takeover<S: Store>(s: &S) {
    installed(s).await;
    publish(s, &[order("e1", None, &["h"])]).await;
    // Long enough that the second claim below comes inside it on a slow test server.
    let short = ClaimRequest {
        lease: Duration::from_secs(1),
        ..request("w1", &["h"])
    };
    let first = claim(s, &short).await;
    let old = first[0].token.clone();
    assert_eq!((old.epoch, old.claims, first[0].attempts), (1, 0, 0));
    let (none, stats) = s.claim(&request("w2", &["h"])).await.unwrap();
    assert_eq!((none.len(), stats.charged, stats.lanes_taken), (0, 0, 0));
    // Before a handler starts, its lane is confirmed: the holder's at the claim's epoch, with
    // the delivery in flight (a lease shorter than the claim's, so the takeover comes on time).
    let confirm = |owner: &'static str, token: LeaseToken| async move {
        s.confirm(owner, Duration::from_millis(900), &token)
            .await
            .unwrap()
    };
    assert!(confirm("w1", old.clone()).await);
    assert!(!confirm("w2", old.clone()).await);
    let other_epoch = LeaseToken {
        epoch: old.epoch + 1,
        ..old.clone()
    };
    assert!(!confirm("w1", other_epoch).await);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (none, stats) = s.claim(&request("w2", &["h"])).await.unwrap();
    assert_eq!((none.len(), stats.charged, stats.lanes_taken), (0, 1, 1));
    assert!(!confirm("w1", old.clone()).await, "the lane changed hands");
    // The lane taken over runs nothing yet but is held: the next claim reads it.
    if let Some(held) = stats.held {
        assert_eq!(held, [old.lane]);
    }
    // The old holder's completion, failure and release all lose.
    assert_eq!(
        s.complete(std::slice::from_ref(&old), false).await.unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(
        s.fail(&old, &Failure::Reject, "late").await.unwrap(),
        FailOutcome::LeaseLost
    );
    s.release("w1", std::slice::from_ref(&old)).await.unwrap();
    let shown = s.show_delivery(&old.delivery_id).await.unwrap().unwrap();
    assert_eq!(
        (
            shown.delivery.status.as_str(),
            shown.delivery.attempts,
            shown.claims,
            shown.delivery.last_error.as_deref()
        ),
        (
            "pending",
            1,
            1,
            Some(
                format!(
                    "lease lost: the worker holding lane {} stopped without completing",
                    old.lane
                )
                .as_str()
            )
        )
    );
    let again = claim(s, &request("w2", &["h"])).await;
    let new = again[0].token.clone();
    assert_eq!(
        (new.lane, new.epoch, new.claims, again[0].attempts),
        (old.lane, old.epoch + 1, 1, 1)
    );
    assert_eq!(
        s.complete(&[old, new.clone()], false).await.unwrap(),
        [new.delivery_id]
    );
    assert_eq!(list(s, DeliveryFilter::default()).await.len(), 0);
}

/// A lane handed back (its worker stopped while a completion was still unrecorded) and taken
/// again: the delivery's claims counter is unchanged, so only the lane's epoch tells the old
/// token from the new one.
pub(crate) async fn a_token_of_a_lane_that_changed_hands_is_stale<S: Store>(s: &S) {
    installed(s).await;
    publish(s, &[order("e1", None, &["h"])]).await;
    let old = claim(s, &request("w1", &["h"])).await[0].token.clone();
    s.release("w1", &[]).await.unwrap();
    let new = claim(s, &request("w2", &["h"])).await[0].token.clone();
    assert_eq!(
        (new.lane, new.epoch, new.claims),
        (old.lane, old.epoch + 1, old.claims)
    );
    assert_eq!(
        s.complete(std::slice::from_ref(&old), false).await.unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(
        s.fail(&old, &Failure::Reject, "late").await.unwrap(),
        FailOutcome::LeaseLost
    );
    assert_eq!(
        s.complete(std::slice::from_ref(&new), false).await.unwrap(),
        std::slice::from_ref(&new.delivery_id)
    );
}

pub(crate) async fn a_takeover_charges_an_attempt_and_buries_at_the_last<S: Store>(s: &S) {
    installed(s).await;
    publish(s, &[order("e1", None, &["h"]), order("e2", None, &["h2"])]).await;
    let short = ClaimRequest {
        lease: Duration::from_millis(100),
        ..request("w1", &["h", "h2"])
    };
    assert_eq!(claim(s, &short).await.len(), 2);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let takeover = ClaimRequest {
        max_attempts: vec![1, 2],
        ..request("w2", &["h", "h2"])
    };
    let (_, stats) = s.claim(&takeover).await.unwrap();
    assert_eq!(stats.charged, 2);
    let listed = list(s, DeliveryFilter::default()).await;
    let state: Vec<(String, String, i32)> = listed
        .iter()
        .map(|d| (d.event_id.clone(), d.status.clone(), d.attempts))
        .collect();
    assert_eq!(
        state,
        [
            ("e1".into(), "dead".into(), 1),
            ("e2".into(), "pending".into(), 1)
        ]
    );
    assert!(listed[0]
        .last_error
        .as_deref()
        .unwrap()
        .starts_with("lease lost: "));
}

pub(crate) async fn complete_deletes_and_keeps_history_only_when_asked<S: Store>(s: &S) {
    installed(s).await;
    publish(s, &[order("e1", None, &["h"]), order("e2", None, &["h"])]).await;
    let claimed = claim(s, &request("w1", &["h"])).await;
    let token = |event: &str| -> LeaseToken {
        claimed
            .iter()
            .find(|d| d.event_id == event)
            .unwrap()
            .token
            .clone()
    };
    let (t1, t2) = (token("e1"), token("e2"));
    assert_eq!(
        s.complete(std::slice::from_ref(&t1), false).await.unwrap(),
        std::slice::from_ref(&t1.delivery_id)
    );
    assert_eq!(
        s.complete(std::slice::from_ref(&t2), true).await.unwrap(),
        std::slice::from_ref(&t2.delivery_id)
    );
    assert_eq!(
        s.complete(&[t1], false).await.unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(list(s, DeliveryFilter::default()).await.len(), 0);
    let completed = list(s, with_status(DeliveryStatus::Completed)).await;
    assert_eq!(rows(&completed), ["e2 h completed"]);
    assert_eq!(
        (completed[0].id.as_deref(), completed[0].attempts),
        (None, 1)
    );
    let stats = s.stats().await.unwrap();
    assert_eq!(
        stats
            .iter()
            .map(|h| (h.handler.as_str(), h.due, h.processing, h.completed))
            .collect::<Vec<_>>(),
        [("h", 0, 0, 1)]
    );
}

pub(crate) async fn a_failure_reschedules_until_the_last_attempt_then_buries<S: Store>(s: &S) {
    installed(s).await;
    publish(s, &[order("e1", None, &["h"])]).await;
    let first = claim(s, &request("w1", &["h"])).await;
    let t1 = first[0].token.clone();
    assert_eq!(
        s.fail(&t1, &retry(Duration::ZERO, 2), "boom 1")
            .await
            .unwrap(),
        FailOutcome::Rescheduled
    );
    let state = |d: relaybus::store::DeliveryDetail| {
        (
            d.delivery.status,
            d.delivery.attempts,
            d.claims,
            d.delivery.last_error.unwrap_or_default(),
        )
    };
    let shown = s.show_delivery(&t1.delivery_id).await.unwrap().unwrap();
    assert_eq!(state(shown), ("pending".into(), 1, 1, "boom 1".into()));
    let second = claim(s, &request("w1", &["h"])).await;
    let t2 = second[0].token.clone();
    assert_eq!((second[0].attempts, t2.claims), (1, 1));
    assert_eq!(
        s.fail(&t2, &retry(Duration::ZERO, 2), "boom 2")
            .await
            .unwrap(),
        FailOutcome::Buried
    );
    let shown = s.show_delivery(&t2.delivery_id).await.unwrap().unwrap();
    assert_eq!(state(shown), ("dead".into(), 2, 2, "boom 2".into()));
    assert_eq!(
        s.fail(&t2, &retry(Duration::ZERO, 2), "again")
            .await
            .unwrap(),
        FailOutcome::LeaseLost
    );
    // A delay keeps it out of claims until it is due.
    publish(s, &[order("e2", None, &["h"])]).await;
    let third = claim(s, &request("w1", &["h"])).await;
    assert_eq!(
        s.fail(
            &third[0].token,
            &retry(Duration::from_secs(3600), 25),
            "later"
        )
        .await
        .unwrap(),
        FailOutcome::Rescheduled
    );
    assert_eq!(claim(s, &request("w1", &["h"])).await.len(), 0);
    let stats = s.stats().await.unwrap();
    assert_eq!((stats[0].due, stats[0].scheduled, stats[0].dead), (0, 1, 1));
}

pub(crate) async fn a_rejection_buries_at_once<S: Store>(s: &S) {
    installed(s).await;
    publish(s, &[order("e1", None, &["h"])]).await;
    let claimed = claim(s, &request("w1", &["h"])).await;
    assert_eq!(
        s.fail(&claimed[0].token, &Failure::Reject, "exit 65")
            .await
            .unwrap(),
        FailOutcome::Buried
    );
    let dead = list(s, with_status(DeliveryStatus::Dead)).await;
    assert_eq!(
        (rows(&dead), dead[0].attempts, dead[0].last_error.as_deref()),
        (vec!["e1 h dead".to_owned()], 1, Some("exit 65"))
    );
}

pub(crate) async fn release_hands_lanes_back_without_charging_an_attempt<S: Store>(s: &S) {
    installed(s).await;
    publish(s, &[order("e1", None, &["h"]), order("e2", None, &["h"])]).await;
    let claimed = claim(s, &request("w1", &["h"])).await;
    assert_eq!(claimed.len(), 2);
    let aborted = claimed
        .iter()
        .find(|d| d.event_id == "e1")
        .unwrap()
        .token
        .clone();
    s.release("w1", std::slice::from_ref(&aborted))
        .await
        .unwrap();
    assert!(s.lanes().await.unwrap().iter().all(|l| l.owner.is_none()));
    let claims_of = |id: String| async move {
        let d = s.show_delivery(&id).await.unwrap().unwrap();
        (d.delivery.attempts, d.claims)
    };
    let other = claimed.iter().find(|d| d.event_id == "e2").unwrap();
    assert_eq!(claims_of(aborted.delivery_id.clone()).await, (0, 1));
    assert_eq!(claims_of(other.token.delivery_id.clone()).await, (0, 0));
    let again = claim(s, &request("w2", &["h"])).await;
    assert_eq!(events_of(&again), ["e1", "e2"]);
    assert!(again.iter().all(|d| d.attempts == 0));
}

/// A lane is renewed while it runs one of the worker's deliveries; once they are all done (their
/// ids stay listed until the lane's next claim) it is not, so its pending work is never held
/// by a worker that does nothing there.
pub(crate) async fn renew_extends_only_lanes_that_run_the_worker_s_deliveries<S: Store>(s: &S) {
    installed(s).await;
    publish(s, &[order("e1", None, &["h"])]).await;
    let short = ClaimRequest {
        lease: Duration::from_secs(1),
        ..request("w1", &["h"])
    };
    let claimed = claim(s, &short).await;
    let id = claimed[0].token.delivery_id.clone();
    let hour = Duration::from_secs(3600);
    assert_eq!(
        s.renew("w1", hour, std::slice::from_ref(&id))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        s.renew("w2", hour, std::slice::from_ref(&id))
            .await
            .unwrap(),
        0
    );
    let lane_of_claim = |lanes: Vec<relaybus::store::LaneRow>| {
        let lane = &lanes[claimed[0].token.lane as usize];
        let left = lane.lease_expires_at.unwrap() - chrono::Utc::now();
        (lane.owner.clone(), lane.in_flight, left)
    };
    let (owner, in_flight, left) = lane_of_claim(s.lanes().await.unwrap());
    assert_eq!((owner.as_deref(), in_flight), (Some("w1"), 1));
    assert!(left > chrono::Duration::minutes(50), "{left}");
    // Done, but still listed in flight: no longer renewed.
    s.complete(&[claimed[0].token.clone()], false)
        .await
        .unwrap();
    assert_eq!(s.renew("w1", hour, &[]).await.unwrap(), 0);
    assert_eq!(s.renew("w1", hour, &["other".to_owned()]).await.unwrap(), 0);
}

/// A worker that stalled past its lease (a lock, a pause) keeps its lanes until another worker
/// takes them over: its next claim goes on with them, the deliveries it still runs stay its
/// own, and nothing is charged.
pub(crate) async fn a_worker_keeps_its_lanes_past_their_lease_until_another_takes_them<S: Store>(
    s: &S,
) {
    installed(s).await;
    publish(
        s,
        &[
            order("e1", Some("k"), &["h"]),
            order("e2", Some("k"), &["h"]),
        ],
    )
    .await;
    let short = ClaimRequest {
        lease: Duration::from_millis(200),
        ..request("w1", &["h"])
    };
    let (first, stats) = s.claim(&short).await.unwrap();
    assert_eq!(events_of(&first), ["e1"]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = ClaimRequest {
        outstanding: vec![first[0].token.delivery_id.clone()],
        held: stats.held,
        ..short.clone()
    };
    let (none, stats) = s.claim(&again).await.unwrap();
    assert_eq!((none.len(), stats.charged, stats.lanes_taken), (0, 0, 0));
    let lane = &s.lanes().await.unwrap()[first[0].token.lane as usize];
    assert_eq!(
        (lane.owner.as_deref(), lane.epoch),
        (Some("w1"), first[0].token.epoch)
    );
    assert_eq!(
        s.complete(&[first[0].token.clone()], false).await.unwrap(),
        [first[0].token.delivery_id.clone()]
    );
    let next = ClaimRequest {
        held: stats.held,
        ..short
    };
    let second = claim(s, &next).await;
    assert_eq!(
        (
            events_of(&second),
            second[0].attempts,
            second[0].token.epoch
        ),
        (vec!["e2".to_owned()], 0, first[0].token.epoch)
    );
}

/// A lane whose worker died after its deliveries were done (their ids still listed in flight,
/// nothing due in the lane) is taken over by the next claim that finds its lanes by owner, charged
/// nothing, and then handed back: no lane stays held by an expired lease.
pub(crate) async fn an_expired_lane_with_deliveries_in_flight_is_taken_over_whatever_is_due<
    S: Store,
>(
    s: &S,
) {
    installed(s).await;
    publish(s, &[order("e1", None, &["h"])]).await;
    let short = ClaimRequest {
        lease: Duration::from_millis(200),
        ..request("w1", &["h"])
    };
    let first = claim(s, &short).await;
    s.complete(&[first[0].token.clone()], false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let expired = |lanes: Vec<relaybus::store::LaneRow>| -> Vec<(i16, Option<String>)> {
        lanes
            .into_iter()
            .filter(|l| l.owner.is_some())
            .map(|l| (l.lane, l.owner))
            .collect()
    };
    assert_eq!(
        expired(s.lanes().await.unwrap()),
        [(first[0].token.lane, Some("w1".to_owned()))]
    );
    let (none, stats) = s.claim(&request("w2", &["h"])).await.unwrap();
    assert_eq!((none.len(), stats.charged, stats.lanes_taken), (0, 0, 1));
    let next = ClaimRequest {
        held: stats.held,
        ..request("w2", &["h"])
    };
    claim(s, &next).await;
    assert_eq!(expired(s.lanes().await.unwrap()), []);
}

/// A dead worker's lane with a delivery in flight is taken over by a busy worker whose own lane
/// fills every batch it claims: the claim that finds its lanes by owner takes the dead lane over
/// and charges its delivery beside a full batch, so that delivery waits for the lease and not
/// for the survivor's backlog.
pub(crate) async fn a_busy_worker_takes_a_dead_worker_s_lane_over_beside_a_full_batch<S: Store>(
    s: &S,
) {
    installed(s).await;
    // The dead worker's delivery in one lane, 25 of the survivor's in another.
    let in_lane = |lane: i16, n: usize| -> Vec<String> {
        (0..)
            .map(|i| format!("e{i}"))
            .filter(|id| lane_of(None, id) == lane)
            .take(n)
            .collect()
    };
    let dead_id = in_lane(3, 1).remove(0);
    publish(s, &[order(&dead_id, None, &["h"])]).await;
    let short = ClaimRequest {
        lease: Duration::from_millis(300),
        ..request("dead", &["h"])
    };
    let dead = claim(s, &short).await;
    assert_eq!(events_of(&dead), std::slice::from_ref(&dead_id));
    let backlog: Vec<NewEvent> = in_lane(9, 25)
        .iter()
        .map(|id| order(id, None, &["h"]))
        .collect();
    publish(s, &backlog).await;
    let (first, stats) = s.claim(&request("busy", &["h"])).await.unwrap();
    assert_eq!((first.len(), stats.charged), (10, 0));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A full batch from the held lane, no search for more lanes, found by owner.
    let census = ClaimRequest {
        new_lanes: 0,
        outstanding: first.iter().map(|d| d.token.delivery_id.clone()).collect(),
        held: None,
        ..request("busy", &["h"])
    };
    let (second, stats) = s.claim(&census).await.unwrap();
    assert!(
        second.iter().all(|d| d.token.lane == 9),
        "{:?}",
        events_of(&second)
    );
    assert_eq!((second.len(), stats.charged, stats.lanes_taken), (10, 1, 1));
    let lanes = s.lanes().await.unwrap();
    assert_eq!(lanes[3].owner.as_deref(), Some("busy"));
    let charged = s
        .show_delivery(&dead[0].token.delivery_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(charged.delivery.attempts, 1);
}

/// A process that restarts and reuses its owner name is another store instance: it does not
/// adopt the live lanes of its dead predecessor, and takes them over, charged, once their lease
/// expires.
pub(crate) async fn a_restarted_worker_with_the_same_owner_name_does_not_adopt_live_lanes<
    S: Store,
>(
    dead: &S,
    restarted: &S,
) {
    installed(dead).await;
    publish(dead, &[order("e1", None, &["h"])]).await;
    let short = ClaimRequest {
        lease: Duration::from_millis(500),
        ..request("w", &["h"])
    };
    let claimed = claim(dead, &short).await;
    assert_eq!(events_of(&claimed), ["e1"]);
    let running = [claimed[0].token.delivery_id.clone()];
    let (none, stats) = restarted.claim(&short).await.unwrap();
    assert_eq!((none.len(), stats.charged, stats.lanes_taken), (0, 0, 0));
    assert_eq!(
        restarted.renew("w", short.lease, &running).await.unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (none, stats) = restarted.claim(&short).await.unwrap();
    assert_eq!((none.len(), stats.charged, stats.lanes_taken), (0, 1, 1));
    let next = ClaimRequest {
        held: stats.held,
        ..short
    };
    let again = claim(restarted, &next).await;
    assert_eq!(
        (events_of(&again), again[0].attempts),
        (vec!["e1".to_owned()], 1)
    );
}

/// Pauses and circuit breakers are shared by every worker of a store: each change applies
/// atomically over the latest state (concurrent failures from two store instances are all
/// counted, one probe is taken), and what one writes the other reads.
pub(crate) async fn handler_rows_change_atomically_and_every_instance_reads_them<S: Store>(
    s: &S,
    other: &S,
) {
    use relaybus::store::handlers::{BreakerPolicy, HandlerRow};
    installed(s).await;
    assert_eq!(other.handler_rows().await.unwrap(), []);
    // To the millisecond, as both engines keep it.
    let now =
        chrono::DateTime::from_timestamp_millis(chrono::Utc::now().timestamp_millis()).unwrap();
    let paused = s
        .change_handler("h", &|c| c.pause("ana", Some("deploy"), now))
        .await
        .unwrap()
        .unwrap();
    let expected = HandlerRow {
        paused_at: Some(now),
        paused_by: Some("ana".into()),
        pause_reason: Some("deploy".into()),
        ..HandlerRow::new("h")
    };
    assert_eq!(paused, expected);
    let again = other
        .change_handler("h", &|c| c.pause("ana", Some("deploy"), now))
        .await;
    assert_eq!(again.unwrap(), None);
    assert_eq!(
        other.handler_rows().await.unwrap(),
        std::slice::from_ref(&expected)
    );
    // The breaker's settings as one worker wrote them are what the other counts against, to
    // the millisecond.
    let policy = BreakerPolicy {
        threshold: 3,
        max_cooldown: std::time::Duration::from_millis(95_250),
    };
    let set = |c: &mut HandlerRow| c.set_breaker_policy(policy);
    assert!(s.change_handler("h", &set).await.unwrap().is_some());
    assert_eq!(other.change_handler("h", &set).await.unwrap(), None);
    let expected = HandlerRow {
        breaker_policy: policy,
        ..expected
    };
    assert_eq!(
        other.handler_rows().await.unwrap(),
        std::slice::from_ref(&expected)
    );
    let fail = |c: &mut HandlerRow| {
        c.failed(false, now);
        true
    };
    let failures = (0..20).map(|i| {
        let store = if i % 2 == 0 { s } else { other };
        store.change_handler("h", &fail)
    });
    futures_util::future::join_all(failures)
        .await
        .into_iter()
        .for_each(|r| assert!(r.unwrap().is_some()));
    let open = HandlerRow {
        failures: 20,
        opened: 1,
        open_until: Some(now + chrono::Duration::seconds(30)),
        ..expected.clone()
    };
    assert_eq!(s.handler_rows().await.unwrap(), [open]);
    let later = now + chrono::Duration::seconds(30);
    let probe = |c: &mut HandlerRow| c.take_probe(later);
    let probes = futures_util::future::join_all(
        [s, other, s, other].map(|store| store.change_handler("h", &probe)),
    )
    .await;
    let taken = probes.into_iter().filter(|p| p.as_ref().unwrap().is_some());
    assert_eq!(taken.count(), 1);
    assert_eq!(
        other
            .change_handler("h", &|c| c.close_breaker())
            .await
            .unwrap(),
        Some(expected.clone())
    );
    let resumed = HandlerRow {
        breaker_policy: policy,
        ..HandlerRow::new("h")
    };
    assert_eq!(
        s.change_handler("h", &|c| c.resume()).await.unwrap(),
        Some(resumed.clone())
    );
    assert_eq!(s.change_handler("h", &|c| c.resume()).await.unwrap(), None);
    assert_eq!(other.handler_rows().await.unwrap(), [resumed]);
}

/// A claim for one handler finds its due delivery behind more due deliveries of another handler
/// than a lane keeps in flight: a paused handler's backlog never hides the others' work.
pub(crate) async fn a_claim_finds_its_handler_s_work_behind_another_handler_s_backlog<S: Store>(
    s: &S,
) {
    installed(s).await;
    let lane = lane_of(None, "a-0");
    let ahead: Vec<NewEvent> = (0..)
        .map(|i| format!("b-{i}"))
        .filter(|id| lane_of(None, id) == lane)
        .take(70)
        .map(|id| order(&id, None, &["b"]))
        .collect();
    publish(s, &ahead).await;
    publish(s, &[order("a-0", None, &["a"])]).await;
    let claimed = claim(s, &request("w", &["a"])).await;
    assert_eq!(events_of(&claimed), ["a-0"]);
}

/// A delivery whose handler could not be started is postponed: due again later, its attempts
/// unchanged, the reason kept as its last error.
pub(crate) async fn a_postponed_delivery_is_due_later_without_an_attempt<S: Store>(s: &S) {
    installed(s).await;
    publish(s, &[order("e1", None, &["h"])]).await;
    let claimed = claim(s, &request("w1", &["h"])).await;
    let later = Failure::Postpone {
        delay: Duration::from_secs(3600),
    };
    let outcome = s
        .fail(
            &claimed[0].token,
            &later,
            "could not start: too many open files",
        )
        .await
        .unwrap();
    assert_eq!(outcome, FailOutcome::Rescheduled);
    assert!(!s.due_exists(&["h".to_owned()]).await.unwrap());
    let shown = s
        .show_delivery(&claimed[0].token.delivery_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            shown.delivery.status.as_str(),
            shown.delivery.attempts,
            shown.claims,
            shown.delivery.last_error.as_deref()
        ),
        (
            "pending",
            0,
            1,
            Some("could not start: too many open files")
        )
    );
    let due = shown.delivery.available_at.unwrap() - chrono::Utc::now();
    assert!(due > chrono::Duration::minutes(50), "{due}");
}

pub(crate) async fn due_exists_sees_only_due_work_of_the_given_handlers<S: Store>(s: &S) {
    installed(s).await;
    let due = |handlers: &[&str]| {
        let handlers: Vec<String> = handlers.iter().map(|h| h.to_string()).collect();
        async move { s.due_exists(&handlers).await.unwrap() }
    };
    assert!(!due(&["h"]).await);
    publish(s, &[order("e1", None, &["h"])]).await;
    assert!(due(&["h"]).await);
    assert!(!due(&["other"]).await);
    let claimed = claim(s, &request("w1", &["h"])).await;
    s.fail(
        &claimed[0].token,
        &retry(Duration::from_secs(3600), 25),
        "later",
    )
    .await
    .unwrap();
    assert!(!due(&["h"]).await);
}

pub(crate) async fn requeue_revives_only_the_selected_dead_deliveries<S: Store>(s: &S) {
    installed(s).await;
    publish(
        s,
        &[
            order("e1", None, &["billing", "crm"]),
            event("e2", "user.new", None, &["billing"]),
            event("e3", "user.new", None, &["crm", "other"]),
        ],
    )
    .await;
    for d in claim(s, &request("w1", &["billing", "crm"])).await {
        let error = format!(
            "{} said no",
            if d.handler == "billing" {
                "HTTP 503 from billing"
            } else {
                "crm"
            }
        );
        s.fail(&d.token, &Failure::Reject, &error).await.unwrap();
    }
    let select = |f: fn(&mut RequeueSelector)| {
        let mut selector = RequeueSelector::default();
        f(&mut selector);
        selector
    };
    let all = select(|s| s.all = true);
    assert_eq!(s.count_dead(&all).await.unwrap(), 4);
    let crm_users = select(|s| {
        s.handler = Some("crm".into());
        s.event_type = Some("user.new".into());
    });
    assert_eq!(s.count_dead(&crm_users).await.unwrap(), 1);
    let http = select(|s| s.error_contains = Some("503".into()));
    assert_eq!(s.count_dead(&http).await.unwrap(), 2);
    let dead = list(s, with_status(DeliveryStatus::Dead)).await;
    let id_of = |event: &str, handler: &str| {
        dead.iter()
            .find(|d| d.event_id == event && d.handler == handler)
            .and_then(|d| d.id.clone())
            .unwrap()
    };
    let one = RequeueSelector {
        ids: vec![id_of("e2", "billing")],
        ..Default::default()
    };
    assert_eq!(s.requeue(&one).await.unwrap(), [id_of("e2", "billing")]);
    assert_eq!(s.requeue(&crm_users).await.unwrap(), [id_of("e3", "crm")]);
    let mut rest = s.requeue(&all).await.unwrap();
    rest.sort();
    let mut expected = vec![id_of("e1", "billing"), id_of("e1", "crm")];
    expected.sort();
    assert_eq!(rest, expected);
    assert_eq!(s.requeue(&all).await.unwrap(), Vec::<String>::new());
    let listed = list(s, DeliveryFilter::default()).await;
    let state: Vec<String> = listed
        .iter()
        .map(|d| {
            format!(
                "{} {} {} {} {}",
                d.event_id,
                d.handler,
                d.status,
                d.attempts,
                d.last_error.as_deref().unwrap_or("-")
            )
        })
        .collect();
    assert_eq!(
        state,
        [
            "e1 billing pending 0 HTTP 503 from billing said no",
            "e1 crm pending 0 crm said no",
            "e2 billing pending 0 HTTP 503 from billing said no",
            "e3 crm pending 0 crm said no",
            "e3 other pending 0 -",
        ]
    );
}

pub(crate) async fn purge_deletes_what_retention_allows_and_keeps_pending_work<S: Store>(s: &S) {
    installed(s).await;
    publish(
        s,
        &[
            order("pending", None, &["h"]),
            order("done", None, &["done"]),
            order("dead", None, &["dies"]),
        ],
    )
    .await;
    for d in claim(s, &request("w1", &["done", "dies"])).await {
        if d.handler == "done" {
            s.complete(&[d.token], true).await.unwrap();
        } else {
            s.fail(&d.token, &Failure::Reject, "gone").await.unwrap();
        }
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let everything = PurgeOptions {
        completed_older_than: Some(Duration::ZERO),
        dead_older_than: Some(Duration::ZERO),
        batch: 1,
    };
    let expected = PurgeCounts {
        dead: 1,
        completed: 0,
        history: 1,
        events: 2,
    };
    assert_eq!(s.purge_count(&everything).await.unwrap(), expected);
    let keep_dead = PurgeOptions {
        dead_older_than: None,
        ..everything.clone()
    };
    assert_eq!(
        s.purge_count(&keep_dead).await.unwrap(),
        PurgeCounts {
            dead: 0,
            events: 1,
            ..expected
        }
    );
    assert_eq!(purge(s, &everything, |_| {}).await.unwrap(), expected);
    assert!(s.show_event("pending").await.unwrap().is_some());
    assert!(s.show_event("done").await.unwrap().is_none());
    assert!(s.show_event("dead").await.unwrap().is_none());
    assert_eq!(
        rows(&list(s, DeliveryFilter::default()).await),
        ["pending h pending"]
    );
    assert_eq!(
        purge(s, &everything, |_| {}).await.unwrap(),
        PurgeCounts::default()
    );
}

pub(crate) async fn listings_filter_by_status_handler_key_event_and_type_in_creation_order<
    S: Store,
>(
    s: &S,
) {
    installed(s).await;
    publish(
        s,
        &[
            order("e1", Some("k1"), &["billing", "email"]),
            order("e2", Some("k2"), &["billing"]),
            event("e3", "user.new", None, &["email"]),
        ],
    )
    .await;
    for d in claim(s, &request("w0", &["email"])).await {
        s.fail(&d.token, &Failure::Reject, "smtp down")
            .await
            .unwrap();
    }
    let running = ClaimRequest {
        batch: 1,
        ..request("w1", &["billing"])
    };
    let claimed = claim(s, &running).await;
    let (busy, idle) = if claimed[0].event_id == "e1" {
        ("e1", "e2")
    } else {
        ("e2", "e1")
    };
    let all = rows(&list(s, DeliveryFilter::default()).await);
    assert_eq!(
        all,
        [
            format!(
                "e1 billing {}",
                if busy == "e1" {
                    "processing"
                } else {
                    "pending"
                }
            ),
            "e1 email dead".into(),
            format!(
                "e2 billing {}",
                if busy == "e2" {
                    "processing"
                } else {
                    "pending"
                }
            ),
            "e3 email dead".into(),
        ]
    );
    let filtered = |f: DeliveryFilter| async move { rows(&list(s, f).await) };
    assert_eq!(
        filtered(with_status(DeliveryStatus::Dead)).await,
        ["e1 email dead", "e3 email dead"]
    );
    assert_eq!(
        filtered(with_status(DeliveryStatus::Processing)).await,
        [format!("{busy} billing processing")]
    );
    assert_eq!(
        filtered(with_status(DeliveryStatus::Pending)).await,
        [format!("{idle} billing pending")]
    );
    assert_eq!(
        filtered(DeliveryFilter {
            key: Some("k1".into()),
            ..Default::default()
        })
        .await[1],
        "e1 email dead"
    );
    assert_eq!(
        filtered(DeliveryFilter {
            handler: Some("email".into()),
            event_type: Some("user.new".into()),
            ..Default::default()
        })
        .await,
        ["e3 email dead"]
    );
    assert_eq!(
        filtered(DeliveryFilter {
            event_id: Some("e1".into()),
            status: Some(DeliveryStatus::Dead),
            ..Default::default()
        })
        .await,
        ["e1 email dead"]
    );
    let first = s
        .list_deliveries(&DeliveryFilter {
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(first[0].event_id, "e1");
    assert_eq!(first.len(), 1);
}

pub(crate) async fn lanes_and_stats_describe_leases_and_backlog<S: Store>(s: &S) {
    installed(s).await;
    publish(
        s,
        &[
            order("a1", Some("k"), &["slow"]),
            order("a2", Some("k"), &["slow"]),
            order("b1", None, &["other"]),
        ],
    )
    .await;
    for d in claim(s, &request("w0", &["other"])).await {
        s.fail(&d.token, &Failure::Reject, "nope").await.unwrap();
    }
    let claimed = claim(s, &request("w1", &["slow"])).await;
    assert_eq!(events_of(&claimed), ["a1"]);
    let lanes = s.lanes().await.unwrap();
    let held: Vec<(i16, i64, i64, bool)> = lanes
        .iter()
        .filter(|l| l.owner.as_deref() == Some("w1"))
        .map(|l| (l.lane, l.in_flight, l.pending, l.expired))
        .collect();
    assert_eq!(held, [(lane_of(Some("k"), ""), 1, 2, false)]);
    let stats = s.stats().await.unwrap();
    let counts: Vec<String> = stats
        .iter()
        .map(|h| {
            format!(
                "{} due={} scheduled={} processing={} dead={} completed={}",
                h.handler, h.due, h.scheduled, h.processing, h.dead, h.completed
            )
        })
        .collect();
    assert_eq!(
        counts,
        [
            "other due=0 scheduled=0 processing=0 dead=1 completed=0",
            "slow due=1 scheduled=0 processing=1 dead=0 completed=0"
        ]
    );
    assert!(stats[1].lag_seconds.unwrap() >= 0.0);
    assert_eq!(stats[0].lag_seconds, None);
}

/// Every event matching `filter` given to `handler`, `batch` events per transaction.
async fn replay_to<S: Store>(
    s: &S,
    handler: &str,
    filter: EventFilter,
    again: bool,
    dry_run: bool,
) -> ReplayTally {
    let options = ReplayOptions {
        handler: handler.into(),
        filter,
        again,
        batch: 2,
        dry_run,
    };
    replay(s, &options, |_| true).await.unwrap()
}

/// What a replay did: matched, replayed, and skipped as pending, scheduled, dead, delivered.
fn counted(t: &ReplayTally) -> [i64; 6] {
    [
        t.matched,
        t.replayed,
        t.skipped_pending,
        t.skipped_scheduled,
        t.skipped_dead,
        t.skipped_delivered,
    ]
}

async fn position<S: Store>(s: &S, id: &str) -> EventPosition {
    let e = s.show_event(id).await.unwrap().unwrap();
    EventPosition {
        at: e.created_at,
        id: Some(e.id),
    }
}

async fn listed<S: Store>(s: &S, filter: EventFilter) -> Vec<String> {
    let rows = s.events(&filter, 100, None).await.unwrap();
    assert_eq!(
        s.count_events(&filter).await.unwrap(),
        rows.len() as i64,
        "the count of {filter:?}"
    );
    rows.into_iter().map(|e| e.id).collect()
}

pub(crate) async fn events_are_listed_in_publish_order_by_type_key_handler_and_bounds<S: Store>(
    s: &S,
) {
    installed(s).await;
    for e in [
        event("a1", "order.paid", Some("k1"), &["h"]),
        event("a2", "order.refunded", Some("k2"), &["h", "g"]),
        event("a3", "user.created", None, &["g"]),
        event("a4", "order.paid", Some("k1"), &["g"]),
    ] {
        publish(s, &[e]).await;
        // Each its own time, on a store that keeps milliseconds.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let all = EventFilter::default;
    let types = |t: &[&str]| EventFilter {
        types: t.iter().map(|t| t.to_string()).collect(),
        ..all()
    };
    assert_eq!(listed(s, all()).await, ["a1", "a2", "a3", "a4"]);
    assert_eq!(listed(s, types(&["order.*"])).await, ["a1", "a2", "a4"]);
    assert_eq!(
        listed(s, types(&["order.paid", "user.*"])).await,
        ["a1", "a3", "a4"]
    );
    assert_eq!(listed(s, types(&["*.created"])).await, ["a3"]);
    // Only `*` is a wildcard: what LIKE or a regular expression would read otherwise is text.
    assert!(listed(s, types(&["order_paid", "order.pai."]))
        .await
        .is_empty());
    let key = EventFilter {
        key: Some("k1".into()),
        ..all()
    };
    assert_eq!(listed(s, key).await, ["a1", "a4"]);
    let handler = EventFilter {
        handler: Some("g".into()),
        ..all()
    };
    assert_eq!(listed(s, handler).await, ["a2", "a3", "a4"]);
    let ids = EventFilter {
        ids: vec!["a3".into(), "a1".into()],
        ..all()
    };
    assert_eq!(listed(s, ids).await, ["a1", "a3"]);
    let since = EventFilter {
        since: Some(position(s, "a2").await),
        ..all()
    };
    assert_eq!(listed(s, since).await, ["a2", "a3", "a4"]);
    let until = EventFilter {
        until: Some(position(s, "a3").await),
        ..all()
    };
    assert_eq!(listed(s, until).await, ["a1", "a2", "a3"]);
    let a3_on = EventPosition {
        id: None,
        ..position(s, "a3").await
    };
    let times = EventFilter {
        since: Some(a3_on.clone()),
        until: Some(a3_on),
        ..all()
    };
    assert_eq!(
        listed(s, times).await,
        ["a3"],
        "a time is every event of it"
    );
    let page = EventFilter {
        since: Some(position(s, "a2").await),
        after: Some(position(s, "a3").await),
        ..all()
    };
    assert_eq!(listed(s, page).await, ["a4"]);
    let first_two = s.events(&all(), 2, Some("h")).await.unwrap();
    let seen: Vec<(&str, TargetState)> = first_two
        .iter()
        .map(|e| (e.id.as_str(), e.target))
        .collect();
    assert_eq!(
        seen,
        [("a1", TargetState::Pending), ("a2", TargetState::Pending)]
    );
    assert_eq!(first_two[1].handlers, ["h", "g"]);
    assert_eq!(first_two[1].event_type, "order.refunded");
    assert_eq!(first_two[1].key.as_deref(), Some("k2"));
}

pub(crate) async fn a_replay_follows_each_key_s_pending_deliveries_and_runs_once<S: Store>(s: &S) {
    installed(s).await;
    publish(
        s,
        &[
            order("e1", Some("k1"), &["h"]),
            order("e2", Some("k1"), &["h"]),
            order("e3", None, &["h"]),
            order("e4", Some("k2"), &["h"]),
        ],
    )
    .await;
    publish(s, &[order("e5", Some("k1"), &["h", "new"])]).await;
    let dry = replay_to(s, "new", EventFilter::default(), false, true).await;
    assert_eq!(counted(&dry), [5, 4, 1, 0, 0, 0]);
    assert!(
        list(
            s,
            DeliveryFilter {
                handler: Some("new".into()),
                ..Default::default()
            }
        )
        .await
        .len()
            == 1,
        "a dry run writes nothing"
    );
    let done = replay_to(s, "new", EventFilter::default(), false, false).await;
    assert_eq!(counted(&done), [5, 4, 1, 0, 0, 0]);
    assert_eq!(
        (done.first_event.as_deref(), done.last_event.as_deref()),
        (Some("e1"), Some("e4"))
    );
    assert_eq!(done.by_type.get("order.paid"), Some(&4));
    let lanes: std::collections::BTreeSet<i16> = [
        lane_of(Some("k1"), ""),
        lane_of(None, "e3"),
        lane_of(Some("k2"), ""),
    ]
    .into();
    assert_eq!(done.lanes, lanes);
    for id in ["e1", "e5"] {
        assert_eq!(
            s.show_event(id).await.unwrap().unwrap().handlers,
            ["h", "new"]
        );
    }
    let new = list(
        s,
        DeliveryFilter {
            handler: Some("new".into()),
            ..Default::default()
        },
    )
    .await;
    for d in &new {
        assert_eq!(
            d.lane,
            Some(lane_of(d.key.as_deref(), &d.event_id)),
            "{}",
            d.event_id
        );
    }
    let sequence = |id: &str| new.iter().find(|d| d.event_id == id).unwrap().sequence;
    assert!(sequence("e5") < sequence("e1") && sequence("e1") < sequence("e2"));
    assert_eq!(sequence("e3"), None);

    // A second replay makes nothing; nor does the application's republish of what it sent.
    let again = replay_to(s, "new", EventFilter::default(), false, false).await;
    assert_eq!(counted(&again), [5, 0, 5, 0, 0, 0]);
    assert!(publish(s, &[order("e1", Some("k1"), &["h"])])
        .await
        .is_empty());

    // `new` runs e5 before the replayed events of its key, then them in publish order.
    let mut handled = vec![];
    for _ in 0..3 {
        let claimed = claim(s, &request("w1", &["new"])).await;
        handled.push(events_of(&claimed));
        let tokens: Vec<LeaseToken> = claimed.iter().map(|d| d.token.clone()).collect();
        s.complete(&tokens, false).await.unwrap();
    }
    assert_eq!(handled, [vec!["e3", "e4", "e5"], vec!["e1"], vec!["e2"]]);
    assert!(claim(s, &request("w1", &["new"])).await.is_empty());
    let delivered = replay_to(s, "new", EventFilter::default(), false, false).await;
    assert_eq!(counted(&delivered), [5, 0, 0, 0, 0, 5]);
}

pub(crate) async fn a_replay_again_takes_only_events_without_a_live_delivery<S: Store>(s: &S) {
    installed(s).await;
    publish(s, &[order("gone", None, &["h"])]).await;
    let claimed = claim(s, &request("w1", &["h"])).await;
    s.complete(&[claimed[0].token.clone()], false)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let events_only = PurgeOptions {
        completed_older_than: Some(Duration::ZERO),
        dead_older_than: None,
        batch: 10,
    };
    purge(s, &events_only, |_| {}).await.unwrap();
    publish(
        s,
        &[
            order("done", None, &["h"]),
            order("dead", None, &["h"]),
            order("later", None, &["h"]),
            order("waiting", None, &["h"]),
        ],
    )
    .await;
    for d in claim(s, &request("w1", &["h"])).await {
        match d.event_id.as_str() {
            "done" => {
                s.complete(&[d.token], false).await.unwrap();
            }
            "dead" => {
                s.fail(&d.token, &Failure::Reject, "no").await.unwrap();
            }
            "later" => {
                s.fail(&d.token, &retry(Duration::from_secs(3600), 5), "later")
                    .await
                    .unwrap();
            }
            _ => {}
        }
    }
    let once = replay_to(s, "h", EventFilter::default(), false, false).await;
    assert_eq!(counted(&once), [4, 0, 1, 1, 1, 1]);
    let again = replay_to(s, "h", EventFilter::default(), true, false).await;
    assert_eq!(counted(&again), [4, 1, 1, 1, 1, 0]);
    assert_eq!(again.first_event.as_deref(), Some("done"));
    assert_eq!(
        rows(&list(s, DeliveryFilter::default()).await),
        [
            "dead h dead",
            "later h pending",
            "waiting h processing",
            "done h pending"
        ]
    );
    let replayed = list(
        s,
        DeliveryFilter {
            event_id: Some("done".into()),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(replayed[0].attempts, 0);
    assert_eq!(
        s.show_event("done").await.unwrap().unwrap().handlers,
        ["h"],
        "a handler is named once"
    );
    let twice = replay_to(s, "h", EventFilter::default(), true, false).await;
    assert_eq!(counted(&twice), [4, 0, 2, 1, 1, 0]);
    assert!(
        s.show_event("gone").await.unwrap().is_none(),
        "purged events are not invented"
    );
}

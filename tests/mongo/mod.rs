//! The MongoDB store end to end: the README's walk-through with the same output shapes as on
//! PostgreSQL, the 0.1 conversion of the fixture, the seed's concurrency cases, parking,
//! exactly-once across worker processes, `kill -9`, and `schema-sql` rendered without a
//! server.

mod connect;
mod faults;
mod run;
mod schema;
mod walk_through;

use std::time::Duration;

use relaybus::store::{ClaimRequest, EventLimits, NewEvent};
use serde_json::json;

use crate::common::claim_request;

fn event(id: &str, key: Option<&str>) -> NewEvent {
    NewEvent::new(
        id.into(),
        "t".into(),
        key.map(Into::into),
        json!({"id": id}),
        Default::default(),
        vec!["h".into()],
        &EventLimits {
            max_payload_bytes: 1 << 20,
        },
    )
    .unwrap()
}

fn request(owner: &str, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        lease,
        ..claim_request(owner, &["h"])
    }
}

//! The operator's queries: listings, requeue, retention, lanes and statistics
//! (`sql/postgres/admin/*.sql`). They run against a live system, so each is a short statement
//! backed by an index of the 0.2 schema wherever its filters allow. They are sent unnamed and
//! planned per call with their values, so a filter left out drops out of the plan.

mod history;
mod inspect;
mod requeue;
mod retention;

use tokio_postgres::Row;

use crate::store::DeliveryRow;

/// A delivery as `admin/list.sql` and its siblings select it.
fn delivery_row(r: &Row) -> DeliveryRow {
    DeliveryRow {
        id: r.get(0),
        event_id: r.get(1),
        event_type: r.get(2),
        handler: r.get(3),
        status: r.get(4),
        attempts: r.get(5),
        key: r.get(6),
        sequence: r.get(7),
        lane: r.get(8),
        available_at: r.get(9),
        last_error: r.get(10),
        created_at: r.get(11),
        updated_at: r.get(12),
        completed_at: r.get(13),
    }
}

/// An age as the statements take it: seconds.
fn seconds(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

//! The conformance suite against MongoDB: each test in a database of its own.

use relaybus::store::{AnyStore, StoreOptions};

use crate::common::mongo::TestMongo;

pub(crate) struct MongoNamespace {
    pub(crate) store: AnyStore,
    // Dropped after the store: the database goes when the test ends, however it ends.
    _database: TestMongo,
}

fn open(test: &str) -> MongoNamespace {
    let database = TestMongo::new(test);
    MongoNamespace {
        store: database.store(StoreOptions::worker(4)),
        _database: database,
    }
}

super::conformance!(open;
    setup_installs_once_and_reports_what_it_found,
    publish_adds_deliveries_only_for_handlers_an_event_never_had,
    keyed_events_get_gapless_sequences_in_publish_order_and_their_key_s_lane,
    a_claim_leases_due_deliveries_to_one_worker,
    a_key_runs_one_delivery_at_a_time_in_sequence_order,
    a_stale_token_changes_nothing_after_a_takeover,
    a_token_of_a_lane_that_changed_hands_is_stale,
    a_takeover_charges_an_attempt_and_buries_at_the_last,
    complete_deletes_and_keeps_history_only_when_asked,
    a_failure_reschedules_until_the_last_attempt_then_buries,
    a_rejection_buries_at_once,
    release_hands_lanes_back_without_charging_an_attempt,
    renew_extends_the_leases_of_lanes_that_run_work,
    due_exists_sees_only_due_work_of_the_given_handlers,
    requeue_revives_only_the_selected_dead_deliveries,
    purge_deletes_what_retention_allows_and_keeps_pending_work,
    listings_filter_by_status_handler_key_event_and_type_in_creation_order,
    lanes_and_stats_describe_leases_and_backlog,
);

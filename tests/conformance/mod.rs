//! The store conformance suite: every behaviour the commands and the dispatcher rely on,
//! asserted only through the `Store` trait, run unchanged against each engine. `suite` holds
//! the story, generic over `S: Store`; each engine's module opens a fresh, empty namespace per
//! test and instantiates the whole suite with `conformance!(open)`, so no test can run on one
//! engine only.

mod mongo;
mod postgres;
pub(crate) mod suite;

/// One `#[test]` per suite function, each on a fresh namespace from `$open`; those after the
/// second `;` get a second store instance over the same namespace too.
macro_rules! tests {
    ($open:path; $($test:ident),* ; $($pair:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                let namespace = $open(stringify!($test));
                let story = crate::conformance::suite::$test(&namespace.store);
                crate::common::block_on(story);
            }
        )*
        $(
            #[test]
            fn $pair() {
                let namespace = $open(stringify!($pair));
                let story = crate::conformance::suite::$pair(&namespace.store, &namespace.other);
                crate::common::block_on(story);
            }
        )*
    };
}
pub(crate) use tests;

/// The suite, for the engine whose fresh namespaces `$open` makes.
macro_rules! conformance {
    ($open:path) => {
        crate::conformance::tests!($open;
            setup_installs_once_and_reports_what_it_found,
            publish_adds_deliveries_only_for_handlers_an_event_never_had,
            a_republish_with_a_number_written_otherwise_is_the_same_event,
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
            renew_extends_only_lanes_that_run_the_worker_s_deliveries,
            a_worker_keeps_its_lanes_past_their_lease_until_another_takes_them,
            an_expired_lane_with_deliveries_in_flight_is_taken_over_whatever_is_due,
            a_busy_worker_takes_a_dead_worker_s_lane_over_beside_a_full_batch,
            a_postponed_delivery_is_due_later_without_an_attempt,
            due_exists_sees_only_due_work_of_the_given_handlers,
            requeue_revives_only_the_selected_dead_deliveries,
            purge_deletes_what_retention_allows_and_keeps_pending_work,
            listings_filter_by_status_handler_key_event_and_type_in_creation_order,
            lanes_and_stats_describe_leases_and_backlog,
            a_claim_finds_its_handler_s_work_behind_another_handler_s_backlog,
            events_are_listed_in_publish_order_by_type_key_handler_and_bounds,
            a_replay_follows_each_key_s_pending_deliveries_and_runs_once,
            a_replay_again_takes_only_events_without_a_live_delivery;
            a_restarted_worker_with_the_same_owner_name_does_not_adopt_live_lanes,
            handler_rows_change_atomically_and_every_instance_reads_them,
        );
    };
}
pub(crate) use conformance;

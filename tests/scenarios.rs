//! The command-line scenarios every engine must pass through the real binary, from one list:
//! each runs on a fresh, installed store of each engine. Those whose setup or checks differ by
//! engine (the three-worker drain, the busy survivor) stay beside their engine's tests.

/// One `#[test]` per scenario, on a fresh store from `$open`.
macro_rules! scenarios {
    ($open:path; $($module:ident :: $scenario:ident),* $(,)?) => {
        $(
            #[test]
            fn $scenario() {
                let target = $open(stringify!($scenario));
                crate::common::$module::$scenario(&target);
            }
        )*
    };
}

/// Every scenario, for the engine whose fresh stores `$open` makes.
macro_rules! all_scenarios {
    ($open:path) => {
        scenarios!($open;
            handlers::a_pause_holds_one_handler_and_a_resume_drains_it,
            handlers::a_failing_endpoint_opens_the_breaker_and_every_delivery_arrives_once,
            handlers::a_breaker_counts_against_the_last_started_worker_s_settings_and_an_operator_closes_it,
            drain::a_dead_worker_s_lane_with_nothing_due_is_let_go,
            replay::a_replay_killed_halfway_and_run_again_delivers_each_event_once_in_key_order,
            top::the_view_shows_handlers_workers_and_lanes_cell_for_cell,
            workers::a_worker_shows_its_host_process_lanes_and_expired_leases,
        );
    };
}

mod postgres {
    all_scenarios!(crate::common::TestSchema::installed);
}

mod mongo {
    all_scenarios!(crate::common::mongo::TestMongo::installed);
}

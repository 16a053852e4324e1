//! The statements of `sql/postgres/`, embedded and rendered once per store for its namespace.
//! Each file declares its parameter types in a `-- params:` line, so a statement's text and
//! types live side by side.

use tokio_postgres::types::{ToSql, Type};

use crate::store::Namespace;

/// A statement's parameters, in order.
pub(crate) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// One statement, rendered for a namespace.
#[derive(Clone, Debug)]
pub(crate) struct Sql {
    /// The file it comes from (`delivery/claim`); names a prepared statement per connection.
    pub(crate) name: &'static str,
    pub(crate) text: String,
    pub(crate) types: Vec<Type>,
}

/// The text of `sql/postgres/<file>.sql`, embedded: how every statement, fragment and script
/// of the PostgreSQL store is loaded.
macro_rules! sql_file {
    ($file:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/sql/postgres/",
            $file,
            ".sql"
        ))
    };
}
pub(crate) use sql_file;

/// Pieces of SQL that more than one statement or script holds, spliced where one names them.
const FRAGMENTS: [(&str, &str); 5] = [
    ("{{reserve_keys}}", sql_file!("fragments/reserve_keys")),
    (
        "{{delete_completed}}",
        sql_file!("fragments/delete_completed"),
    ),
    ("{{event_filter}}", sql_file!("fragments/event_filter")),
    // The conversion and the install loop over what the index drift statement finds.
    ("{{index_drift}}", sql_file!("schema/index_drift")),
    // Both conversions end with the online conversion's cleanup.
    ("{{online_cleanup}}", sql_file!("online/cleanup")),
];

/// A statement's text with the fragments it names spliced in.
pub(crate) fn with_fragments(source: &str) -> String {
    FRAGMENTS
        .iter()
        .fold(source.to_owned(), |s, (placeholder, fragment)| {
            s.replace(placeholder, fragment.trim_end())
        })
}

impl Sql {
    fn render(ns: &Namespace, name: &'static str, source: &str) -> Sql {
        let source = with_fragments(source);
        let declared = source
            .lines()
            .find_map(|l| l.strip_prefix("-- params:"))
            .unwrap_or_else(|| panic!("sql/postgres/{name}.sql has no `-- params:` line"));
        let types = declared
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| {
                param_type(t)
                    .unwrap_or_else(|| panic!("sql/postgres/{name}.sql: unknown type `{t}`"))
            })
            .collect();
        Sql {
            name,
            text: ns.render(&source),
            types,
        }
    }

    /// Parameters paired with their declared types, for statements sent unnamed.
    pub(crate) fn typed<'a>(&self, params: Params<'a>) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
        params
            .iter()
            .zip(&self.types)
            .map(|(p, t)| (*p, t.clone()))
            .collect()
    }
}

fn param_type(name: &str) -> Option<Type> {
    Some(match name {
        "bool" => Type::BOOL,
        "int2" => Type::INT2,
        "int4" => Type::INT4,
        "int8" => Type::INT8,
        "float8" => Type::FLOAT8,
        "text" => Type::TEXT,
        "jsonb" => Type::JSONB,
        "int2[]" => Type::INT2_ARRAY,
        "int4[]" => Type::INT4_ARRAY,
        "int8[]" => Type::INT8_ARRAY,
        "text[]" => Type::TEXT_ARRAY,
        "jsonb[]" => Type::JSONB_ARRAY,
        "tid[]" => Type::TID_ARRAY,
        "timestamptz" => Type::TIMESTAMPTZ,
        _ => return None,
    })
}

macro_rules! statements {
    ($($field:ident => $file:literal,)*) => {
        /// Every statement of a store, rendered for its namespace.
        pub(crate) struct Statements {
            $(pub(crate) $field: Sql,)*
        }

        impl Statements {
            pub(crate) fn render(ns: &Namespace) -> Self {
                Self {
                    $($field: Sql::render(
                        ns,
                        $file,
                        sql_file!($file),
                    ),)*
                }
            }
        }
    };
}

statements! {
    publish_new => "delivery/publish_new",
    publish => "delivery/publish",
    notify => "delivery/notify",
    claim => "delivery/claim",
    complete => "delivery/complete",
    complete_with_history => "delivery/complete_with_history",
    fail => "delivery/fail",
    renew => "delivery/renew",
    confirm => "delivery/confirm",
    blockers => "delivery/blockers",
    release => "delivery/release",
    due_exists => "delivery/due_exists",
    detect => "schema/detect",
    version => "schema/version",
    legacy_writes => "schema/legacy_writes",
    setup_lock => "schema/setup_lock",
    may_create => "schema/may_create",
    foreign_objects => "schema/foreign_objects",
    index_drift => "schema/index_drift",
    online_events => "online/events_batch",
    online_deliveries => "online/deliveries_batch",
    live_leases_0_1 => "schema/live_leases_0_1",
    counts_0_1 => "schema/counts_0_1",
    existing_objects => "schema/existing_objects",
    blocking_sessions => "schema/blocking_sessions",
    doctor_columns => "doctor/columns",
    doctor_storage => "doctor/storage",
    doctor_lanes => "doctor/lanes",
    doctor_vacuum => "doctor/vacuum",
    doctor_horizon => "doctor/horizon",
    doctor_settings => "doctor/settings",
    doctor_replication => "doctor/replication",
    list => "admin/list",
    list_completed => "admin/list_completed",
    show_delivery => "admin/show_delivery",
    show_event => "admin/show_event",
    events => "admin/events",
    count_events => "admin/count_events",
    replay => "admin/replay",
    count_dead => "admin/count_dead",
    requeue => "admin/requeue",
    purge_count => "admin/purge_count",
    purge_dead => "admin/purge_dead",
    purge_completed => "admin/purge_completed",
    purge_history => "admin/purge_history",
    purge_events_lock => "admin/purge_events_lock",
    purge_events_delete => "admin/purge_events_delete",
    lanes => "admin/lanes",
    handler_rows => "handlers/list",
    lock_handler => "handlers/lock",
    write_handler => "handlers/write",
    forget_handler => "handlers/forget",
    event_named => "admin/event_named",
    delivery_ids_like => "admin/delivery_ids_like",
    event_ids_like => "admin/event_ids_like",
    stats => "admin/stats",
    dead_newest => "admin/dead_newest",
    backlog_keys => "admin/backlog_keys",
    bench_preload_events => "bench/preload_events",
    bench_preload_deliveries => "bench/preload_deliveries",
    bench_floor_publish => "bench/floor_publish",
    bench_floor_dispatch => "bench/floor_dispatch",
    bench_pending => "bench/pending",
    bench_counts => "bench/counts",
    bench_server_counters => "bench/server_counters",
    bench_table_counters => "bench/table_counters",
    bench_settings => "bench/settings",
    bench_stores => "bench/stores",
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file renders, declares known types, and keeps no placeholder unfilled.
    #[test]
    fn every_statement_renders_for_a_namespace() {
        let s = Statements::render(&Namespace::new("app", "rb_").unwrap());
        assert_eq!(s.claim.types.len(), 12);
        assert_eq!(s.lanes.types.len(), 0);
        assert!(s.claim.text.contains(r#""app"."rb_lanes""#));
        for sql in [
            &s.publish,
            &s.publish_new,
            &s.list,
            &s.stats,
            &s.bench_table_counters,
        ] {
            assert!(!sql.text.contains("{{"), "{}", sql.name);
        }
    }
}

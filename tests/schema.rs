//! setup, schema-sql and upgrade against the real server.

use std::process::Command as StdCommand;
use std::time::Duration;

use crate::common::{finish, on_a_terminal, relaybus, stderr, stdout, Spawned, TestSchema};
use serde_json::json;

/// The catalog of a schema: tables, columns, indexes, constraints and storage options.
pub(crate) fn catalog(s: &TestSchema) -> Vec<String> {
    let n = &s.name;
    let mut out = s.rows(&format!(
        "SELECT 'table', c.relname, coalesce(array_to_string(c.reloptions, ','), '') \
           FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace \
          WHERE ns.nspname = '{n}' AND c.relkind = 'r' ORDER BY c.relname"
    ));
    // In the order a `SELECT *` or a schema-diff tool sees them, positions aside: a converted
    // table keeps its dropped columns' numbers.
    out.extend(s.rows(&format!(
        "SELECT 'column', table_name, column_name, data_type, is_nullable, coalesce(column_default, '') \
           FROM information_schema.columns WHERE table_schema = '{n}' ORDER BY table_name, ordinal_position"
    )));
    out.extend(s.rows(&format!(
        "SELECT 'index', indexname, replace(indexdef, '{n}.', 'S.') FROM pg_indexes \
          WHERE schemaname = '{n}' ORDER BY indexname"
    )));
    out.extend(s.rows(&format!(
        "SELECT 'constraint', conname, replace(pg_get_constraintdef(c.oid), '{n}.', 'S.') \
           FROM pg_constraint c JOIN pg_namespace ns ON ns.oid = c.connamespace \
          WHERE ns.nspname = '{n}' ORDER BY conname"
    )));
    // Functions with their signature, rights (in effect: the default spelled out is the default)
    // and body (the schema's name in it made neutral).
    out.extend(s.rows(&format!(
        "SELECT 'function', p.proname, pg_get_function_identity_arguments(p.oid), \
                pg_get_function_result(p.oid), p.provolatile, p.prosecdef, \
                coalesce(array_to_string(p.proconfig, ','), ''), coalesce(p.proacl, acldefault('f', p.proowner))::text, \
                md5(replace(p.prosrc, '{n}', 'S')) \
           FROM pg_proc p JOIN pg_namespace ns ON ns.oid = p.pronamespace \
          WHERE ns.nspname = '{n}' ORDER BY p.proname"
    )));
    out
}

/// Catalog plus the physical identity of every row (ctid, xmin): unchanged means nothing was
/// written, not merely that the values match.
fn snapshot(s: &TestSchema) -> Vec<String> {
    let mut out = catalog(s);
    out.extend(s.rows(&format!(
        "SELECT c.relname, c.relfilenode, c.oid FROM pg_class c JOIN pg_namespace ns \
           ON ns.oid = c.relnamespace WHERE ns.nspname = '{}' ORDER BY c.relname",
        s.name
    )));
    for table in ["events", "deliveries", "key_sequences"] {
        out.extend(s.rows(&format!(
            "SELECT ctid, xmin, t::text FROM {} t ORDER BY ctid",
            s.table(table)
        )));
    }
    out
}

#[test]
fn install_creates_exactly_the_0_2_catalog() {
    let s = TestSchema::installed("install");
    let tables = s.rows(&format!(
        "SELECT c.relname, coalesce(array_to_string(c.reloptions, ','), '-') FROM pg_class c \
           JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '{}' AND c.relkind = 'r' \
          ORDER BY 1",
        s.name
    ));
    assert_eq!(
        tables,
        [
            "relaybus_completions|-",
            "relaybus_deliveries|autovacuum_vacuum_scale_factor=0.02",
            "relaybus_events|-",
            "relaybus_handlers|-",
            "relaybus_key_sequences|-",
            "relaybus_lanes|fillfactor=50",
            "relaybus_schema|-",
        ]
    );
    let columns = s.rows(&format!(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns \
          WHERE table_schema = '{}' AND table_name = 'relaybus_deliveries' ORDER BY ordinal_position",
        s.name
    ));
    assert_eq!(
        columns,
        [
            "id|text|NO",
            "event_id|text|NO",
            "handler|text|NO",
            "key|text|YES",
            "sequence|bigint|YES",
            "status|text|NO",
            "attempts|integer|NO",
            "available_at|timestamp with time zone|NO",
            "last_error|text|YES",
            "created_at|timestamp with time zone|NO",
            "updated_at|timestamp with time zone|NO",
            "completed_at|timestamp with time zone|YES",
            "lane|smallint|NO",
            "claims|integer|NO",
        ]
    );
    let indexes = s.rows(&format!(
        "SELECT tablename, replace(indexdef, '{}.', '') FROM pg_indexes WHERE schemaname = '{}' \
          AND tablename IN ('relaybus_deliveries', 'relaybus_lanes') ORDER BY indexname",
        s.name, s.name
    ));
    assert_eq!(
        indexes,
        [
            "relaybus_deliveries|CREATE INDEX relaybus_deliveries_dead_idx ON relaybus_deliveries USING btree (updated_at, id) WHERE (status = 'dead'::text)",
            "relaybus_deliveries|CREATE UNIQUE INDEX relaybus_deliveries_event_handler_unique ON relaybus_deliveries USING btree (event_id, handler)",
            "relaybus_deliveries|CREATE INDEX relaybus_deliveries_lane_due_idx ON relaybus_deliveries USING btree (lane, available_at, id) WHERE (status = 'pending'::text)",
            "relaybus_deliveries|CREATE INDEX relaybus_deliveries_lane_key_idx ON relaybus_deliveries USING btree (lane, handler, key, sequence) WHERE ((key IS NOT NULL) AND (status = 'pending'::text))",
            "relaybus_deliveries|CREATE UNIQUE INDEX relaybus_deliveries_pkey ON relaybus_deliveries USING btree (id)",
            "relaybus_lanes|CREATE UNIQUE INDEX relaybus_lanes_pkey ON relaybus_lanes USING btree (lane)",
        ]
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT count(*), min(lane), max(lane), sum(epoch), count(lease_owner), \
                    sum(cardinality(in_flight)) FROM {}",
            s.table("lanes")
        )),
        ["256|0|255|0|0|0"]
    );
    assert_eq!(lane_pages(&s), 256, "pages holding a lane row");
    assert_eq!(
        s.rows(&format!("SELECT version FROM {}", s.table("schema"))),
        ["0.2"]
    );
}

/// The pages the lane rows lie on. The install gives each lane a page of its own, so that its
/// versions never compete with another lane's for room (an update that finds none is not HOT).
fn lane_pages(s: &TestSchema) -> i64 {
    s.count(&format!(
        "SELECT count(DISTINCT (ctid::text::point)[0])::int8 FROM {}",
        s.table("lanes")
    ))
}

#[test]
fn setup_twice_and_check() {
    let s = TestSchema::new("setup_check");
    let out = s.cmd().args(["setup", "--check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        format!("relaybus schema is not installed in schema \"{}\", prefix \"relaybus_\", expected 0.2; run `relaybus setup`\n", s.name)
    );
    s.cmd().arg("setup").assert().success().stdout(format!(
        "relaybus schema not installed -> 0.2 (schema \"{}\", prefix \"relaybus_\")\n",
        s.name
    ));
    let first = snapshot(&s);
    s.cmd().arg("setup").assert().success().stdout(format!(
        "relaybus schema 0.2 already installed (schema \"{}\", prefix \"relaybus_\"); nothing to do\n",
        s.name
    ));
    assert_eq!(snapshot(&s), first);
    s.cmd()
        .args(["setup", "--check", "--json"])
        .assert()
        .success()
        .stdout("{\n  \"current\": true,\n  \"installed\": \"0.2\",\n  \"expected\": \"0.2\",\n  \"next\": null\n}\n");
}

#[test]
fn concurrent_setups_end_with_one_correct_schema() {
    let s = TestSchema::new("concurrent_setup");
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("relaybus"));
            cmd.env("RELAYBUS_DATABASE_URL", crate::common::database_url())
                .args(["--schema", &s.name, "setup"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped());
            cmd.spawn().unwrap()
        })
        .collect();
    for h in handles {
        let out = crate::common::finish(h, std::time::Duration::from_secs(60));
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let reference = TestSchema::installed("concurrent_ref");
    let normalise = |rows: Vec<String>, name: &str| -> Vec<String> {
        rows.into_iter().map(|r| r.replace(name, "S")).collect()
    };
    assert_eq!(
        normalise(catalog(&s), &s.name),
        normalise(catalog(&reference), &reference.name)
    );
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("lanes"))),
        256
    );
    assert_eq!(lane_pages(&s), 256, "pages holding a lane row");
}

#[test]
fn lane_hash_is_the_same_in_rust_and_sql() {
    let s = TestSchema::installed("lane_hash");
    let vectors = [
        "",
        "a",
        "order-7",
        "héllo-ключ-鍵",
        "🦀 emoji",
        "0195c2a0-7f4e-7cc1-a1c4-5d41402abc4b",
    ];
    for v in vectors {
        let sql: i16 = crate::common::block_on(s.client.query_one(
            &format!("SELECT \"{}\".relaybus_lane_of($1)", s.name),
            &[&v],
        ))
        .unwrap()
        .get(0);
        assert_eq!(
            sql,
            relaybus::store::lane::lane_of(Some(v), "x"),
            "vector {v:?}"
        );
    }
    assert_eq!(relaybus::store::lane::lane_of(None, ""), 197);
    assert_eq!(relaybus::store::lane::lane_of(Some("a"), ""), 44);
    assert_eq!(
        relaybus::store::lane::lane_of(Some("héllo-ключ-鍵"), ""),
        235
    );
}

#[test]
fn schema_sql_applies_to_an_empty_database_and_again_changes_nothing() {
    let s = TestSchema::new("schema_sql");
    let out = s.cmd().arg("schema-sql").output().unwrap();
    assert!(out.status.success());
    let script = stdout(&out);
    assert!(script.starts_with("-- relaybus "), "{script}");
    assert!(script.contains(&format!("CREATE SCHEMA IF NOT EXISTS \"{}\";", s.name)));
    let wrap = |sql: &str| format!("BEGIN;\n{sql}\nCOMMIT;");
    s.exec(&wrap(&script));
    let first = snapshot(&s);
    s.exec(&wrap(&script));
    assert_eq!(snapshot(&s), first);
    s.cmd().args(["setup", "--check"]).assert().success();
    // Rendering needs no connection at all.
    s.cmd()
        .env(
            "RELAYBUS_DATABASE_URL",
            "postgres://nobody@127.0.0.1:1/none",
        )
        .arg("schema-sql")
        .assert()
        .success();
}

/// The rows of a converted fixture, as `relaybus upgrade` and the script must leave them.
fn assert_converted(s: &TestSchema) {
    assert_eq!(
        s.rows(&format!(
            "SELECT id, event_id, handler, lane, coalesce(key, '-'), status, attempts, claims, \
                    coalesce(last_error, '-') FROM {} ORDER BY id",
            s.table("deliveries")
        )),
        [
            "d-1a|ev-1|billing|251|order-7|completed|1|0|-",
            "d-1b|ev-1|email|251|order-7|pending|2|0|timeout",
            "d-2a|ev-2|billing|251|order-7|pending|0|0|-",
            "d-3a|ev-3|email|234|-|pending|1|0|-",
            "d-4a|ev-4|email|11|-|dead|25|0|HTTP 500",
            "d-4b|ev-4|crm|11|-|pending|3|0|connection refused",
            "d-5a|ev-5|billing|235|héllo-ключ-鍵|dead|25|0|exit 65",
            "d-6a|ev-6|crm|49|-|completed|1|0|-",
        ]
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT id, handlers::text FROM {} ORDER BY id",
            s.table("events")
        )),
        [
            "ev-1|{billing,email}",
            "ev-2|{billing}",
            "ev-3|{email}",
            "ev-4|{crm,email}",
            "ev-5|{billing}",
            "ev-6|{crm}",
        ]
    );
    // Lanes match the SQL function for every row.
    assert_eq!(
        s.count(&format!(
            "SELECT count(*) FROM {} WHERE lane <> \"{}\".relaybus_lane_of(coalesce(key, event_id))",
            s.table("deliveries"),
            s.name
        )),
        0
    );
    // Columns, index definitions, constraints and storage parameters: a fresh install's.
    assert_eq!(catalog(s), catalog(&TestSchema::installed("converted_ref")));
    assert_eq!(
        s.count(&format!("SELECT count(*) FROM {}", s.table("lanes"))),
        256
    );
    assert_eq!(lane_pages(s), 256, "pages holding a lane row");
}

#[test]
fn upgrade_converts_the_0_1_fixture_and_a_second_run_changes_nothing() {
    let s = TestSchema::with_fixture_0_1("upgrade");
    let out = s.cmd().args(["upgrade", "--yes"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("found: schema 0.1\nrows: 6 events, 8 deliveries (2 pending, 2 processing -> pending, 2 completed kept, 2 dead)\nsteps:\n"), "{text}");
    assert!(text.contains("  3. events-handlers: fill events.handlers from every delivery, completed ones included, so nothing completed under 0.1 runs again [6 rows]\n"), "{text}");
    assert!(text.contains("  6. install: drop the indexes 0.2 does not keep, found by definition whatever their names; create the 0.2 indexes and tables, seed the 256 lanes, record the version; drops relaybus_deliveries_completed_idx, relaybus_deliveries_dead_purge_idx, relaybus_deliveries_due_idx, relaybus_deliveries_due_unkeyed_idx, relaybus_deliveries_handler_created_idx, relaybus_deliveries_key_sequence_idx, relaybus_deliveries_processing_idx, relaybus_deliveries_status_created_idx; creates relaybus_completions_completed_idx, relaybus_deliveries_dead_idx, relaybus_deliveries_lane_due_idx, relaybus_deliveries_lane_key_idx, relaybus_lanes, relaybus_completions, relaybus_handlers, relaybus_schema\n"), "{text}");
    assert!(
        text.ends_with("from 0.1 to 0.2 in ") || text.contains("\" from 0.1 to 0.2 in "),
        "{text}"
    );
    assert_converted(&s);
    let after_first = snapshot(&s);
    s.cmd()
        .args(["upgrade", "--yes"])
        .assert()
        .success()
        .stdout("relaybus schema is already 0.2; nothing to upgrade\n");
    s.cmd().arg("setup").assert().success();
    assert_eq!(snapshot(&s), after_first);
}

/// The shipped fixture is plain SQL: psql loads it as it is into the search path's schema, and
/// the upgrade converts what it loaded.
#[test]
fn the_0_1_fixture_loads_with_psql_as_it_is() {
    let s = TestSchema::new("psql_fixture");
    s.exec(&format!("CREATE SCHEMA \"{}\"", s.name));
    let out = std::process::Command::new("psql")
        .args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-f",
            "sql/fixtures/store-0.1.sql",
        ])
        .arg(crate::common::database_url())
        .env("PGOPTIONS", format!("-csearch_path={}", s.name))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    s.cmd().args(["upgrade", "--yes"]).assert().success();
    assert_converted(&s);
}

/// The conversion reports its progress as it rewrites: each step from 0, the two that rewrite
/// rows a range of pages at a time, ending at the rows they rewrote.
#[test]
fn upgrade_reports_the_rows_each_step_has_rewritten_as_it_goes() {
    let s = TestSchema::with_fixture_0_1("upgrade_progress");
    s.exec(&format!(
        "INSERT INTO {events} (id, type, payload) \
           SELECT 'g' || g, 't', jsonb_build_object('pad', repeat('x', 100)) \
             FROM generate_series(1, 30000) g; \
         INSERT INTO {deliveries} (id, event_id, handler) \
           SELECT 'gd' || g, 'g' || g, 'h' FROM generate_series(1, 30000) g",
        events = s.table("events"),
        deliveries = s.table("deliveries"),
    ));
    let store = relaybus::store::open(
        Some(&crate::common::database_url()),
        s.namespace(),
        relaybus::store::StoreOptions::admin(),
    )
    .unwrap();
    let reports = crate::common::upgrade_reports(&store);
    let steps: Vec<usize> = reports.iter().map(|(step, _)| *step).collect();
    assert_eq!(steps, [1, 2, 3, 4, 5, 6], "{reports:?}");
    for (step, rows) in &reports {
        assert_eq!(rows[0], 0, "{reports:?}");
        assert!(rows.windows(2).all(|w| w[0] < w[1]), "{reports:?}");
        let (rewritten, at_least) = match step {
            3 => (30_006, 3),
            4 => (30_008, 3),
            _ => (0, 1),
        };
        assert_eq!(*rows.last().unwrap(), rewritten, "step {step}: {reports:?}");
        assert!(rows.len() >= at_least, "step {step}: {reports:?}");
    }
    assert_eq!(
        s.count(&format!(
            "SELECT count(*) FROM {} WHERE id LIKE 'g%' AND handlers = '{{h}}'",
            s.table("events")
        )),
        30_000
    );
    s.exec(&format!(
        "DELETE FROM {} WHERE id LIKE 'g%'; DELETE FROM {} WHERE id LIKE 'g%'",
        s.table("deliveries"),
        s.table("events")
    ));
    assert_converted(&s);
}

/// On an 80-column terminal the upgrade plan is wrapped between words, continuation lines
/// indented under their item: no line is wider than the terminal, and joined up again the lines
/// say word for word what the plan says on one line each when stdout is not a terminal.
#[test]
fn an_upgrade_plan_on_an_80_column_terminal_wraps_between_words() {
    let s = TestSchema::with_fixture_0_1("upgrade_80_columns");
    let piped = s.cmd().args(["upgrade", "--dry-run"]).assert().success();
    let piped = stdout(piped.get_output());
    assert!(piped.lines().any(|l| l.len() > 200), "{piped}");
    let shown = on_a_terminal(&s, 80, "upgrade --dry-run", b"");
    let too_wide: Vec<&str> = shown.lines().filter(|l| l.chars().count() > 80).collect();
    assert!(too_wide.is_empty(), "{too_wide:#?}");
    let mut joined: Vec<String> = Vec::new();
    for line in shown.lines() {
        let item = line
            .trim_start()
            .split_once(". ")
            .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        match joined.last_mut() {
            Some(last) if line.starts_with(' ') && !item => {
                last.push(' ');
                last.push_str(line.trim_start());
            }
            _ => joined.push(line.to_owned()),
        }
    }
    assert_eq!(joined.join("\n"), piped.trim_end());
    assert!(
        shown.lines().count() > piped.lines().count() + 10,
        "{shown}"
    );
}

/// The conversion finds 0.1 indexes by what they are, not by what they are called: renamed ones
/// go, and a 0.1 dead-letter index under the 0.2 name is replaced by the 0.2 one.
#[test]
fn upgrade_recognises_renamed_0_1_indexes_by_definition() {
    let s = TestSchema::with_fixture_0_1("renamed_0_1");
    let n = &s.name;
    s.exec(&format!(
        "ALTER INDEX \"{n}\".relaybus_deliveries_key_sequence_idx RENAME TO keyed_pending;
         ALTER INDEX \"{n}\".relaybus_deliveries_due_idx RENAME TO due;
         ALTER INDEX \"{n}\".relaybus_deliveries_dead_purge_idx RENAME TO relaybus_deliveries_dead_idx;"
    ));
    let out = s.cmd().args(["upgrade", "--yes"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("record the version; drops due, keyed_pending, relaybus_deliveries_completed_idx, relaybus_deliveries_dead_idx, relaybus_deliveries_due_unkeyed_idx, relaybus_deliveries_handler_created_idx, relaybus_deliveries_processing_idx, relaybus_deliveries_status_created_idx; creates relaybus_completions_completed_idx, relaybus_deliveries_dead_idx, relaybus_deliveries_lane_due_idx, relaybus_deliveries_lane_key_idx, relaybus_lanes,"), "{text}");
    assert_converted(&s);
    s.cmd().args(["setup", "--check"]).assert().success();
}

/// A 0.1 store whose indexes carry the 0.1 names with other definitions converts to exactly a
/// fresh install's indexes; the application's index is listed by the plan and `doctor`, and
/// kept.
#[test]
fn upgrade_drops_0_1_indexes_by_name_and_keeps_the_application_s() {
    let s = TestSchema::with_fixture_0_1("other_0_1_indexes");
    let n = &s.name;
    s.exec(&format!(
        "SET search_path TO \"{n}\"; {}; RESET search_path",
        include_str!("../sql/fixtures/store-0.1-other-indexes.sql")
    ));
    let kept = format!(
        "index app_deliveries_failing (not relaybus's, kept): CREATE INDEX app_deliveries_failing \
         ON {n}.relaybus_deliveries USING btree (last_error) WHERE (last_error IS NOT NULL)\n"
    );
    let out = s.cmd().args(["upgrade", "--dry-run"]).output().unwrap();
    assert!(stdout(&out).contains(&kept), "{}", stdout(&out));
    let out = s.cmd().args(["upgrade", "--yes"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("record the version; drops relaybus_deliveries_completed_idx, relaybus_deliveries_dead_purge_idx, relaybus_deliveries_due_idx, relaybus_deliveries_due_unkeyed_idx, relaybus_deliveries_event_handler_unique, relaybus_deliveries_handler_created_idx, relaybus_deliveries_key_sequence_idx, relaybus_deliveries_processing_idx, relaybus_deliveries_status_created_idx, relaybus_events_created_idx; creates relaybus_completions_completed_idx, relaybus_deliveries_dead_idx, relaybus_deliveries_event_handler_unique, relaybus_deliveries_lane_due_idx, relaybus_deliveries_lane_key_idx, relaybus_events_created_idx, relaybus_lanes,"), "{text}");
    assert!(text.contains(&kept), "{text}");
    let application = "index|app_deliveries_failing|CREATE INDEX app_deliveries_failing ON \
                       S.relaybus_deliveries USING btree (last_error) WHERE (last_error IS NOT NULL)";
    let mut found = catalog(&s);
    let at = found.iter().position(|r| *r == application);
    assert!(at.is_some(), "{found:?}");
    found.remove(at.unwrap());
    assert_eq!(
        found,
        catalog(&TestSchema::installed("other_0_1_indexes_ref"))
    );
    s.cmd().args(["setup", "--check"]).assert().success();
    let doctor = s.cmd().arg("doctor").output().unwrap();
    assert_eq!(doctor.status.code(), Some(3), "{}", stdout(&doctor));
    let indexes: Vec<String> = stdout(&doctor)
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("index"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        indexes,
        [
            "ok index indexes every 0.2 index, by definition".to_owned(),
            format!("warn index app_deliveries_failing not relaybus's: CREATE INDEX app_deliveries_failing ON {n}.relaybus_deliveries USING btree (last_error) WHERE (last_error IS NOT NULL); relaybus keeps it; it slows every write of the table it indexes"),
        ]
    );
}

/// An application's index whose columns are all in a 0.2 index of its table (here 0.1's keyed
/// index without its status rule, beside 0.2's lane/key index) is kept, and named as possibly
/// redundant by the plan and by `doctor`, whose fix script offers its `DROP INDEX CONCURRENTLY`
/// commented out, for the operator to choose.
#[test]
fn an_application_index_covered_by_a_0_2_index_is_named_and_its_drop_offered() {
    let s = TestSchema::with_fixture_0_1("covered_index");
    let n = &s.name;
    s.exec(&format!(
        "CREATE INDEX app_keyed ON \"{n}\".relaybus_deliveries (handler, key, sequence) WHERE key IS NOT NULL"
    ));
    let plan = s.cmd().args(["upgrade", "--dry-run"]).output().unwrap();
    assert!(
        stdout(&plan).contains(
            "its columns are all in 0.2's relaybus_deliveries_lane_key_idx, so it may be redundant"
        ),
        "{}",
        stdout(&plan)
    );
    s.cmd().args(["upgrade", "--yes"]).assert().success();
    let doctor = s.cmd().arg("doctor").output().unwrap();
    assert_eq!(doctor.status.code(), Some(3), "{}", stdout(&doctor));
    assert!(
        stdout(&doctor)
            .contains("its columns are all in relaybus's relaybus_deliveries_lane_key_idx"),
        "{}",
        stdout(&doctor)
    );
    let fix = stdout(&s.cmd().args(["doctor", "--fix-sql"]).output().unwrap());
    assert!(
        fix.contains(&format!(
            "-- Covered by relaybus_deliveries_lane_key_idx; uncomment to drop it, outside a transaction:\n-- DROP INDEX CONCURRENTLY \"{n}\".\"app_keyed\";\n"
        )),
        "{fix}"
    );
    assert!(!fix.lines().any(|l| l.starts_with("DROP INDEX")), "{fix}");
}

/// An application index on a 0.1 lease column would go with the column: the conversion refuses,
/// naming the statement that drops it, and writes nothing, by `upgrade`, `setup` and the script.
#[test]
fn an_application_index_on_a_0_1_lease_column_blocks_the_conversion() {
    let s = TestSchema::with_fixture_0_1("blocking_index");
    let n = &s.name;
    s.exec(&format!(
        "CREATE INDEX app_by_owner ON \"{n}\".relaybus_deliveries (lease_owner)"
    ));
    let before = snapshot(&s);
    let drop = format!("DROP INDEX \"{n}\".\"app_by_owner\";");
    let out = s.cmd().args(["upgrade", "--dry-run"]).output().unwrap();
    assert!(
        stdout(&out).contains(&format!("index app_by_owner blocks the conversion: CREATE INDEX app_by_owner ON {n}.relaybus_deliveries USING btree (lease_owner); drop it first: {drop}\n")),
        "{}",
        stdout(&out)
    );
    let out = s.cmd().args(["upgrade", "--yes"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        format!("error: indexes that are not relaybus's name what 0.2 removes (a 0.1 lease column or the status `processing`): the conversion would drop them or leave them meaningless; nothing was changed. Drop them first, then rerun: {drop}\n")
    );
    let out = s.cmd().arg("setup").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!("indexes that are not relaybus's name what 0.2 removes (a 0.1 lease column or the status processing); drop them first: DROP INDEX {n}.app_by_owner;")),
        "{}",
        stderr(&out)
    );
    let script = stdout(
        &s.cmd()
            .args(["schema-sql", "--from", "0.1"])
            .output()
            .unwrap(),
    );
    let psql = std::process::Command::new("psql")
        .args([
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "--single-transaction",
            "-d",
        ])
        .arg(crate::common::database_url())
        .args(["-c", &script])
        .output()
        .unwrap();
    assert_eq!(psql.status.code(), Some(1), "{}", stderr(&psql));
    assert_eq!(snapshot(&s), before);
    s.exec(&drop);
    s.cmd().args(["upgrade", "--yes"]).assert().success();
    assert_converted(&s);
}

/// What an online conversion killed after its first step leaves: the 0.2 columns, the
/// constraints and the triggers (applied here from the scripts the binary embeds).
fn begin_online(s: &TestSchema) {
    let ns = s.namespace();
    s.exec(&format!(
        "{}\n{}",
        ns.render(include_str!("../sql/postgres/00_prelude.sql")),
        ns.render(include_str!("../sql/postgres/online/begin.sql"))
    ));
}

/// Rows a 0.1 publisher writes (0.1's columns only): a new event with two deliveries, and a new
/// handler's delivery for an event the backfill has not reached.
fn publish_0_1(s: &TestSchema) {
    s.exec(&format!(
        "INSERT INTO {events} (id, type, key, payload) VALUES ('ev-7', 'order.shipped', 'order-7', '{{}}');
         INSERT INTO {deliveries} (id, event_id, handler, key, sequence) VALUES
           ('d-7a', 'ev-7', 'email', 'order-7', 3), ('d-7b', 'ev-7', 'billing', 'order-7', 3),
           ('d-3b', 'ev-3', 'audit', NULL, NULL);",
        events = s.table("events"),
        deliveries = s.table("deliveries"),
    ));
}

/// The rows `publish_0_1` wrote, converted: lanes by the publish-time hash, handlers of every
/// delivery on their events.
fn assert_published_0_1_converted(s: &TestSchema) {
    assert_eq!(
        s.rows(&format!(
            "SELECT id, lane, status, claims FROM {} WHERE id IN ('d-3b', 'd-7a', 'd-7b') ORDER BY id",
            s.table("deliveries")
        )),
        ["d-3b|234|pending|0", "d-7a|251|pending|0", "d-7b|251|pending|0"]
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT id, handlers::text FROM {} WHERE id IN ('ev-3', 'ev-7') ORDER BY id",
            s.table("events")
        )),
        ["ev-3|{audit,email}", "ev-7|{billing,email}"]
    );
    s.exec(&format!(
        "DELETE FROM {} WHERE id IN ('d-3b', 'd-7a', 'd-7b');
         DELETE FROM {} WHERE id = 'ev-7';
         UPDATE {} SET handlers = '{{email}}' WHERE id = 'ev-3';",
        s.table("deliveries"),
        s.table("events"),
        s.table("events")
    ));
}

/// `upgrade --online` plans its own steps, converts the fixture to exactly what the offline
/// conversion leaves, and a second run changes nothing.
#[test]
fn upgrade_online_converts_the_0_1_fixture_as_the_offline_conversion_does() {
    let s = TestSchema::with_fixture_0_1("online");
    let before = snapshot(&s);
    let out = s
        .cmd()
        .args(["upgrade", "--online", "--dry-run", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let steps: Vec<String> = plan["plan"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| format!("{} {}", s["name"].as_str().unwrap(), s["rows"]))
        .collect();
    assert_eq!(
        steps,
        [
            "begin null",
            "events-handlers 6",
            "deliveries-lanes 8",
            "validate null",
            "indexes null",
            "finish null"
        ]
    );
    assert!(plan["plan"]["steps"][4]["description"]
        .as_str()
        .unwrap()
        .ends_with("; creates relaybus_deliveries_dead_idx, relaybus_deliveries_lane_due_idx, relaybus_deliveries_lane_key_idx; drops relaybus_deliveries_completed_idx, relaybus_deliveries_dead_purge_idx, relaybus_deliveries_due_idx, relaybus_deliveries_due_unkeyed_idx, relaybus_deliveries_handler_created_idx, relaybus_deliveries_key_sequence_idx, relaybus_deliveries_processing_idx, relaybus_deliveries_status_created_idx"), "{plan}");
    assert_eq!(plan["expected_lock_seconds"], 0.2);
    assert_eq!(snapshot(&s), before);
    let out = s
        .cmd()
        .args(["upgrade", "--online", "--yes"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("  6. finish: drop the triggers and the lease columns"),
        "{}",
        stdout(&out)
    );
    let again = s
        .cmd()
        .args(["upgrade", "--online", "--yes"])
        .output()
        .unwrap();
    assert!(
        stdout(&again).starts_with("relaybus schema is 0.2, expanded: 0.1 publishers accepted (no 0.1 write since the conversion); nothing to upgrade."),
        "{}",
        stdout(&again)
    );
    // Expanded for 0.1 publishers until the contract, which leaves the offline catalog.
    contract(&s);
    assert_converted(&s);
    s.cmd()
        .args(["upgrade", "--online", "--yes"])
        .assert()
        .success()
        .stdout("relaybus schema is already 0.2; nothing to upgrade\n");
}

/// Ends the expansion an online conversion left, whatever 0.1 wrote.
fn contract(s: &TestSchema) {
    s.cmd()
        .args(["upgrade", "--contract", "--yes", "--force"])
        .assert()
        .success();
}

/// Killed after its first step, with a 0.2 index left invalid by an interrupted concurrent
/// build, while a 0.1 publisher went on writing: the rerun gives the new rows their lanes and
/// handlers, builds the index again, and ends with a fresh install's catalog.
#[test]
fn upgrade_online_run_again_after_a_kill_finishes_with_what_was_published_meanwhile() {
    let s = TestSchema::with_fixture_0_1("online_again");
    begin_online(&s);
    let n = &s.name;
    s.exec(&format!(
        "CREATE INDEX relaybus_deliveries_lane_due_idx ON \"{n}\".relaybus_deliveries
           (lane, available_at, id) WHERE status = 'pending';
         UPDATE pg_index SET indisvalid = false
          WHERE indexrelid = '\"{n}\".relaybus_deliveries_lane_due_idx'::regclass;"
    ));
    publish_0_1(&s);
    s.cmd()
        .args(["upgrade", "--online", "--yes"])
        .assert()
        .success();
    assert_eq!(
        s.count(&format!(
            "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
              JOIN pg_namespace ns ON ns.oid = c.relnamespace
             WHERE ns.nspname = '{n}' AND NOT i.indisvalid"
        )),
        0
    );
    assert_published_0_1_converted(&s);
    contract(&s);
    assert_converted(&s);
}

/// The offline conversion of a store an online one left halfway removes what the online one
/// added for its own use.
#[test]
fn upgrade_offline_after_an_interrupted_online_one_leaves_a_fresh_install_s_catalog() {
    let s = TestSchema::with_fixture_0_1("online_then_offline");
    begin_online(&s);
    publish_0_1(&s);
    s.cmd().args(["upgrade", "--yes"]).assert().success();
    assert_eq!(
        s.count(&format!(
            "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
              JOIN pg_namespace ns ON ns.oid = c.relnamespace WHERE ns.nspname = '{}'
               AND NOT t.tgisinternal",
            s.name
        )),
        0
    );
    assert_published_0_1_converted(&s);
    assert_converted(&s);
}

/// A 0.2 store whose index was redefined by hand is not current: `setup --check` says so, and
/// `setup` puts the 0.2 definition back.
#[test]
fn setup_check_sees_a_redefined_index_and_setup_repairs_it() {
    let s = TestSchema::installed("redefined");
    let n = &s.name;
    s.exec(&format!(
        "DROP INDEX \"{n}\".relaybus_deliveries_dead_idx;
         CREATE INDEX relaybus_deliveries_dead_idx ON \"{n}\".relaybus_deliveries (updated_at)
          WHERE status = 'dead';
         ALTER INDEX \"{n}\".relaybus_deliveries_lane_key_idx RENAME TO lane_key;"
    ));
    incomplete_until_setup(&s);
    assert_eq!(
        catalog(&s),
        catalog(&TestSchema::installed("redefined_ref"))
    );
    s.cmd().args(["setup", "--check"]).assert().success();
}

/// `setup --check` finds the store incomplete (exit 1, saying what to run), and `setup`
/// completes it.
fn incomplete_until_setup(s: &TestSchema) {
    let n = &s.name;
    let out = s.cmd().args(["setup", "--check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        format!("relaybus schema is 0.2 (incomplete) in schema \"{n}\", prefix \"relaybus_\", expected 0.2; run `relaybus setup`\n")
    );
    s.cmd().arg("setup").assert().success().stdout(format!(
        "relaybus schema 0.2 (incomplete) -> 0.2 (schema \"{n}\", prefix \"relaybus_\")\n"
    ));
}

/// A 0.2 store installed before the handlers table existed is not current: workers and the
/// admin commands ask for `setup`, which adds the table and nothing else.
#[test]
fn a_0_2_store_without_the_handlers_table_is_completed_by_setup() {
    let s = TestSchema::installed("no_handlers_table");
    let n = &s.name;
    s.exec(&format!("DROP TABLE \"{n}\".relaybus_handlers"));
    let out = s.cmd().args(["handlers", "list"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        format!("error: the relaybus schema in schema \"{n}\" with prefix \"relaybus_\" is incomplete (no version row, a table, column or collection missing, indexes that differ from 0.2's, or publish functions missing or from another relaybus); run `relaybus setup`\n")
    );
    s.cmd().arg("setup").assert().success().stdout(format!(
        "relaybus schema 0.2 (incomplete) -> 0.2 (schema \"{n}\", prefix \"relaybus_\")\n"
    ));
    assert_eq!(
        catalog(&s),
        catalog(&TestSchema::installed("no_handlers_table_ref"))
    );
    s.cmd()
        .args(["handlers", "list"])
        .assert()
        .success()
        .stdout("no handler has deliveries or a row\n");
}

/// A 0.2 store whose handlers table is from before it kept the breaker's settings is not
/// current: `setup` adds the columns, keeping every row, and a row without settings has the
/// defaults.
#[test]
fn a_0_2_store_without_the_breaker_settings_is_completed_by_setup() {
    let s = TestSchema::installed("no_breaker_settings");
    let n = &s.name;
    s.cmd()
        .args(["handlers", "pause", "--new", "mailer", "--reason", "kept"])
        .assert()
        .success();
    s.exec(&format!(
        "ALTER TABLE \"{n}\".relaybus_handlers DROP COLUMN breaker_threshold, \
         DROP COLUMN breaker_max_cooldown"
    ));
    incomplete_until_setup(&s);
    let out = s
        .cmd()
        .args(["handlers", "list", "--json"])
        .output()
        .unwrap();
    let listed: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        (
            &listed[0]["handler"],
            &listed[0]["pause_reason"],
            &listed[0]["breaker_policy"]
        ),
        (
            &json!("mailer"),
            &json!("kept"),
            &json!({"threshold": 10, "max_cooldown": "10m"})
        )
    );
    assert_eq!(
        catalog(&s),
        catalog(&TestSchema::installed("no_breaker_settings_ref"))
    );
}

/// A 0.2 store whose publish functions are missing, or are another binary's (a body that
/// differs), is not current: `setup` creates them as this binary writes them, keeping the
/// grants an operator gave on them.
#[test]
fn a_0_2_store_with_missing_or_other_publish_functions_is_completed_by_setup() {
    let s = TestSchema::installed("publish_functions_drift");
    let n = &s.name;
    let role = crate::common::TestRole::new("fn_grantee", &s.url);
    let role = &role.name;
    s.exec(&format!(
        "GRANT EXECUTE ON FUNCTION \"{n}\".relaybus_publish_many(jsonb) TO {role};
         DROP FUNCTION \"{n}\".relaybus_publish(text, jsonb, text[], text, text, jsonb);
         CREATE OR REPLACE FUNCTION \"{n}\".relaybus_new_id() RETURNS text LANGUAGE sql
           AS $$ SELECT 'same-id-every-time' $$;"
    ));
    incomplete_until_setup(&s);
    s.cmd().args(["setup", "--check"]).assert().success();
    let granted = format!(
        "SELECT count(*) FROM information_schema.role_routine_grants \
          WHERE routine_schema = '{n}' AND grantee = '{role}' AND privilege_type = 'EXECUTE'"
    );
    assert_eq!(s.count(&granted), 1, "the grant on publish_many is kept");
    let ids = s.rows(&format!(
        "SELECT \"{n}\".relaybus_new_id() FROM generate_series(1, 2)"
    ));
    assert_ne!(ids[0], ids[1]);
    s.exec(&format!(
        "REVOKE ALL ON FUNCTION \"{n}\".relaybus_publish_many(jsonb) FROM {role}"
    ));
    assert_eq!(
        catalog(&s),
        catalog(&TestSchema::installed("publish_functions_drift_ref"))
    );
}

#[test]
fn conversion_script_applied_twice_converts_the_fixture_once() {
    let s = TestSchema::with_fixture_0_1("convert_script");
    let out = s
        .cmd()
        .args(["schema-sql", "--from", "0.1"])
        .output()
        .unwrap();
    let script = format!("BEGIN;\n{}\nCOMMIT;", stdout(&out));
    s.exec(&script);
    assert_converted(&s);
    let first = snapshot(&s);
    s.exec(&script);
    assert_eq!(snapshot(&s), first);
}

#[test]
fn upgrade_dry_run_writes_nothing() {
    let s = TestSchema::with_fixture_0_1("dry_run");
    let before = snapshot(&s);
    let out = s.cmd().args(["upgrade", "--dry-run"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let locks = format!(
        "locks: ACCESS EXCLUSIVE on {} and {} from the first step to the commit (one \
         transaction): every read and write of them waits until it ends, under a second for \
         these rows at the rate of a 2-core server (a busy or slow server takes longer)\n",
        s.namespace().table("events"),
        s.namespace().table("deliveries")
    );
    assert!(
        stdout(&out).ends_with(&format!("{locks}dry run: nothing was written\n")),
        "{}",
        stdout(&out)
    );
    // --show-sql prints the script schema-sql renders for the same store.
    let script = s
        .cmd()
        .args(["schema-sql", "--from", "0.1"])
        .output()
        .unwrap();
    let out = s
        .cmd()
        .args(["upgrade", "--dry-run", "--show-sql"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).ends_with(&format!(
        "{locks}{}dry run: nothing was written\n",
        stdout(&script)
    )));
    let json = s
        .cmd()
        .args(["upgrade", "--dry-run", "--json"])
        .output()
        .unwrap();
    let plan: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(plan["applied"], false);
    assert_eq!(plan["plan"]["counts"]["processing"], 2);
    assert_eq!(plan["plan"]["steps"].as_array().unwrap().len(), 6);
    assert_eq!(plan["sql"], serde_json::Value::Null);
    assert_eq!(plan["expected_lock_seconds"], 0.0);
    assert_eq!(
        format!("locks: {}\n", plan["locks"].as_str().unwrap()),
        locks
    );
    assert_eq!(snapshot(&s), before);
    let refused = s.cmd().args(["upgrade", "--show-sql"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(2));
}

#[test]
fn upgrade_refuses_live_0_1_leases_unless_forced() {
    let s = TestSchema::with_fixture_0_1("live_leases");
    s.exec(&format!(
        "UPDATE {} SET lease_expires_at = '2999-01-01 00:00:00+00' WHERE id = 'd-3a'",
        s.table("deliveries")
    ));
    let before = snapshot(&s);
    let out = s.cmd().args(["upgrade", "--yes"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("error: 1 deliveries are still leased by 0.1 workers (until 2999-01-01 00:00:00+00); stop every 0.1 worker first, then run `relaybus upgrade --force` (or wait until the leases expire)"), "{}", stderr(&out));
    assert_eq!(snapshot(&s), before);
    let out = s.cmd().arg("setup").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(snapshot(&s), before);
    s.cmd()
        .args(["upgrade", "--yes", "--force"])
        .assert()
        .success();
    assert_converted(&s);
}

#[test]
fn upgrade_needs_confirmation_without_a_terminal() {
    let s = TestSchema::with_fixture_0_1("confirm");
    let before = snapshot(&s);
    let out = s.cmd().arg("upgrade").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out)
        .contains("Not confirmed: standard input is not a terminal; rerun with --yes to proceed"));
    assert_eq!(snapshot(&s), before);
}

#[test]
fn a_lock_timeout_names_the_blocking_session_and_changes_nothing() {
    let s = TestSchema::with_fixture_0_1("lock_timeout");
    let before = snapshot(&s);
    let blocker = crate::common::connect();
    let pid: i32 = crate::common::block_on(async {
        blocker
            .batch_execute(&format!(
                "BEGIN; LOCK TABLE {} IN ACCESS SHARE MODE",
                s.table("events")
            ))
            .await
            .unwrap();
        blocker.query_one("SELECT pg_backend_pid()", &[]).await
    })
    .unwrap()
    .get(0);
    let out = s
        .cmd()
        .args(["--lock-timeout", "300ms", "upgrade", "--yes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with(&format!(
            "error: timed out after 300ms waiting for a lock held by pid {pid} (user postgres, "
        )),
        "{err}"
    );
    assert!(err.contains("nothing was changed"), "{err}");
    crate::common::block_on(blocker.batch_execute("ROLLBACK")).unwrap();
    assert_eq!(snapshot(&s), before);
}

#[test]
fn bad_names_and_urls_are_refused_with_what_to_do() {
    let s = TestSchema::new("bad_input");
    let out = s
        .cmd()
        .args(["--prefix", "Bad-Prefix", "setup"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: invalid prefix `Bad-Prefix`: only lower-case ASCII letters, digits and `_` are allowed; pass a name like `relaybus_`\n"
    );
    let out = s
        .cmd()
        .env("RELAYBUS_DATABASE_URL", "mysql://x@y/z")
        .arg("setup")
        .output()
        .unwrap();
    assert_eq!(
        stderr(&out),
        "error: unsupported database URL `mysql://x@y/z`: use postgres://, postgresql://, key=value pairs (host=... dbname=...), mongodb:// or mongodb+srv://\n"
    );
    let out = s
        .cmd()
        .env(
            "RELAYBUS_DATABASE_URL",
            "postgres://app:hunter2@127.0.0.1:1/x",
        )
        .arg("setup")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(!stderr(&out).contains("hunter2"));
    assert!(stderr(&out)
        .starts_with("error: could not connect to PostgreSQL at 127.0.0.1:1/x as app: "));
}

/// The setup lock queues upgraders: a second upgrade waits for the first however long it
/// converts (its --lock-timeout guards the tables, not the queue), then finds the store
/// current and says so, instead of failing after the timeout.
#[test]
fn an_upgrade_waits_for_the_setup_lock_and_finds_the_store_converted() {
    let s = TestSchema::with_fixture_0_1("upgrade_waits");
    let script = stdout(
        &s.cmd()
            .args(["schema-sql", "--from", "0.1"])
            .output()
            .unwrap(),
    );
    let key: i64 = script
        .lines()
        .find_map(|l| l.strip_prefix("SELECT pg_advisory_xact_lock("))
        .and_then(|r| r.strip_suffix(");"))
        .unwrap()
        .parse()
        .unwrap();
    let holder = crate::common::connect();
    crate::common::block_on(
        holder.batch_execute(&format!("BEGIN; SELECT pg_advisory_xact_lock({key})")),
    )
    .unwrap();
    let mut waiter = StdCommand::new(assert_cmd::cargo::cargo_bin("relaybus"))
        .env("RELAYBUS_DATABASE_URL", crate::common::database_url())
        .args([
            "--schema",
            &s.name,
            "--lock-timeout",
            "300ms",
            "upgrade",
            "--yes",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map(Spawned::from)
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "the upgrade stopped waiting"
    );
    // The lock's holder converts the store, as a first upgrade would, and commits.
    crate::common::block_on(holder.batch_execute(&script)).unwrap();
    crate::common::block_on(holder.batch_execute("COMMIT")).unwrap();
    let out = finish(waiter, Duration::from_secs(30));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("found: schema 0.1\n"), "{text}");
    assert!(
        text.ends_with(
            "relaybus schema is 0.2 now: another session converted it while this one waited \
             for the setup lock; nothing was changed\n"
        ),
        "{text}"
    );
}

/// A runtime role with the grants `schema-sql --grants` renders runs publish, workers and the
/// admin commands, and `setup` on a current store reports it current instead of failing on
/// privileges it need not have.
#[test]
fn a_runtime_role_with_the_rendered_grants_runs_everything_but_schema_changes() {
    struct Role(String);
    impl Drop for Role {
        fn drop(&mut self) {
            let admin = crate::common::connect();
            let _ = crate::common::block_on(admin.batch_execute(&format!(
                "DROP OWNED BY \"{0}\"; DROP ROLE IF EXISTS \"{0}\"",
                self.0
            )));
        }
    }
    let s = TestSchema::installed("runtime_role");
    let db = crate::common::database_name();
    let role = Role(format!("rb_app_{}", std::process::id()));
    s.exec(&format!(
        "DROP ROLE IF EXISTS \"{0}\"; CREATE ROLE \"{0}\" LOGIN",
        role.0
    ));
    let grants = s
        .cmd()
        .args(["schema-sql", "--grants", &role.0])
        .output()
        .unwrap();
    assert!(grants.status.success(), "{}", stderr(&grants));
    s.exec(&stdout(&grants));
    let url = format!("postgres://{}@127.0.0.1:5432/{db}", role.0);
    let as_role = |args: &[&str]| {
        let out = s
            .cmd()
            .env("RELAYBUS_DATABASE_URL", &url)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        stdout(&out)
    };
    assert_eq!(
        as_role(&["setup"]),
        format!(
            "relaybus schema 0.2 already installed (schema \"{}\", prefix \"relaybus_\"); nothing to do\n",
            s.name
        )
    );
    as_role(&["setup", "--check"]);
    as_role(&["upgrade", "--dry-run"]);
    as_role(&[
        "publish",
        "--type",
        "t",
        "--id",
        "e1",
        "--handler",
        "h",
        "--handler",
        "dies",
    ]);
    as_role(&["run", "--handler", "h", "--exec", "true", "--drain"]);
    as_role(&[
        "run",
        "--handler",
        "dies",
        "--exec",
        "exit 65",
        "--drain",
        "--completion-history",
    ]);
    as_role(&["dead", "list"]);
    as_role(&["dead", "requeue", "--all", "--yes"]);
    as_role(&["deliveries", "list"]);
    as_role(&["events", "show", "e1"]);
    as_role(&["lanes"]);
    as_role(&["stats"]);
    as_role(&[
        "purge",
        "--completed-older-than",
        "0s",
        "--dead-older-than",
        "0s",
        "--yes",
    ]);
    let out = relaybus()
        .env("RELAYBUS_DATABASE_URL", &url)
        .args(["--schema", "elsewhere_entirely", "setup"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "a new store needs the owner");
}

/// `CREATE TABLE IF NOT EXISTS` does not look at the table it finds: setup took an
/// application's `events` for its own, and purge then deleted the application's rows. Objects
/// of relaybus's names must have relaybus's shape; an empty prefix and PostgreSQL's own schemas
/// are refused.
#[test]
fn setup_refuses_to_adopt_an_application_s_table() {
    let s = TestSchema::new("foreign_table");
    s.exec(&format!(
        "CREATE SCHEMA \"{0}\"; CREATE TABLE \"{0}\".app_events (id text PRIMARY KEY, title text); \
         INSERT INTO \"{0}\".app_events VALUES ('a', 'keep me')",
        s.name
    ));
    let out = s
        .cmd()
        .args(["--prefix", "app_", "setup"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        format!(
            "error: objects of relaybus's names that are not relaybus's are in the way: \
             `{}.app_events` (it has no column created_at, headers, key, payload, type); choose \
             another --schema or --prefix, or move them; nothing was changed\n",
            s.name
        )
    );
    assert_eq!(
        s.rows(&format!(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
              WHERE n.nspname = '{}' AND c.relkind = 'r'",
            s.name
        )),
        ["app_events"]
    );
    for (args, message) in [
        (["--prefix", "", "setup"], "error: invalid prefix ``: it is empty; pass a name like `relaybus_`\n"),
        (
            ["--schema", "information_schema", "setup"],
            "error: invalid schema `information_schema`: it is a schema of PostgreSQL's own; pass a name like `public`\n",
        ),
    ] {
        let out = relaybus()
            .env("RELAYBUS_DATABASE_URL", crate::common::database_url())
            .args(args)
            .output()
            .unwrap();
        assert_eq!((out.status.code(), stderr(&out)), (Some(2), message.to_owned()));
    }
}

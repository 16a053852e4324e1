//! The schema scripts of `sql/postgres/`, rendered for a namespace without a connection: the
//! install, and the 0.1 -> 0.2 conversion split into the steps `upgrade` runs and reports.

use super::super::sql::{sql_file, with_fragments};
use super::super::wake::channel;
use super::locks::setup_lock_key;
use crate::store::{Namespace, Script, DEFAULT_MAX_PAYLOAD_BYTES, MAX_NAME_BYTES, SCHEMA_VERSION};

pub(super) const PRELUDE: &str = sql_file!("00_prelude");
pub(super) const CONVERT_0_1: &str = sql_file!("10_convert_0_1");
pub(super) const INSTALL: &str = sql_file!("20_install");
const GRANTS: &str = sql_file!("grants");
const PUBLISH_FUNCTIONS: &str = sql_file!("30_publish");
const PUBLISH: &str = sql_file!("delivery/publish");

/// A schema script for a namespace, with its fragments spliced in (the index drift query where
/// the conversion and the install loop over what it finds, the online conversion's cleanup
/// where both conversions end) and the publish functions where the install creates them.
pub(super) fn render(ns: &Namespace, source: &str) -> String {
    ns.render(&with_fragments(source).replace("{{publish_functions}}", &publish_functions(ns)))
}

/// The functions an application publishes with: the command's own publish statement inside,
/// and the limits and wake-up channel the command applies.
fn publish_functions(ns: &Namespace) -> String {
    PUBLISH_FUNCTIONS
        .trim_end()
        .replace("{{publish}}", &publish_statement())
        .replace("{{channel}}", &channel(ns))
        .replace("{{max_name_bytes}}", &MAX_NAME_BYTES.to_string())
        .replace(
            "{{max_payload_bytes}}",
            &DEFAULT_MAX_PAYLOAD_BYTES.to_string(),
        )
}

/// The command's publish statement without its leading comment, its parameters ($1..$12)
/// spelled as the variables of `publish_many` that hold them.
fn publish_statement() -> String {
    const PARAMETERS: [&str; 12] = [
        "ids",
        "types",
        "keys",
        "payloads",
        "headers",
        "d_events",
        "d_handlers",
        "d_ids",
        "d_lanes",
        "d_keys",
        "firsts",
        "lasts",
    ];
    let statement: Vec<&str> = PUBLISH
        .lines()
        .skip_while(|line| line.starts_with("--"))
        .collect();
    let statement = with_fragments(&statement.join("\n"));
    // From $12 down, so that $1 does not take the start of $10.
    PARAMETERS
        .iter()
        .enumerate()
        .rev()
        .fold(statement, |sql, (i, name)| {
            sql.replace(&format!("${}", i + 1), name)
        })
        .trim_end()
        .to_owned()
}

/// The functions the install creates, by name (without the prefix), each with its body as the
/// catalog keeps it (`pg_proc.prosrc`): a store whose functions differ is not current.
pub(in crate::store::postgres) fn function_bodies(ns: &Namespace) -> Vec<(String, String)> {
    let script = ns.render(&publish_functions(ns));
    let head = format!("CREATE OR REPLACE FUNCTION {}", ns.table(""));
    script
        .split(&head[..head.len() - 1])
        .skip(1)
        .filter_map(|definition| {
            let name = definition.split('"').next()?;
            let body = definition.split("$fn$").nth(1)?;
            Some((name.to_owned(), body.to_owned()))
        })
        .collect()
}

fn header(ns: &Namespace, what: &str) -> String {
    format!(
        "-- relaybus {} schema {SCHEMA_VERSION}: {what}\n\
         -- schema \"{}\", prefix \"{}\"; rendered by `relaybus schema-sql`.\n\
         -- Apply in one transaction, with every relaybus worker of an older version stopped:\n\
         --   psql -v ON_ERROR_STOP=1 --single-transaction -f FILE\n\
         -- Applying it again changes nothing.\n\n\
         -- Serialises with `relaybus setup` and `relaybus upgrade` on the same schema.\n\
         SELECT pg_advisory_xact_lock({});\n\n",
        env!("CARGO_PKG_VERSION"),
        ns.schema(),
        ns.prefix(),
        setup_lock_key(ns)
    )
}

/// A schema script: the install for an empty database, the conversion of a 0.1 store followed
/// by the install it ends with, or a runtime role's grants.
pub(crate) fn script(ns: &Namespace, script: &Script) -> String {
    match script {
        Script::Grants { role } => format!(
            "-- relaybus {} schema {SCHEMA_VERSION}: grants for a runtime role\n\
             -- schema \"{}\", prefix \"{}\"; rendered by `relaybus schema-sql --grants`.\n\n{}",
            env!("CARGO_PKG_VERSION"),
            ns.schema(),
            ns.prefix(),
            // A role name is an identifier, quoted, so any name is taken as it is.
            ns.render(GRANTS)
                .replace("{{role}}", &format!("\"{}\"", role.replace('"', "\"\"")))
        ),
        Script::Install => {
            header(ns, "install") + &render(ns, PRELUDE) + "\n" + &render(ns, INSTALL)
        }
        Script::ConvertFrom01 => {
            header(ns, "in-place conversion from 0.1")
                + &render(ns, PRELUDE)
                + "\n"
                + &render(ns, CONVERT_0_1)
                + "\n"
                + &render(ns, INSTALL)
        }
    }
}

/// The install script of a namespace, as `setup` and `schema-sql` run it.
pub(in crate::store::postgres) fn install_script(ns: &Namespace) -> String {
    script(ns, &Script::Install)
}

/// A runnable part of the conversion, with the description its header comment gives.
pub(super) struct ScriptStep {
    pub(super) name: String,
    pub(super) description: String,
    pub(super) sql: String,
}

/// The steps `upgrade` runs, in order: the prelude, each `-- step` block of the conversion, the
/// install. One source for the script and the command.
pub(super) fn conversion_steps(ns: &Namespace) -> Vec<ScriptStep> {
    let mut steps = vec![ScriptStep {
        name: "prelude".into(),
        description: "schema, version table and lane function".into(),
        sql: render(ns, PRELUDE),
    }];
    for block in render(ns, CONVERT_0_1).split("\n-- step ").skip(1) {
        let (head, body) = block.split_once("\n").unwrap_or((block, ""));
        let mut description = head.to_owned();
        let mut sql = String::new();
        for line in body.lines() {
            match line.strip_prefix("-- ") {
                Some(more) if sql.is_empty() => {
                    description.push(' ');
                    description.push_str(more);
                }
                _ => {
                    sql.push_str(line);
                    sql.push('\n');
                }
            }
        }
        let (name, description) = description
            .split_once(": ")
            .unwrap_or(("step", description.as_str()));
        steps.push(ScriptStep {
            name: name.to_owned(),
            description: description.to_owned(),
            sql,
        });
    }
    steps.push(ScriptStep {
        name: "install".into(),
        description: "drop the indexes 0.2 does not keep, found by definition whatever their \
                      names; create the 0.2 indexes and tables, seed the 256 lanes, record the \
                      version"
            .into(),
        sql: render(ns, INSTALL),
    });
    steps
}

/// The statement of a rendered script that creates the index `name`.
pub(in crate::store::postgres) fn index_statement(script: &str, name: &str) -> Option<String> {
    let quoted = format!("\"{name}\"");
    let mut statement = String::new();
    for line in script.lines() {
        if statement.is_empty() && !line.starts_with("CREATE") {
            continue;
        }
        statement.push_str(line);
        statement.push('\n');
        if line.trim_end().ends_with(';') {
            if statement.contains("INDEX") && statement.contains(&quoted) {
                return Some(statement);
            }
            statement.clear();
        }
    }
    None
}

/// Object names a script creates or drops, read from its own text.
pub(super) fn names_after(script: &str, marker: &str) -> Vec<String> {
    script
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix(marker))
        .filter_map(|rest| rest.rsplit('"').nth(1).map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_come_from_the_script() {
        let ns = Namespace::new("public", "relaybus_").unwrap();
        let names: Vec<String> = conversion_steps(&ns).into_iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "prelude",
                "check-indexes",
                "events-handlers",
                "deliveries-lanes",
                "lease-columns",
                "install"
            ]
        );
        for step in conversion_steps(&ns) {
            assert!(!step.sql.contains("{{"), "{}: {}", step.name, step.sql);
        }
    }
}

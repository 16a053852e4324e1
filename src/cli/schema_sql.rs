//! `relaybus schema-sql`: the schema as a script, rendered without a connection.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, ValueEnum};

use super::{GlobalArgs, Output};
use crate::store::{schema_script, Engine, Script};

/// Print the schema as SQL for your own migration tool (Flyway, Atlas, a DBA).
///
/// Connects to nothing. Without --from, prints the complete install script for an
/// empty database; with --from 0.1, the in-place conversion of a 0.1 store. Both
/// are idempotent. With --grants ROLE, the least privileges a runtime role needs
/// (publish, run, the admin commands), for a store installed by its owner:
///
///   relaybus schema-sql --schema app > relaybus.sql
///   psql -v ON_ERROR_STOP=1 --single-transaction -f relaybus.sql
///   relaybus schema-sql --schema app --grants app_worker | psql -v ON_ERROR_STOP=1
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct SchemaSqlArgs {
    /// Render the conversion from this installed version instead of a fresh install.
    #[arg(long, value_enum, value_name = "VERSION", conflicts_with = "grants")]
    pub from: Option<FromVersion>,
    /// Render the grants a runtime role needs instead.
    #[arg(long, value_name = "ROLE", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub grants: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FromVersion {
    #[value(name = "0.1")]
    V01,
}

pub(super) fn run(g: &GlobalArgs, out: &Output, args: SchemaSqlArgs) -> Result<ExitCode> {
    let ns = g.namespace()?;
    let engine = Engine::of(g.url()?.as_deref())?;
    let script = match (args.from, args.grants) {
        (_, Some(role)) => Script::Grants { role },
        (Some(FromVersion::V01), None) => Script::ConvertFrom01,
        (None, None) => Script::Install,
    };
    let script = schema_script(engine, &ns, &script)?;
    out.line(script.trim_end())?;
    Ok(ExitCode::SUCCESS)
}

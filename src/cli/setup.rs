//! `relaybus setup`: install or complete the schema, or check it.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use serde_json::json;

use super::{GlobalArgs, Output};
use crate::store::prelude::*;
use crate::store::{SchemaStatus, StoreOptions, SCHEMA_VERSION};

/// Install the store, or bring it to the current schema in place.
///
/// Runs in one transaction under an advisory lock, any number of times: several setups started
/// at once end with one correct schema. A 0.1 store is converted as `relaybus upgrade` would
/// (see `relaybus upgrade --dry-run` first); it is refused while 0.1 workers hold leases.
///
/// With --check nothing is changed: exit 0 when the schema is current, 1 otherwise, with the
/// installed version and the command to run.
#[derive(Debug, Args)]
pub struct SetupArgs {
    /// Only check the installed version; change nothing.
    #[arg(long)]
    pub check: bool,
}

pub(super) async fn run(g: &GlobalArgs, out: &Output, args: SetupArgs) -> Result<ExitCode> {
    let store = g.open(StoreOptions::admin())?;
    let ns = store.namespace();
    let place = ns.place();
    if args.check {
        let status = store.schema_status().await?;
        let current = status.is_current();
        let expanded = matches!(status, SchemaStatus::Expanded(_));
        if out.json {
            out.print_json(&json!({
                "current": current,
                "installed": status.describe(),
                "expected": SCHEMA_VERSION,
                "next": expanded.then(|| status.advice()),
            }))?;
        } else if expanded {
            out.line(format!(
                "relaybus schema {SCHEMA_VERSION} is current ({place}): {}; {}",
                status.describe(),
                status.advice()
            ))?;
        } else if current {
            out.line(format!(
                "relaybus schema {SCHEMA_VERSION} is current ({place})"
            ))?;
        }
        if !current {
            eprintln!(
                "relaybus schema is {} in {place}, expected {SCHEMA_VERSION}; {}",
                status.describe(),
                status.advice()
            );
            return Ok(ExitCode::from(super::exit::FAILURE));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let outcome = store.setup(false).await?;
    if out.json {
        out.print_json(&json!({
            "before": outcome.before.describe(),
            "after": outcome.after.describe(),
        }))?;
    } else if outcome.before.is_current() {
        out.line(format!(
            "relaybus schema {SCHEMA_VERSION} already installed ({place}); nothing to do"
        ))?;
    } else {
        out.line(format!(
            "relaybus schema {} -> {} ({place})",
            outcome.before.describe(),
            outcome.after.describe()
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

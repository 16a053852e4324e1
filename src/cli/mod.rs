//! The command line: clap types and one file per command. A command resolves its arguments
//! into engine calls and formats the result; it never holds SQL or business rules.

mod bench;
mod dead;
mod deliveries;
mod doctor;
pub mod generate;
mod lanes;
pub mod logs;
mod output;
mod publish;
mod purge;
mod run;
mod schema_sql;
mod setup;
mod upgrade;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use crate::bounds::Bounds;
use crate::store::{AnyStore, Namespace, StoreOptions};

pub use output::Output;

/// The operator's tool for a relaybus event bus.
///
/// Installs and upgrades the store, renders its schema as SQL, publishes events, runs workers
/// whose handlers are shell commands or webhooks, and finds, requeues and purges deliveries.
/// Every command talks to the store given by --database-url (or RELAYBUS_DATABASE_URL, or the
/// libpq variables PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE).
///
/// Exit codes: 0 done (also when a confirmation is answered no), 1 failed (or `setup --check`
/// found the schema not current, or `doctor` a failing check), 2 usage error (also those found
/// after parsing, and a destructive command without a terminal and without --yes), 3 `doctor`
/// found warnings only, 69 no server answered at the URL, 130 or 143 `run` stopped by a second
/// SIGINT or SIGTERM.
#[derive(Debug, Parser)]
#[command(
    name = "relaybus",
    version,
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Database URL: postgres://user:password@host:port/db (or libpq's key=value pairs), or
    /// mongodb://host/db?replicaSet=NAME for a MongoDB store. Without it, the file
    /// RELAYBUS_DATABASE_URL_FILE names, or else the libpq variables (PGHOST, PGPORT, PGUSER,
    /// PGPASSWORD, PGDATABASE) with libpq's defaults.
    #[arg(
        long,
        global = true,
        env = "RELAYBUS_DATABASE_URL",
        hide_env_values = true
    )]
    pub database_url: Option<String>,

    /// Schema that holds the relaybus tables [default: public]. On MongoDB, the database that
    /// holds the collections [default: the URL's database, else relaybus].
    #[arg(long, global = true, env = "RELAYBUS_SCHEMA", value_name = "NAME")]
    pub schema: Option<String>,

    /// Prefix of every relaybus table, index and function name (of every collection on
    /// MongoDB).
    #[arg(
        long,
        global = true,
        env = "RELAYBUS_PREFIX",
        default_value = "relaybus_",
        value_name = "PREFIX"
    )]
    pub prefix: String,

    /// Print results as JSON for scripts (stable field names).
    #[arg(long, global = true)]
    pub json: bool,

    /// Send every statement unnamed, for poolers that cannot keep prepared statements
    /// (PgBouncer before 1.21 in transaction mode).
    #[arg(long, global = true)]
    pub no_prepared_statements: bool,

    /// How long a schema change waits for a lock before it fails, names the blocking session
    /// and changes nothing.
    #[arg(long, global = true, default_value = human(StoreOptions::LOCK_TIMEOUT), value_parser = within(StoreOptions::LOCK_TIMEOUT_BOUNDS), value_name = "DURATION")]
    pub lock_timeout: Duration,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Setup(setup::SetupArgs),
    SchemaSql(schema_sql::SchemaSqlArgs),
    Upgrade(upgrade::UpgradeArgs),
    Publish(publish::PublishArgs),
    Run(run::RunArgs),
    Deliveries(deliveries::DeliveriesArgs),
    Events(deliveries::EventsArgs),
    Dead(dead::DeadArgs),
    Purge(purge::PurgeArgs),
    Lanes(lanes::LanesArgs),
    Stats(lanes::StatsArgs),
    Doctor(doctor::DoctorArgs),
    Completions(generate::CompletionsArgs),
    Bench(bench::BenchArgs),
    #[command(hide = true)]
    BenchWorker(bench::WorkerArgs),
}

/// An error in what the user typed, found after parsing (a missing handler, a requeue without a
/// selection): it exits with 2, as clap's own usage errors do.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Returns a usage error from the enclosing function.
macro_rules! usage {
    ($($arg:tt)*) => {
        return Err($crate::cli::UsageError(format!($($arg)*)).into())
    };
}
pub(crate) use usage;

/// The exit code of each kind of failure, documented in `--help` and README.
pub mod exit {
    /// Something failed.
    pub const FAILURE: u8 = 1;
    /// What was typed cannot be run: clap's errors, and those found after parsing.
    pub const USAGE: u8 = 2;
    /// `doctor` found warnings and no failure.
    pub const WARNINGS: u8 = 3;
    /// No server answered at the URL (sysexits' EX_UNAVAILABLE).
    pub const UNAVAILABLE: u8 = 69;
}

/// The exit code an error ends the command with.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    use crate::config::ConfigError;
    use crate::store::StoreError;
    for cause in e.chain() {
        if cause.is::<UsageError>() || cause.is::<ConfigError>() {
            return exit::USAGE;
        }
        match cause.downcast_ref::<StoreError>() {
            Some(
                StoreError::InvalidIdentifier { .. }
                | StoreError::UnsupportedUrl(_)
                | StoreError::InvalidConnectionString { .. },
            ) => return exit::USAGE,
            Some(StoreError::Connect { .. }) => return exit::UNAVAILABLE,
            _ => {}
        }
    }
    exit::FAILURE
}

/// Durations as `30s`, `5m`, `1h`, `250ms`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use a duration like 30s, 5m, 250ms)"))
}

/// The parser of a duration option: a duration within the setting's bounds.
fn within(bounds: Bounds) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync {
    move |s| parse_duration(s).and_then(|d| bounds.check(d))
}

/// A default duration as the help text shows it (and as `parse_duration` reads it back).
fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// A secret from the file a `*_FILE` variable names, so it need not sit in the environment.
fn secret_file(variable: &str) -> Result<Option<String>> {
    match std::env::var_os(variable) {
        None => Ok(None),
        Some(path) => {
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!("could not read {variable} (`{}`)", path.to_string_lossy())
            })?;
            Ok(Some(text.trim_end_matches(['\n', '\r']).to_owned()))
        }
    }
}

impl GlobalArgs {
    /// The database URL: --database-url, RELAYBUS_DATABASE_URL, or the file
    /// RELAYBUS_DATABASE_URL_FILE names.
    fn url(&self) -> Result<Option<String>> {
        match &self.database_url {
            Some(url) => Ok(Some(url.clone())),
            None => secret_file("RELAYBUS_DATABASE_URL_FILE"),
        }
    }

    fn namespace(&self) -> Result<Namespace> {
        Ok(crate::store::namespace(
            self.url()?.as_deref(),
            self.schema.as_deref(),
            &self.prefix,
        )?)
    }

    /// The store of these options, for a command of the kind `options` describes.
    /// Connections open on first use.
    fn open(&self, options: StoreOptions) -> Result<AnyStore> {
        let options = StoreOptions {
            prepared_statements: !self.no_prepared_statements,
            lock_timeout: self.lock_timeout,
            ..options
        };
        let url = self.url()?;
        Ok(crate::store::open(
            url.as_deref(),
            self.namespace()?,
            options,
        )?)
    }
}

/// Runs the parsed command line; the error is printed by `main`.
pub async fn run(cli: Cli) -> Result<ExitCode> {
    let out = Output::new(cli.global.json);
    let g = &cli.global;
    match cli.command {
        Command::Setup(args) => setup::run(g, &out, args).await,
        Command::SchemaSql(args) => schema_sql::run(g, &out, args),
        Command::Upgrade(args) => upgrade::run(g, &out, args).await,
        Command::Publish(args) => publish::run(g, &out, args).await,
        Command::Run(args) => run::run(g, &out, args).await,
        Command::Deliveries(args) => deliveries::run(g, &out, args).await,
        Command::Events(args) => deliveries::run_events(g, &out, args).await,
        Command::Dead(args) => dead::run(g, &out, args).await,
        Command::Purge(args) => purge::run(g, &out, args).await,
        Command::Lanes(args) => lanes::run(g, &out, args).await,
        Command::Stats(args) => lanes::run_stats(g, &out, args).await,
        Command::Doctor(args) => doctor::run(g, &out, args).await,
        Command::Completions(args) => generate::run(g, &out, args),
        Command::Bench(args) => bench::run(g, &out, args).await,
        Command::BenchWorker(_) => bench::run_worker(&out).await,
    }
}

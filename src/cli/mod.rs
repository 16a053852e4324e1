//! The command line: clap types and one file per command. A command resolves its arguments
//! into engine calls and formats the result; it never holds SQL or business rules.

mod bench;
mod dead;
mod deliveries;
mod doctor;
mod events;
pub mod generate;
mod handlers;
mod lanes;
pub mod logs;
mod names;
mod output;
mod publish;
mod purge;
mod run;
mod schema_sql;
mod setup;
pub mod top;
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
/// whose handlers are shell commands, webhooks or SQL statements, and finds, requeues and purges
/// deliveries.
/// Every command talks to the store given by --database-url (or RELAYBUS_DATABASE_URL, or the
/// libpq variables PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE).
///
/// Exit codes: 0 done (also when a confirmation is answered no), 1 failed (or `setup --check`
/// found the schema not current, or `doctor` a failing check), 2 usage error (also those found
/// after parsing, and a destructive command without a terminal and without --yes), 3 `doctor`
/// found warnings only, 69 no server answered at the URL, 130 or 143 `run` stopped by a second
/// SIGINT or SIGTERM, 130 `events replay` stopped by SIGINT.
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

/// Options every command takes (`command()` hides those that do nothing for a command).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Global options")]
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
    #[arg(
        long,
        global = true,
        env = "RELAYBUS_SCHEMA",
        hide_env_values = true,
        value_name = "NAME"
    )]
    pub schema: Option<String>,

    /// Prefix of every relaybus table, index and function name (of every collection on
    /// MongoDB).
    #[arg(
        long,
        global = true,
        env = "RELAYBUS_PREFIX",
        hide_env_values = true,
        default_value = "relaybus_",
        value_name = "PREFIX"
    )]
    pub prefix: String,

    /// Print results as JSON for scripts (stable field names).
    #[arg(long, global = true)]
    pub json: bool,

    /// Send every statement unnamed, as relaybus does on its own when it finds a transaction
    /// pooler (PgBouncer in transaction mode) between it and the server.
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
    Events(events::EventsArgs),
    Dead(dead::DeadArgs),
    Purge(purge::PurgeArgs),
    Lanes(lanes::LanesArgs),
    Workers(lanes::WorkersArgs),
    Stats(lanes::StatsArgs),
    Top(top::TopArgs),
    Handlers(handlers::HandlersArgs),
    Doctor(doctor::DoctorArgs),
    Completions(generate::CompletionsArgs),
    Bench(bench::BenchArgs),
}

/// The global options each command has no use for: hidden from its help, man page and
/// completions. Only schema changes wait for locks; only commands that connect send statements;
/// the completion script depends on nothing.
const NOT_APPLICABLE: &[(&str, &[&str])] = &[
    (
        "completions",
        &[
            "database_url",
            "schema",
            "prefix",
            "json",
            "no_prepared_statements",
            "lock_timeout",
        ],
    ),
    ("schema-sql", &["no_prepared_statements", "lock_timeout"]),
    ("publish", &["lock_timeout"]),
    ("run", &["lock_timeout"]),
    ("deliveries", &["lock_timeout"]),
    ("events", &["lock_timeout"]),
    ("dead", &["lock_timeout"]),
    ("purge", &["lock_timeout"]),
    ("lanes", &["lock_timeout"]),
    ("workers", &["lock_timeout"]),
    ("stats", &["lock_timeout"]),
    ("handlers", &["lock_timeout"]),
    ("doctor", &["lock_timeout"]),
    ("bench", &["schema", "lock_timeout"]),
];

/// The command line's definition, as parsed and as help, man pages and completions show it.
/// A command gets hidden copies of the global options it has no use for: clap propagates a
/// global option only to commands that do not define it themselves.
pub fn command() -> clap::Command {
    let cmd = <Cli as clap::CommandFactory>::command();
    let globals: Vec<clap::Arg> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set())
        .cloned()
        .collect();
    NOT_APPLICABLE.iter().fold(cmd, |cmd, (name, ids)| {
        cmd.mut_subcommand(name, |sub| {
            globals
                .iter()
                .filter(|a| ids.contains(&a.get_id().as_str()))
                .fold(sub, |sub, a| sub.arg(a.clone().hide(true)))
        })
    })
}

/// The hidden command each process of `relaybus bench` runs, recognised before the command
/// line is parsed so that it shows in no help, man page or completion.
pub const BENCH_WORKER: &str = "bench-worker";

/// Runs one bench process: its plan comes on stdin, its report goes to stdout.
pub async fn bench_worker() -> Result<ExitCode> {
    bench::run_worker(&Output::new(false)).await
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
    /// Stopped by SIGINT (128 + its number): `events replay` after the batch in hand.
    pub const INTERRUPTED: u8 = 130;
}

/// No server answered: the store's error with what to check, named as the user gave the URL.
#[derive(Debug)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

/// What to check when no server answered, naming where the URL came from.
fn connection_hint() -> String {
    let flag = std::env::args_os().any(|a| {
        let a = a.to_string_lossy();
        a == "--database-url" || a.starts_with("--database-url=")
    });
    if flag {
        return "check --database-url and that the server is running".into();
    }
    if std::env::var_os("RELAYBUS_DATABASE_URL").is_some() {
        return "check RELAYBUS_DATABASE_URL (set in the environment) and that the server is \
                running"
            .into();
    }
    if let Some(file) = std::env::var_os("RELAYBUS_DATABASE_URL_FILE") {
        return format!(
            "check the URL in RELAYBUS_DATABASE_URL_FILE (`{}`) and that the server is running",
            file.to_string_lossy()
        );
    }
    let libpq: Vec<String> = ["PGHOST", "PGPORT", "PGUSER", "PGDATABASE"]
        .iter()
        .filter_map(|v| std::env::var(v).ok().map(|value| format!("{v}={value}")))
        .collect();
    let chosen = match libpq.as_slice() {
        [] => "libpq's defaults chose this server".to_owned(),
        set => format!(
            "libpq's variables ({}) and defaults chose this server",
            set.join(", ")
        ),
    };
    format!(
        "no --database-url, RELAYBUS_DATABASE_URL or RELAYBUS_DATABASE_URL_FILE was given, so \
         {chosen}; give --database-url, or start a server there"
    )
}

/// The exit code an error ends the command with.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    use crate::config::ConfigError;
    use crate::store::StoreError;
    for cause in e.chain() {
        if cause.is::<UsageError>() || cause.is::<ConfigError>() {
            return exit::USAGE;
        }
        if cause.is::<Unavailable>() {
            return exit::UNAVAILABLE;
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
    let result = match cli.command {
        Command::Setup(args) => setup::run(g, &out, args).await,
        Command::SchemaSql(args) => schema_sql::run(g, &out, args),
        Command::Upgrade(args) => upgrade::run(g, &out, args).await,
        Command::Publish(args) => publish::run(g, &out, args).await,
        Command::Run(args) => run::run(g, &out, args).await,
        Command::Deliveries(args) => deliveries::run(g, &out, args).await,
        Command::Events(args) => events::run(g, &out, args).await,
        Command::Dead(args) => dead::run(g, &out, args).await,
        Command::Purge(args) => purge::run(g, &out, args).await,
        Command::Lanes(args) => lanes::run(g, &out, args).await,
        Command::Workers(args) => lanes::run_workers(g, &out, args).await,
        Command::Stats(args) => lanes::run_stats(g, &out, args).await,
        Command::Top(args) => top::run(g, &out, args).await,
        Command::Handlers(args) => handlers::run(g, &out, args).await,
        Command::Doctor(args) => doctor::run(g, &out, args).await,
        Command::Completions(args) => generate::run(g, &out, args),
        Command::Bench(args) => bench::run(g, &out, args).await,
    };
    result.map_err(|e| {
        let unavailable = e.chain().any(|c| {
            matches!(
                c.downcast_ref::<crate::store::StoreError>(),
                Some(crate::store::StoreError::Connect { .. })
            )
        });
        if unavailable {
            Unavailable(format!("{e:#}; {}", connection_hint())).into()
        } else {
            e
        }
    })
}

//! `relaybus run`: a worker whose handlers are shell commands, webhooks or SQL statements.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, ValueEnum};
use tokio::sync::watch;

use super::logs::{self, LogFormat};
use super::{human, secret_file, within, GlobalArgs, Output};
use crate::backoff::Backoff;
use crate::config::{self, Defaults, HandlerConfig, Target};
use crate::dispatch::{endpoint, Reporter};
use crate::dispatch::{DispatchOptions, Dispatcher, RetryPolicy, Runner, Shutdown, Summary};
use crate::handler::WebhookSecret;
use crate::store::handlers::BreakerPolicy;
use crate::store::prelude::*;
use crate::store::{AnyStore, StoreOptions};

/// Run a worker: claim deliveries and hand them to shell commands, webhooks or SQL.
///
/// One handler from flags:
///
///   relaybus run --handler billing --exec './bill.sh'
///   relaybus run --handler crm --webhook https://crm.internal/hooks \
///     --webhook-secret whsec_...
///   relaybus run --handler audit \
///     --sql 'INSERT INTO audit (event_id, payload) VALUES ($1, $2)'
///
/// Several handlers in one process from a TOML file, one table per handler (keys:
/// exec, webhook or sql, and optionally timeout, max_attempts, retry_delay,
/// retry_max_delay, webhook_secret; the flags below are the defaults):
///
///   [handlers.billing]
///   exec = "./bill.sh"
///   timeout = "2m"
///
///   [handlers.crm]
///   webhook = "https://crm.internal/hooks"
///   max_attempts = 10
///
///   [handlers.ledger]
///   sql = "INSERT INTO ledger SELECT $1, ($2->>'amount')::numeric"
///
/// Shell handlers get the JSON envelope on stdin and RELAYBUS_EVENT_ID,
/// RELAYBUS_EVENT_TYPE, RELAYBUS_KEY, RELAYBUS_HANDLER, RELAYBUS_DELIVERY_ID,
/// RELAYBUS_ATTEMPT in the environment. Exit 0 completes, 65 buries at once,
/// anything else (or the timeout, which kills the process group) fails the attempt.
/// Webhooks get a POST of the envelope: 2xx completes, 410 buries, anything else
/// fails the attempt, honouring Retry-After. A SQL handler's statement runs on the
/// store's database in the transaction that completes the delivery: both commit or
/// neither, so its effect exists once per delivery whatever crashes; an error (with
/// the database's message), or the timeout, fails the attempt. Failed attempts are
/// retried with exponential backoff and buried (dead letter) at the last attempt.
///
/// SIGINT or SIGTERM stops claiming, lets running handlers finish within
/// --shutdown-grace, releases the rest without charging an attempt and hands every
/// lane back. A second signal aborts running handlers at once and exits with 128 +
/// the signal: 130 (SIGINT) or 143 (SIGTERM).
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct RunArgs {
    /// Handler name (with --exec, --webhook, --sql or --noop).
    #[arg(long, value_name = "NAME", conflicts_with = "config")]
    pub handler: Option<String>,
    /// Shell command run with `sh -c` for each delivery.
    #[arg(
        long,
        value_name = "CMD",
        requires = "handler",
        conflicts_with = "webhook"
    )]
    pub exec: Option<String>,
    /// URL that gets a POST of each delivery.
    #[arg(
        long,
        value_name = "URL",
        requires = "handler",
        conflicts_with = "noop"
    )]
    pub webhook: Option<String>,
    /// Complete each delivery without running anything (benchmarks, or discarding a handler's
    /// backlog on purpose).
    #[arg(long, requires = "handler", conflicts_with = "exec")]
    pub noop: bool,
    /// SQL statement run on the store's PostgreSQL database in the transaction that completes
    /// each delivery, so its effect exists exactly once per delivery. Parameters: $1 event id,
    /// $2 payload (jsonb), $3 key, $4 type, $5 headers (jsonb), $6 delivery id, $7 attempt.
    #[arg(
        long,
        value_name = "STATEMENT",
        requires = "handler",
        conflicts_with_all = ["exec", "webhook", "noop"]
    )]
    pub sql: Option<String>,
    /// TOML file with one table per handler, for several handlers in one process.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Deliveries handled at once.
    #[arg(long, default_value_t = DispatchOptions::CONCURRENCY as u32, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,
    /// Deliveries claimed per claim at most.
    #[arg(long, default_value_t = DispatchOptions::BATCH_SIZE as u32, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_size: u32,
    /// How often an idle worker looks for due work (wake-ups usually come sooner).
    #[arg(long, default_value = human(DispatchOptions::POLL_INTERVAL), value_parser = within(DispatchOptions::POLL_INTERVAL_BOUNDS), value_name = "DURATION")]
    pub poll_interval: Duration,
    /// How long a lane lease lasts without renewal; a crashed worker's work waits this long.
    #[arg(long, default_value = human(DispatchOptions::LEASE_DURATION), value_parser = within(DispatchOptions::LEASE_DURATION_BOUNDS), value_name = "DURATION")]
    pub lease_duration: Duration,
    /// Database connections.
    #[arg(long, default_value_t = StoreOptions::WORKER_POOL_SIZE as u32, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub pool_size: u32,
    /// Attempts before a delivery is buried.
    #[arg(long, default_value_t = RetryPolicy::MAX_ATTEMPTS, value_parser = clap::value_parser!(i32).range(1..=RetryPolicy::MAX_ATTEMPTS_LIMIT as i64))]
    pub max_attempts: i32,
    /// Base of the exponential backoff between attempts.
    #[arg(long, default_value = human(RetryPolicy::RETRY_DELAY), value_parser = within(RetryPolicy::RETRY_DELAY_BOUNDS), value_name = "DURATION")]
    pub retry_delay: Duration,
    /// Longest wait between attempts (also caps Retry-After).
    #[arg(long, default_value = human(RetryPolicy::RETRY_MAX_DELAY), value_parser = within(RetryPolicy::RETRY_DELAY_BOUNDS), value_name = "DURATION")]
    pub retry_max_delay: Duration,
    /// Time one attempt may take.
    #[arg(long, default_value = human(config::TIMEOUT), value_parser = within(config::TIMEOUT_BOUNDS), value_name = "DURATION")]
    pub timeout: Duration,
    /// Standard Webhooks signing secret (`whsec_...`) for webhook handlers.
    #[arg(
        long,
        env = "RELAYBUS_WEBHOOK_SECRET",
        hide_env_values = true,
        value_name = "SECRET"
    )]
    pub webhook_secret: Option<String>,
    /// Exit 0 once no due work is left (batch jobs, tests). Deliveries whose next attempt is due
    /// later are not waited for; the summary counts them.
    #[arg(long)]
    pub drain: bool,
    /// Completions finishing within this window are deleted by one statement.
    #[arg(long, default_value = human(DispatchOptions::COMPLETION_WINDOW), value_parser = within(DispatchOptions::COMPLETION_WINDOW_BOUNDS), value_name = "DURATION")]
    pub completion_window: Duration,
    /// How long running handlers may finish after a stop signal.
    #[arg(long, default_value = human(DispatchOptions::SHUTDOWN_GRACE), value_parser = within(DispatchOptions::SHUTDOWN_GRACE_BOUNDS), value_name = "DURATION")]
    pub shutdown_grace: Duration,
    /// A claim, lease renewal or recording of an outcome that waits this long is reported
    /// stalled: logged with the database sessions blocking it, counted in
    /// relaybus_stalls_total, and /readyz unready until it goes through.
    #[arg(long, default_value = human(DispatchOptions::STALL_AFTER), value_parser = within(DispatchOptions::STALL_AFTER_BOUNDS), value_name = "DURATION")]
    pub stall_after: Duration,
    /// A webhook endpoint that fails (5xx, timeout, refused connection) this many times in a
    /// row opens its circuit breaker, shared by every worker of the store: nothing is sent to
    /// it for 30 s (doubling after each failed probe, up to --breaker-max-cooldown), then one
    /// probe; its deliveries wait meanwhile without an attempt charged. The worker writes its
    /// breaker settings (these flags, or a handler's `breaker_threshold` and
    /// `breaker_max_cooldown` in --config) to the handler's row when it starts, and every
    /// worker counts against the row's: the last started worker's settings hold.
    #[arg(long, default_value_t = BreakerPolicy::THRESHOLD, value_parser = clap::value_parser!(i32).range(1..=BreakerPolicy::THRESHOLD_LIMIT as i64), value_name = "FAILURES")]
    pub breaker_threshold: i32,
    /// The longest an open circuit breaker waits before its next probe (a shorter one finds a
    /// flapping endpoint up sooner, at the price of more probes).
    #[arg(long, default_value = human(BreakerPolicy::MAX_COOLDOWN), value_parser = within(BreakerPolicy::MAX_COOLDOWN_BOUNDS), value_name = "DURATION")]
    pub breaker_max_cooldown: Duration,
    /// Keep an append-only history of completions (one insert per completion).
    #[arg(long)]
    pub completion_history: bool,
    /// How an idle worker learns of new work: LISTEN/NOTIFY plus polling, or polling only (for
    /// poolers that cannot LISTEN).
    #[arg(long, value_enum, default_value_t = WakeUp::Listen)]
    pub wake_up: WakeUp,
    /// Serve Prometheus metrics at /metrics, and /healthz and /readyz, on this address
    /// (for example 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Log lines as text or JSON, on stderr. On a terminal, text lines print above a live
    /// status line (handled, failed, dead, in flight, the rate of the last 10 s).
    #[arg(
        long,
        default_value = "text",
        value_name = "FORMAT",
        value_parser = PossibleValuesParser::new(["text", "json"])
            .map(|s| s.parse::<LogFormat>().expect("one of the possible values"))
    )]
    pub log_format: LogFormat,
    /// More log detail: -v relaybus's debug events, -vv everything's. RELAYBUS_LOG, a
    /// tracing filter (`warn`, `relaybus=debug`), overrides it.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum WakeUp {
    Listen,
    Poll,
}

/// The handlers the flags or the config file describe.
fn handler_configs(args: &RunArgs) -> Result<Vec<HandlerConfig>> {
    let (secret, origin) = match &args.webhook_secret {
        Some(s) => (
            Some(s.clone()),
            "--webhook-secret (or RELAYBUS_WEBHOOK_SECRET)",
        ),
        None => (
            secret_file("RELAYBUS_WEBHOOK_SECRET_FILE")?,
            "RELAYBUS_WEBHOOK_SECRET_FILE",
        ),
    };
    let webhook_secret = secret
        .map(|s| WebhookSecret::parse(s.trim_end()).map_err(|e| format!("invalid {origin}: {e}")));
    let defaults = Defaults {
        timeout: args.timeout,
        retry: RetryPolicy {
            max_attempts: args.max_attempts,
            backoff: Backoff::jittered(args.retry_delay, args.retry_max_delay),
        },
        breaker: BreakerPolicy {
            threshold: args.breaker_threshold,
            max_cooldown: args.breaker_max_cooldown,
        },
        webhook_secret,
    };
    if let Some(path) = &args.config {
        return Ok(config::from_file(path, &defaults)?);
    }
    let Some(name) = args.handler.clone() else {
        super::usage!("nothing to run: give --handler NAME with --exec CMD or --webhook URL, or --config FILE");
    };
    let target = match (&args.exec, &args.webhook, &args.sql, args.noop) {
        (Some(cmd), None, None, false) => Target::Exec(cmd.clone()),
        (None, Some(url), None, false) => Target::Webhook(url.clone()),
        (None, None, Some(sql), false) => Target::Sql(sql.clone()),
        (None, None, None, true) => Target::Noop,
        _ => super::usage!(
            "handler `{name}` needs one of --exec CMD, --webhook URL, --sql STATEMENT or --noop"
        ),
    };
    Ok(vec![HandlerConfig::new(name, target, &defaults)])
}

/// First SIGINT/SIGTERM: graceful; second: immediate. Returns the number of the signal that
/// came last, for the exit code (128 + it) after an immediate stop.
fn watch_signals(tx: watch::Sender<Shutdown>) -> Result<Arc<AtomicI32>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).context("could not listen for SIGINT")?;
    let mut term = signal(SignalKind::terminate()).context("could not listen for SIGTERM")?;
    let last = Arc::new(AtomicI32::new(0));
    let seen = Arc::clone(&last);
    tokio::spawn(async move {
        for next in [Shutdown::Graceful, Shutdown::Immediate] {
            let number = tokio::select! {
                _ = int.recv() => nix::libc::SIGINT,
                _ = term.recv() => nix::libc::SIGTERM,
            };
            seen.store(number, Ordering::Relaxed);
            let _ = tx.send(next);
        }
    });
    Ok(last)
}

pub(super) async fn run(g: &GlobalArgs, out: &Output, args: RunArgs) -> Result<ExitCode> {
    // Handlers run as the same user: keep them from reading this process's environment (the
    // database URL, the webhook secret) through /proc/<pid>/environ.
    nix::sys::prctl::set_dumpable(false).context("could not protect the worker's memory")?;
    crate::handler::raise_open_files_limit()
        .context("could not raise the limit of open files to its hard limit")?;
    let handlers = config::build(handler_configs(&args)?)?;
    // Before the store opens: its first connection may have something to say.
    let status = logs::start(args.log_format, args.verbose)?;
    let store = Arc::new(g.open(StoreOptions::worker(args.pool_size as usize))?);
    store.require_current().await?;
    // A statement that cannot run stops the worker now, not each delivery 25 times.
    for spec in &handlers {
        if let Runner::Statement { sql, .. } = &spec.runner {
            store
                .check_statement(sql)
                .await
                .with_context(|| format!("handler `{}`", spec.name))?;
        }
    }
    let reporter = match status {
        Some(status) => Reporter::new().with_status_line(status),
        None => Reporter::new(),
    };
    let reporter = Arc::new(match args.metrics_addr {
        Some(_) => reporter.with_metrics(),
        None => reporter,
    });
    let names: Vec<String> = handlers.iter().map(|h| h.name.clone()).collect();
    if let Some(addr) = args.metrics_addr {
        serve_metrics(addr, &reporter, &store, &names).await?;
    }
    let (tx, rx) = watch::channel(Shutdown::Running);
    let signal = watch_signals(tx)?;
    let options = DispatchOptions {
        concurrency: args.concurrency as usize,
        batch_size: args.batch_size as usize,
        poll_interval: args.poll_interval,
        lease_duration: args.lease_duration,
        completion_window: args.completion_window,
        shutdown_grace: args.shutdown_grace,
        drain: args.drain,
        completion_history: args.completion_history,
        wake_ups: args.wake_up == WakeUp::Listen,
        stall_after: args.stall_after,
        ..DispatchOptions::new(crate::identity::worker_name())
    };
    let summary = Dispatcher::new(Arc::clone(&store), options, handlers, reporter)
        .run(rx.clone())
        .await;
    report(out, &store, &summary, args.drain, &names).await?;
    Ok(if *rx.borrow() == Shutdown::Immediate {
        ExitCode::from(128 + signal.load(Ordering::Relaxed) as u8)
    } else {
        ExitCode::SUCCESS
    })
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` for as long as the worker runs.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    reporter: &Arc<Reporter>,
    store: &Arc<AnyStore>,
    names: &[String],
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("could not listen on {addr} for --metrics-addr"))?;
    let endpoint = endpoint::serve(
        listener,
        Arc::clone(reporter),
        Arc::clone(store),
        names.to_vec(),
    );
    tokio::spawn(async move {
        if let Err(e) = endpoint.await {
            tracing::error!(error = %e, "the metrics endpoint stopped");
        }
    });
    Ok(())
}

/// What the worker did, and after a drain what it left scheduled for later.
async fn report(
    out: &Output,
    store: &AnyStore,
    summary: &Summary,
    drain: bool,
    names: &[String],
) -> Result<()> {
    // A drain ends when nothing is due; retries due later are left, and said so.
    let scheduled = if drain {
        let stats = store.stats().await?;
        let mine = stats.iter().filter(|s| names.contains(&s.handler));
        Some(mine.map(|s| s.scheduled).sum::<i64>())
    } else {
        None
    };
    if out.json {
        let mut value = serde_json::to_value(summary)?;
        value["scheduled"] = scheduled.into();
        out.print_json(&value)?;
    } else {
        let later = match scheduled {
            Some(n) if n > 0 => format!("; {n} scheduled for a later attempt, not drained"),
            _ => String::new(),
        };
        out.line(format!(
            "handled {}, failed attempts {}, dead {}, lease lost {}, released {}{later}",
            summary.handled, summary.failed, summary.dead, summary.lease_lost, summary.released
        ))?;
    }
    Ok(())
}

//! `relaybus run`: a worker whose handlers are shell commands or webhooks.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Deserialize;
use tokio::sync::{watch, Notify};

use super::{parse_duration, GlobalArgs, Output};
use crate::dispatch::report::{LogFormat, Reporter};
use crate::dispatch::{self, Backoff, DispatchOptions, HandlerSpec, Shutdown};
use crate::handler::{Handler, NoopHandler, ShellHandler, WebhookHandler, WebhookSecret};
use crate::store::postgres::StoreOptions;

/// Run a worker: claim deliveries and hand them to shell commands or webhooks.
///
/// One handler from flags:
///
///   relaybus run --handler billing --exec './bill.sh'
///   relaybus run --handler crm --webhook https://crm.internal/hooks --webhook-secret whsec_...
///
/// Several handlers in one process from a TOML file, one table per handler (keys: exec or
/// webhook, and optionally timeout, max_attempts, retry_delay, retry_max_delay, webhook_secret;
/// the flags below are the defaults):
///
///   [handlers.billing]
///   exec = "./bill.sh"
///   timeout = "2m"
///
///   [handlers.crm]
///   webhook = "https://crm.internal/hooks"
///   max_attempts = 10
///
/// Shell handlers get the JSON envelope on stdin and RELAYBUS_EVENT_ID, RELAYBUS_EVENT_TYPE,
/// RELAYBUS_KEY, RELAYBUS_HANDLER, RELAYBUS_DELIVERY_ID, RELAYBUS_ATTEMPT in the environment.
/// Exit 0 completes, 65 buries at once, anything else (or the timeout, which kills the process
/// group) fails the attempt. Webhooks get a POST of the envelope: 2xx completes, 410 buries,
/// anything else fails the attempt, honouring Retry-After. Failed attempts are retried with
/// exponential backoff and buried (dead letter) at the last attempt.
///
/// SIGINT or SIGTERM stops claiming, lets running handlers finish within --shutdown-grace,
/// releases the rest without charging an attempt and hands every lane back. A second signal
/// aborts running handlers at once and exits with code 130.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct RunArgs {
    /// Handler name (with --exec or --webhook).
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
    /// TOML file with one table per handler, for several handlers in one process.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Deliveries handled at once.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,
    /// Deliveries claimed per claim at most.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_size: u32,
    /// How often an idle worker looks for due work (wake-ups usually come sooner).
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub poll_interval: Duration,
    /// How long a lane lease lasts without renewal; a crashed worker's work waits this long.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub lease_duration: Duration,
    /// Database connections.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub pool_size: u32,
    /// Attempts before a delivery is buried.
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(i32).range(1..))]
    pub max_attempts: i32,
    /// Base of the exponential backoff between attempts.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub retry_delay: Duration,
    /// Longest wait between attempts (also caps Retry-After).
    #[arg(long, default_value = "1h", value_parser = parse_duration, value_name = "DURATION")]
    pub retry_max_delay: Duration,
    /// Time one attempt may take.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Duration,
    /// Standard Webhooks signing secret (`whsec_...`) for webhook handlers.
    #[arg(
        long,
        env = "RELAYBUS_WEBHOOK_SECRET",
        hide_env_values = true,
        value_name = "SECRET"
    )]
    pub webhook_secret: Option<String>,
    /// Exit 0 once no due work is left (batch jobs, tests).
    #[arg(long)]
    pub drain: bool,
    /// Completions finishing within this window are deleted by one statement.
    #[arg(long, default_value = "2ms", value_parser = parse_duration, value_name = "DURATION")]
    pub completion_window: Duration,
    /// How long running handlers may finish after a stop signal.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub shutdown_grace: Duration,
    /// Keep an append-only history of completions (one insert per completion).
    #[arg(long)]
    pub completion_history: bool,
    /// How an idle worker learns of new work: LISTEN/NOTIFY plus polling, or polling only (for
    /// poolers that cannot LISTEN).
    #[arg(long, value_enum, default_value_t = WakeUp::Listen)]
    pub wake_up: WakeUp,
    /// Log lines as text or JSON (a live status line replaces them on a terminal).
    #[arg(long, value_enum, default_value_t = LogFormatArg::Text)]
    pub log_format: LogFormatArg,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum WakeUp {
    Listen,
    Poll,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

/// One handler table of the config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HandlerEntry {
    exec: Option<String>,
    webhook: Option<String>,
    timeout: Option<String>,
    max_attempts: Option<i32>,
    retry_delay: Option<String>,
    retry_max_delay: Option<String>,
    webhook_secret: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    handlers: BTreeMap<String, HandlerEntry>,
}

enum Target {
    Exec(String),
    Webhook(String),
    Noop,
}

/// A handler as resolved from flags or the config file, before it is built.
struct Resolved {
    name: String,
    target: Target,
    timeout: Duration,
    max_attempts: i32,
    backoff: Backoff,
    secret: Option<WebhookSecret>,
}

fn duration(field: &str, name: &str, value: Option<&str>, default: Duration) -> Result<Duration> {
    match value {
        None => Ok(default),
        Some(v) => {
            parse_duration(v).map_err(|e| anyhow::anyhow!("handler `{name}`: `{field}`: {e}"))
        }
    }
}

fn secret(text: Option<&str>) -> Result<Option<WebhookSecret>> {
    text.map(|s| WebhookSecret::parse(s).map_err(|e| anyhow::anyhow!("{e}")))
        .transpose()
}

fn resolve(args: &RunArgs) -> Result<Vec<Resolved>> {
    let default_backoff = Backoff {
        base: args.retry_delay,
        max: args.retry_max_delay,
    };
    let default_secret = secret(args.webhook_secret.as_deref())
        .context("invalid --webhook-secret (or RELAYBUS_WEBHOOK_SECRET)")?;
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("could not read the config file `{}`", path.display()))?;
        let file: ConfigFile = toml::from_str(&text)
            .with_context(|| format!("invalid config file `{}`", path.display()))?;
        if file.handlers.is_empty() {
            bail!(
                "the config file `{}` has no [handlers.NAME] table",
                path.display()
            );
        }
        return file
            .handlers
            .into_iter()
            .map(|(name, e)| {
                let target = match (e.exec, e.webhook) {
                    (Some(cmd), None) => Target::Exec(cmd),
                    (None, Some(url)) => Target::Webhook(url),
                    _ => bail!("handler `{name}`: give exactly one of `exec` or `webhook`"),
                };
                let max_attempts = e.max_attempts.unwrap_or(args.max_attempts);
                if max_attempts < 1 {
                    bail!("handler `{name}`: `max_attempts` must be at least 1");
                }
                Ok(Resolved {
                    timeout: duration("timeout", &name, e.timeout.as_deref(), args.timeout)?,
                    backoff: Backoff {
                        base: duration(
                            "retry_delay",
                            &name,
                            e.retry_delay.as_deref(),
                            default_backoff.base,
                        )?,
                        max: duration(
                            "retry_max_delay",
                            &name,
                            e.retry_max_delay.as_deref(),
                            default_backoff.max,
                        )?,
                    },
                    secret: match e.webhook_secret {
                        Some(s) => secret(Some(&s)).with_context(|| {
                            format!("handler `{name}`: invalid `webhook_secret`")
                        })?,
                        None => default_secret.clone(),
                    },
                    max_attempts,
                    target,
                    name,
                })
            })
            .collect();
    }
    let Some(name) = args.handler.clone() else {
        bail!("nothing to run: give --handler NAME with --exec CMD or --webhook URL, or --config FILE");
    };
    let target = match (&args.exec, &args.webhook, args.noop) {
        (Some(cmd), None, false) => Target::Exec(cmd.clone()),
        (None, Some(url), false) => Target::Webhook(url.clone()),
        (None, None, true) => Target::Noop,
        _ => bail!("handler `{name}` needs one of --exec CMD, --webhook URL or --noop"),
    };
    Ok(vec![Resolved {
        name,
        target,
        timeout: args.timeout,
        max_attempts: args.max_attempts,
        backoff: default_backoff,
        secret: default_secret,
    }])
}

fn build(resolved: Vec<Resolved>) -> Result<Vec<HandlerSpec>> {
    // One client for every webhook handler, so connections are pooled and kept alive.
    let client = reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(90))
        .user_agent(concat!("relaybus/", env!("CARGO_PKG_VERSION")))
        .build()
        .context("could not create the HTTP client")?;
    resolved
        .into_iter()
        .map(|r| {
            let handler: Arc<dyn Handler> = match r.target {
                Target::Exec(cmd) => Arc::new(ShellHandler::new(cmd, r.timeout)),
                Target::Noop => Arc::new(NoopHandler),
                Target::Webhook(url) => {
                    let parsed = reqwest::Url::parse(&url).with_context(|| {
                        format!("handler `{}`: invalid webhook URL `{url}`", r.name)
                    })?;
                    if !matches!(parsed.scheme(), "http" | "https") {
                        bail!(
                            "handler `{}`: the webhook URL must be http:// or https://",
                            r.name
                        );
                    }
                    Arc::new(WebhookHandler::new(
                        client.clone(),
                        url,
                        r.secret,
                        r.timeout,
                    ))
                }
            };
            Ok(HandlerSpec {
                name: r.name,
                handler,
                max_attempts: r.max_attempts,
                backoff: r.backoff,
            })
        })
        .collect()
}

/// First SIGINT/SIGTERM: graceful; second: immediate.
fn watch_signals(tx: watch::Sender<Shutdown>) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt()).context("could not listen for SIGINT")?;
    let mut term = signal(SignalKind::terminate()).context("could not listen for SIGTERM")?;
    tokio::spawn(async move {
        for next in [Shutdown::Graceful, Shutdown::Immediate] {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            let _ = tx.send(next);
        }
    });
    Ok(())
}

pub async fn run(g: &GlobalArgs, out: &Output, args: RunArgs) -> Result<ExitCode> {
    let handlers = build(resolve(&args)?)?;
    let store = Arc::new(g.store(StoreOptions {
        pool_size: args.pool_size as usize,
        notify: false,
    })?);
    store.require_current().await?;
    let reporter = Arc::new(Reporter::new(match args.log_format {
        LogFormatArg::Text => LogFormat::Text,
        LogFormatArg::Json => LogFormat::Json,
    }));
    let (tx, rx) = watch::channel(Shutdown::Running);
    watch_signals(tx)?;
    let wake = Arc::new(Notify::new());
    let listener = (args.wake_up == WakeUp::Listen).then(|| {
        tokio::spawn(dispatch::listen::listen(
            store.connect_options().clone(),
            store.channel(),
            Arc::clone(&wake),
            Arc::clone(&reporter),
            rx.clone(),
        ))
    });
    let options = DispatchOptions {
        owner: dispatch::worker_name(),
        concurrency: args.concurrency as usize,
        batch_size: args.batch_size as usize,
        poll_interval: args.poll_interval,
        lease_duration: args.lease_duration,
        completion_window: args.completion_window,
        shutdown_grace: args.shutdown_grace,
        drain: args.drain,
        completion_history: args.completion_history,
    };
    let summary = dispatch::run(store, options, handlers, reporter, wake, rx.clone()).await?;
    if let Some(l) = listener {
        l.abort();
    }
    if out.json {
        out.print_json(&summary)?;
    } else {
        out.line(format!(
            "handled {}, failed attempts {}, dead {}, lease lost {}, released {}",
            summary.handled, summary.failed, summary.dead, summary.lease_lost, summary.released
        ))?;
    }
    Ok(if *rx.borrow() == Shutdown::Immediate {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

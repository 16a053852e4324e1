//! What a worker runs, resolved once: handlers from flags or from a TOML file (one table per
//! handler), validated and built into the dispatcher's handler specs. The command line only
//! says where the settings come from; the file's schema and every rule about it live here.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

use crate::bounds::Bounds;
use crate::dispatch::{HandlerSpec, RetryPolicy, Runner};
use crate::handler::{Handler, NoopHandler, ShellHandler, WebhookHandler, WebhookSecret};
use crate::store::handlers::BreakerPolicy;

/// The time one attempt may take, unless configured.
pub const TIMEOUT: Duration = Duration::from_secs(30);
pub const TIMEOUT_BOUNDS: Bounds = Bounds::POSITIVE_UP_TO_A_DAY;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("could not read the config file `{path}`: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid config file `{path}`: {message}")]
    Parse { path: String, message: String },
    #[error("the config file `{0}` has no [handlers.NAME] table")]
    Empty(String),
    #[error("handler `{name}`: {why}")]
    Handler { name: String, why: String },
    #[error("could not create the HTTP client: {0}")]
    HttpClient(reqwest::Error),
}

/// One handler table of the config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    exec: Option<String>,
    webhook: Option<String>,
    sql: Option<String>,
    #[serde(default)]
    noop: bool,
    #[serde(default, with = "humantime_serde")]
    timeout: Option<Duration>,
    max_attempts: Option<i32>,
    #[serde(default, with = "humantime_serde")]
    retry_delay: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    retry_max_delay: Option<Duration>,
    webhook_secret: Option<String>,
    breaker_threshold: Option<i32>,
    #[serde(default, with = "humantime_serde")]
    breaker_max_cooldown: Option<Duration>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    handlers: BTreeMap<String, Entry>,
}

/// What runs a handler's deliveries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `sh -c CMD`.
    Exec(String),
    /// A POST to the URL.
    Webhook(String),
    /// A statement run in the transaction that completes the delivery.
    Sql(String),
    /// Nothing: every delivery completes.
    Noop,
}

/// A webhook secret as given: parsed, or why it could not be. Only a webhook handler needs one,
/// so a bad secret stops only a worker that has one.
pub type SecretSetting = Option<Result<WebhookSecret, String>>;

/// The settings every handler has unless its table says otherwise (the command line's).
#[derive(Clone, Debug)]
pub struct Defaults {
    pub timeout: Duration,
    pub retry: RetryPolicy,
    pub breaker: BreakerPolicy,
    pub webhook_secret: SecretSetting,
}

/// One handler, resolved.
#[derive(Clone, Debug)]
pub struct HandlerConfig {
    pub name: String,
    pub target: Target,
    pub timeout: Duration,
    pub retry: RetryPolicy,
    pub breaker: BreakerPolicy,
    pub webhook_secret: SecretSetting,
}

impl HandlerConfig {
    /// A handler from the command line, with the defaults.
    pub fn new(name: String, target: Target, defaults: &Defaults) -> Self {
        Self {
            name,
            target,
            timeout: defaults.timeout,
            retry: defaults.retry,
            breaker: defaults.breaker,
            webhook_secret: defaults.webhook_secret.clone(),
        }
    }
}

/// The handlers of a config file, each table over the defaults.
pub fn from_file(path: &Path, defaults: &Defaults) -> Result<Vec<HandlerConfig>, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: shown.clone(),
        source,
    })?;
    let file: ConfigFile = toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: shown.clone(),
        message: parse_error(&text, &e),
    })?;
    if file.handlers.is_empty() {
        return Err(ConfigError::Empty(shown));
    }
    file.handlers
        .into_iter()
        .map(|(name, e)| handler(name, e, defaults))
        .collect()
}

/// One `[handlers.NAME]` table over the defaults.
fn handler(name: String, e: Entry, defaults: &Defaults) -> Result<HandlerConfig, ConfigError> {
    let invalid = |why: &str| ConfigError::Handler {
        name: name.clone(),
        why: why.to_owned(),
    };
    let target = match (e.exec, e.webhook, e.sql, e.noop) {
        (Some(cmd), None, None, false) => Target::Exec(cmd),
        (None, Some(url), None, false) => Target::Webhook(url),
        (None, None, Some(sql), false) => Target::Sql(sql),
        (None, None, None, true) => Target::Noop,
        _ => {
            return Err(invalid(
                "give exactly one of `exec`, `webhook`, `sql` or `noop = true`",
            ))
        }
    };
    let max_attempts = e.max_attempts.unwrap_or(defaults.retry.max_attempts);
    if !(1..=RetryPolicy::MAX_ATTEMPTS_LIMIT).contains(&max_attempts) {
        return Err(invalid(&format!(
            "`max_attempts` must be from 1 to {}",
            RetryPolicy::MAX_ATTEMPTS_LIMIT
        )));
    }
    let within = |field: &str, bounds: Bounds, value: Option<Duration>, default| {
        value
            .map(|d| bounds.check(d))
            .transpose()
            .map(|d| d.unwrap_or(default))
            .map_err(|e| invalid(&format!("`{field}`: {e}")))
    };
    let mut retry = defaults.retry;
    retry.max_attempts = max_attempts;
    let delay_bounds = RetryPolicy::RETRY_DELAY_BOUNDS;
    retry.backoff.base = within(
        "retry_delay",
        delay_bounds,
        e.retry_delay,
        retry.backoff.base,
    )?;
    retry.backoff.max = within(
        "retry_max_delay",
        delay_bounds,
        e.retry_max_delay,
        retry.backoff.max,
    )?;
    let timeout = within("timeout", TIMEOUT_BOUNDS, e.timeout, defaults.timeout)?;
    let breaker_set = e.breaker_threshold.is_some() || e.breaker_max_cooldown.is_some();
    if breaker_set && !matches!(target, Target::Webhook(_)) {
        return Err(invalid(
            "`breaker_threshold` and `breaker_max_cooldown` apply to a `webhook` handler only",
        ));
    }
    let mut breaker = defaults.breaker;
    breaker.threshold = e.breaker_threshold.unwrap_or(breaker.threshold);
    if !(1..=BreakerPolicy::THRESHOLD_LIMIT).contains(&breaker.threshold) {
        return Err(invalid(&format!(
            "`breaker_threshold` must be from 1 to {}",
            BreakerPolicy::THRESHOLD_LIMIT
        )));
    }
    breaker.max_cooldown = within(
        "breaker_max_cooldown",
        BreakerPolicy::MAX_COOLDOWN_BOUNDS,
        e.breaker_max_cooldown,
        breaker.max_cooldown,
    )?;
    let webhook_secret = match e.webhook_secret {
        Some(s) => Some(Ok(WebhookSecret::parse(&s)
            .map_err(|why| invalid(&format!("invalid `webhook_secret`: {why}")))?)),
        None => defaults.webhook_secret.clone(),
    };
    Ok(HandlerConfig {
        timeout,
        retry,
        breaker,
        webhook_secret,
        target,
        name,
    })
}

/// Where and why a config file failed to parse, without quoting it: the offending line may be
/// a `webhook_secret`, and a message may repeat a value, so every secret of the file is masked.
fn parse_error(text: &str, e: &toml::de::Error) -> String {
    let mut message = e.message().to_owned();
    if let Some(span) = e.span() {
        let before = &text[..span.start.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        message = format!("line {line}, column {column}: {message}");
    }
    for secret in text.lines().filter_map(secret_value) {
        message = message.replace(secret, "***");
    }
    message
}

/// The value of a `webhook_secret = "..."` line, as written, whatever follows it.
fn secret_value(line: &str) -> Option<&str> {
    let (key, value) = line.split_once('=')?;
    if key.trim() != "webhook_secret" {
        return None;
    }
    let value = value.trim_start();
    let secret = match value.chars().next()? {
        quote @ ('"' | '\'') => value[1..].split(quote).next()?,
        _ => value.split_whitespace().next()?,
    };
    (!secret.is_empty()).then_some(secret)
}

/// Builds the handlers. Webhook handlers share one HTTP client, so connections are pooled and
/// kept alive.
pub fn build(configs: Vec<HandlerConfig>) -> Result<Vec<HandlerSpec>, ConfigError> {
    let client = reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(90))
        // A redirect would turn the POST into a GET without the envelope (301-303), or send the
        // signed body wherever `Location` says (307, 308): a 3xx is a failed attempt instead.
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("relaybus/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(ConfigError::HttpClient)?;
    configs
        .into_iter()
        .map(|c| {
            let invalid = |why: String| ConfigError::Handler {
                name: c.name.clone(),
                why,
            };
            let breaker = matches!(c.target, Target::Webhook(_)).then_some(c.breaker);
            let handler: Arc<dyn Handler> = match c.target {
                Target::Sql(sql) if sql.trim().is_empty() => {
                    return Err(invalid("the statement is empty".into()))
                }
                Target::Sql(sql) => {
                    return Ok(HandlerSpec {
                        name: c.name,
                        runner: Runner::Statement {
                            sql,
                            timeout: c.timeout,
                        },
                        retry: c.retry,
                        breaker,
                    })
                }
                // An unset variable in a deploy script gives an empty command, which `sh -c`
                // runs successfully: every delivery would complete without being handled.
                Target::Exec(cmd) if cmd.trim().is_empty() => {
                    return Err(invalid(
                        "the command is empty; give a command to run, or --noop to complete \
                         deliveries without running anything"
                            .into(),
                    ))
                }
                Target::Exec(cmd) => {
                    if let Some(program) = ShellHandler::missing_program(&cmd) {
                        return Err(invalid(format!(
                            "`{program}` is not a command sh can find (not a builtin, and not \
                             on PATH={}); every attempt would fail",
                            std::env::var("PATH").unwrap_or_default()
                        )));
                    }
                    Arc::new(ShellHandler::new(cmd, c.timeout))
                }
                Target::Noop => Arc::new(NoopHandler),
                Target::Webhook(url) => {
                    let parsed = reqwest::Url::parse(&url)
                        .map_err(|e| invalid(format!("invalid webhook URL `{url}`: {e}")))?;
                    if !matches!(parsed.scheme(), "http" | "https") {
                        return Err(invalid(
                            "the webhook URL must be http:// or https://".into(),
                        ));
                    }
                    let secret = c.webhook_secret.transpose().map_err(invalid)?;
                    Arc::new(WebhookHandler::new(client.clone(), url, secret, c.timeout))
                }
            };
            Ok(HandlerSpec {
                name: c.name,
                runner: Runner::Handler(handler),
                retry: c.retry,
                breaker,
            })
        })
        .collect()
}

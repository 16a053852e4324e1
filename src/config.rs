//! What a worker runs, resolved once: handlers from flags or from a TOML file (one table per
//! handler), validated and built into the dispatcher's handler specs. The command line only
//! says where the settings come from; the file's schema and every rule about it live here.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

use crate::dispatch::{HandlerSpec, RetryPolicy};
use crate::handler::{Handler, NoopHandler, ShellHandler, WebhookHandler, WebhookSecret};

/// The time one attempt may take, unless configured.
pub const TIMEOUT: Duration = Duration::from_secs(30);

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
    #[serde(default, with = "humantime_serde")]
    timeout: Option<Duration>,
    max_attempts: Option<i32>,
    #[serde(default, with = "humantime_serde")]
    retry_delay: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    retry_max_delay: Option<Duration>,
    webhook_secret: Option<String>,
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
    /// Nothing: every delivery completes.
    Noop,
}

/// The settings every handler has unless its table says otherwise (the command line's).
#[derive(Clone, Debug)]
pub struct Defaults {
    pub timeout: Duration,
    pub retry: RetryPolicy,
    pub webhook_secret: Option<WebhookSecret>,
}

/// One handler, resolved.
#[derive(Clone, Debug)]
pub struct HandlerConfig {
    pub name: String,
    pub target: Target,
    pub timeout: Duration,
    pub retry: RetryPolicy,
    pub webhook_secret: Option<WebhookSecret>,
}

impl HandlerConfig {
    /// A handler from the command line, with the defaults.
    pub fn new(name: String, target: Target, defaults: &Defaults) -> Self {
        Self {
            name,
            target,
            timeout: defaults.timeout,
            retry: defaults.retry,
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
        message: e.to_string(),
    })?;
    if file.handlers.is_empty() {
        return Err(ConfigError::Empty(shown));
    }
    file.handlers
        .into_iter()
        .map(|(name, e)| {
            let invalid = |why: &str| ConfigError::Handler {
                name: name.clone(),
                why: why.to_owned(),
            };
            let target = match (e.exec, e.webhook) {
                (Some(cmd), None) => Target::Exec(cmd),
                (None, Some(url)) => Target::Webhook(url),
                _ => return Err(invalid("give exactly one of `exec` or `webhook`")),
            };
            let max_attempts = e.max_attempts.unwrap_or(defaults.retry.max_attempts);
            if max_attempts < 1 {
                return Err(invalid("`max_attempts` must be at least 1"));
            }
            let mut retry = defaults.retry;
            retry.max_attempts = max_attempts;
            retry.backoff.base = e.retry_delay.unwrap_or(retry.backoff.base);
            retry.backoff.max = e.retry_max_delay.unwrap_or(retry.backoff.max);
            let webhook_secret = match e.webhook_secret {
                Some(s) => Some(
                    WebhookSecret::parse(&s)
                        .map_err(|why| invalid(&format!("invalid `webhook_secret`: {why}")))?,
                ),
                None => defaults.webhook_secret.clone(),
            };
            Ok(HandlerConfig {
                timeout: e.timeout.unwrap_or(defaults.timeout),
                retry,
                webhook_secret,
                target,
                name,
            })
        })
        .collect()
}

/// Builds the handlers. Webhook handlers share one HTTP client, so connections are pooled and
/// kept alive.
pub fn build(configs: Vec<HandlerConfig>) -> Result<Vec<HandlerSpec>, ConfigError> {
    let client = reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(90))
        .user_agent(concat!("relaybus/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(ConfigError::HttpClient)?;
    configs
        .into_iter()
        .map(|c| {
            let handler: Arc<dyn Handler> = match c.target {
                Target::Exec(cmd) => Arc::new(ShellHandler::new(cmd, c.timeout)),
                Target::Noop => Arc::new(NoopHandler),
                Target::Webhook(url) => {
                    let invalid = |why: String| ConfigError::Handler {
                        name: c.name.clone(),
                        why,
                    };
                    let parsed = reqwest::Url::parse(&url)
                        .map_err(|e| invalid(format!("invalid webhook URL `{url}`: {e}")))?;
                    if !matches!(parsed.scheme(), "http" | "https") {
                        return Err(invalid(
                            "the webhook URL must be http:// or https://".into(),
                        ));
                    }
                    Arc::new(WebhookHandler::new(
                        client.clone(),
                        url,
                        c.webhook_secret,
                        c.timeout,
                    ))
                }
            };
            Ok(HandlerSpec {
                name: c.name,
                handler,
                retry: c.retry,
            })
        })
        .collect()
}

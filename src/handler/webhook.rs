//! Webhook handlers: POST of the envelope over a pooled keep-alive client. With a secret, every
//! request is signed the Standard Webhooks way. 2xx completes, 410 buries, anything else (or a
//! timeout, or a connection error) fails the attempt, honouring `Retry-After`. Redirects are not
//! followed: a 3xx fails the attempt, naming its `Location`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use reqwest::header::{HeaderValue, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use sha2::Sha256;

use super::{Envelope, Gate, Handler, HandlerFuture, Outcome, Tail};
use crate::store::ClaimedDelivery;

const BODY_TAIL: usize = 512;

/// A Standard Webhooks signing key (`whsec_` + base64).
#[derive(Clone)]
pub struct WebhookSecret(Vec<u8>);

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(***)")
    }
}

impl WebhookSecret {
    pub fn parse(text: &str) -> Result<Self, String> {
        let encoded = text
            .strip_prefix("whsec_")
            .ok_or("a webhook secret starts with `whsec_` followed by base64")?;
        let key = STANDARD
            .decode(encoded)
            .map_err(|_| "the webhook secret after `whsec_` is not valid base64".to_owned())?;
        if key.is_empty() {
            return Err("the webhook secret has no key after `whsec_`".into());
        }
        Ok(WebhookSecret(key))
    }

    /// `v1,` + base64 HMAC-SHA256 over `{id}.{timestamp}.{body}`.
    pub fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

pub struct WebhookHandler {
    client: reqwest::Client,
    url: String,
    secret: Option<WebhookSecret>,
    timeout: Duration,
}

impl WebhookHandler {
    /// `client` is shared by every webhook handler of a process, so connections are pooled.
    pub fn new(
        client: reqwest::Client,
        url: String,
        secret: Option<WebhookSecret>,
        timeout: Duration,
    ) -> Self {
        Self {
            client,
            url,
            secret,
            timeout,
        }
    }

    async fn run(&self, d: &ClaimedDelivery, gate: Gate<'_>) -> Outcome {
        let body = match serde_json::to_vec(&Envelope::of(d)) {
            Ok(b) => b,
            Err(e) => return failed(format!("could not encode the envelope: {e}"), None),
        };
        let mut request = self
            .client
            .post(&self.url)
            .timeout(self.timeout)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(secret) = &self.secret {
            let timestamp = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let id = &d.token.delivery_id;
            request = request
                .header("webhook-id", id.as_str())
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", secret.sign(id, timestamp, &body));
        }
        if !gate() {
            return Outcome::Withheld;
        }
        let mut response = match request.body(body).send().await {
            Ok(r) => r,
            Err(e) if e.is_timeout() => {
                return unavailable(
                    format!(
                        "timed out after {}",
                        humantime::format_duration(self.timeout)
                    ),
                    None,
                )
            }
            Err(e) => return unavailable(format!("request failed: {}", error_chain(&e)), None),
        };
        let status = response.status();
        if status.is_success() {
            return Outcome::Completed;
        }
        if status.is_redirection() {
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("(none)");
            return failed(
                format!(
                    "HTTP {}: redirect to {location} not followed; point the webhook at the final URL",
                    status.as_u16()
                ),
                None,
            );
        }
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let mut body = Tail::new(BODY_TAIL);
        while let Ok(Some(chunk)) = response.chunk().await {
            body.push(&chunk);
        }
        let error = format!("HTTP {}: {}", status.as_u16(), body.text());
        if status == reqwest::StatusCode::GONE {
            Outcome::Rejected { error }
        } else if status.is_server_error() {
            unavailable(error, retry_after)
        } else {
            failed(error, retry_after)
        }
    }
}

fn failed(error: String, retry_after: Option<Duration>) -> Outcome {
    Outcome::Failed { error, retry_after }
}

fn unavailable(error: String, retry_after: Option<Duration>) -> Outcome {
    Outcome::Unavailable { error, retry_after }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// `Retry-After` as delay-seconds or an HTTP date.
fn parse_retry_after(value: &str) -> Option<Duration> {
    if let Ok(secs) = value.trim().parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = chrono::DateTime::parse_from_rfc2822(value.trim()).ok()?;
    let delta = when.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(delta.to_std().unwrap_or(Duration::ZERO))
}

impl Handler for WebhookHandler {
    fn handle<'a>(&'a self, delivery: &'a ClaimedDelivery, gate: Gate<'a>) -> HandlerFuture<'a> {
        Box::pin(self.run(delivery, gate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_like_the_standard_webhooks_reference() {
        // The example of the Standard Webhooks specification.
        let secret = WebhookSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert!(WebhookSecret::parse("nope").is_err());
    }

    #[test]
    fn retry_after_takes_seconds_or_a_date() {
        assert_eq!(parse_retry_after("7"), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon"), None);
    }
}

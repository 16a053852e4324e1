//! Connection strings as both engines meet them: the password hidden in messages, the strings
//! a parser would misread refused, and libpq's `key=value` pairs, which the redaction reads too.

use super::{Result, StoreError};

/// A connection string with its password replaced by `***`, for messages and logs: in a URL's
/// user information or query, or in `key=value` pairs.
pub fn redact(conn: &str) -> String {
    let Some(scheme_end) = conn.find("://") else {
        return redact_pairs(conn);
    };
    let mut rest = &conn[scheme_end + 3..];
    let mut out = conn[..scheme_end + 3].to_owned();
    // The user information ends at the string's last `@`: a password may hold a `/`, `?` or `@`
    // its writer did not encode, and what follows it then looks like a path or a query. Cutting
    // there hides every byte that may be the password; an `@` in a query value only makes it
    // hide more than it must.
    if let Some(at) = rest.rfind('@') {
        let user_info = &rest[..at];
        match user_info.split_once(':') {
            Some((user, _)) => {
                out.push_str(user);
                out.push_str(":***");
            }
            None => out.push_str(user_info),
        }
        out.push('@');
        rest = &rest[at + 1..];
    }
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    out.push_str(&rest[..authority_end]);
    let tail = &rest[authority_end..];
    match tail.split_once('?') {
        None => out.push_str(tail),
        Some((path, query)) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) if k == "password" => format!("{k}=***"),
                    _ => pair.to_owned(),
                })
                .collect();
            out.push_str(path);
            out.push('?');
            out.push_str(&pairs.join("&"));
        }
    }
    out
}

/// How to write a password that a URL's parser would split.
const ENCODE_PASSWORD: &str = "a password holding `/`, `?`, `@`, `#`, `:` or `%` must be \
                               percent-encoded (`/` as `%2F`, `?` as `%3F`, `@` as `%40`, `%` as \
                               `%25`)";

/// The error for a connection string that does not parse. A driver's reason may quote the part
/// it stumbled on, which for a password with an unencoded `/` or `?` is a piece of the password:
/// when a URL's password holds such a character, the reason is ours, and says how to write one.
pub(crate) fn unparsable(conn: &str, why: String) -> StoreError {
    let password = conn.split_once("://").and_then(|(_, rest)| {
        let (user_info, _) = rest.rsplit_once('@')?;
        Some(user_info.split_once(':')?.1)
    });
    let why = match password {
        Some(p) if p.contains(['/', '?', '@', '#', ':', '%']) => {
            format!("it does not parse; {ENCODE_PASSWORD}")
        }
        _ => why,
    };
    StoreError::InvalidConnectionString {
        shown: redact(conn),
        why,
    }
}

/// Refuses a URL whose user information may hold an unencoded `@` or `/` (an `@` after a `/`, or
/// two, before the query): a parser splits it where its writer did not mean to, and the host or
/// database it then names in a message is a piece of the password.
pub(crate) fn refuse_ambiguous(conn: &str) -> Result<()> {
    let Some((_, rest)) = conn.split_once("://") else {
        return Ok(());
    };
    let before_query = rest.split('?').next().unwrap_or(rest);
    let ambiguous = match (before_query.find('@'), before_query.rfind('@')) {
        (Some(first), Some(last)) => {
            first != last || before_query.find('/').is_some_and(|slash| slash < first)
        }
        _ => false,
    };
    if !ambiguous {
        return Ok(());
    }
    Err(StoreError::InvalidConnectionString {
        shown: redact(conn),
        why: format!("its user, password and host cannot be told apart; {ENCODE_PASSWORD}"),
    })
}

/// `key=value` pairs, values optionally in single quotes with `\` escapes, as libpq reads them.
pub(crate) fn pairs(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = vec![];
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(format!(
                "missing `=` after `{key}` in the connection string"
            ));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => return Err(format!("unterminated quoted value of `{key}`")),
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        out.push((key, value));
    }
}

/// A `key=value` connection string with its password replaced by `***`.
fn redact_pairs(s: &str) -> String {
    match pairs(s) {
        Ok(pairs) => pairs
            .into_iter()
            .map(|(k, v)| {
                if k == "password" {
                    format!("{k}=***")
                } else {
                    format!("{k}={v}")
                }
            })
            .collect::<Vec<_>>()
            .join(" "),
        // Unreadable: nothing of it is shown, since a password may hide anywhere in it.
        Err(_) => "(an unreadable connection string)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_survive_redaction() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/x?sslmode=disable"),
            "postgres://app:***@db:5432/x?sslmode=disable"
        );
        assert_eq!(
            redact("postgres://app@db/x?user=a&password=s3cret&sslmode=require"),
            "postgres://app@db/x?user=a&password=***&sslmode=require"
        );
        assert_eq!(redact("postgres://app@db/x"), "postgres://app@db/x");
        // Unencoded `/`, `?` and `@` in a password.
        for (url, shown) in [
            ("postgres://app:se/cr?et@db/x", "postgres://app:***@db/x"),
            (
                "postgres://app:s@c?r/t@db:5432/x?sslmode=require",
                "postgres://app:***@db:5432/x?sslmode=require",
            ),
            (
                "mongodb://app:p/w@h1,h2/db?replicaSet=rs0",
                "mongodb://app:***@h1,h2/db?replicaSet=rs0",
            ),
        ] {
            assert_eq!(redact(url), shown);
        }
        for url in [
            "postgres://app:s3cret@db/x?application_name=a@b",
            "mongodb://app:s3cret@h1,h2/db?replicaSet=rs0",
            "host=db password=a@b/c",
        ] {
            assert!(refuse_ambiguous(url).is_ok(), "{url}");
        }
        for url in ["postgres://app:12/34@db/x", "mongodb://app:a@b@h/db"] {
            let refused = refuse_ambiguous(url).unwrap_err().to_string();
            assert!(refused.contains("cannot be told apart"), "{refused}");
            assert!(
                !refused.contains("34") && !refused.contains("a@b"),
                "{refused}"
            );
        }
        assert_eq!(redact("host=db password=s3cret"), "host=db password=***");
        // Several hosts, as libpq takes them.
        assert_eq!(
            redact("postgres://app:s3cret@a:5432,b:5433/x?target_session_attrs=read-write"),
            "postgres://app:***@a:5432,b:5433/x?target_session_attrs=read-write"
        );
        assert_eq!(
            redact("host=a,b port=5432,5433 password=s3cret target_session_attrs=read-write"),
            "host=a,b port=5432,5433 password=*** target_session_attrs=read-write"
        );
    }

    #[test]
    fn passwords_never_survive_redaction_of_pairs() {
        assert_eq!(
            redact_pairs("host=db user=app password='s3 cret' sslmode=require"),
            "host=db user=app password=*** sslmode=require"
        );
        assert_eq!(
            redact_pairs("host=db password='unterminated"),
            "(an unreadable connection string)"
        );
    }
}

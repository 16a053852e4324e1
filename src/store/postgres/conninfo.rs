//! A PostgreSQL connection string resolved as libpq resolves it: a `postgres://` URL or
//! `key=value` pairs, completed from the `PG*` variables and the password file, with the TLS
//! settings tokio-postgres does not read itself (`sslmode` verify-ca and verify-full,
//! `sslrootcert`, `sslcert`, `sslkey`) and a bound on the whole connection start-up.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::Config;

use crate::store::connstr::pairs;

/// libpq's `sslmode`, of which tokio-postgres knows only disable, prefer and require.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TlsMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// Where and how to connect.
pub(crate) struct ConnInfo {
    pub(crate) config: Config,
    /// The same, one for each host in the order given (the only one when one host is given):
    /// each host is tried with its own bound, as libpq tries them.
    pub(crate) hosts: Vec<Config>,
    pub(crate) tls: ClientConfig,
    /// The bound on connecting, TLS and authentication together; None waits forever
    /// (`connect_timeout=0`, as libpq).
    pub(crate) connect_timeout: Option<Duration>,
}

/// The connection start-up bound when nothing sets one.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Parameters relaybus reads itself; the rest goes to tokio-postgres.
const OWN: [&str; 6] = [
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "connect_timeout",
    "passfile",
];

/// Each parameter's variable, the default libpq takes when the string does not give it.
const VARIABLES: [(&str, &str); 12] = [
    ("host", "PGHOST"),
    ("port", "PGPORT"),
    ("user", "PGUSER"),
    ("dbname", "PGDATABASE"),
    ("password", "PGPASSWORD"),
    ("application_name", "PGAPPNAME"),
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("sslcert", "PGSSLCERT"),
    ("sslkey", "PGSSLKEY"),
    ("connect_timeout", "PGCONNECT_TIMEOUT"),
    ("passfile", "PGPASSFILE"),
];

/// Resolves `conn` (None: the variables alone), reading variables through `env`. A URL is read
/// as the pairs it stands for, each variable is the default of its parameter, and libpq's own
/// defaults come last. Errors never repeat a password.
pub(crate) fn resolve(
    conn: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ConnInfo, String> {
    let given = completed(conn, env)?;
    let (own, rest): (Vec<_>, Vec<_>) = given
        .into_iter()
        .partition(|(k, _)| OWN.contains(&k.as_str()));
    let param = |name: &str| last(&own, name).filter(|v| !v.is_empty());
    let build = |pairs: &[(String, String)]| -> Result<(Config, ClientConfig), String> {
        let quoted: Vec<String> = pairs
            .iter()
            .map(|(k, v)| format!("{k}='{}'", v.replace('\\', "\\\\").replace('\'', "\\'")))
            .collect();
        let mut config = quoted
            .join(" ")
            .parse::<Config>()
            .map_err(|e| format!("invalid connection string: {e}"))?;
        if config.get_password().is_none() {
            let file = param("passfile")
                .map(PathBuf::from)
                .or_else(|| env("HOME").map(|h| Path::new(&h).join(".pgpass")));
            if let Some(password) = file.and_then(|f| password_from_file(&f, &config)) {
                config.password(password);
            }
        }
        let tls = tls(&mut config, &param, env)?;
        Ok((config, tls))
    };
    let (config, tls) = build(&rest)?;
    let hosts = per_host(&rest)?
        .iter()
        .map(|pairs| build(pairs).map(|(config, _)| config))
        .collect::<Result<Vec<_>, _>>()?;
    let connect_timeout = match param("connect_timeout") {
        None => Some(CONNECT_TIMEOUT),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(0) => None,
            Ok(secs) => Some(Duration::from_secs(secs.max(2))),
            Err(_) => return Err(format!("invalid connect_timeout `{v}`: give whole seconds")),
        },
    };
    Ok(ConnInfo {
        config,
        hosts,
        tls,
        connect_timeout,
    })
}

/// The pairs of each host of a multi-host string (`host=a,b port=5432,5433`), with its own
/// host, address and port; the pairs themselves for one host.
fn per_host(pairs: &[(String, String)]) -> Result<Vec<Vec<(String, String)>>, String> {
    let list = |key: &str| -> Vec<String> {
        last(pairs, key)
            .map(|v| v.split(',').map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let (hosts, addrs, ports) = (list("host"), list("hostaddr"), list("port"));
    let n = hosts.len().max(addrs.len());
    if n <= 1 {
        return Ok(vec![pairs.to_vec()]);
    }
    if ports.len() > 1 && ports.len() != n {
        return Err(format!(
            "{} ports for {n} hosts: give one port for all, or one for each host",
            ports.len()
        ));
    }
    Ok((0..n)
        .map(|i| {
            let mut one: Vec<(String, String)> = pairs
                .iter()
                .filter(|(k, _)| !["host", "hostaddr", "port"].contains(&k.as_str()))
                .cloned()
                .collect();
            for (key, values) in [("host", &hosts), ("hostaddr", &addrs)] {
                if let Some(v) = values.get(i) {
                    one.push((key.into(), v.clone()));
                }
            }
            if let Some(port) = ports.get(i).or(ports.first()) {
                one.push(("port".into(), port.clone()));
            }
            one
        })
        .collect())
}

/// The value a key was given last.
fn last(pairs: &[(String, String)], key: &str) -> Option<String> {
    pairs
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
}

/// The pairs of `conn`, completed from the variables and then libpq's defaults.
fn completed(
    conn: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, String> {
    let mut given = match conn {
        None => vec![],
        Some(s) if s.contains("://") => url_pairs(s)?,
        Some(s) => pairs(s)?,
    };
    let has = |pairs: &[(String, String)], key: &str| pairs.iter().any(|(k, _)| k == key);
    for (key, var) in VARIABLES {
        if let Some(value) = env(var).filter(|v| !v.is_empty()) {
            if !has(&given, key) {
                given.push((key.into(), value));
            }
        }
    }
    if !has(&given, "host") {
        // libpq's default is the server's Unix socket directory where one exists.
        let socket = Path::new("/var/run/postgresql");
        let host = if socket.exists() {
            socket.to_string_lossy().into_owned()
        } else {
            "localhost".into()
        };
        given.push(("host".into(), host));
    }
    if !has(&given, "user") {
        let user = env("USER").unwrap_or_else(|| "postgres".into());
        given.push(("user".into(), user));
    }
    if !has(&given, "dbname") {
        let user = last(&given, "user").unwrap_or_default();
        given.push(("dbname".into(), user));
    }
    if !has(&given, "application_name") {
        given.push(("application_name".into(), "relaybus".into()));
    }
    Ok(given)
}

/// The TLS of a connection, from `sslmode` and the certificate parameters (or the files libpq
/// looks for in ~/.postgresql), with the driver's `sslmode` set to match.
fn tls(
    config: &mut Config,
    param: &dyn Fn(&str) -> Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ClientConfig, String> {
    let tls_mode = match param("sslmode").as_deref() {
        None | Some("prefer") | Some("allow") => TlsMode::Prefer,
        Some("disable") => TlsMode::Disable,
        Some("require") => TlsMode::Require,
        Some("verify-ca") => TlsMode::VerifyCa,
        Some("verify-full") => TlsMode::VerifyFull,
        Some(other) => {
            return Err(format!(
                "invalid sslmode `{other}`: use disable, prefer, require, verify-ca or verify-full"
            ))
        }
    };
    // As libpq: TLS does not apply to Unix-domain sockets (a socket's path is no host name).
    let sockets_only = config
        .get_hosts()
        .iter()
        .all(|h| matches!(h, Host::Unix(_)));
    config.ssl_mode(match tls_mode {
        _ if sockets_only => SslMode::Disable,
        TlsMode::Disable => SslMode::Disable,
        TlsMode::Prefer => SslMode::Prefer,
        _ => SslMode::Require,
    });
    let home_file = |name: &str| {
        env("HOME")
            .map(|h| Path::new(&h).join(".postgresql").join(name))
            .filter(|p| p.exists())
    };
    let root = param("sslrootcert")
        .map(PathBuf::from)
        .or_else(|| home_file("root.crt"));
    let client = match (
        param("sslcert")
            .map(PathBuf::from)
            .or_else(|| home_file("postgresql.crt")),
        param("sslkey")
            .map(PathBuf::from)
            .or_else(|| home_file("postgresql.key")),
    ) {
        (Some(cert), Some(key)) => Some((cert, key)),
        _ => None,
    };
    tls_config(tls_mode, root.as_deref(), client)
}

/// A `postgres://user:password@host:port,host2:port2/dbname?param=value` URL as the pairs it
/// stands for.
fn url_pairs(url: &str) -> Result<Vec<(String, String)>, String> {
    let rest = url
        .strip_prefix("postgresql://")
        .or_else(|| url.strip_prefix("postgres://"))
        .ok_or("a connection URL starts with postgres:// or postgresql://")?;
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let mut out = vec![];
    let hosts = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            if !user.is_empty() {
                out.push(("user".into(), percent_decode(user)));
            }
            if userinfo.contains(':') {
                out.push(("password".into(), percent_decode(password)));
            }
            hosts
        }
        None => authority,
    };
    if !hosts.is_empty() {
        let (mut names, mut ports) = (vec![], vec![]);
        for entry in hosts.split(',') {
            let (name, port) = match entry.strip_prefix('[') {
                Some(v6) => {
                    let (addr, after) = v6
                        .split_once(']')
                        .ok_or("unterminated [ in the URL's host")?;
                    (addr, after.strip_prefix(':'))
                }
                None => match entry.rsplit_once(':') {
                    Some((name, port)) => (name, Some(port)),
                    None => (entry, None),
                },
            };
            names.push(percent_decode(name));
            ports.push(port.map(str::to_owned));
        }
        out.push(("host".into(), names.join(",")));
        if ports.iter().any(Option::is_some) {
            let ports: Vec<String> = ports
                .into_iter()
                .map(|p| p.unwrap_or_else(|| "5432".into()))
                .collect();
            out.push(("port".into(), ports.join(",")));
        }
    }
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    if let Some(db) = path.strip_prefix('/').filter(|d| !d.is_empty()) {
        out.push(("dbname".into(), percent_decode(db)));
    }
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.push((percent_decode(k), percent_decode(v)));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).and_then(|b| hex(*b)),
            bytes.get(i + 2).and_then(|b| hex(*b)),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The password for this connection from a `.pgpass` file (`host:port:db:user:password`, `*`
/// matching anything, `\` escaping `:` and `\`). As libpq does, a file others can read is
/// ignored, and a socket host matches `localhost`.
fn password_from_file(file: &Path, config: &Config) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(file).ok()?;
    if meta.permissions().mode() & 0o077 != 0 {
        return None;
    }
    let text = std::fs::read_to_string(file).ok()?;
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        _ => "localhost".into(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let wanted = [
        host.as_str(),
        port.as_str(),
        config.get_dbname().unwrap_or(""),
        config.get_user().unwrap_or(""),
    ];
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(pgpass_fields)
        .find(|f| f.len() == 5 && f[..4].iter().zip(wanted).all(|(f, w)| f == "*" || f == w))
        .map(|mut f| f.remove(4))
}

fn pgpass_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => fields.last_mut().unwrap().extend(chars.next()),
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The TLS client for a mode: verify-full checks the chain and the host name, verify-ca the
/// chain alone (and so does require when a root certificate is given, as libpq does); prefer
/// and require without one check only that the server holds its certificate's key.
fn tls_config(
    mode: TlsMode,
    root: Option<&Path>,
    client: Option<(PathBuf, PathBuf)>,
) -> Result<ClientConfig, String> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let verifying = matches!(mode, TlsMode::VerifyCa | TlsMode::VerifyFull)
        || (mode == TlsMode::Require && root.is_some());
    let builder = if verifying {
        let Some(root) = root else {
            return Err(format!(
                "sslmode {} needs the server's root certificate: set sslrootcert (or \
                 PGSSLROOTCERT), or put it in ~/.postgresql/root.crt",
                if mode == TlsMode::VerifyCa {
                    "verify-ca"
                } else {
                    "verify-full"
                }
            ));
        };
        let mut roots = RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(root)
            .map_err(|e| format!("could not read sslrootcert `{}`: {e}", root.display()))?;
        for cert in certs {
            let cert =
                cert.map_err(|e| format!("could not read sslrootcert `{}`: {e}", root.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("sslrootcert `{}`: {e}", root.display()))?;
        }
        let webpki =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
                .build()
                .map_err(|e| format!("TLS: {e}"))?;
        if mode == TlsMode::VerifyFull {
            builder.with_webpki_verifier(webpki)
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
        }
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(KeyOnly(provider)))
    };
    match client {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(&cert)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("could not read sslcert `{}`: {e}", cert.display()))?;
            let key = PrivateKeyDer::from_pem_file(&key)
                .map_err(|e| format!("could not read sslkey `{}`: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("sslcert and sslkey: {e}"))
        }
    }
}

/// verify-ca: the chain must lead to a trusted root; the name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// prefer and require (libpq's meaning): encrypted, with any certificate whose key the server
/// holds.
#[derive(Debug)]
struct KeyOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for KeyOnly {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn key_value_strings_and_urls_resolve_alike_and_variables_fill_the_gaps() {
        let vars = env(&[
            ("PGPORT", "6543"),
            ("PGUSER", "app"),
            ("PGAPPNAME", "billing-worker"),
            ("PGCONNECT_TIMEOUT", "7"),
            ("PGSSLMODE", "disable"),
        ]);
        for conn in [
            "host=db.internal dbname=orders password=x",
            "postgres://db.internal/orders?password=x",
        ] {
            let info = resolve(Some(conn), &vars).unwrap();
            let c = &info.config;
            assert_eq!(c.get_hosts(), [Host::Tcp("db.internal".into())], "{conn}");
            assert_eq!(c.get_ports(), [6543]);
            assert_eq!(
                (c.get_user(), c.get_dbname()),
                (Some("app"), Some("orders"))
            );
            assert_eq!(c.get_application_name(), Some("billing-worker"));
            assert_eq!(info.connect_timeout, Some(Duration::from_secs(7)));
            assert_eq!(info.config.get_ssl_mode(), SslMode::Disable);
        }
        let defaults = resolve(Some("host=h"), &env(&[])).unwrap();
        assert_eq!(defaults.connect_timeout, Some(CONNECT_TIMEOUT));
        assert_eq!(defaults.config.get_application_name(), Some("relaybus"));
        let quoted = resolve(Some("host=h password='a b\\'c'"), &env(&[])).unwrap();
        assert_eq!(quoted.config.get_password(), Some(&b"a b'c"[..]));
        let own = resolve(
            Some("postgres://h/db?sslmode=require&connect_timeout=0"),
            &env(&[]),
        )
        .unwrap();
        assert_eq!(
            (own.config.get_ssl_mode(), own.connect_timeout),
            (SslMode::Require, None)
        );
        assert_eq!(
            resolve(Some("host=h sslmode=verify-full"), &env(&[]))
                .err()
                .unwrap(),
            "sslmode verify-full needs the server's root certificate: set sslrootcert (or \
             PGSSLROOTCERT), or put it in ~/.postgresql/root.crt"
        );
    }

    #[test]
    fn each_host_of_a_multi_host_string_gets_its_own_configuration() {
        let hosts = |conn: &str| -> Result<Vec<(String, u16)>, String> {
            Ok(resolve(Some(conn), &env(&[]))?
                .hosts
                .iter()
                .map(|c| {
                    let host = match &c.get_hosts()[0] {
                        Host::Tcp(h) => h.clone(),
                        Host::Unix(p) => p.display().to_string(),
                    };
                    (host, c.get_ports().first().copied().unwrap_or(5432))
                })
                .collect())
        };
        let both = vec![("a".to_owned(), 5432), ("b".to_owned(), 5433)];
        assert_eq!(hosts("postgres://a:5432,b:5433/db"), Ok(both.clone()));
        assert_eq!(hosts("host=a,b port=5432,5433 dbname=db"), Ok(both));
        assert_eq!(
            hosts("host=a,b port=6000"),
            Ok(vec![("a".to_owned(), 6000), ("b".to_owned(), 6000)])
        );
        assert_eq!(hosts("host=a"), Ok(vec![("a".to_owned(), 5432)]));
        assert_eq!(
            hosts("host=a,b port=1,2,3"),
            Err("3 ports for 2 hosts: give one port for all, or one for each host".to_owned())
        );
    }

    #[test]
    fn the_password_file_matches_as_libpq_does_and_only_when_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pgpass");
        std::fs::write(
            &file,
            "# comment\nother:5432:*:app:wrong\ndb.internal:*:orders:app:r\\:ight\\\\\n*:*:*:*:fallback\n",
        )
        .unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let vars = env(&[("PGPASSFILE", file.to_str().unwrap()), ("PGUSER", "app")]);
        let password = |conn: &str| {
            resolve(Some(conn), &vars)
                .unwrap()
                .config
                .get_password()
                .map(|p| String::from_utf8_lossy(p).into_owned())
        };
        assert_eq!(
            password("host=db.internal dbname=orders").as_deref(),
            Some("r:ight\\")
        );
        assert_eq!(
            password("host=elsewhere dbname=x").as_deref(),
            Some("fallback")
        );
        assert_eq!(
            password("host=db.internal dbname=orders password=given").as_deref(),
            Some("given")
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(password("host=db.internal dbname=orders"), None);
    }
}

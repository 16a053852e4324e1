//! A throwaway PgBouncer (Debian's package) in transaction mode, in front of the test database.

use std::path::Path;
use std::time::Duration;

use super::cluster::{as_postgres, free_port, give_to_postgres};

pub struct PgBouncer {
    dir: tempfile::TempDir,
    port: u16,
}

impl PgBouncer {
    /// Transaction pooling over two server sessions. Every server session is reset when a
    /// client's transaction ends (`server_reset_query_always`), so a statement prepared in one
    /// transaction is gone in the next: the pooler's effect on prepared statements, every time
    /// rather than by chance.
    pub fn start() -> Self {
        Self::pooling(
            "default_pool_size = 2\n\
                       server_reset_query = DISCARD ALL\n\
                       server_reset_query_always = 1\n",
        )
    }

    /// Transaction pooling over one server session that is never reset, as PgBouncer runs in
    /// transaction mode by default: what one client prepares there stays for the next.
    pub fn one_session() -> Self {
        Self::pooling("default_pool_size = 1\n")
    }

    fn pooling(pool: &str) -> Self {
        let target: tokio_postgres::Config = super::database_url().parse().unwrap();
        let host = match &target.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            other => panic!("the test database must be reached over TCP, not {other:?}"),
        };
        let bouncer = Self {
            dir: tempfile::tempdir().unwrap(),
            port: free_port(),
        };
        let dir = bouncer.dir.path();
        std::fs::write(
            dir.join("pgbouncer.ini"),
            format!(
                "[databases]\n\
                 test = host={host} port={port} dbname={db} user={user}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {listen}\n\
                 unix_socket_dir =\n\
                 auth_type = any\n\
                 pool_mode = transaction\n\
                 {pool}\
                 logfile = {dir}/pgbouncer.log\n\
                 pidfile = {dir}/pgbouncer.pid\n",
                port = target.get_ports().first().copied().unwrap_or(5432),
                db = target.get_dbname().unwrap_or("test"),
                user = target.get_user().unwrap_or("postgres"),
                listen = bouncer.port,
                dir = dir.display(),
            ),
        )
        .unwrap();
        give_to_postgres(dir);
        let out = as_postgres(Path::new("/usr/sbin/pgbouncer"))
            .arg("-d")
            .arg(dir.join("pgbouncer.ini"))
            .output()
            .expect("pgbouncer (Debian's package `pgbouncer`)");
        assert!(
            out.status.success(),
            "pgbouncer: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        super::wait_until("PgBouncer to listen", Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", bouncer.port)).is_ok()
        });
        bouncer
    }

    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/test?sslmode=disable",
            self.port
        )
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.path().join("pgbouncer.pid")) {
            if let Ok(pid) = pid.trim().parse() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
    }
}

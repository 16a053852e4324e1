//! A throwaway PostgreSQL cluster for tests that stop, restart or freeze a server: `initdb`
//! into a temporary directory, `pg_ctl` on a free port, removed when dropped. The cluster on
//! the default port is never touched.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub struct TestCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
    /// Server settings beyond the harness's own, as `-c name=value` options.
    settings: String,
}

/// The server's binaries, from the system's PostgreSQL.
fn bin_dir() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL's server binaries under /usr/lib/postgresql")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .expect("an initdb under /usr/lib/postgresql/*/bin")
}

/// A server program, run as `postgres` when the tests run as root: PostgreSQL and PgBouncer
/// refuse to run as root.
pub fn as_postgres(program: &Path) -> Command {
    if nix::unistd::geteuid().is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

/// Makes a directory the server programs write into theirs, when the tests run as root.
pub fn give_to_postgres(dir: &Path) {
    if nix::unistd::geteuid().is_root() {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl TestCluster {
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// A cluster whose server runs with these `-c name=value` settings too.
    pub fn start_with(settings: &str) -> Self {
        let cluster = Self::unstarted(settings);
        cluster.tool(
            "initdb",
            &[
                "-D",
                cluster.data().to_str().unwrap(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
            ],
        );
        cluster.ctl("start");
        cluster
    }

    /// A streaming standby of this cluster: a base backup started on a port of its own, which
    /// follows the primary until it is promoted.
    pub fn standby(&self) -> Self {
        let standby = Self::unstarted(&self.settings);
        let (port, data) = (self.port.to_string(), standby.data());
        standby.tool(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-X",
                "stream",
                "-R",
                "-D",
                data.to_str().unwrap(),
            ],
        );
        standby.ctl("start");
        standby
    }

    fn unstarted(settings: &str) -> Self {
        let cluster = Self {
            bin: bin_dir(),
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            settings: settings.to_string(),
        };
        give_to_postgres(cluster.dir.path());
        cluster
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Runs one of the server's tools.
    fn tool(&self, name: &str, args: &[&str]) {
        let out = as_postgres(&self.bin.join(name))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn ctl(&self, action: &str) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off {}",
            self.port,
            self.dir.path().display(),
            self.settings
        );
        let data = self.data();
        let log = self.dir.path().join("log");
        let mut args = vec![
            "-D",
            data.to_str().unwrap(),
            "-l",
            log.to_str().unwrap(),
            "-w",
            "-t",
            "30",
        ];
        match action {
            "start" => args.extend(["-o", &options, "start"]),
            "stop" => args.extend(["-m", "fast", "stop"]),
            "kill" => args.extend(["-m", "immediate", "stop"]),
            "promote" => args.push("promote"),
            _ => unreachable!("{action}"),
        }
        self.tool("pg_ctl", &args);
    }

    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    pub fn stop(&self) {
        self.ctl("stop");
    }

    pub fn start_again(&self) {
        self.ctl("start");
    }

    /// Stops the server as a crash would: no checkpoint, sessions cut.
    pub fn kill(&self) {
        self.ctl("kill");
    }

    /// Makes a standby a primary, once it has replayed what it received.
    pub fn promote(&self) {
        self.ctl("promote");
    }

    /// The pid of the server process serving the session for which `sql` (a query on
    /// pg_stat_activity, run on this cluster) finds it.
    pub fn backend(&self, filter: &str) -> i32 {
        let client = connect(&self.url());
        let sql = format!("SELECT pid FROM pg_stat_activity WHERE {filter}");
        let mut pid = None;
        super::wait_until(
            &format!("a session with {filter}"),
            Duration::from_secs(20),
            || {
                pid = super::block_on(client.query(&sql, &[]))
                    .ok()
                    .and_then(|rows| rows.first().map(|r| r.get(0)));
                pid.is_some()
            },
        );
        pid.unwrap()
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let data = self.data();
        let _ = as_postgres(&self.bin.join("pg_ctl"))
            .args(["-D", data.to_str().unwrap(), "-m", "immediate", "stop"])
            .output();
    }
}

/// A client of this cluster.
pub fn connect(url: &str) -> tokio_postgres::Client {
    super::block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
    })
}

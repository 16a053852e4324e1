//! Shell handlers: `sh -c CMD`, one process per delivery, the envelope on stdin (never in the
//! command line), `RELAYBUS_*` variables in the environment (and never the worker's database
//! URL, password or webhook secret). Exit 0 completes, 65 (EX_DATAERR)
//! buries, anything else fails the attempt. The attempt ends when `sh` exits. The process runs
//! in a group of its own: the whole group is killed a second after that exit (at once on
//! timeout or abort), so a background job cannot outlive its delivery for long; a process that
//! left the group (`setsid`, a daemon) is its own and is left running. Input and output stream while the command runs,
//! and only the tail of stderr is kept, so no handler's output grows the worker.

use std::pin::Pin;
use std::process::Stdio;
use std::sync::OnceLock;
use std::task::Poll;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::process::{ChildStdin, Command};

use super::{Envelope, Gate, Handler, HandlerFuture, Outcome, Tail};
use crate::store::ClaimedDelivery;

/// The limit of open files the worker was started with (soft, hard), when it raised its own: its
/// handlers get it back.
static STARTED_WITH: OnceLock<(u64, u64)> = OnceLock::new();

/// Raises the process's soft limit of open files to its hard limit. At the common soft limit of
/// 1,024, a busy worker's handler pipes, database connections and metrics clients run short, and
/// a handler that cannot be started is a delivery that waits. Handlers are given the limit the
/// worker was started with (programs that use `select` break past 1,024), as Go's runtime does
/// for the processes it starts.
pub fn raise_open_files_limit() -> std::io::Result<()> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
        let _ = STARTED_WITH.set((soft, hard));
    }
    Ok(())
}

/// The exit code that buries a delivery at once.
pub(super) const EX_DATAERR: i32 = 65;
/// How much of stderr becomes `last_error`.
const STDERR_TAIL: usize = 2048;
/// How long a background job the command left in its process group has to leave the group
/// before the group is killed.
const GROUP_GRACE: Duration = Duration::from_secs(1);
/// How long stderr is read after the command exited, for what it wrote last.
const STDERR_DRAIN: Duration = Duration::from_millis(100);

pub struct ShellHandler {
    command: String,
    timeout: Duration,
}

/// The command's process group, killed when dropped.
struct GroupGuard(Option<i32>);

impl GroupGuard {
    fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// Kills the group once `GROUP_GRACE` has passed, or when the worker stops first: the
    /// command has exited, and a job it left in the background gets a moment to leave the
    /// group (`setsid`, a daemon's fork) before the rest is killed. A job left in the group
    /// would otherwise outlive its delivery, one more with each, until the worker runs out of
    /// processes.
    fn linger(self) {
        tokio::spawn(async move {
            tokio::time::sleep(GROUP_GRACE).await;
            drop(self);
        });
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

impl ShellHandler {
    pub fn new(command: String, timeout: Duration) -> Self {
        Self { command, timeout }
    }

    /// The program the command starts when `sh` cannot find it: checked at start-up, since
    /// every attempt would fail the same way until the delivery is buried. `command -v` knows
    /// builtins, reserved words and PATH as `sh` does; a command that begins with shell syntax
    /// (an assignment, an expansion, a quote) is left for `sh` to judge.
    pub fn missing_program(command: &str) -> Option<String> {
        let program = command.split_whitespace().next()?;
        let plain = program
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./+-@:,%".contains(c));
        if !plain {
            return None;
        }
        let found = std::process::Command::new("sh")
            .args(["-c", "command -v -- \"$1\"", "sh", program])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        (!found).then(|| program.to_owned())
    }

    async fn run(&self, d: &ClaimedDelivery, gate: Gate<'_>) -> Outcome {
        let envelope = match serde_json::to_vec(&Envelope::of(d)) {
            Ok(v) => v,
            Err(e) => return failed(format!("could not encode the envelope: {e}")),
        };
        let mut command = self.command(d);
        let mut child = match command.spawn() {
            Ok(c) => c,
            Err(e) => {
                let error = format!("could not start `sh -c {}`: {e}", self.command);
                return if out_of_resources(&e) {
                    Outcome::NotStarted { error }
                } else {
                    failed(error)
                };
            }
        };
        let mut group = GroupGuard(child.id().map(|p| p as i32));
        let stdin = child.stdin.take().expect("stdin is piped");
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let mut err = Tail::new(STDERR_TAIL);
        // The envelope is written while stderr is read, so a command that logs before it reads
        // its input cannot wait on a full pipe while the worker waits on the other; both end
        // with the command's own exit, whatever its descendants keep open.
        let ran = tokio::time::timeout(self.timeout, async {
            let feeding = async {
                if feed(stdin, &envelope, gate).await {
                    std::future::pending().await
                }
            };
            let reading = async {
                read_into(&mut err, &mut stderr).await;
                std::future::pending::<()>().await
            };
            tokio::select! {
                status = child.wait() => Some(status),
                () = feeding => None,
                () = reading => unreachable!("pending never ends"),
            }
        })
        .await;
        let Ok(ran) = ran else {
            group.kill();
            return failed(format!(
                "timed out after {}; the process group was killed",
                humantime::format_duration(self.timeout)
            ));
        };
        let Some(status) = ran else {
            // Killed (with the group, as the guard goes) before it had its whole envelope.
            return Outcome::Withheld;
        };
        group.linger();
        // What the command wrote before its exit is in the pipe; a process that left the group
        // (setsid) may hold the pipe open for ever, so the rest is read for a moment only.
        let _ = tokio::time::timeout(STDERR_DRAIN, read_into(&mut err, &mut stderr)).await;
        outcome(status, &err.text())
    }

    /// `sh -c COMMAND` for a delivery: the envelope's fields in the environment, the worker's
    /// credentials out of it, in a process group of its own that dies with the worker.
    fn command(&self, d: &ClaimedDelivery) -> Command {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(&self.command)
            .env("RELAYBUS_EVENT_ID", &d.event_id)
            .env("RELAYBUS_EVENT_TYPE", &d.event_type)
            .env("RELAYBUS_KEY", d.key.as_deref().unwrap_or(""))
            .env("RELAYBUS_HANDLER", &d.handler)
            .env("RELAYBUS_DELIVERY_ID", &d.token.delivery_id)
            .env("RELAYBUS_ATTEMPT", (d.attempts + 1).to_string())
            // The worker's own credentials are not the handler's business.
            .env_remove("RELAYBUS_DATABASE_URL")
            .env_remove("RELAYBUS_DATABASE_URL_FILE")
            .env_remove("RELAYBUS_WEBHOOK_SECRET")
            .env_remove("RELAYBUS_WEBHOOK_SECRET_FILE")
            .env_remove("PGPASSWORD")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: between fork and exec the closure only makes system calls (prctl, setrlimit),
        // which are async-signal-safe, and reads a value set before; it allocates nothing.
        unsafe {
            command.pre_exec(|| {
                // A worker killed with SIGKILL cannot kill its handlers; the kernel does, so that
                // a delivery taken over by another worker does not run twice at once.
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
                if let Some(&(soft, hard)) = STARTED_WITH.get() {
                    let files = nix::sys::resource::Resource::RLIMIT_NOFILE;
                    nix::sys::resource::setrlimit(files, soft, hard)?;
                }
                Ok(())
            });
        }
        command
    }
}

/// Writes the envelope to the command's stdin and closes it, asking `gate` before every write
/// and before the close, in the same poll as each: nothing of the delivery reaches the command,
/// and it never sees the envelope end, once the worker cannot vouch for its lease (a fork that
/// a stop signal interrupts is redone after the process continues, and a write may wait for
/// the pipe). False when the gate said no. A command that closes its stdin early has made its
/// choice: that counts as sent.
async fn feed(mut stdin: ChildStdin, envelope: &[u8], gate: Gate<'_>) -> bool {
    let mut sent = 0;
    std::future::poll_fn(|cx| loop {
        if !gate() {
            return Poll::Ready(false);
        }
        if sent == envelope.len() {
            return Poll::Ready(true);
        }
        match Pin::new(&mut stdin).poll_write(cx, &envelope[sent..]) {
            Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(true),
            Poll::Ready(Ok(n)) => sent += n,
            Poll::Pending => return Poll::Pending,
        }
    })
    .await
}

/// Reads `from` to its end, keeping the tail.
async fn read_into(tail: &mut Tail, from: &mut (impl AsyncRead + Unpin)) {
    let mut chunk = [0u8; 4096];
    while let Ok(n @ 1..) = from.read(&mut chunk).await {
        tail.push(&chunk[..n]);
    }
}

/// What a finished command's exit says, with the tail of its stderr.
fn outcome(status: std::io::Result<std::process::ExitStatus>, stderr_tail: &str) -> Outcome {
    let describe = |what: String| {
        if stderr_tail.is_empty() {
            what
        } else {
            format!("{what}: {stderr_tail}")
        }
    };
    match status {
        Err(e) => failed(format!("could not wait for the command: {e}")),
        Ok(s) if s.success() => Outcome::Completed,
        Ok(s) if s.code() == Some(EX_DATAERR) => Outcome::Rejected {
            error: describe(format!("exit {EX_DATAERR}")),
        },
        Ok(s) => {
            use std::os::unix::process::ExitStatusExt;
            let what = match (s.code(), s.signal()) {
                (Some(code), _) => format!("exit {code}"),
                (None, Some(sig)) => format!("killed by signal {sig}"),
                _ => "ended abnormally".into(),
            };
            failed(describe(what))
        }
    }
}

/// A start that failed for want of what the system gives processes (file descriptors, process
/// slots, memory), not because of the command: the delivery is not to blame.
fn out_of_resources(e: &std::io::Error) -> bool {
    use nix::libc::{EAGAIN, EMFILE, ENFILE, ENOMEM};
    e.raw_os_error()
        .is_some_and(|code| [EMFILE, ENFILE, EAGAIN, ENOMEM].contains(&code))
}

fn failed(error: String) -> Outcome {
    Outcome::Failed {
        error,
        retry_after: None,
    }
}

impl Handler for ShellHandler {
    fn handle<'a>(&'a self, delivery: &'a ClaimedDelivery, gate: Gate<'a>) -> HandlerFuture<'a> {
        Box::pin(self.run(delivery, gate))
    }
}

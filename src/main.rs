use std::io::ErrorKind;
use std::process::ExitCode;

use clap::FromArgMatches;
use relaybus::cli::{self, Cli};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// One thread: every command waits on the database, and a worker's wake-ups across threads cost
// more than they bought (docs/design/delivery-path.md, "The worker's runtime").
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let run = if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == cli::BENCH_WORKER)
    {
        (false, cli::bench_worker().await)
    } else {
        let cli = Cli::from_arg_matches(&cli::command().get_matches()).unwrap_or_else(|e| e.exit());
        (cli.global.json, cli::run(cli).await)
    };
    let (json, result) = run;
    match result {
        Ok(code) => code,
        Err(e) => {
            // A closed pipe (`relaybus ... | head`) is the reader's choice, not a failure.
            let broken_pipe = e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == ErrorKind::BrokenPipe)
            });
            if broken_pipe {
                return ExitCode::SUCCESS;
            }
            let code = cli::exit_code(&e);
            if json {
                let error =
                    serde_json::json!({"error": {"message": format!("{e:#}"), "exit_code": code}});
                eprintln!("{error}");
            } else {
                eprintln!("error: {e:#}");
            }
            ExitCode::from(code)
        }
    }
}

//! Shell completions and man pages, generated from the command definition. The checked-in copies
//! in `completions/` and `man/` are held to these by a test.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use clap_complete::Shell;

use super::{GlobalArgs, Output};

/// Print a shell completion script.
///
///   relaybus completions bash > /etc/bash_completion.d/relaybus
///   relaybus completions zsh > "${fpath[1]}/_relaybus"
///   relaybus completions fish > ~/.config/fish/completions/relaybus.fish
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// The completion script for a shell.
pub fn completions(shell: Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut super::command(), "relaybus", &mut out);
    out
}

/// Every man page: `relaybus.1`, and one per command (`relaybus-dead-requeue.1`, ...).
pub fn man_pages() -> Result<Vec<(String, Vec<u8>)>> {
    fn walk(cmd: &clap::Command, name: String, pages: &mut Vec<(String, Vec<u8>)>) -> Result<()> {
        let cmd = cmd
            .clone()
            .name(name.clone())
            .bin_name(name.replace('-', " "));
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
        pages.push((
            format!("{name}.1"),
            keep_examples(&String::from_utf8(page)?),
        ));
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            walk(sub, format!("{name}-{}", sub.get_name()), pages)?;
        }
        Ok(())
    }
    let cmd = super::command();
    let mut pages = Vec::new();
    walk(&cmd, "relaybus".into(), &mut pages)?;
    Ok(pages)
}

/// Examples, the indented lines of a help text, are set without filling, so that man shows
/// them as the help does instead of joining and justifying them.
fn keep_examples(roff: &str) -> Vec<u8> {
    let mut out = String::with_capacity(roff.len());
    let mut in_example = false;
    for line in roff.lines() {
        let example = line.starts_with("  ");
        if example && !in_example {
            out.push_str(".nf\n");
        } else if !example && in_example {
            out.push_str(".fi\n");
        }
        in_example = example;
        out.push_str(line);
        out.push('\n');
    }
    if in_example {
        out.push_str(".fi\n");
    }
    out.into_bytes()
}

pub fn run(_: &GlobalArgs, out: &Output, args: CompletionsArgs) -> Result<ExitCode> {
    out.line(String::from_utf8_lossy(&completions(args.shell)).trim_end())?;
    Ok(ExitCode::SUCCESS)
}

//! `devstack up|down|status|env`: the shared local stack (see the
//! `devstack::stack` docs for the rules). `scripts/stack.sh` runs this.

use std::process::ExitCode;

use clap::Parser;
use devstack::cli::{Cli, Command};
use devstack::stack::StackDir;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[expect(
    clippy::print_stdout,
    reason = "status and env are the command's output"
)]
async fn run(cli: Cli) -> devstack::Result<ExitCode> {
    let dir = StackDir::new(&cli.root)?;
    let mut say = |line: String| eprintln!("stack: {line}");
    match cli.command {
        Command::Up => {
            dir.up(&mut say).await?;
        }
        Command::Down => dir.down(&mut say).await?,
        Command::Status => {
            let (lines, ok) = dir.status().await;
            for line in lines {
                println!("{line}");
            }
            if !ok {
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Env => print!("{}", dir.env()?),
        Command::NisshiPath => println!("{}", devstack::nisshi::ensure_binary()?.display()),
    }
    Ok(ExitCode::SUCCESS)
}

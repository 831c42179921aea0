//! Retired settings. A setting the code no longer reads stays declared —
//! hidden from `--help`, under the [`HEADING`] heading, its doc comment
//! saying what replaced it — so that a deployment still setting it is
//! stopped at start naming it, never started with the setting silently
//! ignored. The settings reference (`docs/settings.md`) lists them from
//! the same declaration.
//!
//! ```ignore
//! /// The archiver follows `archive_queue` in Postgres, not the topic.
//! #[arg(long, env = "ARCHIVE_TOPIC", hide = true, help_heading = serving::retired::HEADING)]
//! pub retired_topic: Option<String>,
//! ```

use clap::parser::ValueSource;
use clap::{ArgMatches, Command, Parser};

/// The help heading that marks an argument as retired.
pub const HEADING: &str = "Retired";

/// A retired setting that was set, in the environment or on the command line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting} is retired and no longer read: {replaced_by}. Unset it.")]
pub struct RetiredSetting {
    /// The environment variable (or, without one, the flag) that was set.
    pub setting: String,
    /// What took its place: the argument's doc comment, without its final
    /// full stop.
    pub replaced_by: String,
}

/// Parses the command line and environment like [`Parser::parse`] (exiting
/// with clap's message on a bad value), then refuses any retired setting
/// that was set.
pub fn parse<C: Parser>() -> Result<C, RetiredSetting> {
    let command = C::command();
    let mut matches = command.clone().get_matches();
    refuse(&command, &matches)?;
    Ok(C::from_arg_matches_mut(&mut matches).unwrap_or_else(|e| e.exit()))
}

/// The first retired setting that `matches` (parsed by `command`, or one of
/// its subcommands) took from the environment or the command line.
pub fn refuse(command: &Command, matches: &ArgMatches) -> Result<(), RetiredSetting> {
    for arg in command.get_arguments() {
        if arg.get_help_heading() != Some(HEADING) {
            continue;
        }
        let source = matches.value_source(arg.get_id().as_str());
        if matches!(
            source,
            Some(ValueSource::EnvVariable | ValueSource::CommandLine)
        ) {
            let setting = match (arg.get_env(), arg.get_long()) {
                (Some(env), _) => env.to_string_lossy().into_owned(),
                (None, Some(long)) => format!("--{long}"),
                (None, None) => arg.get_id().to_string(),
            };
            let replaced_by = arg
                .get_help()
                .map(|h| h.to_string().trim_end_matches('.').to_owned())
                .unwrap_or_default();
            return Err(RetiredSetting {
                setting,
                replaced_by,
            });
        }
    }
    if let Some((name, sub_matches)) = matches.subcommand() {
        if let Some(sub) = command.find_subcommand(name) {
            refuse(sub, sub_matches)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Subcommand};

    #[derive(Parser)]
    struct Cli {
        /// Still read.
        #[arg(long, default_value = "a")]
        kept: String,
        /// Replaced by `--kept`.
        #[arg(long, hide = true, help_heading = HEADING)]
        old: Option<String>,
        #[command(subcommand)]
        command: Option<Sub>,
    }

    #[derive(Subcommand)]
    enum Sub {
        Run {
            /// Runs follow the queue now.
            #[arg(long, hide = true, help_heading = HEADING)]
            old_group: Option<String>,
        },
    }

    fn check(args: &[&str]) -> Result<(), RetiredSetting> {
        let command = Cli::command();
        let matches = command.clone().try_get_matches_from(args).unwrap();
        refuse(&command, &matches)
    }

    #[test]
    fn a_retired_flag_is_refused_naming_it_and_its_replacement() {
        let err = check(&["x", "--old", "v"]).unwrap_err();
        assert_eq!(err.setting, "--old");
        assert_eq!(
            err.to_string(),
            "--old is retired and no longer read: Replaced by `--kept`. Unset it."
        );
    }

    #[test]
    fn a_retired_setting_of_a_subcommand_is_refused() {
        let err = check(&["x", "run", "--old-group", "g"]).unwrap_err();
        assert_eq!(err.setting, "--old-group");
        assert!(err.replaced_by.contains("queue"));
    }

    #[test]
    fn settings_still_read_pass() {
        assert_eq!(check(&["x", "--kept", "b", "run"]), Ok(()));
    }

    #[test]
    fn retired_settings_are_hidden_from_help() {
        let help = Cli::command().render_help().to_string();
        assert!(help.contains("--kept") && !help.contains("--old"), "{help}");
    }
}

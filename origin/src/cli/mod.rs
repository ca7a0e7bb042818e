//! The `fanout` command line: `serve`, client commands that talk to a running daemon's API
//! (`status`, `subscriber add|list|show|update|remove|secret|filter`, `customer …`, `send`, `deliveries`,
//! `replay`, `listen`, `apply`, `export`), `load`, the commands that work on a ledger directly (`backup`,
//! `ledger copy`), and `outbox schema|init` on a producer's database. This file holds the
//! grammar's top ([`Cli`], [`Command`]) and sends each
//! command to its file; listings print a table for people and JSON with `--json`; progress
//! bars go to stderr only when it is a terminal. It does not run the daemon (`crate::run`).

mod apply;
mod args;
mod client;
mod customers;
mod deliveries;
mod healthcheck;
mod ledger;
mod listen;
mod load;
mod outbox;
mod send;
mod status;
mod subscriber_update;
mod subscribers;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub use apply::{ApplyArgs, ExportArgs};
pub use client::{ClientArgs, ClientError};
pub use customers::CustomerCommand;
pub use deliveries::{DeliveriesArgs, ReplayArgs};
pub use healthcheck::HealthcheckArgs;
pub use ledger::{BackupArgs, LedgerCommand, LedgerCopyArgs, PG_BACKUP};
pub use listen::{ListenArgs, ReaperArgs};
pub use load::LoadArgs;
pub use outbox::{OutboxArgs, OutboxCommand};
pub use send::SendArgs;
pub use status::StatusArgs;
pub use subscribers::{SubscriberAdd, SubscriberCommand};

use crate::config::Settings;

#[derive(Debug, Parser)]
#[command(
    name = "fanout",
    version,
    about = "Rate-limited webhook fan-out: the origin daemon and its client"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format on stderr: text (colour only on a terminal) or json (one object per line)
    #[arg(long, env = "FANOUT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// The command as the user typed its names (`subscriber add`): what an error names.
    #[arg(skip)]
    pub invoked: String,
}

impl Cli {
    /// The command line, read as [`Cli::command_hiding_values`] describes it.
    pub fn parse_hiding_values() -> Cli {
        use clap::FromArgMatches as _;
        let matches = Cli::command_hiding_values().get_matches();
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        cli.invoked = invoked(&matches);
        cli
    }

    /// The command line's grammar with no variable's value shown in any help: `--help` names
    /// each variable an option reads (`[env: FANOUT_API_TOKEN]`) but never prints what it holds
    /// (tokens, keys, database URLs with their passwords), for every option of every command,
    /// also those added later.
    pub fn command_hiding_values() -> clap::Command {
        fn hide(c: clap::Command) -> clap::Command {
            c.mut_args(|a| a.hide_env_values(true))
                .mut_subcommands(hide)
        }
        hide(<Cli as clap::CommandFactory>::command())
    }
}

/// The names of the subcommands matched, `subscriber add` (pure).
fn invoked(matches: &clap::ArgMatches) -> String {
    let mut names = Vec::new();
    let mut at = matches;
    while let Some((name, sub)) = at.subcommand() {
        names.push(name);
        at = sub;
    }
    names.join(" ")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
// Parsed once at start-up and matched once: boxing `serve`'s settings would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Run the daemon: ledger, dispatcher and HTTP API
    Serve(ServeArgs),
    /// Manage subscribers
    Subscriber {
        #[command(subcommand)]
        command: SubscriberCommand,
    },
    /// Manage customers (owners of subscribers) and links to their portal
    Customer {
        #[command(subcommand)]
        command: CustomerCommand,
    },
    /// Send events (one JSON object, an array, or one object per line) from a file or stdin
    Send(SendArgs),
    /// List deliveries, e.g. `fanout deliveries --status dead`
    Deliveries(DeliveriesArgs),
    /// Replay one delivery by id, or every delivery matching the filters (dead by default)
    Replay(ReplayArgs),
    /// Per-subscriber status: lane, rate, backlog, sent, dead, disabled, pause and breaker,
    /// last error
    Status(StatusArgs),
    /// Receive webhooks here: a temporary subscriber pointing at a receiver on 127.0.0.1 that
    /// verifies, prints, forwards (--forward-to) or fails on purpose (--status, --fail-rate,
    /// --retry-after, --delay); Ctrl-C removes it
    Listen(ListenArgs),
    /// Started by `fanout listen`: removes its subscriber if it dies without doing so
    #[command(hide = true)]
    ListenReaper(ReaperArgs),
    /// Flood a URL, or the edge for one subscriber, for a bounded time; report accepted,
    /// throttled and the achieved rate
    Load(LoadArgs),
    /// Write a consistent copy of a SQLite ledger, also while its daemon serves; leases in
    /// the copy return to pending (a PostgreSQL ledger is backed up with pg_dump)
    Backup(BackupArgs),
    /// Work on a ledger directly (the daemon stopped)
    Ledger {
        #[command(subcommand)]
        command: LedgerCommand,
    },
    /// The producer's outbox in its own database: `schema` prints its DDL, `init` creates it
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// Make the daemon's customers and subscribers what a YAML file declares: prints the plan
    /// (create, change, remove), then carries it out
    Apply(ApplyArgs),
    /// Print the daemon's customers and subscribers in `fanout apply`'s YAML format (no
    /// secrets)
    Export(ExportArgs),
    /// GET the daemon's /healthz: exit 0 when it answers 200, 1 otherwise (for a container's
    /// HEALTHCHECK)
    Healthcheck(HealthcheckArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML config file (same names as the flags, with underscores) [default: none, flags and
    /// environment only]
    #[arg(long, env = "FANOUT_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: Settings,
}

impl ServeArgs {
    /// Flags and environment over the config file.
    pub fn merged(self) -> Result<Settings, crate::config::ConfigError> {
        let file = match &self.config {
            Some(p) => Settings::from_file(p)?,
            None => Settings::default(),
        };
        Ok(self.settings.over(file))
    }
}

/// Run a client command: each is its own function below.
pub async fn run_client(command: Command) -> Result<(), ClientError> {
    match command {
        Command::Serve(_) => Err(ClientError::Input("serve is not a client command".into())),
        Command::Customer { command } => customers::run_customer(command).await,
        Command::Subscriber { command } => subscribers::run(command).await,
        Command::Send(a) => send::send(a).await,
        Command::Deliveries(a) => deliveries::deliveries(a).await,
        Command::Replay(a) => deliveries::replay(a).await,
        Command::Status(a) => status::status(a).await,
        Command::Load(a) => load::load(a).await,
        Command::Listen(a) => listen::listen(a).await,
        Command::ListenReaper(a) => listen::reap(a).await,
        Command::Ledger {
            command: LedgerCommand::Copy(a),
        } => ledger::ledger_copy(a).await,
        Command::Backup(a) => ledger::backup(a),
        Command::Outbox { command } => outbox::run(command).await,
        Command::Healthcheck(a) => healthcheck::healthcheck(a).await,
        Command::Apply(a) => apply::apply(a).await,
        Command::Export(a) => apply::export(a).await,
    }
}

/// Ctrl-C or SIGTERM, whichever comes first: how `fanout serve` and `fanout listen` are asked
/// to stop.
pub async fn stop_signal() {
    stop_signal_armed().await
}

/// [`stop_signal`] with its handlers installed now, not when the future is first polled: a
/// signal that arrives after this returns is caught, even before anything awaits it. (`fanout
/// listen` says "Ready." before its server polls its shutdown; a Ctrl-C right after that line
/// killed it without removing its subscriber.)
pub fn stop_signal_armed() -> impl std::future::Future<Output = ()> + Send {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let interrupt = signal(SignalKind::interrupt()).ok();
        let terminate = signal(SignalKind::terminate()).ok();
        async move {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = wait(interrupt) => {},
                _ = wait(terminate) => {},
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The long help of `fanout <path…>`.
    fn help(path: &[&str]) -> String {
        use clap::CommandFactory as _;
        let mut cli = Cli::command();
        let mut cmd = &mut cli;
        for name in path {
            cmd = cmd.find_subcommand_mut(name).expect("a subcommand");
        }
        cmd.render_long_help().to_string()
    }

    /// The part of a help text about `flag`: from its line to the next flag's.
    fn flag_help<'a>(help: &'a str, flag: &str) -> &'a str {
        let at = help
            .find(&format!("  {flag}"))
            .unwrap_or_else(|| panic!("{flag} not in\n{help}"));
        let rest = &help[at + 2..];
        let end = rest.find("\n  -").unwrap_or(rest.len());
        &rest[..end]
    }

    /// Each flag says what it is: `fanout listen`'s way to the daemon reads as the daemon's
    /// (`--daemon-listen`; `--listen` is still taken), `subscriber add`'s limits say what they
    /// limit and their default, and `ledger copy` names everything it copies.
    #[test]
    fn help_says_what_each_flag_is() {
        let listen = help(&["listen"]);
        let daemon = flag_help(&listen, "--daemon-listen <HOST:PORT>");
        assert!(daemon.contains("The daemon's"), "{daemon}");
        assert!(!listen.contains("--listen <"), "{listen}");
        assert!(
            Cli::try_parse_from(["fanout", "listen", "--listen", "127.0.0.1:1"]).is_ok(),
            "the old flag"
        );
        let add = help(&["subscriber", "add"]);
        for (flag, default) in [
            ("--rate-per-sec <RATE_PER_SEC>", "[default: 100]"),
            ("--burst <BURST>", "[default: the rate"),
            ("--max-in-flight <MAX_IN_FLIGHT>", "[default: 16]"),
            ("--timeout-ms <TIMEOUT_MS>", "[default: 10000]"),
        ] {
            let text = flag_help(&add, flag);
            assert!(text.contains(default), "{text}");
            assert!(
                text.lines().count() > 1,
                "{flag} has no description: {text}"
            );
        }
        let copy = help(&["ledger", "copy"]);
        for what in [
            "customers",
            "portal",
            "signing keys",
            "sequence",
            "ordering keys",
            "filters",
        ] {
            assert!(copy.contains(what), "{what} not in\n{copy}");
        }
    }

    /// Every flag and argument of every command says what it is, and every optional flag
    /// that takes a value says what holds without it: clap's `[default: …]`, or the same
    /// words in its description (`[default: the rate, rounded up]`, `[default: unchanged]`).
    #[test]
    fn every_flag_has_a_description_and_a_default() {
        fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
            for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let text = a
                    .get_long_help()
                    .or(a.get_help())
                    .map(|h| h.to_string())
                    .unwrap_or_default();
                if text.trim().is_empty() {
                    out.push(format!("fanout {path} {id}: no description"));
                }
                let takes_value = matches!(
                    a.get_action(),
                    clap::ArgAction::Set | clap::ArgAction::Append
                );
                let positional = a.get_long().is_none() && a.get_short().is_none();
                if takes_value
                    && !positional
                    && !a.is_required_set()
                    && a.get_default_values().is_empty()
                    && !text.contains("[default: ")
                {
                    out.push(format!("fanout {path} {id}: no default"));
                }
            }
            for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
                let sub_path = format!("{path} {}", sub.get_name()).trim().to_string();
                walk(sub, &sub_path, out);
            }
        }
        use clap::CommandFactory as _;
        let mut cli = Cli::command();
        cli.build();
        let mut missing = Vec::new();
        walk(&cli, "", &mut missing);
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    #[test]
    fn the_invoked_command_is_the_names_typed() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["fanout", "subscriber", "add", "s", "https://x.example/"],
                "subscriber add",
            ),
            (&["fanout", "status"], "status"),
            (
                &["fanout", "ledger", "copy", "--from", "a", "--to", "b"],
                "ledger copy",
            ),
        ];
        for (words, expected) in cases {
            let m = Cli::command_hiding_values()
                .try_get_matches_from(*words)
                .expect("parses");
            assert_eq!(invoked(&m), *expected);
        }
    }

    #[test]
    fn load_arguments() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("fanout").chain(args.iter().copied()))
                .map(|c| match c.command {
                    Command::Load(l) => (l.workers, l.duration.as_millis(), l.rate, l.burst),
                    other => panic!("{other:?}"),
                })
                .map_err(|e| e.kind())
        };
        assert_eq!(
            parse(&[
                "load",
                "--url",
                "http://127.0.0.1:1/",
                "--duration",
                "1500ms"
            ]),
            Ok((8, 1500, 10.0, 20))
        );
        assert_eq!(
            parse(&[
                "load",
                "--edge-url",
                "http://127.0.0.1:8787",
                "--edge-key",
                "whsec_x",
                "--rate",
                "5",
                "--burst",
                "7",
                "--workers",
                "2"
            ]),
            Ok((2, 10_000, 5.0, 7))
        );
        assert!(parse(&["load"]).is_err(), "a target is required");
        assert!(
            parse(&["load", "--edge-url", "http://127.0.0.1:8787"]).is_err()
                || std::env::var("FANOUT_EDGE_KEY").is_ok()
        );
        assert!(parse(&["load", "--url", "http://x/", "--duration", "soon"]).is_err());
    }

    #[test]
    fn cli_parses() {
        Cli::command_check();
    }

    impl Cli {
        fn command_check() {
            use clap::CommandFactory;
            Cli::command().debug_assert();
            let cli = Cli::try_parse_from([
                "fanout",
                "serve",
                "--db",
                "x.db",
                "--allow-loopback",
                "--max-attempts",
                "3",
            ])
            .unwrap();
            match cli.command {
                Command::Serve(s) => {
                    assert_eq!(s.settings.allow_loopback, Some(true));
                    assert_eq!(s.settings.max_attempts, Some(3));
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

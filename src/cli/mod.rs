//! Command-line arguments: `run` (the default), `check`, `schema`, `openapi` and `demo`, and the commands that
//! drive a running proxy through its admin API (`routes`, `reload`, `keys`, `entities`,
//! `queue`; carried out in `admin` and `queue`, over `api`). [`process`] runs the one
//! given.

mod admin;
mod api;
mod demo;
mod dry_run;
pub mod process;
mod queue;

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::Overrides;
use crate::values::UpstreamUrl;

#[derive(Debug, Parser)]
#[command(
    name = "dedupe-proxy",
    version,
    about = "A webhook deduplication proxy: forwards each event to the application once"
)]
pub struct Cli {
    /// The YAML configuration file (for the admin commands: where to find the admin API
    /// and its token).
    #[arg(short, long, env = "DEDUPE_PROXY_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Without a subcommand, `run` with these arguments.
    #[command(flatten)]
    pub run: RunArgs,
}

impl Cli {
    /// Parses the command line, exiting with clap's message when it is wrong; `run`'s
    /// flags given before another command are refused (they would do nothing).
    pub fn parse_checked() -> Cli {
        use clap::{CommandFactory, FromArgMatches};
        let matches = Cli::command().get_matches();
        let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
        // `run`'s own flags, as clap knows them: given before another command, they
        // would do nothing.
        let run_flags = RunArgs::augment_args(clap::Command::new("run"));
        let command = matches.subcommand_name().filter(|name| *name != "run");
        let given = run_flags.get_arguments().find(|flag| {
            matches.value_source(flag.get_id().as_str())
                == Some(clap::parser::ValueSource::CommandLine)
        });
        if let (Some(command), Some(flag)) = (command, given) {
            Cli::command()
                .error(
                    clap::error::ErrorKind::ArgumentConflict,
                    format!(
                        "--{} is a flag of `run`, not of `{command}`",
                        flag.get_long().unwrap_or_default()
                    ),
                )
                .exit();
        }
        cli
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve until SIGTERM or SIGINT (the default).
    Run(RunArgs),
    /// Validate the configuration, print the resolved routes, exit 0 (valid) or 2.
    Check(CheckArgs),
    /// Show what the proxy would do with one request, without contacting the app or the
    /// store: the route, the signature's check, the key and where it came from, the
    /// answers. Exit status 0: a route takes it; 1: refused, or no route takes it; 2: the
    /// configuration or the request cannot be read.
    #[command(name = "try")]
    Try(TryArgs),
    /// Print the configuration file's JSON Schema, for editors (`config/schema.json`).
    Schema,
    /// Print the admin API's OpenAPI document (`docs/openapi.json`).
    Openapi,
    /// Run a self-contained demonstration: a sample app, the proxy, a burst of deliveries.
    Demo(DemoArgs),
    /// Print a running proxy's resolved routes.
    Routes(AdminArgs),
    /// Make a running proxy read its configuration file again.
    Reload(AdminArgs),
    /// Print a running proxy's scopes (where routes keep their keys) with their keys
    /// counted by state.
    Scopes(AdminArgs),
    /// List, inspect, expire, forget and clear a running proxy's keys, and resolve held
    /// ones.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Inspect or forget the newest version done for an entity (routes with `order:`).
    Entities {
        #[command(subcommand)]
        command: EntitiesCommand,
    },
    /// Watch, pause and resume queued routes (`delivery: queued`); list, inspect, replay
    /// and discard their dead letters.
    Queue {
        #[command(subcommand)]
        command: QueueCommand,
    },
}

/// Settings of the file that the command line overrides.
#[derive(Debug, Clone, Default, Args)]
pub struct FileOverrides {
    /// Listen here instead of the file's `listen`.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Forward to this application instead of the file's `upstream`.
    #[arg(long)]
    pub upstream: Option<UpstreamUrl>,
}

/// What `run` takes besides the configuration file.
#[derive(Debug, Clone, Default, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub file: FileOverrides,
    /// How many threads serve connections (default: one per CPU this process may use,
    /// which counts a cgroup CPU limit but not a node's other tenants).
    #[arg(long, env = "DEDUPE_PROXY_WORKERS")]
    pub workers: Option<NonZeroUsize>,
    /// Log lines as human-readable text or as JSON objects.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl RunArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            workers: self.workers,
            ..self.file.overrides()
        }
    }
}

impl FileOverrides {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen,
            upstream: self.upstream.clone(),
            workers: None,
        }
    }
}

/// What `check` takes besides the configuration file.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub file: FileOverrides,
    /// Check everything but the secrets' values: a secret's variable that is not set is
    /// listed, not refused (for a pipeline that holds no secrets; `run` still needs them).
    #[arg(long)]
    pub without_secrets: bool,
}

/// What `try` takes: a request file, a sample, or a request's parts.
#[derive(Debug, Clone, Args)]
pub struct TryArgs {
    /// A request as a plain HTTP message (request line, headers, blank line, body), `-`
    /// for standard input. A `# signed-at: TIME` line before it gives its signing time.
    #[arg(conflicts_with_all = ["sample", "path"])]
    pub request: Option<PathBuf>,
    /// A provider preset's sample delivery, shipped with the binary, by the preset's
    /// name (`stripe`, `github`, ...; an unknown name lists them).
    #[arg(long, conflicts_with = "path")]
    pub sample: Option<String>,
    /// The request's method (default: the file's or sample's, `POST` with `--path`).
    #[arg(short = 'X', long)]
    pub method: Option<String>,
    /// The request's path and query, to make a request from parts (`-H`, `-d`).
    #[arg(long)]
    pub path: Option<String>,
    /// A header, `Name: value`; replaces one of the same name in the request.
    #[arg(short = 'H', long = "header")]
    pub headers: Vec<String>,
    /// The body, or `@FILE` for a file's bytes; replaces the request's.
    #[arg(short = 'd', long = "data")]
    pub data: Option<String>,
    /// Judge a signature's timestamp as of this time (RFC 3339 or Unix seconds); default:
    /// the file's `# signed-at:`, else now.
    #[arg(long)]
    pub at: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// How many distinct events the simulated provider sends.
    #[arg(long, default_value_t = 200)]
    pub events: usize,
}

/// Where the admin API is and how its answers are printed.
#[derive(Debug, Clone, Args)]
pub struct AdminArgs {
    /// The admin API's URL (default: the configuration's `admin.listen`, else
    /// http://127.0.0.1:9091). Its token is read from the variable the configuration's
    /// `admin.token_env` names, else from DEDUPE_ADMIN_TOKEN.
    #[arg(long, env = "DEDUPE_ADMIN_URL")]
    pub admin: Option<String>,
    /// Print the API's JSON answer instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// A page of a route's live keys (every page with --all).
    List {
        /// The route whose keys to list.
        #[arg(long)]
        route: String,
        /// Only the keys starting with this.
        #[arg(long)]
        prefix: Option<String>,
        /// Only the keys in this state.
        #[arg(long, value_enum)]
        state: Option<KeyStateArg>,
        /// The most keys on a page (1 to 1000).
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1000))]
        limit: Option<u16>,
        #[command(flatten)]
        page: PageArgs,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// One key's state.
    Show {
        route: String,
        key: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Forget a done key, so that a redelivery runs the work again.
    Forget {
        route: String,
        key: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Move a done key's expiry, sooner or later: until then its deliveries are
    /// duplicates.
    #[command(group(clap::ArgGroup::new("when").required(true).args(["at", "within"])))]
    Expire {
        route: String,
        key: String,
        /// The new expiry, an RFC 3339 time (2030-01-01T00:00:00Z).
        #[arg(long)]
        at: Option<String>,
        /// The new expiry from now, a duration (48h).
        #[arg(long = "in")]
        within: Option<String>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Forget a scope's done keys, all or those starting with --prefix, so that their
    /// events run again; asks until the whole scope is done. Refused while any of them
    /// is in flight unless --force; held keys are left unless --force releases them.
    Clear {
        /// The scope (`dedupe-proxy scopes` lists them; a route's own is its name).
        scope: String,
        /// Only the keys starting with this.
        #[arg(long)]
        prefix: Option<String>,
        /// Clear though keys are in flight (they stay), and release held keys.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Resolve a held key: `done` (the work happened) or `release` (the next delivery
    /// runs it).
    Resolve {
        route: String,
        key: String,
        #[arg(long, value_enum)]
        outcome: Outcome,
        /// Only if the key is still held since this time (as `show` printed `held_at`).
        #[arg(long)]
        held_at: Option<String>,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Each queued route's counts: waiting, retrying, in flight, dead, the oldest's age.
    Status {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Stop delivering a route's jobs, on every replica (accepting goes on).
    Pause {
        route: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Deliver a paused route's jobs again.
    Resume {
        route: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// A page of a route's dead letters (every page with --all).
    Dead {
        route: String,
        #[command(flatten)]
        filter: DeadFilterArgs,
        /// The most jobs on a page (1 to 100).
        #[arg(long, value_parser = clap::value_parser!(u8).range(1..=100))]
        limit: Option<u8>,
        #[command(flatten)]
        page: PageArgs,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// One job, queued or dead, with every attempt kept.
    Show {
        route: String,
        key: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Make a dead letter due again now, for a new round of attempts.
    Replay {
        route: String,
        key: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Replay every dead letter the filter picks, in the background (prints its id).
    ReplayAll {
        route: String,
        #[command(flatten)]
        filter: DeadFilterArgs,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// A bulk replay's progress.
    Replays {
        id: u64,
        /// Cancel it (what it replayed stays replayed).
        #[arg(long)]
        cancel: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Discard a dead letter.
    Discard {
        route: String,
        key: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// Which page of a listing: the one after a cursor, or every page.
#[derive(Debug, Clone, Default, Args)]
pub struct PageArgs {
    /// The page after this cursor (the `next` a listing printed).
    #[arg(long)]
    pub after: Option<String>,
    /// Follow the cursor to the last page.
    #[arg(long)]
    pub all: bool,
}

/// Which dead letters a listing or a bulk replay picks.
#[derive(Debug, Clone, Default, Args)]
pub struct DeadFilterArgs {
    /// The app's last status.
    #[arg(long, value_parser = clap::value_parser!(u16).range(100..=599))]
    pub status: Option<u16>,
    /// Why they died.
    #[arg(long, value_enum)]
    pub reason: Option<DeadReasonArg>,
    /// Their keys' prefix.
    #[arg(long)]
    pub key_prefix: Option<String>,
    /// Dead at or after this time (RFC 3339).
    #[arg(long)]
    pub since: Option<String>,
    /// Dead before this time (RFC 3339).
    #[arg(long)]
    pub until: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeadReasonArg {
    /// The app answered a status that is not retried.
    #[value(name = "refused")]
    Refused,
    #[value(name = "max_attempts", alias = "max-attempts")]
    MaxAttempts,
    #[value(name = "max_age", alias = "max-age")]
    MaxAge,
}

impl DeadReasonArg {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReasonArg::Refused => "refused",
            DeadReasonArg::MaxAttempts => "max_attempts",
            DeadReasonArg::MaxAge => "max_age",
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum EntitiesCommand {
    /// The newest version done for an entity.
    Show {
        route: String,
        entity: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Forget an entity's newest version (a version far ahead made real events stale).
    Forget {
        route: String,
        entity: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KeyStateArg {
    /// As the API spells it; `in-flight` is taken too.
    #[value(name = "in_flight", alias = "in-flight")]
    InFlight,
    Done,
    Held,
}

impl KeyStateArg {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyStateArg::InFlight => "in_flight",
            KeyStateArg::Done => "done",
            KeyStateArg::Held => "held",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Outcome {
    Done,
    Release,
}

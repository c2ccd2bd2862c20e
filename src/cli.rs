//! Command-line arguments: `run` (the default), `check` and `demo`.

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
    about = "A webhook deduplication proxy: forwards each event to the application once",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Without a subcommand, `run` with these arguments.
    #[command(flatten)]
    pub run: ConfigArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve until SIGTERM or SIGINT (the default).
    Run(ConfigArgs),
    /// Validate the configuration, print the resolved routes, exit 0 (valid) or 2.
    Check(ConfigArgs),
    /// Run a self-contained demonstration: a sample app, the proxy, a burst of deliveries.
    Demo(DemoArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    /// The YAML configuration file.
    #[arg(short, long, env = "DEDUPE_PROXY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Listen here instead of the file's `listen`.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Forward to this application instead of the file's `upstream`.
    #[arg(long)]
    pub upstream: Option<UpstreamUrl>,
    /// How many threads serve connections (default: one per CPU this process may use,
    /// which counts a cgroup CPU limit but not a node's other tenants).
    #[arg(long, env = "DEDUPE_PROXY_WORKERS")]
    pub workers: Option<NonZeroUsize>,
    /// Log lines as human-readable text or as JSON objects.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl ConfigArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen,
            upstream: self.upstream.clone(),
            workers: self.workers,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// How many distinct events the simulated provider sends.
    #[arg(long, default_value_t = 200)]
    pub events: usize,
}

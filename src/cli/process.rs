//! The process behind the binary: parse the command line, set up logging, load the
//! configuration (exit 2 if it is invalid), and run until a shutdown signal; or check a
//! configuration, run the demonstration, or drive a running proxy's admin API.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::prelude::*;

use super::{CheckArgs, Cli, Command, LogFormat, RunArgs};
use crate::config::{Config, Overrides};
use crate::telemetry::Telemetry;
use crate::{log_text, redact};

/// Runs the command the command line names; its exit status.
pub fn main() -> ExitCode {
    let cli = Cli::parse_checked();
    let config = cli.config.as_deref();
    match cli.command.unwrap_or(Command::Run(cli.run)) {
        Command::Run(args) => serve(config, &args),
        Command::Check(args) => check(config, &args),
        Command::Try(args) => super::dry_run::run(config, &args),
        Command::Schema => {
            let schema = Config::schema();
            println!("{}", serde_json::to_string_pretty(&schema).expect("JSON"));
            ExitCode::SUCCESS
        }
        Command::Openapi => {
            let document = crate::admin::openapi_document();
            println!("{}", serde_json::to_string_pretty(&document).expect("JSON"));
            ExitCode::SUCCESS
        }
        Command::Demo(args) => {
            init_logging(LogFormat::Text, "warn", None);
            runtime().block_on(super::demo::run(&args))
        }
        admin => super::admin::run(config, admin),
    }
}

fn serve(path: Option<&Path>, args: &RunArgs) -> ExitCode {
    let config = match load(path, &args.overrides()) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let runtime = runtime();
    // Inside the runtime: the exporter's connections run on it.
    let telemetry = match runtime.block_on(async { Telemetry::start(config.telemetry.as_ref()) }) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("error: {}", redact::text(&error.to_string()));
            return ExitCode::from(2);
        }
    };
    init_logging(args.log_format, "info", telemetry.as_ref());
    let served = runtime.block_on(async {
        let shutdown = crate::shutdown::on_signal();
        crate::app::run(config, shutdown).await
    });
    if let Some(telemetry) = telemetry {
        // Said, since it may take a while after `dedupe-proxy stopped` (up to 5 s; 0.8 s
        // toward a collector that is not there).
        tracing::info!("exporting the last traces before exiting");
        // It blocks until the last spans are out, which the runtime's threads carry.
        runtime
            .block_on(async { tokio::task::spawn_blocking(|| telemetry.shutdown()).await })
            .ok();
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // Once: as a JSON log line where logs are read by machines, else as text.
            match args.log_format {
                LogFormat::Json => tracing::error!(%error, "dedupe-proxy failed"),
                LogFormat::Text => eprintln!("error: {}", redact::text(&error.to_string())),
            }
            ExitCode::FAILURE
        }
    }
}

fn check(path: Option<&Path>, args: &CheckArgs) -> ExitCode {
    let overrides = args.file.overrides();
    let (config, stood_in) = if args.without_secrets {
        crate::values::without_secrets(|| load(path, &overrides))
    } else {
        (load(path, &overrides), Vec::new())
    };
    let config = match config {
        Ok(config) => config,
        Err(code) => return code,
    };
    for warning in &config.warnings {
        eprintln!("warning: {warning}");
    }
    let resolved = serde_yaml::to_string(&config).expect("a configuration serializes");
    print!("{}", redact::text(&resolved));
    eprintln!(
        "{}: valid, {} route(s)",
        config.source.display(),
        config.routes.len()
    );
    if !stood_in.is_empty() {
        eprintln!(
            "not checked: the secrets of {} (not set or empty here; `run` needs them)",
            stood_in.join(", ")
        );
    }
    ExitCode::SUCCESS
}

/// Loads the configuration, or prints why not and gives exit status 2.
fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ExitCode> {
    let Some(path) = path else {
        eprintln!("error: no configuration: pass --config FILE or set DEDUPE_PROXY_CONFIG");
        return Err(ExitCode::from(2));
    };
    let config = Config::load(path, overrides).map_err(|error| {
        // One line per error, when the file has several.
        for line in error.to_string().lines() {
            eprintln!("error: {line}");
        }
        ExitCode::from(2)
    })?;
    redact::remember(config.secrets());
    Ok(config)
}

/// Logs to stderr as `format` says, filtered by `RUST_LOG`; with traces on, the proxy's
/// spans also go to the exporter, whatever `RUST_LOG` filters out of the log.
fn init_logging(format: LogFormat, default_filter: &str, telemetry: Option<&Telemetry>) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let log = tracing_subscriber::fmt::layer()
        .with_writer(redact::Stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let log = match format {
        LogFormat::Text => log.fmt_fields(log_text::QuotedFields).boxed(),
        LogFormat::Json => log.json().boxed(),
    };
    tracing_subscriber::registry()
        .with(log.with_filter(filter))
        .with(telemetry.map(Telemetry::layer))
        .init();
    log_panics();
}

/// A panic is written as a log line like any other (one JSON line with `--log-format
/// json`), so that a log pipeline reads it, with the thread it happened on.
fn log_panics() {
    std::panic::set_hook(Box::new(|panic| {
        let thread = std::thread::current();
        let message = match (
            panic.payload().downcast_ref::<&str>(),
            panic.payload().downcast_ref::<String>(),
        ) {
            (Some(text), _) => text.to_string(),
            (_, Some(text)) => text.clone(),
            _ => "(no message)".into(),
        };
        let location = panic
            .location()
            .map(ToString::to_string)
            .unwrap_or_default();
        // The panic's text under a name of its own: as `message` it would be the line's words.
        tracing::error!(thread = thread.name().unwrap_or("unnamed"), %location, panic = message, "a thread panicked");
    }));
}

/// The main runtime: it accepts connections and runs the background work (store start-up,
/// sweeps, reloads); the connections themselves run on the workers (`workers.rs`).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime")
}

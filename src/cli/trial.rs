//! `dedupe-proxy try`: a dry run of one request against a configuration file's routes
//! (see `dry_run`). The request comes from a file, a shipped sample or its parts; a
//! secret the environment does not set comes from the request's `# secret:` lines, else
//! the signature is reported unchecked.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use bytes::Bytes;
use http::{HeaderMap, Method};

use super::TryArgs;
use super::api::printable;
use crate::config::{Config, Overrides};
use crate::dry_run::message::{self, Written};
use crate::dry_run::{Verdict, judge};

pub fn run(config: Option<&Path>, args: &TryArgs) -> ExitCode {
    match trial(config, args) {
        Ok(code) => code,
        Err(error) => {
            for line in error.lines() {
                eprintln!("error: {}", printable(line));
            }
            ExitCode::from(2)
        }
    }
}

fn trial(config: Option<&Path>, args: &TryArgs) -> Result<ExitCode, String> {
    let path = config.ok_or("no configuration: pass --config FILE or set DEDUPE_PROXY_CONFIG")?;
    let written = request(args)?;
    let given = written.secrets.clone();
    let (loaded, stand_ins) =
        crate::values::with_given_secrets(given, || Config::load(path, &Overrides::default()));
    let config = loaded.map_err(|error| error.to_string())?;
    let now = written.judged_at(args.at.as_deref())?;
    let mut report = judge(&config.routing(), &written.request, now);
    for variable in &stand_ins.from_given {
        report.notes.push(format!(
            "{variable} is not set here: its value came from the request's `# secret:` line"
        ));
    }
    let checked = report
        .signature
        .as_ref()
        .is_some_and(|signature| matches!(signature.result, "verified" | "refused"));
    if checked && args.at.is_none() && written.signed_at.is_some() {
        report.notes.push(format!(
            "timestamps judged as of {} (the request's `# signed-at:`); `--at` judges them as of another time",
            crate::store::rfc3339(u64::try_from(now).unwrap_or(0).saturating_mul(1000))
        ));
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("a report is JSON")
        );
    } else {
        for line in report.to_string().lines() {
            println!("{}", printable(line));
        }
    }
    Ok(match report.verdict {
        Verdict::Taken => ExitCode::SUCCESS,
        Verdict::Refused | Verdict::Unmatched => ExitCode::from(1),
    })
}

/// The request to try: a file's, a sample's or one made of parts, with `-H` and `-d`
/// applied.
fn request(args: &TryArgs) -> Result<Written, String> {
    let mut written = match (&args.request, &args.sample, &args.path) {
        (Some(file), _, _) => message::parse(&read_file(file)?)?,
        (None, Some(sample), _) => message::parse(message::sample(sample)?.as_bytes())?,
        (None, None, Some(target)) => {
            let method = Method::from_bytes(args.method.as_bytes())
                .map_err(|_| format!("`{}` is not a method", args.method))?;
            Written {
                request: message::build(method, target, HeaderMap::new(), Bytes::new())?,
                signed_at: None,
                secrets: Vec::new(),
            }
        }
        (None, None, None) => {
            return Err(
                "no request: give a file (or - for standard input), --sample NAME, or --path with -H and -d".into(),
            );
        }
    };
    if let Some(data) = &args.data {
        let body = match data.strip_prefix('@') {
            Some(file) => read_file(Path::new(file))?,
            None => data.as_bytes().to_vec(),
        };
        let (head, _) = written.request.into_parts();
        let target = head.uri.to_string();
        let mut headers = head.headers;
        headers.remove(http::header::CONTENT_LENGTH);
        written.request = message::build(head.method, &target, headers, Bytes::from(body))?;
    }
    for line in &args.headers {
        let (name, value) = message::header(line)?;
        written.request.headers_mut().insert(name, value);
    }
    Ok(written)
}

/// A file's bytes (`-`: standard input), at most a dry run's limit.
fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    let limit = message::MESSAGE_MAX as u64 + 1;
    let read = if path == Path::new("-") {
        std::io::stdin().take(limit).read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path).and_then(|file| file.take(limit).read_to_end(&mut bytes))
    };
    read.map_err(|error| format!("{}: {error}", path.display()))?;
    Ok(bytes)
}

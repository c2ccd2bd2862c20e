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
use crate::config::StoreConfig;
use crate::config::{Config, Overrides};
use crate::dry_run::{Checked, Report, Verdict, judge};
use crate::http_file::{self, Written};

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
    // Only a shipped sample's test secret stands in: a file that brought its own secret
    // would only prove that it signed itself.
    let given = if args.sample.is_some() {
        written.secrets.clone()
    } else {
        Vec::new()
    };
    let (loaded, stand_ins) =
        crate::values::with_given_secrets(given, || Config::load(path, &Overrides::default()));
    let config = loaded.map_err(|error| error.to_string())?;
    let now = written.judged_at(args.at.as_deref())?;
    let mut report = judge(&config.routing(), &written.request, now);
    notes(&mut report, &written, &stand_ins, args.sample.is_some());
    if let (StoreConfig::Redis(redis), Some(key)) = (&config.store, report.key.as_mut())
        && let Some(store_key) = &mut key.store_key
    {
        store_key.insert_str(0, &redis.prefix);
    }
    if args.json {
        let json = serde_json::to_string_pretty(&report).expect("a report is JSON");
        println!("{json}");
    } else {
        for line in report.to_string().lines() {
            println!("{}", printable(line));
        }
    }
    Ok(match report.verdict {
        Verdict::Taken => ExitCode::SUCCESS,
        Verdict::Unverified | Verdict::Refused | Verdict::Unmatched => ExitCode::from(1),
    })
}

/// Where the secrets of the route's signature check came from, where that is not the
/// environment alone.
fn notes(
    report: &mut Report,
    written: &Written,
    stand_ins: &crate::values::StandIns,
    sample: bool,
) {
    let Some(signature) = &report.signature else {
        return;
    };
    let checked = matches!(signature.result, Checked::Verified | Checked::Refused);
    let mut notes = Vec::new();
    for variable in &signature.secrets {
        if stand_ins.from_given.contains(variable) {
            notes.push(format!(
                "{variable} is not set here: the sample's test secret (its `# secret:` line) stood in"
            ));
        } else if written.secrets.iter().any(|(name, _)| name == variable) {
            notes.push(if checked {
                format!("{variable} is set here: the request's `# secret:` line was not used")
            } else if !sample {
                format!("{variable}: a request file's `# secret:` lines are not read, only a shipped sample's: set the variable")
            } else {
                continue;
            });
        }
    }
    report.notes.extend(notes);
}

/// The request to try: a file's, a sample's or one made of parts, with `-H` and `-d`
/// applied.
fn request(args: &TryArgs) -> Result<Written, String> {
    let mut written = match (&args.request, &args.sample, &args.path) {
        (Some(file), _, _) => http_file::parse(&read_file(file)?)?,
        (None, Some(sample), _) => http_file::parse(http_file::sample(sample)?.as_bytes())?,
        (None, None, Some(target)) => Written {
            request: http_file::build(Method::POST, target, HeaderMap::new(), Bytes::new())?,
            signed_at: None,
            secrets: Vec::new(),
        },
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
        written.request = http_file::build(head.method, &target, headers, Bytes::from(body))?;
    }
    if let Some(method) = &args.method {
        *written.request.method_mut() = Method::from_bytes(method.as_bytes())
            .map_err(|_| format!("`{method}` is not a method"))?;
    }
    for line in &args.headers {
        let (name, value) = http_file::header(line)?;
        written.request.headers_mut().insert(name, value);
    }
    Ok(written)
}

/// A file's bytes (`-`: standard input), at most a dry run's limit.
fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    let limit = http_file::MESSAGE_MAX as u64 + 1;
    let read = if path == Path::new("-") {
        std::io::stdin().take(limit).read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path).and_then(|file| file.take(limit).read_to_end(&mut bytes))
    };
    read.map_err(|error| format!("{}: {error}", path.display()))?;
    Ok(bytes)
}

//! `dedupe-proxy try`: a dry run of one request against a configuration file's routes
//! (see `dry_run`). The request comes from a file, a shipped sample or its parts; a
//! secret the environment does not set comes from the request's `# secret:` lines, else
//! the signature is reported unchecked.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue, Method};

use super::TryArgs;
use super::api::printable;
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

/// The request to try: a file's, a sample's or one made of parts, with `-X`, `-H` and `-d`
/// applied. A file's or sample's head stays as written (no `Host` made up); `-d` replaces
/// its body and a `Content-Length` it has.
fn request(args: &TryArgs) -> Result<Written, String> {
    let body = match args.data.as_deref() {
        Some(data) => Some(Bytes::from(match data.strip_prefix('@') {
            Some(file) => read_file(Path::new(file))?,
            None => data.as_bytes().to_vec(),
        })),
        None => None,
    };
    let mut written = match (&args.request, &args.sample, &args.path) {
        (Some(file), _, _) => http_file::parse(&read_file(file)?)?,
        (None, Some(sample), _) => http_file::parse(http_file::sample(sample)?.as_bytes())?,
        (None, None, Some(target)) => {
            let body = body.clone().unwrap_or_default();
            Written {
                request: http_file::build(Method::POST, target, HeaderMap::new(), body)?,
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
    if let (Some(body), None) = (body, &args.path) {
        let headers = written.request.headers_mut();
        if headers.contains_key(CONTENT_LENGTH) {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        }
        *written.request.body_mut() = body;
    }
    if let Some(method) = &args.method {
        *written.request.method_mut() = Method::from_bytes(method.as_bytes())
            .map_err(|_| format!("`{method}` is not a method"))?;
    }
    for line in &args.headers {
        let (name, value) = http_file::header(line)?;
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING {
            return Err(format!(
                "-H cannot set {name}: -d sets the body and its length"
            ));
        }
        let headers = written.request.headers_mut();
        headers.insert(name, value);
        if headers.len() > http_file::HEADERS_MAX {
            return Err(format!("more than {} header lines", http_file::HEADERS_MAX));
        }
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

//! The admin commands: each sends requests to a running proxy's admin API and prints the
//! answers, as a table for people or as the API's JSON with `--json`. The API is found
//! by `--admin`, else by the configuration file's `admin.listen` (read without loading
//! the rest, so that no secret is needed), else at the default address; its token comes
//! from the variable `admin.token_env` names, else from `DEDUPE_ADMIN_TOKEN`.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Value, json};

use super::{AdminArgs, Command, EntitiesCommand, KeysCommand, Outcome};

/// The variable the token is read from when the configuration names none.
const DEFAULT_TOKEN_ENV: &str = "DEDUPE_ADMIN_TOKEN";

/// How long one request to the admin API may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest answer read (a page of 1 000 keys is about 300 KiB).
const MAX_ANSWER: usize = 16 << 20;

/// What a path segment escapes: all but RFC 3986's unreserved characters, and dots too,
/// so that no intermediary reads a key `..` as a dot segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'~');

/// Runs an admin command; exit 0 when the API did it, 1 when it refused or could not be
/// reached, 2 when the command itself is wrong.
pub fn run(config: Option<&Path>, command: Command) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    match runtime.block_on(carry_out(config, command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Api(message)) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Why a command did not do what it was asked.
enum Failure {
    /// The command's own arguments or configuration are wrong.
    Usage(String),
    /// The API refused, failed or could not be reached.
    Api(String),
}

async fn carry_out(config: Option<&Path>, command: Command) -> Result<(), Failure> {
    match command {
        Command::Routes(admin) => {
            let api = Api::find(config, &admin)?;
            let answer = api.call(Method::GET, "/v1/routes", None).await?;
            print(&admin, &answer, routes_table);
        }
        Command::Reload(admin) => {
            let api = Api::find(config, &admin)?;
            let answer = api
                .call(Method::POST, "/v1/reload", Some(json!({})))
                .await?;
            print(&admin, &answer, |answer| {
                let mut text = format!(
                    "reloaded: {} route(s)\n",
                    answer["routes"].as_u64().unwrap_or(0)
                );
                for setting in answer["restart_needed"].as_array().into_iter().flatten() {
                    let _ = writeln!(text, "restart needed for: {}", plain(setting));
                }
                text
            });
        }
        Command::Keys { command } => keys(config, command).await?,
        Command::Entities { command } => {
            let (method, route, entity, admin) = match command {
                EntitiesCommand::Show {
                    route,
                    entity,
                    admin,
                } => (Method::GET, route, entity, admin),
                EntitiesCommand::Forget {
                    route,
                    entity,
                    admin,
                } => (Method::DELETE, route, entity, admin),
            };
            let api = Api::find(config, &admin)?;
            let path = format!("/v1/entities/{}/{}", segment(&route), segment(&entity));
            let forgetting = method == Method::DELETE;
            let answer = api.call(method, &path, None).await?;
            if forgetting {
                let forgotten = json!({ "forgotten": { "route": route, "entity": entity } });
                print(&admin, &forgotten, |_| {
                    format!("forgotten: the newest version of {route}/{entity}\n")
                });
            } else {
                print(&admin, &answer, fields);
            }
        }
        Command::Run(_) | Command::Check(_) | Command::Demo(_) => {
            unreachable!("not an admin command")
        }
    }
    Ok(())
}

async fn keys(config: Option<&Path>, command: KeysCommand) -> Result<(), Failure> {
    match command {
        KeysCommand::List {
            route,
            state,
            limit,
            mut after,
            all,
            admin,
        } => {
            let api = Api::find(config, &admin)?;
            let mut first = true;
            loop {
                let mut query = form_urlencoded::Serializer::new(String::new());
                query.append_pair("route", &route);
                if let Some(state) = state {
                    query.append_pair("state", state.as_str());
                }
                if let Some(limit) = limit {
                    query.append_pair("limit", &limit.to_string());
                }
                if let Some(after) = &after {
                    query.append_pair("after", after);
                }
                let path = format!("/v1/keys?{}", query.finish());
                let answer = api.call(Method::GET, &path, None).await?;
                let next = answer["next"].as_str().map(str::to_owned);
                // Under --all, one table: headings once, no cursor to pass on.
                print(&admin, &answer, |answer| keys_table(answer, first, !all));
                first = false;
                if !all || next.is_none() {
                    break;
                }
                if next == after {
                    return Err(Failure::Api(format!(
                        "the listing's cursor did not move ({}): stopped",
                        next.unwrap_or_default()
                    )));
                }
                after = next;
            }
        }
        KeysCommand::Show { route, key, admin } => {
            let api = Api::find(config, &admin)?;
            let answer = api.call(Method::GET, &key_path(&route, &key), None).await?;
            print(&admin, &answer, fields);
        }
        KeysCommand::Forget { route, key, admin } => {
            let api = Api::find(config, &admin)?;
            api.call(Method::DELETE, &key_path(&route, &key), None)
                .await?;
            let forgotten = json!({ "forgotten": { "route": route, "key": key } });
            print(&admin, &forgotten, |_| {
                format!("forgotten: {route}/{key}\n")
            });
        }
        KeysCommand::Resolve {
            route,
            key,
            outcome,
            held_at,
            admin,
        } => {
            let api = Api::find(config, &admin)?;
            let outcome = match outcome {
                Outcome::Done => "done",
                Outcome::Release => "release",
            };
            let mut body = json!({ "outcome": outcome });
            if let Some(held_at) = held_at {
                body["held_at"] = json!(held_at);
            }
            let path = format!("{}/resolve", key_path(&route, &key));
            let answer = api.call(Method::POST, &path, Some(body)).await?;
            print(&admin, &answer, fields);
        }
    }
    Ok(())
}

/// A running proxy's admin API.
struct Api {
    /// `http://host:port`, without a trailing slash.
    base: String,
    token: Option<String>,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

impl Api {
    /// The API `admin` or the configuration file names, with its token.
    fn find(config: Option<&Path>, admin: &AdminArgs) -> Result<Api, Failure> {
        let written = match config {
            Some(path) => admin_section(path)?,
            None => AdminSection::default(),
        };
        let base = match (&admin.admin, written.listen) {
            (Some(url), _) => url.trim_end_matches('/').to_owned(),
            (None, Some(listen)) => format!("http://{listen}"),
            (None, None) => format!("http://{}", crate::config::default_admin_listen()),
        };
        let base = if base.contains("://") {
            base
        } else {
            format!("http://{base}")
        };
        if !base.starts_with("http://") {
            return Err(Failure::Usage(format!(
                "the admin API speaks plain HTTP (put it behind a TLS proxy to reach it from afar): {base}"
            )));
        }
        base.parse::<http::Uri>()
            .map_err(|error| Failure::Usage(format!("--admin {base}: {error}")))?;
        let variable = written.token_env.as_deref().unwrap_or(DEFAULT_TOKEN_ENV);
        let token = std::env::var(variable)
            .ok()
            .filter(|token| !token.is_empty());
        if written.token_env.is_some() && token.is_none() {
            return Err(Failure::Usage(format!(
                "the configuration's admin.token_env names {variable}, which is not set"
            )));
        }
        Ok(Api {
            base,
            token,
            client: Client::builder(TokioExecutor::new()).build_http(),
        })
    }

    /// Sends `method path` (with `body` as JSON) and returns the answer's JSON (`null`
    /// for an answer without a body), or the API's refusal as a failure.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Failure> {
        let mut request = Request::builder()
            .method(method.clone())
            .uri(format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = match body {
            Some(body) => {
                request = request.header(CONTENT_TYPE, "application/json");
                Bytes::from(body.to_string())
            }
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(body))
            .map_err(|error| Failure::Usage(format!("{method} {path}: {error}")))?;
        let unreachable = |error: &dyn std::fmt::Display| {
            Failure::Api(format!(
                "cannot reach the admin API at {}: {error} (is the proxy running? pass --admin URL or --config FILE)",
                self.base
            ))
        };
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|error| unreachable(&error))?;
            let (head, body) = response.into_parts();
            let body = Limited::new(body, MAX_ANSWER)
                .collect()
                .await
                .map_err(|error| Failure::Api(format!("the answer could not be read: {error}")))?
                .to_bytes();
            Ok::<_, Failure>((head.status, body))
        };
        let (status, body) = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| unreachable(&format!("no answer within {REQUEST_TIMEOUT:?}")))??;
        let answer: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).map_err(|_| {
                Failure::Api(format!(
                    "{method} {path}: the answer ({status}) is not JSON: is {} a dedupe-proxy admin port?",
                    self.base
                ))
            })?
        };
        if status.is_success() {
            return Ok(answer);
        }
        Err(Failure::Api(refusal(status, &answer)))
    }
}

/// An API refusal as one line: its detail, code and status.
fn refusal(status: StatusCode, answer: &Value) -> String {
    let detail = answer["detail"].as_str().unwrap_or("no detail");
    let code = answer["error"].as_str().unwrap_or("error");
    format!("{detail} ({code}, HTTP {})", status.as_u16())
}

/// The parts of a configuration's `admin:` the commands use.
#[derive(Default)]
struct AdminSection {
    listen: Option<String>,
    token_env: Option<String>,
}

/// `admin.listen` (an unspecified address read as loopback) and `admin.token_env` of the
/// configuration at `path`, read without checking the rest.
fn admin_section(path: &Path) -> Result<AdminSection, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| Failure::Usage(format!("{}: {error}", path.display())))?;
    let document: serde_yaml::Value = serde_yaml::from_str(&text).map_err(|error| {
        // The parser may quote a line of the file, a store URL's password with it.
        let error = crate::dsn::masked_anywhere(&error.to_string());
        Failure::Usage(format!("{}: {error}", path.display()))
    })?;
    let admin = &document["admin"];
    let listen = match admin["listen"].as_str() {
        Some(written) => {
            let address = crate::values::parse_listen(written).map_err(|reason| {
                Failure::Usage(format!("{}: admin.listen: {reason}", path.display()))
            })?;
            let ip = match address.ip() {
                ip if !ip.is_unspecified() => ip,
                std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            };
            Some(std::net::SocketAddr::new(ip, address.port()).to_string())
        }
        None => None,
    };
    Ok(AdminSection {
        listen,
        token_env: admin["token_env"].as_str().map(str::to_owned),
    })
}

fn key_path(route: &str, key: &str) -> String {
    format!("/v1/keys/{}/{}", segment(route), segment(key))
}

fn segment(text: &str) -> String {
    utf8_percent_encode(text, SEGMENT).to_string()
}

/// Prints `answer` as JSON with `--json`, else as `table` makes it.
fn print(admin: &AdminArgs, answer: &Value, table: impl Fn(&Value) -> String) {
    if admin.json {
        println!("{answer}");
    } else {
        print!("{}", table(answer));
    }
}

/// A JSON value as a cell: strings bare, nothing as `-`.
fn plain(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// One object's fields, a line each.
fn fields(answer: &Value) -> String {
    let Some(object) = answer.as_object() else {
        return format!("{}\n", plain(answer));
    };
    let width = object.keys().map(String::len).max().unwrap_or(0);
    let mut text = String::new();
    for (name, value) in object {
        let _ = writeln!(text, "{name:width$}  {}", plain(value));
    }
    text
}

/// A page of keys, under headings if `headings`, with the cursor of the next page if
/// `more`.
fn keys_table(answer: &Value, headings: bool, more: bool) -> String {
    let rows: Vec<Vec<String>> = answer["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|key| {
            let since = if key["state"] == "held" {
                &key["held_at"]
            } else {
                &key["completed_at"]
            };
            vec![
                plain(&key["key"]),
                plain(&key["state"]),
                plain(&key["upstream_status"]),
                plain(since),
                plain(&key["expires_at"]),
            ]
        })
        .collect();
    let mut text = table(
        &["KEY", "STATE", "UPSTREAM", "DONE/HELD AT", "EXPIRES"],
        &rows,
    );
    if !headings {
        text = text
            .split_once('\n')
            .map(|(_, rows)| rows.to_owned())
            .unwrap_or_default();
    }
    if let Some(next) = answer["next"].as_str().filter(|_| more) {
        let _ = writeln!(text, "more: --after {next}");
    }
    text
}

fn routes_table(answer: &Value) -> String {
    let rows: Vec<Vec<String>> = answer["routes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|route| {
            let matcher = route["match"]
                .as_object()
                .map(|fields| {
                    fields
                        .iter()
                        .filter(|(_, value)| !value.is_null())
                        .map(|(name, value)| format!("{name}={}", plain(value)))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            vec![
                plain(&route["name"]),
                matcher,
                plain(&route["key"]),
                plain(&route["upstream"]),
            ]
        })
        .collect();
    let mut text = table(&["NAME", "MATCH", "KEY", "UPSTREAM"], &rows);
    let _ = writeln!(text, "unmatched: {}", plain(&answer["unmatched"]));
    text
}

/// Rows under their headings, each column as wide as its widest cell.
fn table(headings: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headings.iter().map(|heading| heading.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (cell, width) in cells.zip(&widths) {
            let _ = write!(out, "{cell:width$}  ");
        }
        text.push_str(out.trim_end());
        text.push('\n');
    };
    line(&mut headings.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_escape_all_but_unreserved_characters() {
        assert_eq!(segment("evt_1-b~c"), "evt_1-b~c");
        assert_eq!(segment(".."), "%2E%2E");
        assert_eq!(segment("a/b?c#d e%"), "a%2Fb%3Fc%23d%20e%25");
    }

    #[test]
    fn tables_align_their_columns() {
        let rows = vec![vec!["evt_long".to_owned(), "done".to_owned()]];
        assert_eq!(
            table(&["KEY", "STATE"], &rows),
            "KEY       STATE\nevt_long  done\n"
        );
    }
}

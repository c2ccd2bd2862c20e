//! The admin API as the commands reach it: where it is (`--admin`, else the configuration
//! file's `admin.listen`, read without loading the rest so that no secret is needed, else
//! the default address), its token (from the variable `admin.token_env` names, else
//! `DEDUPE_ADMIN_TOKEN`), one request and its answer or refusal, and answers printed as
//! tables for people or as the API's JSON with `--json`.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use super::AdminArgs;

/// The variable the token is read from when the configuration names none.
const DEFAULT_TOKEN_ENV: &str = "DEDUPE_ADMIN_TOKEN";

/// How long one request to the admin API may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) use crate::target::path_segment;

/// The largest answer read (a page of 1 000 keys is about 300 KiB).
const MAX_ANSWER: usize = 16 << 20;

/// Why a command did not do what it was asked.
pub(super) enum Failure {
    /// The command's own arguments or configuration are wrong.
    Usage(String),
    /// The API refused, failed or could not be reached.
    Api(String),
}

/// A running proxy's admin API.
pub(super) struct Api {
    /// `http://host:port`, without a trailing slash.
    base: String,
    token: Option<String>,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

impl Api {
    /// The API `admin` or the configuration file names, with its token.
    pub(super) fn find(config: Option<&Path>, admin: &AdminArgs) -> Result<Api, Failure> {
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
    pub(super) async fn call(
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
    printable(&format!("{detail} ({code}, HTTP {})", status.as_u16()))
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
            // The proxy listens on an address of its own machine; a file naming another
            // would have the operator's token sent there.
            if !ip.is_loopback() && !is_own_address(ip) {
                return Err(Failure::Usage(format!(
                    "{}: admin.listen names {ip}, which is not an address of this machine; the token is sent only there: pass --admin URL to reach an API elsewhere",
                    path.display()
                )));
            }
            Some(std::net::SocketAddr::new(ip, address.port()).to_string())
        }
        None => None,
    };
    Ok(AdminSection {
        listen,
        token_env: admin["token_env"].as_str().map(str::to_owned),
    })
}

/// Whether `ip` is an address of one of this machine's interfaces. Asked of the interfaces
/// rather than tried by binding it: `ip_nonlocal_bind` lets any address be bound.
fn is_own_address(ip: std::net::IpAddr) -> bool {
    let Ok(interfaces) = nix::ifaddrs::getifaddrs() else {
        return false;
    };
    interfaces
        .filter_map(|interface| interface.address)
        .any(|address| {
            let v4 = address
                .as_sockaddr_in()
                .map(|a| std::net::IpAddr::V4(a.ip()));
            let v6 = address
                .as_sockaddr_in6()
                .map(|a| std::net::IpAddr::V6(a.ip()));
            v4.or(v6) == Some(ip)
        })
}

/// Prints `answer` as JSON with `--json`, else as `table` makes it.
pub(super) fn print(admin: &AdminArgs, answer: &Value, table: impl Fn(&Value) -> String) {
    if admin.json {
        println!("{answer}");
    } else {
        print!("{}", table(answer));
    }
}

/// An answer read as the type the API writes it as; `None` for another shape (a proxy of
/// another version), which is then printed field by field.
pub(super) fn typed<T: serde::de::DeserializeOwned>(answer: &Value) -> Option<T> {
    T::deserialize(answer).ok()
}

/// A JSON value as a cell: strings bare, nothing as `-`.
pub(super) fn plain(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(text) => printable(text),
        // A request's headers, an answer's: sender text as much as any string.
        other => printable(&other.to_string()),
    }
}

/// `text` with every character a terminal would act on, or that reorders or hides part
/// of a line, shown as `\u{fffd}`: what the API answers may come from senders and apps.
pub(crate) fn printable(text: &str) -> String {
    crate::misleading::replaced(text)
}

/// Fetches a listing's pages from `after` on (`path` makes each request's path from the
/// cursor): one page, or with `all` each page until `next` is null. `show` prints each,
/// told whether it is the first. A cursor seen before stops it: such a listing would
/// never end.
pub(super) async fn pages(
    api: &Api,
    mut after: Option<String>,
    all: bool,
    path: impl Fn(Option<&str>) -> String,
    mut show: impl FnMut(&Value, bool),
) -> Result<(), Failure> {
    let mut seen: HashSet<String> = after.iter().cloned().collect();
    let mut first = true;
    loop {
        let answer = api.call(Method::GET, &path(after.as_deref()), None).await?;
        show(&answer, first);
        first = false;
        let Some(next) = answer["next"].as_str().filter(|_| all) else {
            return Ok(());
        };
        if !seen.insert(next.to_owned()) {
            return Err(Failure::Api(format!(
                "the listing's cursor came back ({}): stopped",
                printable(next)
            )));
        }
        after = Some(next.to_owned());
    }
}

/// One page of a listing as a table: under its headings if `headings` (under `--all`,
/// only the first page has them), then the cursor of the next page if `more`.
pub(super) fn page_table(
    names: &[&str],
    rows: &[Vec<String>],
    answer: &Value,
    headings: bool,
    more: bool,
) -> String {
    let mut text = table(names, rows);
    if !headings {
        text = text
            .split_once('\n')
            .map(|(_, rows)| rows.to_owned())
            .unwrap_or_default();
    }
    if let Some(next) = answer["next"].as_str().filter(|_| more) {
        let _ = writeln!(text, "{}", after_hint(next));
    }
    text
}

/// A listing's cursor as a line to paste into a shell: `--after '<cursor>'`, quoted (a
/// cursor holds a key, which may hold spaces or `$(...)`).
fn after_hint(next: &str) -> String {
    format!("more: --after '{}'", printable(next).replace('\'', r"'\''"))
}

/// One object's fields, a line each.
pub(super) fn fields(answer: &Value) -> String {
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

/// Rows under their headings, each column as wide as its widest cell. A cell holding a
/// space (a key may) is quoted, but for the last column's: unquoted, `a  done  200` would
/// read as three columns.
pub(super) fn table(headings: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let last = row.len().saturating_sub(1);
            row.iter()
                .enumerate()
                .map(|(at, cell)| {
                    if at < last && cell.contains(char::is_whitespace) {
                        format!("{cell:?}")
                    } else {
                        cell.clone()
                    }
                })
                .collect()
        })
        .collect();
    let rows = rows.as_slice();
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
        assert_eq!(path_segment("evt_1-b~c"), "evt_1-b~c");
        assert_eq!(path_segment(".."), "%2E%2E");
        assert_eq!(path_segment("a/b?c#d e%"), "a%2Fb%3Fc%23d%20e%25");
    }

    #[test]
    fn what_a_terminal_acts_on_is_not_printed() {
        assert_eq!(
            printable("a\u{1b}[31mb\u{202e}c\nd"),
            "a\u{fffd}[31mb\u{fffd}c\u{fffd}d"
        );
        assert_eq!(
            after_hint("0001x$(rm -rf /)'y"),
            r"more: --after '0001x$(rm -rf /)'\''y'"
        );
    }

    #[test]
    fn tables_align_their_columns() {
        let rows = vec![vec!["evt_long".to_owned(), "done".to_owned()]];
        assert_eq!(
            table(&["KEY", "STATE"], &rows),
            "KEY       STATE\nevt_long  done\n"
        );
        let forged = vec![vec!["a  done  200".to_owned(), "in_flight".to_owned()]];
        assert_eq!(
            table(&["KEY", "STATE"], &forged),
            "KEY             STATE\n\"a  done  200\"  in_flight\n"
        );
    }

    #[test]
    fn nested_values_are_made_printable_too() {
        // JSON escapes C0 itself; C1 (CSI as one character) and bidi pass through it.
        let headers = serde_json::json!({ "user-agent": "x\u{202e}y\u{9b}31m\u{1b}]52;c;A\u{7}" });
        assert_eq!(
            plain(&headers),
            "{\"user-agent\":\"x\u{fffd}y\u{fffd}31m\\u001b]52;c;A\\u0007\"}"
        );
    }
}

//! The admin commands `routes`, `reload`, `scopes`, `keys` and `entities`: each sends requests to a
//! running proxy's admin API ([`super::api`]) and prints the answers.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use http::Method;
use serde_json::{Value, json};

use super::api::{Api, Failure, fields, page_table, pages, path_segment, plain, print, table};
use super::api::{printable, typed};
use super::{AdminArgs, Command, EntitiesCommand, KeyStateArg, KeysCommand, Outcome};
use crate::admin::answers::{Cleared, KeyPage, KeyStateName, Reloaded, Scopes};

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
                let Some(reloaded) = typed::<Reloaded>(answer) else {
                    return fields(answer);
                };
                let mut text = format!("reloaded: {} route(s)\n", reloaded.routes);
                for setting in &reloaded.restart_needed {
                    let _ = writeln!(text, "restart needed for: {}", printable(setting));
                }
                text
            });
        }
        Command::Scopes(admin) => {
            let api = Api::find(config, &admin)?;
            let answer = api.call(Method::GET, "/v1/scopes", None).await?;
            print(&admin, &answer, scopes_table);
        }
        Command::Keys { command } => keys(config, command).await?,
        Command::Queue { command } => super::queue::carry_out(config, command).await?,
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
            let path = format!(
                "/v1/entities/{}/{}",
                path_segment(&route),
                path_segment(&entity)
            );
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
        Command::Run(_)
        | Command::Check(_)
        | Command::Try(_)
        | Command::Schema
        | Command::Openapi
        | Command::Demo(_) => {
            unreachable!("not an admin command")
        }
    }
    Ok(())
}

async fn keys(config: Option<&Path>, command: KeysCommand) -> Result<(), Failure> {
    match command {
        KeysCommand::List {
            route,
            prefix,
            state,
            limit,
            page,
            admin,
        } => {
            let api = Api::find(config, &admin)?;
            let path =
                |after: Option<&str>| keys_path(&route, prefix.as_deref(), state, limit, after);
            // Under --all, one table: headings once, no cursor to pass on.
            pages(&api, page.after, page.all, path, |answer, first| {
                print(&admin, answer, |answer| {
                    keys_table(answer, first, !page.all)
                });
            })
            .await?;
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
        KeysCommand::Expire {
            route,
            key,
            at,
            within,
            admin,
        } => expire(config, &route, &key, at, within, &admin).await?,
        KeysCommand::Clear {
            scope,
            prefix,
            force,
            admin,
        } => clear(config, &scope, prefix, force, &admin).await?,
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

/// `keys expire`: a done key's new expiry, `at` a time or `within` a duration from now.
async fn expire(
    config: Option<&Path>,
    route: &str,
    key: &str,
    at: Option<String>,
    within: Option<String>,
    admin: &AdminArgs,
) -> Result<(), Failure> {
    let api = Api::find(config, admin)?;
    let body = match (at, within) {
        (Some(at), _) => json!({ "expires_at": at }),
        (None, within) => json!({ "expires_in": within }),
    };
    let answer = api
        .call(Method::PATCH, &key_path(route, key), Some(body))
        .await?;
    print(admin, &answer, fields);
    Ok(())
}

/// `keys clear`: asks the API to clear until it answers that the clearing is complete
/// (one request works for a bounded time), and prints what all the requests did.
async fn clear(
    config: Option<&Path>,
    scope: &str,
    prefix: Option<String>,
    force: bool,
    admin: &AdminArgs,
) -> Result<(), Failure> {
    let api = Api::find(config, admin)?;
    let path = format!("/v1/scopes/{}/clear", path_segment(scope));
    let mut body = json!({ "prefix": prefix.unwrap_or_default(), "force": force });
    let mut all: Option<Cleared> = None;
    // Each answer that is not complete says where to go on from; the counts add up.
    let all = loop {
        let answer = api.call(Method::POST, &path, Some(body.clone())).await?;
        let Some(part) = typed::<Cleared>(&answer) else {
            let answer = printable(&answer.to_string());
            return Err(Failure::Api(format!(
                "an answer of another shape: {answer}"
            )));
        };
        let sum = match all.take() {
            None => part,
            Some(earlier) => Cleared {
                removed: earlier.removed + part.removed,
                released: earlier.released + part.released,
                held_left: earlier.held_left + part.held_left,
                in_flight_left: earlier.in_flight_left + part.in_flight_left,
                ..part
            },
        };
        match &sum.next {
            Some(next) if !sum.complete && body["after"] != *next => {
                body["after"] = json!(next);
                all = Some(sum);
            }
            _ => break sum,
        }
    };
    let complete = all.complete;
    print(admin, &serde_json::to_value(all).expect("JSON"), fields);
    if !complete {
        return Err(Failure::Api(
            "the clearing is not complete: the proxy gave no cursor to go on from, or the same one twice".into(),
        ));
    }
    Ok(())
}

/// `GET /v1/keys` with the arguments of `keys list` given, and the cursor `after`.
fn keys_path(
    route: &str,
    prefix: Option<&str>,
    state: Option<KeyStateArg>,
    limit: Option<u16>,
    after: Option<&str>,
) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("route", route);
    if let Some(prefix) = prefix {
        query.append_pair("prefix", prefix);
    }
    if let Some(state) = state {
        query.append_pair("state", state.as_str());
    }
    if let Some(limit) = limit {
        query.append_pair("limit", &limit.to_string());
    }
    if let Some(after) = after {
        query.append_pair("after", after);
    }
    format!("/v1/keys?{}", query.finish())
}

fn key_path(route: &str, key: &str) -> String {
    format!("/v1/keys/{}/{}", path_segment(route), path_segment(key))
}

/// A page of keys, under headings if `headings`, with the cursor of the next page if
/// `more`.
fn keys_table(answer: &Value, headings: bool, more: bool) -> String {
    let Some(page) = typed::<KeyPage>(answer) else {
        return fields(answer);
    };
    let rows: Vec<Vec<String>> = page
        .keys
        .iter()
        .map(|key| {
            let since = if key.state == KeyStateName::Held {
                &key.held_at
            } else {
                &key.completed_at
            };
            vec![
                printable(&key.key),
                plain(&json!(key.state)),
                plain(&json!(key.upstream_status)),
                plain(&json!(since)),
                plain(&json!(key.expires_at)),
            ]
        })
        .collect();
    let names = ["KEY", "STATE", "UPSTREAM", "DONE/HELD AT", "EXPIRES"];
    page_table(&names, &rows, answer, headings, more)
}

fn scopes_table(answer: &Value) -> String {
    let Some(scopes) = typed::<Scopes>(answer) else {
        return fields(answer);
    };
    let rows: Vec<Vec<String>> = scopes
        .scopes
        .iter()
        .map(|scope| {
            let counted = |count: u64| match scope.counted_all {
                true => count.to_string(),
                false => format!("{count}+"),
            };
            vec![
                printable(&scope.scope),
                printable(&scope.routes.join(",")),
                counted(scope.keys.in_flight),
                counted(scope.keys.done),
                counted(scope.keys.held),
            ]
        })
        .collect();
    table(&["SCOPE", "ROUTES", "IN FLIGHT", "DONE", "HELD"], &rows)
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

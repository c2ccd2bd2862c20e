//! The `queue` commands: a queued route's counts, pause and resume, and its dead letters
//! (listed, shown, replayed one by one or in bulk, discarded), through the admin API's
//! `/v1/queue` and `/v1/replays`.

use std::path::Path;

use http::Method;
use serde_json::{Value, json};

use super::api::{Api, Failure, fields, page_table, pages, path_segment, plain, print, table};
use super::api::{printable, typed};
use super::{DeadFilterArgs, PageArgs, QueueCommand};
use crate::admin::answers::{DeadLetterPage, JobDetail, QueueList, ReplayProgress};

pub(super) async fn carry_out(config: Option<&Path>, command: QueueCommand) -> Result<(), Failure> {
    match command {
        QueueCommand::Status { admin } => {
            let api = Api::find(config, &admin)?;
            let answer = api.call(Method::GET, "/v1/queue", None).await?;
            print(&admin, &answer, status_table);
        }
        QueueCommand::Pause { route, admin } => {
            let api = Api::find(config, &admin)?;
            let path = format!("{}/pause", route_path(&route));
            let answer = api.call(Method::POST, &path, Some(json!({}))).await?;
            print(&admin, &answer, |_| format!("paused: {route}\n"));
        }
        QueueCommand::Resume { route, admin } => {
            let api = Api::find(config, &admin)?;
            let path = format!("{}/resume", route_path(&route));
            let answer = api.call(Method::POST, &path, Some(json!({}))).await?;
            print(&admin, &answer, |_| format!("resumed: {route}\n"));
        }
        QueueCommand::Dead {
            route,
            filter,
            limit,
            page,
            admin,
        } => {
            let api = Api::find(config, &admin)?;
            dead_letters(&api, &route, &filter, limit, page, &admin).await?;
        }
        QueueCommand::Show { route, key, admin } => {
            let api = Api::find(config, &admin)?;
            let answer = api.call(Method::GET, &job_path(&route, &key), None).await?;
            print(&admin, &answer, job_fields);
        }
        QueueCommand::Replay { route, key, admin } => {
            let api = Api::find(config, &admin)?;
            let path = format!("{}/replay", job_path(&route, &key));
            let answer = api.call(Method::POST, &path, Some(json!({}))).await?;
            print(&admin, &answer, |_| format!("replayed: {route}/{key}\n"));
        }
        QueueCommand::ReplayAll {
            route,
            filter,
            admin,
        } => {
            let api = Api::find(config, &admin)?;
            let path = format!(
                "{}/replays?{}",
                route_path(&route),
                filter_query(&filter).finish()
            );
            let answer = api.call(Method::POST, &path, Some(json!({}))).await?;
            print(&admin, &answer, |answer| {
                let Some(started) = typed::<ReplayProgress>(answer) else {
                    return fields(answer);
                };
                let id = started.id;
                format!("replay {id} started (watch: dedupe-proxy queue replays {id})\n")
            });
        }
        QueueCommand::Replays { id, cancel, admin } => {
            let api = Api::find(config, &admin)?;
            replay_progress(&api, id, cancel, &admin).await?;
        }
        QueueCommand::Discard { route, key, admin } => {
            let api = Api::find(config, &admin)?;
            api.call(Method::DELETE, &job_path(&route, &key), None)
                .await?;
            let discarded = json!({ "discarded": { "route": route, "key": key } });
            print(&admin, &discarded, |_| {
                format!("discarded: {route}/{key}\n")
            });
        }
    }
    Ok(())
}

/// Prints a bulk replay's progress, or cancels it.
async fn replay_progress(
    api: &Api,
    id: u64,
    cancel: bool,
    admin: &super::AdminArgs,
) -> Result<(), Failure> {
    let path = format!("/v1/replays/{id}");
    if cancel {
        let answer = api.call(Method::DELETE, &path, None).await?;
        print(admin, &answer, |_| format!("cancelling: replay {id}\n"));
    } else {
        let answer = api.call(Method::GET, &path, None).await?;
        print(admin, &answer, fields);
    }
    Ok(())
}

/// Prints a page of a route's dead letters, or every page under one heading with `all`.
async fn dead_letters(
    api: &Api,
    route: &str,
    filter: &DeadFilterArgs,
    limit: Option<u8>,
    page: PageArgs,
    admin: &super::AdminArgs,
) -> Result<(), Failure> {
    let path = |after: Option<&str>| {
        let mut query = filter_query(filter);
        if let Some(limit) = limit {
            query.append_pair("limit", &limit.to_string());
        }
        if let Some(after) = after {
            query.append_pair("after", after);
        }
        format!("{}/dead?{}", route_path(route), query.finish())
    };
    pages(api, page.after, page.all, path, |answer, first| {
        print(admin, answer, |answer| dead_table(answer, first, !page.all));
    })
    .await
}

fn route_path(route: &str) -> String {
    format!("/v1/queue/{}", path_segment(route))
}

fn job_path(route: &str, key: &str) -> String {
    format!("{}/jobs/{}", route_path(route), path_segment(key))
}

/// The filter as the API's query takes it.
fn filter_query(filter: &DeadFilterArgs) -> form_urlencoded::Serializer<'static, String> {
    let mut query = form_urlencoded::Serializer::new(String::new());
    let status = filter.status.map(|status| status.to_string());
    for (name, value) in [
        ("status", status.as_deref()),
        ("reason", filter.reason.map(|reason| reason.as_str())),
        ("key_prefix", filter.key_prefix.as_deref()),
        ("since", filter.since.as_deref()),
        ("until", filter.until.as_deref()),
    ] {
        if let Some(value) = value {
            query.append_pair(name, value);
        }
    }
    query
}

fn status_table(answer: &Value) -> String {
    let Some(list) = typed::<QueueList>(answer) else {
        return fields(answer);
    };
    let rows: Vec<Vec<String>> = list
        .routes
        .iter()
        .map(|route| {
            let age = route
                .oldest_age_seconds
                .map_or_else(|| "-".to_owned(), |age| format!("{age}s"));
            vec![
                printable(&route.route),
                route.paused.to_string(),
                route.waiting.to_string(),
                route.retrying.to_string(),
                route.in_flight.to_string(),
                route.dead.to_string(),
                age,
            ]
        })
        .collect();
    table(
        &[
            "ROUTE",
            "PAUSED",
            "WAITING",
            "RETRYING",
            "IN FLIGHT",
            "DEAD",
            "OLDEST",
        ],
        &rows,
    )
}

/// A page of dead letters, under headings if `headings`, with the cursor of the next page
/// if `more`.
fn dead_table(answer: &Value, headings: bool, more: bool) -> String {
    let Some(page) = typed::<DeadLetterPage>(answer) else {
        return fields(answer);
    };
    let rows: Vec<Vec<String>> = page
        .jobs
        .iter()
        .map(|job| {
            vec![
                printable(&job.key),
                plain(&json!(job.dead_because)),
                plain(&json!(job.last_status)),
                job.attempts.to_string(),
                plain(&json!(job.dead_at)),
            ]
        })
        .collect();
    let names = ["KEY", "WHY", "STATUS", "ATTEMPTS", "DEAD AT"];
    page_table(&names, &rows, answer, headings, more)
}

/// The start of an app's answer, as one cell (`plain` has made it printable).
fn answer_cell(answer: &str) -> String {
    const SHOWN: usize = 120;
    match answer.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &answer[..cut]),
        None => answer.to_owned(),
    }
}

/// A job's fields, then its attempts as a table.
fn job_fields(answer: &Value) -> String {
    let Some(job) = typed::<JobDetail>(answer) else {
        return fields(answer);
    };
    let mut shown = answer.clone();
    if let Some(fields) = shown.as_object_mut() {
        fields.remove("history");
    }
    let mut text = fields(&shown);
    let rows: Vec<Vec<String>> = job
        .history
        .iter()
        .map(|attempt| {
            vec![
                printable(&attempt.at),
                plain(&json!(attempt.status)),
                attempt.latency_ms.to_string(),
                // The app's answer, on one line and without control characters (a
                // terminal would act on them).
                answer_cell(&printable(&attempt.answer)),
            ]
        })
        .collect();
    text.push('\n');
    text.push_str(&table(&["ATTEMPT AT", "STATUS", "MS", "ANSWER"], &rows));
    text
}

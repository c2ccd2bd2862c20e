//! `dedupe-proxy demo`: a self-contained show in one process. It starts a sample
//! application that fails some first attempts, the proxy on a temporary store, and a
//! simulated provider that sends every event from several senders at once, retries until
//! acknowledged and replays each event afterwards; then it prints what happened.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::DemoArgs;
use crate::body::{ProxyBody, full};
use crate::config::{Config, Overrides};

/// Senders that deliver each event at the same moment, as a provider's retry storm does.
const SENDERS_PER_EVENT: usize = 3;
/// Events in progress at once.
const EVENTS_AT_ONCE: usize = 32;
/// Every how-many-th event the sample app fails on its first attempt.
const FLAKY_EVERY: usize = 5;

pub async fn run(args: &DemoArgs) -> ExitCode {
    match demonstrate(args.events).await {
        Ok(report) => {
            print!("{report}");
            if report.lost() == 0 && report.extra_executions() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("demo failed: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The sample application: does the "work" for an event (counts it) and answers 200,
/// except that it answers 500 without working on the first attempt of flaky events.
#[derive(Default)]
struct SampleApp {
    attempts: Mutex<HashMap<String, usize>>,
    executions: Mutex<HashMap<String, usize>>,
}

impl SampleApp {
    async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<ProxyBody> {
        let body = request
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let id = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|event| event["id"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let attempt = {
            let mut attempts = self.attempts.lock().expect("demo lock");
            let count = attempts.entry(id.clone()).or_default();
            *count += 1;
            *count
        };
        // Some work that takes a moment, so that concurrent duplicates overlap it.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let flaky = id.trim_start_matches("evt_").parse::<usize>().unwrap_or(0) % FLAKY_EVERY == 0;
        let mut response = Response::new(full(r#"{"ok":true}"#));
        if flaky && attempt == 1 {
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        } else {
            *self
                .executions
                .lock()
                .expect("demo lock")
                .entry(id)
                .or_default() += 1;
        }
        response
    }
}

/// What the simulated provider saw.
#[derive(Default)]
struct Report {
    events: usize,
    deliveries: usize,
    by_outcome: HashMap<String, usize>,
    acknowledged: usize,
    executions: HashMap<String, usize>,
}

impl Report {
    fn outcome(&self, name: &str) -> usize {
        self.by_outcome.get(name).copied().unwrap_or(0)
    }

    fn executed_events(&self) -> usize {
        self.executions.values().filter(|&&count| count > 0).count()
    }

    /// Events never acknowledged, or acknowledged without the app having done the work.
    fn lost(&self) -> usize {
        (self.events - self.acknowledged)
            + (self.acknowledged - self.executed_events().min(self.acknowledged))
    }

    fn extra_executions(&self) -> usize {
        self.executions
            .values()
            .map(|&count| count.saturating_sub(1))
            .sum()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rows = [
            ("events", self.events),
            ("deliveries sent", self.deliveries),
            ("forwarded, app succeeded", self.outcome("forwarded")),
            ("forwarded, app failed (released)", self.outcome("released")),
            ("duplicates answered", self.outcome("duplicate")),
            ("in flight, asked to retry", self.outcome("in-flight")),
            ("upstream executions", self.executions.values().sum()),
            ("events acknowledged", self.acknowledged),
            ("extra executions", self.extra_executions()),
            ("events lost", self.lost()),
        ];
        writeln!(
            f,
            "\n{} events, each sent by {SENDERS_PER_EVENT} senders at once, retried until acknowledged, then replayed;",
            self.events
        )?;
        writeln!(
            f,
            "the sample app fails the first attempt of every {FLAKY_EVERY}th event.\n"
        )?;
        for (label, value) in rows {
            writeln!(f, "  {label:<34} {value:>6}")?;
        }
        Ok(())
    }
}

/// Serves the sample app over HTTP/1.1 until `stop`.
async fn serve_app(listener: TcpListener, app: Arc<SampleApp>, stop: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of descriptors, say: a moment for some to close.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let app = Arc::clone(&app);
        let service = hyper::service::service_fn(move |request| {
            let app = Arc::clone(&app);
            async move { Ok::<_, std::convert::Infallible>(app.handle(request).await) }
        });
        tokio::spawn(
            hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
        );
    }
}

async fn demonstrate(events: usize) -> Result<Report, Box<dyn std::error::Error>> {
    let app = Arc::new(SampleApp::default());
    let stop_app = CancellationToken::new();
    let app_listener = TcpListener::bind("127.0.0.1:0").await?;
    let app_addr = app_listener.local_addr()?;
    tokio::spawn(serve_app(app_listener, Arc::clone(&app), stop_app.clone()));

    let data = tempfile::tempdir()?;
    let config = demo_config(app_addr, data.path())?;
    let proxy = crate::start(config).await?;
    let proxy_addr = proxy.proxy_addr;
    println!(
        "sample app on {app_addr}, dedupe-proxy on {proxy_addr}, store in {}",
        data.path().display()
    );

    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let limit = Arc::new(Semaphore::new(EVENTS_AT_ONCE));
    let mut providers = Vec::new();
    for event in 0..events {
        let (client, limit) = (client.clone(), Arc::clone(&limit));
        providers.push(tokio::spawn(async move {
            let _turn = limit.acquire_owned().await.expect("semaphore open");
            provide(&client, proxy_addr, &format!("evt_{event}")).await
        }));
    }
    let mut report = Report {
        events,
        ..Report::default()
    };
    for provider in providers {
        let (acknowledged, outcomes) = provider.await?;
        report.acknowledged += usize::from(acknowledged);
        report.deliveries += outcomes.len();
        for outcome in outcomes {
            *report.by_outcome.entry(outcome).or_default() += 1;
        }
    }
    proxy.shutdown().await?;
    stop_app.cancel();
    report.executions = app.executions.lock().expect("demo lock").clone();
    Ok(report)
}

fn demo_config(app: SocketAddr, data: &Path) -> Result<Config, crate::config::ConfigError> {
    let yaml = format!(
        r#"
listen: 127.0.0.1:0
upstream: http://{app}
admin: {{ listen: 127.0.0.1:0 }}
store: {{ sled: {{ path: "{}", durability: fsync }} }}
routes:
  - name: demo
    match: {{ method: POST, path: /webhooks/demo }}
    key: "{{json:/id}}"
    retry_after: 1s
"#,
        data.join("db").display()
    );
    Config::parse(&yaml, Path::new("<demo>"), &Overrides::default())
}

/// One event's provider: several senders at once, each retrying until acknowledged,
/// then one replay. Returns whether the event was acknowledged and every outcome seen.
async fn provide(
    client: &Client<HttpConnector, Full<Bytes>>,
    proxy: SocketAddr,
    id: &str,
) -> (bool, Vec<String>) {
    let body = Bytes::from(format!(r#"{{"id":"{id}","type":"invoice.paid"}}"#));
    let mut senders = JoinSet::new();
    for _ in 0..SENDERS_PER_EVENT {
        let (client, body) = (client.clone(), body.clone());
        senders.spawn(async move { deliver_until_acknowledged(&client, proxy, body).await });
    }
    let mut outcomes = Vec::new();
    let mut acknowledged = true;
    while let Some(sender) = senders.join_next().await {
        let (acked, seen) = sender.unwrap_or_default();
        acknowledged &= acked;
        outcomes.extend(seen);
    }
    let (_, replay) = send(client, proxy, body).await;
    outcomes.extend(replay);
    (acknowledged, outcomes)
}

async fn deliver_until_acknowledged(
    client: &Client<HttpConnector, Full<Bytes>>,
    proxy: SocketAddr,
    body: Bytes,
) -> (bool, Vec<String>) {
    let mut outcomes = Vec::new();
    for _ in 0..50 {
        let (status, outcome) = send(client, proxy, body.clone()).await;
        outcomes.extend(outcome);
        if status.is_some_and(|status| status.is_success()) {
            return (true, outcomes);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (false, outcomes)
}

async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    proxy: SocketAddr,
    body: Bytes,
) -> (Option<StatusCode>, Option<String>) {
    let request = Request::post(format!("http://{proxy}/webhooks/demo"))
        .header("content-type", "application/json")
        .body(Full::new(body))
        .expect("a valid request");
    match client.request(request).await {
        Ok(response) => {
            let outcome = response
                .headers()
                .get("dedupe-status")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned);
            let status = response.status();
            let _ = response.into_body().collect().await;
            (Some(status), outcome)
        }
        Err(_) => (None, None),
    }
}

//! OpenTelemetry traces from the real binary, received by a real OTLP receiver in the test
//! (the protobuf export decoded, over `http/protobuf` and over `grpc`): a span per
//! delivery continuing the sender's `traceparent`, with children for verify, claim,
//! forward and record; the route, `Dedupe-Status` and the key's hash as attributes, never
//! the key or the body; the trace passed on to the app; the trace's ID in the delivery's
//! log line; and a collector that never answers neither slows nor fails a delivery, its
//! spans dropped and counted instead.

use crate::support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use support::*;

/// What a receiver got: every span, with its resource's service name.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<(String, Span)>>>);

impl Received {
    fn take(&self, request: ExportTraceServiceRequest) {
        let mut spans = self.0.lock().unwrap();
        for resource in request.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|resource| &resource.attributes)
                .find(|attribute| attribute.key == "service.name")
                .and_then(|attribute| text(attribute.value.as_ref()?.value.as_ref()?))
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.push((service.clone(), span));
                }
            }
        }
    }

    fn spans(&self) -> Vec<(String, Span)> {
        self.0.lock().unwrap().clone()
    }

    /// Waits until a span named `name` arrives.
    async fn span(&self, name: &str) -> (String, Span) {
        let started = Instant::now();
        loop {
            if let Some(found) = self.spans().into_iter().find(|(_, span)| span.name == name) {
                return found;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "no `{name}` span; got {:?}",
                self.spans()
                    .iter()
                    .map(|(_, span)| &span.name)
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::StringValue(text) => Some(text.clone()),
        Value::IntValue(number) => Some(number.to_string()),
        _ => None,
    }
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|attribute| attribute.key == key)
        .and_then(|attribute| text(attribute.value.as_ref()?.value.as_ref()?))
}

/// An OTLP receiver over HTTP: `POST /v1/traces`, protobuf.
async fn http_receiver() -> (SocketAddr, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Received::default();
    let taking = received.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let taking = taking.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let taking = taking.clone();
                    async move {
                        assert_eq!(request.uri().path(), "/v1/traces");
                        let body = request.into_body().collect().await.unwrap().to_bytes();
                        taking.take(ExportTraceServiceRequest::decode(body).unwrap());
                        let answer = ExportTraceServiceResponse::default().encode_to_vec();
                        let mut response = hyper::Response::new(Full::new(Bytes::from(answer)));
                        response.headers_mut().insert(
                            "content-type",
                            http::HeaderValue::from_static("application/x-protobuf"),
                        );
                        Ok::<_, std::convert::Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, received)
}

struct Grpc(Received);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.take(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP receiver over gRPC (the collector's `TraceService`).
async fn grpc_receiver() -> (SocketAddr, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Received::default();
    let service = TraceServiceServer::new(Grpc(received.clone()));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (addr, received)
}

const SECRET: &str = "telemetry-secret";
const KEY: &str = "evt_private_42";
const BODY_MARK: &str = "card-4242";
/// The sender's trace and span.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SENDER_SPAN: &str = "00f067aa0ba902b7";

/// A signed route `hooks`, and `telemetry` if given.
fn config(upstream: SocketAddr, dir: &std::path::Path, telemetry: &str) -> std::path::PathBuf {
    let path = dir.join("config.yaml");
    let text = format!(
        r#"listen: 127.0.0.1:0
upstream: http://{upstream}
admin: {{ listen: 127.0.0.1:0 }}
store: {{ sled: {{ path: "{}" }} }}
{telemetry}routes:
  - name: hooks
    match: {{ method: POST, path: /hooks }}
    key: "{{json:/id}}"
    verify: {{ hmac: {{ secret_env: HOOK_SECRET, header: X-Signature }} }}
  - name: loose
    match: {{ method: POST, path: /loose }}
    key: "{{json:/id}}"
    on_missing_key: forward
"#,
        dir.join("data").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// The binary on the signed route, exporting to `collector` as the environment says,
/// with `env` besides.
fn exporting_binary(
    upstream: &Upstream,
    dir: &std::path::Path,
    collector: SocketAddr,
    env: &[(&str, &str)],
) -> Binary {
    let endpoint = format!("http://{collector}");
    let mut all = vec![
        ("HOOK_SECRET", SECRET),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
    ];
    all.extend_from_slice(env);
    Binary::start_with_env(&config(upstream.addr, dir, ""), &all)
}

/// Posts a signed event `id` carrying the sender's `traceparent`.
async fn deliver(proxy: SocketAddr, id: &str) -> Reply {
    use hmac::{KeyInit, Mac};
    let body = format!(r#"{{"id":"{id}","card":"{BODY_MARK}"}}"#);
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let signature = hex::encode(mac.finalize().into_bytes());
    let traceparent = format!("00-{TRACE}-{SENDER_SPAN}-01");
    let headers = [
        ("content-type", "application/json"),
        ("x-signature", signature.as_str()),
        ("traceparent", traceparent.as_str()),
    ];
    send(proxy, "POST", "/hooks", &headers, body).await
}

/// A delivery's spans as the receiver got them: the delivery continues the sender's
/// trace, each step is its child, the app got the forward's context, and nothing shows
/// the key or the body.
async fn check_one_delivery(received: &Received, upstream: &Upstream, service: &str) {
    let (exported_by, delivery) = received.span("delivery").await;
    assert_eq!(exported_by, service);
    assert_eq!(hex::encode(&delivery.trace_id), TRACE);
    assert_eq!(hex::encode(&delivery.parent_span_id), SENDER_SPAN);
    assert_eq!(attribute(&delivery, "route").as_deref(), Some("hooks"));
    assert_eq!(
        attribute(&delivery, "dedupe.status").as_deref(),
        Some("forwarded")
    );
    assert_eq!(
        attribute(&delivery, "http.response.status_code").as_deref(),
        Some("200")
    );
    let hash = hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(KEY)[..16]);
    assert_eq!(attribute(&delivery, "dedupe.key_hash"), Some(hash));
    let mut forward = None;
    for step in ["verify", "claim", "forward", "record"] {
        let (_, span) = received.span(step).await;
        assert_eq!(span.trace_id, delivery.trace_id, "{step}");
        assert_eq!(span.parent_span_id, delivery.span_id, "{step}'s parent");
        if step == "forward" {
            forward = Some(span);
        }
    }
    for (_, span) in received.spans() {
        let shown = format!("{span:?}");
        assert!(!shown.contains(KEY), "{} shows the key: {shown}", span.name);
        assert!(
            !shown.contains(BODY_MARK),
            "{} shows the body: {shown}",
            span.name
        );
    }
    let app = &upstream.received()[0];
    let passed_on = app.headers["traceparent"].to_str().unwrap();
    let forward = forward.unwrap();
    assert_eq!(
        passed_on,
        format!("00-{TRACE}-{}-01", hex::encode(&forward.span_id)),
        "the app's spans join the trace under the forward"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_are_traced_over_http_protobuf_from_the_environment() {
    let (collector, received) = http_receiver().await;
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let binary = exporting_binary(
        &upstream,
        dir.path(),
        collector,
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "webhooks-edge"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let reply = deliver(binary.addr, KEY).await;
    assert_eq!(reply.dedupe(), "forwarded");
    check_one_delivery(&received, &upstream, "webhooks-edge").await;
    // The delivery's log line carries the trace's ID.
    let logged = binary.log_entry("delivery answered").unwrap();
    assert_eq!(logged["span"]["trace_id"], TRACE, "{logged}");

    // Forwarded without a claim (no key), it is still the delivery's forward; a
    // `tracestate` too long to continue is not passed on.
    let traceparent = format!("00-{TRACE}-{SENDER_SPAN}-01");
    let long_state = format!("vendor={}", "x".repeat(600));
    let headers = [
        ("content-type", "application/json"),
        ("traceparent", traceparent.as_str()),
        ("tracestate", long_state.as_str()),
    ];
    let unkeyed = send(binary.addr, "POST", "/loose", &headers, "{}").await;
    assert_eq!(unkeyed.dedupe(), "unkeyed");
    let app = &upstream.received()[1];
    let passed_on = app.headers["traceparent"].to_str().unwrap();
    assert!(
        passed_on.starts_with(&format!("00-{TRACE}-")),
        "{passed_on}"
    );
    assert!(
        !passed_on.contains(SENDER_SPAN),
        "the proxy's span: {passed_on}"
    );
    assert_eq!(app.headers.get("tracestate"), None);
    let forwards: Vec<_> = received
        .spans()
        .into_iter()
        .filter(|(_, span)| span.name == "forward")
        .collect();
    let started = Instant::now();
    while received
        .spans()
        .iter()
        .filter(|(_, span)| span.name == "forward")
        .count()
        < 2
    {
        assert!(started.elapsed() < Duration::from_secs(15), "{forwards:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_are_traced_over_grpc_from_the_configuration() {
    let (collector, received) = grpc_receiver().await;
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let telemetry = format!(
        "telemetry: {{ otlp_endpoint: \"http://{collector}\", protocol: grpc, service_name: configured-name, sample_ratio: 1 }}\n"
    );
    let binary = Binary::start_with_env(
        &config(upstream.addr, dir.path(), &telemetry),
        &[("HOOK_SECRET", SECRET), ("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let reply = deliver(binary.addr, KEY).await;
    assert_eq!(reply.dedupe(), "forwarded");
    check_one_delivery(&received, &upstream, "configured-name").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_slows_no_delivery_and_its_spans_are_counted() {
    // Takes connections, reads nothing, answers nothing.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector = silent.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let holding = Arc::clone(&held);
    tokio::spawn(async move {
        while let Ok((stream, _)) = silent.accept().await {
            holding.lock().unwrap().push(stream);
        }
    });
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let binary = exporting_binary(
        &upstream,
        dir.path(),
        collector,
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "8"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
        ],
    );
    // 60 deliveries, five spans each, against exports that never end before their timeout.
    for n in 0..60 {
        let started = Instant::now();
        let reply = deliver(binary.addr, &format!("evt_{n}")).await;
        assert_eq!(reply.dedupe(), "forwarded", "{n}");
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{n}: {:?}",
            started.elapsed()
        );
    }
    let text = send(binary.admin, "GET", "/metrics", &[], "").await.body;
    let dropped: u64 = text
        .lines()
        .find_map(|line| {
            line.strip_prefix("dedupe_trace_spans_dropped_total ")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no dropped-span counter in:\n{text}"));
    // Of 300 spans, the queue (8) and the batch stuck in its export are kept; the rest
    // is dropped.
    assert!(dropped >= 250, "{dropped}");
    let admin = binary.admin;
    eventually(
        Duration::from_secs(10),
        "a failed export counted",
        || async move {
            let text = send(admin, "GET", "/metrics", &[], "").await.body;
            text.lines().any(|line| {
                line.strip_prefix("dedupe_trace_exports_failed_total ")
                    .and_then(|count| count.parse::<u64>().ok())
                    .is_some_and(|count| count >= 1)
            })
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_nothing_is_traced_and_traceparent_passes_through() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let binary = Binary::start_with_env(
        &config(upstream.addr, dir.path(), ""),
        &[("HOOK_SECRET", SECRET)],
    );
    assert_eq!(deliver(binary.addr, KEY).await.dedupe(), "forwarded");
    let app = &upstream.received()[0];
    assert_eq!(
        app.headers["traceparent"],
        format!("00-{TRACE}-{SENDER_SPAN}-01").as_str(),
        "untouched"
    );
    let logged = binary.log_entry("delivery answered").unwrap();
    assert!(logged["span"].get("trace_id").is_none(), "{logged}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sampler_in_the_environment_is_followed() {
    let (collector, received) = http_receiver().await;
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let binary = exporting_binary(
        &upstream,
        dir.path(),
        collector,
        &[
            ("OTEL_TRACES_SAMPLER", "always_off"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    for n in 0..5 {
        assert_eq!(
            deliver(binary.addr, &format!("evt_{n}")).await.dedupe(),
            "forwarded"
        );
    }
    // A graceful stop sends whatever is queued.
    let mut binary = binary;
    binary.signal("TERM");
    binary.wait(Duration::from_secs(15));
    assert!(received.spans().is_empty(), "{:?}", received.spans().len());
}

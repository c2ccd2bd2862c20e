//! OpenTelemetry traces: off unless `telemetry:` or the standard `OTEL_*` environment asks
//! for them. Each delivery is a span (`delivery`) with children for its steps (`verify`,
//! `claim`, `forward`, `record`), continuing a sender's W3C `traceparent` and passed on to
//! the app, exported over OTLP (`http/protobuf` or `grpc`) by a batch processor on a
//! thread of its own.
//!
//! Export never holds a delivery up: a span ends into a bounded queue, and one that finds
//! it full is dropped and counted (`dedupe_trace_spans_dropped_total`). Only the proxy's
//! own spans are exported, never log events, and never a key or a body: a delivery's key
//! is stripped from its span, which carries the key's hash instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry::Context;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_http::{HeaderExtractor, HeaderInjector, HttpError};
use opentelemetry_otlp::{SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider, SpanData, SpanProcessor,
};
use sha2::{Digest, Sha256};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::registry::LookupSpan;

use crate::config::{OtlpProtocol, TelemetryConfig};
use crate::values::OtlpEndpoint;

/// Whether spans are exported: the proxy makes its step spans and reads `traceparent`
/// only then, so that a proxy without traces pays nothing for them.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The default of `OTEL_BSP_MAX_QUEUE_SIZE`: spans waiting for export at most.
const QUEUE_SIZE: usize = 2048;

/// How long one export may take, unless `OTEL_EXPORTER_OTLP_TIMEOUT` says otherwise.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The most of a collector's answer read: as the exporter's own clients.
const ANSWER_LIMIT: usize = 4 << 20;

/// The longest `tracestate` continued: a sender's may run to 32 members of 512 bytes,
/// copied into every span and passed on to the app.
const TRACESTATE_LIMIT: usize = 512;

/// The tracer's name, and the default service name.
const NAME: &str = "dedupe-proxy";

/// Whether traces are on: what the proxy adds for them (step spans, `traceparent` read
/// and passed on) costs nothing when they are off.
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A span for a step of a delivery, under the current one; none when traces are off.
macro_rules! step_span {
    ($name:literal) => {
        if $crate::telemetry::enabled() {
            tracing::info_span!($name)
        } else {
            tracing::Span::none()
        }
    };
}
pub(crate) use step_span;

/// Why traces could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTEL_EXPORTER_OTLP_PROTOCOL `{0}` is not supported: use http/protobuf or grpc")]
    Protocol(String),
    #[error(
        "{0} `{1}` must be a plain http:// URL with a host and no password (TLS belongs to the collector beside the proxy)"
    )]
    Endpoint(&'static str, String),
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(String),
}

/// The running trace pipeline.
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Starts exporting as `config`, else the `OTEL_*` environment, says; `None` when
    /// neither names an endpoint, or `OTEL_SDK_DISABLED` is `true`. Runs inside the
    /// runtime that the exporter's connections then use.
    pub fn start(config: Option<&TelemetryConfig>) -> Result<Option<Telemetry>, TelemetryError> {
        let env = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        if env("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true"))
            || env("OTEL_TRACES_EXPORTER").is_some_and(|value| value == "none")
        {
            return Ok(None);
        }
        let configured = config.and_then(|config| config.otlp_endpoint.clone());
        let from_env = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .map(|url| ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url))
            .or_else(|| {
                env("OTEL_EXPORTER_OTLP_ENDPOINT").map(|url| ("OTEL_EXPORTER_OTLP_ENDPOINT", url))
            });
        if configured.is_none() && from_env.is_none() {
            return Ok(None);
        }
        if let Some((name, url)) = &from_env
            && configured.is_none()
            && url.parse::<OtlpEndpoint>().is_err()
        {
            return Err(TelemetryError::Endpoint(
                name,
                crate::dsn::masked(url).into_owned(),
            ));
        }
        let protocol = match config.and_then(|config| config.protocol) {
            Some(protocol) => protocol,
            None => match env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
            {
                Some(text) => OtlpProtocol::parse(&text).ok_or(TelemetryError::Protocol(text))?,
                None => OtlpProtocol::HttpProtobuf,
            },
        };
        let timeout = env("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
            .or_else(|| env("OTEL_EXPORTER_OTLP_TIMEOUT"))
            .and_then(|ms| ms.parse().ok())
            .map_or(EXPORT_TIMEOUT, Duration::from_millis);
        let exporter = exporter(protocol, configured.map(|url| url.0), timeout)?;
        let queue = env("OTEL_BSP_MAX_QUEUE_SIZE")
            .and_then(|size| size.parse().ok())
            .filter(|size| *size > 0)
            .unwrap_or(QUEUE_SIZE);
        let queued = Arc::new(AtomicUsize::new(0));
        let batches = BatchSpanProcessor::builder(Counting {
            inner: exporter,
            queued: Arc::clone(&queued),
        })
        // Room beyond the gate's, so that the processor itself never drops: every drop is
        // the gate's, and counted.
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(queue + 64)
                .build(),
        )
        .build();
        let mut builder = SdkTracerProvider::builder().with_span_processor(Gate {
            inner: batches,
            queued,
            capacity: queue,
        });
        let service_name = config.and_then(|config| config.service_name.clone());
        let resource = match service_name {
            Some(name) => Resource::builder().with_service_name(name).build(),
            None if env("OTEL_SERVICE_NAME").is_some() => Resource::builder().build(),
            None => Resource::builder().with_service_name(NAME).build(),
        };
        builder = builder.with_resource(resource);
        if let Some(ratio) = config.and_then(|config| config.sample_ratio) {
            builder = builder.with_sampler(Sampler::ParentBased(Box::new(
                Sampler::TraceIdRatioBased(ratio.0),
            )));
        }
        let provider = builder.build();
        ENABLED.store(true, Ordering::Relaxed);
        Ok(Some(Telemetry { provider }))
    }

    /// The layer that turns the proxy's spans into exported ones: only spans, and only
    /// the proxy's (the exporter's own connections make spans too, which must not be
    /// exported in turn).
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span> + Send + Sync,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer(NAME))
            .with_threads(false)
            .with_location(false)
            .with_filter(filter_fn(|metadata| {
                metadata.is_span() && metadata.target().starts_with("dedupe_proxy")
            }))
    }

    /// Exports what is queued and stops. Blocks: call it off the runtime's workers.
    pub fn shutdown(self) {
        ENABLED.store(false, Ordering::Relaxed);
        if let Err(error) = self.provider.shutdown_with_timeout(Duration::from_secs(5)) {
            tracing::warn!(%error, "traces not all exported at shutdown");
        }
    }
}

fn exporter(
    protocol: OtlpProtocol,
    endpoint: Option<String>,
    timeout: Duration,
) -> Result<SpanExporter, TelemetryError> {
    let failed =
        |error: opentelemetry_otlp::ExporterBuildError| TelemetryError::Exporter(error.to_string());
    match protocol {
        OtlpProtocol::Grpc => {
            let builder = SpanExporter::builder().with_tonic().with_timeout(timeout);
            match endpoint {
                Some(endpoint) => builder.with_endpoint(endpoint).build(),
                None => builder.build(),
            }
            .map_err(failed)
        }
        OtlpProtocol::HttpProtobuf => {
            let client = Export {
                client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
                runtime: tokio::runtime::Handle::current(),
                timeout,
            };
            let builder = SpanExporter::builder()
                .with_http()
                .with_http_client(client)
                .with_timeout(timeout);
            match endpoint {
                // As the environment's base URL: the traces' own path after it.
                Some(endpoint) => builder
                    .with_endpoint(format!("{endpoint}/v1/traces"))
                    .build(),
                None => builder.build(),
            }
            .map_err(failed)
        }
    }
}

/// The OTLP HTTP exporter's client. The batch processor exports from a thread of its own,
/// outside the runtime, so each request is sent on the runtime and its answer comes back
/// through a channel. Hand-written because the exporter's own hyper client must run on the
/// runtime, which the processor does not.
#[derive(Debug, Clone)]
struct Export {
    client: Client<HttpConnector, Full<Bytes>>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Export {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let (client, timeout) = (self.client.clone(), self.timeout);
        self.runtime.spawn(async move {
            // One deadline for the whole exchange, and a collector's answer (a status and
            // a small protobuf) read up to what the exporter's own clients allow.
            let sent = tokio::time::timeout(timeout, async {
                let response = client.request(request.map(Full::new)).await?;
                let (head, body) = response.into_parts();
                let body = Limited::new(body, ANSWER_LIMIT).collect().await?;
                Ok::<_, HttpError>(http::Response::from_parts(head, body.to_bytes()))
            });
            let sent = async {
                sent.await
                    .map_err(|_| HttpError::from("no answer within the export timeout"))?
            };
            let _ = answer.send(sent.await);
        });
        answered.await?
    }
}

/// The exporter, counting the spans it takes off the queue.
#[derive(Debug)]
struct Counting {
    inner: SpanExporter,
    queued: Arc<AtomicUsize>,
}

impl opentelemetry_sdk::trace::SpanExporter for Counting {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.queued.fetch_sub(batch.len(), Ordering::AcqRel);
        let exported = self.inner.export(batch).await;
        if let Err(error) = &exported {
            crate::metrics::SPAN_EXPORTS_FAILED.inc();
            tracing::debug!(%error, "spans not exported");
        }
        exported
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// In front of the batch processor: lets a span in only while the queue has room, else
/// drops and counts it; and takes the key off a delivery's span.
#[derive(Debug)]
struct Gate {
    inner: BatchSpanProcessor,
    queued: Arc<AtomicUsize>,
    capacity: usize,
}

impl SpanProcessor for Gate {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, mut span: SpanData) {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.capacity {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            crate::metrics::SPANS_DROPPED.inc();
            return;
        }
        span.attributes
            .retain(|attribute| attribute.key.as_str() != "key");
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Continues the sender's trace (its `traceparent` and `tracestate`) in a delivery's
/// span, and records the trace's ID on it for the log. Nothing when traces are off.
pub(crate) fn continue_trace(span: &Span, headers: &HeaderMap) {
    if !enabled() {
        return;
    }
    let mut carried = HeaderMap::new();
    for name in ["traceparent", "tracestate"] {
        let mut lines = headers.get_all(name).iter();
        if let (Some(value), None) = (lines.next(), lines.next())
            && (name == "traceparent" || value.len() <= TRACESTATE_LIMIT)
        {
            carried.insert(name, value.clone());
        }
    }
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(&carried));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
    let trace_id = span.context().span().span_context().trace_id();
    span.record("trace_id", tracing::field::display(trace_id));
}

/// Tells the app `span`'s trace (`traceparent`, `tracestate`), so that its spans join it.
/// Nothing when traces are off: a sender's headers then pass untouched.
pub(crate) fn propagate(span: &Span, headers: &mut HeaderMap) {
    if enabled() {
        let context = span.context();
        // The sender's, if too long to be continued, goes too.
        headers.remove("tracestate");
        TraceContextPropagator::new().inject_context(&context, &mut HeaderInjector(headers));
        if headers
            .get("tracestate")
            .is_some_and(|state| state.is_empty())
        {
            headers.remove("tracestate");
        }
    }
}

/// Marks the current delivery's span with its key's hash (the first 16 bytes of its
/// SHA-256, in hex): a trace backend is never told the key itself.
pub fn keyed(key: &str) {
    if enabled() {
        let hash = hex::encode(&Sha256::digest(key.as_bytes())[..16]);
        Span::current().set_attribute("dedupe.key_hash", hash);
    }
}

/// Marks a delivery's span with what it was answered.
pub fn answered(span: &Span, dedupe_status: &'static str, status: u16) {
    if enabled() {
        span.set_attribute("dedupe.status", dedupe_status);
        span.set_attribute("http.response.status_code", i64::from(status));
    }
}

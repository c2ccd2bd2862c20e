//! The sections of the file that are settings as written, beside the routes and the
//! store: `admin:`, `telemetry:`, `limits:` and `delivery_log:`.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::defaults;
use crate::values::{EnvSecret, HostName, HumanDuration, OtlpEndpoint, SampleRatio, Size};

/// `admin:`: the listener for health, readiness and key inspection.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Where the admin port listens; on a loopback address, the API answers without a token.
    #[serde(
        default = "defaults::admin_listen",
        deserialize_with = "crate::values::socket_address"
    )]
    pub listen: SocketAddr,
    /// When set, `/v1/*` needs `Authorization: Bearer <the variable's value>`.
    #[serde(default)]
    pub token_env: Option<EnvSecret>,
    /// A second token, which reads everything the API and the console show and changes
    /// nothing; needs `token_env`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub viewer_token_env: Option<EnvSecret>,
    /// Names the port may be reached by besides its own address and `localhost` (a
    /// Service's DNS name, say); requests naming any other host are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostName>,
    /// What `/mcp` (the admin API for coding agents) offers.
    #[serde(default)]
    pub mcp: McpAccess,
}

/// `admin.mcp`: the tools `/mcp` offers.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum McpAccess {
    /// No `/mcp`.
    Off,
    /// The tools that read: routes, keys, the delivery log.
    #[default]
    ReadOnly,
    /// Those, and the tools that change keys (forget, set expiry, resolve).
    ReadWrite,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: defaults::admin_listen(),
            token_env: None,
            viewer_token_env: None,
            hosts: Vec::new(),
            mcp: McpAccess::default(),
        }
    }
}

/// `telemetry:`: OpenTelemetry traces, exported over OTLP (`crate::telemetry`). Each field
/// left out falls back to its standard `OTEL_*` variable.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The collector's base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it: with
    /// `http/protobuf`, spans go to its `/v1/traces`.
    pub otlp_endpoint: Option<OtlpEndpoint>,
    /// `http/protobuf` (port 4318) or `grpc` (port 4317).
    pub protocol: Option<OtlpProtocol>,
    /// The `service.name` of every span (default `dedupe-proxy`).
    pub service_name: Option<String>,
    /// The share of traces started here that are kept (a sender's sampled flag is
    /// followed): `0` to `1`.
    pub sample_ratio: Option<SampleRatio>,
}

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
pub enum OtlpProtocol {
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    #[serde(rename = "grpc")]
    Grpc,
}

impl OtlpProtocol {
    /// The value `OTEL_EXPORTER_OTLP_PROTOCOL` takes.
    pub fn parse(text: &str) -> Option<OtlpProtocol> {
        match text.trim() {
            "http/protobuf" => Some(OtlpProtocol::HttpProtobuf),
            "grpc" => Some(OtlpProtocol::Grpc),
            _ => None,
        }
    }
}

/// `limits:`: what one sender may cost the proxy, on the provider-facing listener.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Open connections at most; one more closes the connection idle longest, or, with
    /// none idle, is answered 503 and closed.
    #[serde(default = "defaults::max_connections")]
    pub max_connections: usize,
    /// Requests in progress, over all connections (HTTP/2 streams included), each until
    /// its forward has ended and its response is sent; one more is answered 503 at once.
    /// Requests no route takes may use half. Buffered bodies stay under this × `max_body`.
    #[serde(default = "defaults::max_requests")]
    pub max_requests: usize,
    /// Time for a new connection to choose its protocol (HTTP/2: preface and SETTINGS)
    /// and send a request's head, and the most a connection may idle between requests.
    #[serde(default = "defaults::header_read_timeout")]
    pub header_read_timeout: HumanDuration,
    /// Time to send a request's body (then 408), and the most a response may wait for its
    /// sender to take it (then its connection is closed).
    #[serde(default = "defaults::body_read_timeout")]
    pub body_read_timeout: HumanDuration,
    /// Size of a request's head (request line and headers); more gets 431.
    #[serde(default = "defaults::max_header_bytes")]
    pub max_header_bytes: Size,
    /// Request places kept for health probes once every other is taken: the admin
    /// port's, never the file's.
    #[serde(skip)]
    #[schemars(skip)]
    pub probe_places: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: defaults::max_connections(),
            max_requests: defaults::max_requests(),
            header_read_timeout: defaults::header_read_timeout(),
            body_read_timeout: defaults::body_read_timeout(),
            max_header_bytes: defaults::max_header_bytes(),
            probe_places: 0,
        }
    }
}

/// `delivery_log:`: the log of what became of every request a route took, kept in the
/// store (`crate::delivery_log`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveryLogConfig {
    /// `false`: nothing is logged.
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    /// How long an entry is kept.
    #[serde(default = "defaults::log_retention")]
    pub retention: HumanDuration,
    /// The most entries kept: beyond, the oldest go first.
    #[serde(default = "defaults::log_max_entries")]
    pub max_entries: u64,
    /// Log requests no route took too (they are always counted).
    #[serde(default)]
    pub unmatched: bool,
}

impl Default for DeliveryLogConfig {
    fn default() -> Self {
        DeliveryLogConfig {
            enabled: true,
            retention: defaults::log_retention(),
            max_entries: defaults::log_max_entries(),
            unmatched: false,
        }
    }
}

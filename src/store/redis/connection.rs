//! Connections to Redis: one server or a cluster, plain or over TLS, reconnecting by
//! themselves; opened once per worker, and checked to be a Redis that can claim.

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::store::settings::RedisConfig;
use crate::store::{StoreError, tls};

/// A connection to one Redis, or to a cluster; both reconnect by themselves.
#[derive(Clone)]
pub(super) enum Link {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Single(connection) => connection.req_packed_command(cmd),
            Link::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Single(connection) => connection.req_packed_commands(pipeline, offset, count),
            Link::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Single(connection) => connection.get_db(),
            Link::Cluster(connection) => connection.get_db(),
        }
    }
}

/// How connections are opened: a client of one server or of a cluster, with TLS when the
/// URLs are `rediss://`.
// Made once per store and cloned once per worker: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub(super) enum Opener {
    Single(redis::Client),
    Cluster(redis::cluster::ClusterClient),
}

impl Opener {
    pub(super) fn new(config: &RedisConfig) -> Result<Opener, StoreError> {
        let url = config.url.masked();
        let invalid =
            |error: redis::RedisError| StoreError::Backend(format!("redis URL {url}: {error}"));
        let certificates = tls::redis_certificates(config.tls.as_ref());
        let uses_tls = config.url.expose().starts_with("rediss://");
        if config.cluster {
            let seeds = std::iter::once(config.url.expose().to_owned())
                .chain(config.nodes.iter().map(|node| node.expose().to_owned()));
            let mut builder = ClusterClientBuilder::new(seeds)
                .connection_timeout(config.timeout.0)
                .response_timeout(config.timeout.0);
            if uses_tls {
                builder = builder.certs(certificates);
            }
            return builder.build().map(Opener::Cluster).map_err(invalid);
        }
        let client = if uses_tls {
            redis::Client::build_with_tls(config.url.expose(), certificates)
        } else {
            redis::Client::open(config.url.expose())
        };
        client.map(Opener::Single).map_err(invalid)
    }

    /// Clients of the server, or of each node the configuration names, for a
    /// subscription: classic Pub/Sub messages reach every node of a cluster.
    pub(super) fn subscribers(config: &RedisConfig) -> Result<Vec<redis::Client>, StoreError> {
        let nodes = config
            .cluster
            .then_some(&config.nodes)
            .into_iter()
            .flatten();
        let urls = std::iter::once(config.url.expose()).chain(nodes.map(|node| node.expose()));
        urls.map(|url| {
            let client = if url.starts_with("rediss://") {
                let certificates = tls::redis_certificates(config.tls.as_ref());
                redis::Client::build_with_tls(url, certificates)
            } else {
                redis::Client::open(url)
            };
            client.map_err(|error| {
                StoreError::Backend(format!("redis URL {}: {error}", config.url.masked()))
            })
        })
        .collect()
    }

    /// Opens a connection and checks that Redis answers.
    pub(super) async fn open(self, config: RedisConfig) -> Result<Link, StoreError> {
        let (url, timeout) = (config.url.masked(), config.timeout.0);
        let opening = async {
            match self {
                Opener::Single(client) => {
                    let manager = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(timeout))
                        .set_response_timeout(Some(timeout))
                        .set_number_of_retries(1);
                    client
                        .get_connection_manager_with_config(manager)
                        .await
                        .map(Link::Single)
                }
                Opener::Cluster(client) => client.get_async_connection().await.map(Link::Cluster),
            }
        };
        let mut connection = tokio::time::timeout(timeout, opening)
            .await
            .map_err(|_| {
                StoreError::Backend(format!("redis at {url} did not answer within {timeout:?}"))
            })?
            .map_err(|error| {
                StoreError::from(error).context(&format!("cannot reach redis at {url}"))
            })?;
        let _: String = redis::cmd("PING")
            .query_async(&mut connection)
            .await
            .map_err(|error| StoreError::from(error).context(&format!("redis at {url}")))?;
        Ok(connection)
    }
}

/// Refuses a Redis that would fail every claim: `SET` with both `NX` and `GET` needs Redis
/// 7.0. The probe key cannot be a store key (those hold a `:`) and lives a millisecond.
pub(super) async fn check_version(
    connection: &mut Link,
    config: &RedisConfig,
) -> Result<(), StoreError> {
    let mut probe = redis::cmd("SET");
    probe
        .arg(format!("{}version-probe", config.prefix))
        .arg("")
        .arg("NX")
        .arg("PX")
        .arg(1)
        .arg("GET");
    let answer: redis::RedisResult<Option<Vec<u8>>> = probe.query_async(connection).await;
    answer.map(drop).map_err(|error| {
        StoreError::from(error).context(&format!(
            "redis at {} refuses SET with NX and GET (dedupe-proxy needs Redis 7.0 or later)",
            config.url.masked()
        ))
    })
}

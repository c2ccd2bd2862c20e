//! TLS toward the shared stores, against the servers `tests/servers` starts: what a
//! configuration asks to check is checked, and a server that fails the check stops the
//! start with a clear message (exit 1), never a silent plain connection. The contract on
//! these servers, when the check passes, is in `conformance.rs`.

use crate::support;

use std::process::Command;
use std::time::Duration;

use dedupe_proxy::config::{DirectUrl, PostgresConfig, RedisConfig, ServerUrl, SslMode, TlsConfig};
use dedupe_proxy::store::postgres::PostgresStore;
use dedupe_proxy::store::redis::RedisStore;
use dedupe_proxy::values::{HumanDuration, Secret, TableName};
use support::TestServers;

fn redis(url: String, tls: Option<TlsConfig>) -> RedisConfig {
    RedisConfig {
        url: ServerUrl::Written(Secret::new(url)),
        prefix: "dedupe-tls-test:".into(),
        timeout: HumanDuration(Duration::from_secs(2)),
        tls,
        cluster: false,
        nodes: Vec::new(),
    }
}

fn postgres(url: String, ssl_mode: SslMode, tls: Option<TlsConfig>) -> PostgresConfig {
    PostgresConfig {
        url: ServerUrl::Written(Secret::new(url)),
        direct_url: None,
        table: TableName("dedupe_tls_test".into()),
        timeout: HumanDuration(Duration::from_secs(5)),
        pool_size: 2,
        ssl_mode,
        tls,
    }
}

/// The error a connection fails with, or a panic if it succeeds.
async fn redis_refusal(config: RedisConfig) -> String {
    match RedisStore::connect(&config, None).await {
        Ok(_) => panic!("{} was accepted", config.url.masked()),
        Err(error) => error.to_string(),
    }
}

async fn postgres_refusal(config: PostgresConfig) -> String {
    match PostgresStore::connect(&config, None).await {
        Ok(_) => panic!("{} was accepted", config.url.masked()),
        Err(error) => error.to_string(),
    }
}

#[tokio::test]
async fn redis_over_tls_checks_the_ca_and_presents_the_client_certificate() {
    let Some(servers) = TestServers::get() else {
        return;
    };
    let url = format!("rediss://127.0.0.1:{}/0", servers.redis_tls_port);
    RedisStore::connect(&redis(url.clone(), Some(servers.tls("ca.pem", true))), None)
        .await
        .expect("the test CA vouches for the server");

    let error = redis_refusal(redis(url.clone(), Some(servers.tls("other-ca.pem", true)))).await;
    assert!(error.contains("UnknownIssuer"), "another CA: {error}");
    // Without a CA file the system's roots are used, and none of them signed the server.
    let error = redis_refusal(redis(url.clone(), None)).await;
    assert!(
        error.contains("UnknownIssuer"),
        "the system's roots: {error}"
    );
    // The server wants a client certificate.
    let error = redis_refusal(redis(url, Some(servers.tls("ca.pem", false)))).await;
    assert!(error.contains("redis"), "no client certificate: {error}");
    // Plain text to the TLS port gets no answer a client could take for Redis's.
    let plain = format!("redis://127.0.0.1:{}/0", servers.redis_tls_port);
    redis_refusal(redis(plain, None)).await;
}

#[tokio::test]
async fn redis_over_tls_checks_the_name_in_the_certificate() {
    let Some(servers) = TestServers::get() else {
        return;
    };
    let port = servers.redis_tls_named_port;
    // The certificate names `localhost` only.
    let by_name = format!("rediss://localhost:{port}/0");
    RedisStore::connect(&redis(by_name, Some(servers.tls("ca.pem", false))), None)
        .await
        .expect("the name the certificate holds");
    let by_address = format!("rediss://127.0.0.1:{port}/0");
    let error = redis_refusal(redis(by_address, Some(servers.tls("ca.pem", false)))).await;
    assert!(
        error.contains("not valid for name"),
        "a name the certificate lacks: {error}"
    );
}

#[tokio::test]
async fn postgres_over_tls_checks_what_sslmode_asks() {
    let Some(servers) = TestServers::get() else {
        return;
    };
    let port = servers.postgres_tls_port;
    let url =
        |host: &str, mode: &str| format!("postgres://postgres@{host}:{port}/test?sslmode={mode}");
    let ca = || Some(servers.tls("ca.pem", false));
    // The server's certificate names `localhost` only.
    PostgresStore::connect(
        &postgres(url("localhost", "verify-full"), SslMode::VerifyFull, ca()),
        None,
    )
    .await
    .expect("verify-full with the name the certificate holds");
    let error = postgres_refusal(postgres(
        url("127.0.0.1", "verify-full"),
        SslMode::VerifyFull,
        ca(),
    ))
    .await;
    assert!(
        error.contains("not valid for name"),
        "a name the certificate lacks: {error}"
    );
    PostgresStore::connect(
        &postgres(url("127.0.0.1", "verify-ca"), SslMode::VerifyCa, ca()),
        None,
    )
    .await
    .expect("verify-ca does not compare names");
    let other = Some(servers.tls("other-ca.pem", false));
    let error = postgres_refusal(postgres(
        url("localhost", "verify-full"),
        SslMode::VerifyFull,
        other.clone(),
    ))
    .await;
    assert!(error.contains("UnknownIssuer"), "another CA: {error}");
    let error = postgres_refusal(postgres(
        url("127.0.0.1", "verify-ca"),
        SslMode::VerifyCa,
        other,
    ))
    .await;
    assert!(
        error.contains("UnknownIssuer"),
        "another CA under verify-ca: {error}"
    );
    PostgresStore::connect(
        &postgres(url("127.0.0.1", "require"), SslMode::Require, None),
        None,
    )
    .await
    .expect("require without a CA only encrypts, as libpq's does");
    // The server takes no plain connection.
    let error = postgres_refusal(postgres(
        url("127.0.0.1", "disable"),
        SslMode::Disable,
        None,
    ))
    .await;
    assert!(error.contains("pg_hba.conf"), "plain text: {error}");
}

/// `direct_url` (the server past a pooler) is held to the same TLS checks as `url`: a
/// direct URL by an address the certificate does not name is refused, though `url` passes.
#[tokio::test]
async fn postgres_direct_url_is_checked_as_url_is() {
    let Some(servers) = TestServers::get() else {
        return;
    };
    let port = servers.postgres_tls_port;
    let url = |host: &str| format!("postgres://postgres@{host}:{port}/test");
    let config = |direct: &str| PostgresConfig {
        direct_url: Some(DirectUrl(ServerUrl::Written(Secret::new(direct.into())))),
        ..postgres(
            format!("{}?sslmode=verify-full", url("localhost")),
            SslMode::VerifyFull,
            Some(servers.tls("ca.pem", false)),
        )
    };
    PostgresStore::connect(&config(&url("localhost")), None)
        .await
        .expect("a direct URL by the name the certificate holds");
    let error = postgres_refusal(config(&url("127.0.0.1"))).await;
    assert!(
        error.contains("not valid for name"),
        "a direct URL by a name the certificate lacks: {error}"
    );
}

#[test]
fn a_store_that_fails_its_tls_check_stops_the_start_with_exit_1() {
    let Some(servers) = TestServers::get() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tls.yaml");
    let other_ca = servers.tls_dir.join("other-ca.pem");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:0\nupstream: http://127.0.0.1:9\nadmin: {{ listen: 127.0.0.1:0 }}\n\
             store:\n  postgres:\n    url: postgres://postgres@localhost:{}/test?sslmode=verify-full\n    tls: {{ ca_file: {} }}\n",
            servers.postgres_tls_port,
            other_ca.display()
        ),
    )
    .unwrap();
    let output = Command::new(support::binary_path())
        .args(["run", "-c"])
        .arg(&config)
        .env_remove("DEDUPE_PROXY_CONFIG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");
}

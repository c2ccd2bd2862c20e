//! Fuzzes what the proxy does with a request head before anything is claimed: any bytes
//! are parsed as hyper parses them (httparse), then the host check, the readings of the
//! method, host and path (override headers, forwarded hosts, rewritten URLs), the path's
//! normal form, the route lookup, key extraction and the rewrite for the upstream run on
//! what parsed. Never a panic; a normal path has no empty, dot-only or dot-ended segment
//! and no control character; a rewritten target is in origin form under the upstream's
//! base path; the key header is the proxy's alone.
#![no_main]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::OnceLock;

use dedupe_proxy::config::{Config, Overrides};
use dedupe_proxy::key::Delivery;
use dedupe_proxy::route::Routing;
use dedupe_proxy::testing::{addressed, empty_body, normal_path, outbound};
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = r#"
upstream: http://127.0.0.1:9/base
routes:
  - name: exact
    match: { method: POST, path: /hooks/Sig/ }
    key: "{header:x-id}"
  - name: tree
    match: { path_prefix: /tree, host: hooks.example.com }
    key: "{query:id}"
    upstream: http://127.0.0.1:9
  - name: all
    match: {}
    key: "{header:x-id}:{query:id}"
"#;

fn routing() -> &'static Routing {
    static ROUTING: OnceLock<Routing> = OnceLock::new();
    ROUTING.get_or_init(|| {
        let config = Config::parse(CONFIG, Path::new("fuzz.yaml"), &Overrides::default())
            .expect("the fuzz configuration is valid");
        config.routing()
    })
}

fuzz_target!(|data: &[u8]| {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut parsed = httparse::Request::new(&mut headers);
    let Ok(httparse::Status::Complete(_)) = parsed.parse(data) else {
        return;
    };
    let version = match parsed.version {
        Some(0) => http::Version::HTTP_10,
        _ => http::Version::HTTP_11,
    };
    let mut builder = http::Request::builder()
        .method(parsed.method.unwrap_or("GET"))
        .uri(parsed.path.unwrap_or("/"))
        .version(version);
    for header in parsed.headers.iter() {
        builder = builder.header(header.name, header.value);
    }
    // What hyper itself refuses never reaches the proxy.
    let Ok(request) = builder.body(()) else {
        return;
    };
    let (head, ()) = request.into_parts();

    let Ok(normal) = normal_path(head.uri.path()) else {
        return;
    };
    assert!(normal.starts_with(b"/"), "{normal:?}");
    assert!(normal.len() == 1 || !normal.ends_with(b"/"), "{normal:?}");
    assert!(!normal.windows(2).any(|pair| pair == b"//"), "{normal:?}");
    if normal.len() > 1 {
        assert!(
            !normal[1..]
                .split(|&byte| byte == b'/')
                .any(|segment| segment.is_empty() || segment.ends_with(b".")),
            "{normal:?}"
        );
    }
    assert!(!normal.iter().any(u8::is_ascii_control), "{normal:?}");
    // Escapes decode until none is left (three rounds at most), and may decode to `%`,
    // `;` or `\`, which another pass would read again; without those, the form is its own.
    if let Ok(text) = std::str::from_utf8(&normal)
        && !text.contains(['%', ';', '\\'])
    {
        let again = normal_path(text).expect("a normal path has no `..`");
        assert_eq!(again.as_ref(), normal.as_ref(), "idempotent");
    }
    let routing = routing();
    let Ok(target) = addressed(
        head.version,
        &head.method,
        &head.uri,
        &head.headers,
        routing.table.limits_hosts(),
    ) else {
        return;
    };
    assert_eq!(target.path.as_ref(), normal.as_ref());
    let Ok(route) = routing.table.find(&target) else {
        return;
    };
    let route = route.cloned();
    drop(target);
    let (upstream_url, key) = match &route {
        Some(route) => {
            let delivery = Delivery {
                headers: &head.headers,
                query: head.uri.query(),
                body: b"",
            };
            (&route.upstream, route.key.extract(&delivery).ok())
        }
        None => (&routing.fallback_upstream, None),
    };
    let peer: SocketAddr = "203.0.113.7:4000".parse().unwrap();
    let Ok(outbound) = outbound(head, empty_body(), upstream_url, peer, key.as_deref()) else {
        return;
    };
    let sent = outbound.uri().to_string();
    assert!(outbound.uri().authority().is_none(), "{sent}");
    assert!(sent.starts_with(&upstream_url.base_path), "{sent}");
    let keys: Vec<_> = outbound
        .headers()
        .iter()
        .filter(|(name, _)| name.as_str().replace('_', "-") == "dedupe-key")
        .map(|(_, value)| value.as_bytes())
        .collect();
    match key.as_deref().filter(|key| http::HeaderValue::from_str(key).is_ok()) {
        Some(key) => assert_eq!(keys, [key.as_bytes()]),
        None => assert!(keys.is_empty(), "{keys:?}"),
    }
});

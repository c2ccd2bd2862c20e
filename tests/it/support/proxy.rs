//! The proxy started in-process on port 0, and the configuration text it starts with.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use dedupe_proxy::config::{Config, Overrides};
use tempfile::TempDir;

/// The configuration text for a proxy on port 0 in front of `upstream`, storing in `data`.
/// `rest` may set its own `admin:`.
pub fn config_text(upstream: SocketAddr, data: &Path, rest: &str) -> String {
    let admin = if rest.contains("admin:") {
        ""
    } else {
        "admin: { listen: 127.0.0.1:0 }\n"
    };
    format!(
        "listen: 127.0.0.1:0\nupstream: http://{upstream}\n{admin}store: {{ sled: {{ path: \"{}\" }} }}\n{rest}",
        data.display()
    )
}

pub fn parse_config(text: &str) -> Config {
    Config::parse(text, Path::new("test.yaml"), &Overrides::default()).unwrap()
}

/// The proxy, started in-process on a temporary sled store.
pub struct Proxy {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub app: Option<dedupe_proxy::App>,
    pub data: TempDir,
}

impl Proxy {
    /// `rest` is YAML after `listen`, `upstream`, `admin` and `store`: defaults, routes...
    pub async fn start(upstream: SocketAddr, rest: &str) -> Proxy {
        let data = tempfile::tempdir().unwrap();
        let config = parse_config(&config_text(upstream, &data.path().join("db"), rest));
        let app = dedupe_proxy::start(config).await.unwrap();
        Proxy {
            addr: app.proxy_addr,
            admin: app.admin_addr,
            app: Some(app),
            data,
        }
    }

    pub async fn shutdown(&mut self) {
        if let Some(app) = self.app.take() {
            app.shutdown().await.unwrap();
        }
    }
}

/// One route named `hooks` on `POST /hooks` keyed by `{json:/id}`, plus `extra` lines
/// indented under the route.
pub fn json_route(extra: &str) -> String {
    format!(
        "routes:\n  - name: hooks\n    match: {{ method: POST, path: /hooks }}\n    key: \"{{json:/id}}\"\n{extra}"
    )
}

/// Writes `config.yaml` in `dir` for the binary: port 0, a data directory in `dir`.
pub fn write_config(dir: &Path, upstream: SocketAddr, rest: &str) -> PathBuf {
    let path = dir.join("config.yaml");
    std::fs::write(&path, config_text(upstream, &dir.join("data"), rest)).unwrap();
    path
}

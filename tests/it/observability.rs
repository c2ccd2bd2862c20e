//! What operators watch the proxy with: the alert rules (`deploy/prometheus/alerts.yaml`),
//! checked and unit-tested with `promtool`, carried unchanged by the Prometheus Operator's
//! `PrometheusRule`; the Grafana dashboard (`deploy/grafana/dedupe-proxy.json`), every
//! expression of which names a metric the proxy exports; and a real Prometheus server
//! scraping the real binary, evaluating every dashboard expression and alert rule.
//!
//! `promtool` and `prometheus` come from Debian's `prometheus` package (`tests/setup`);
//! without them those tests are skipped with a message, except in CI (`CI=true`).

use crate::support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::*;

/// A tool of Debian's `prometheus` package, if installed: a failure in CI otherwise.
fn prometheus_tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("CI").map_or(true, |ci| ci != "true"),
            "{name} must be installed in CI (tests/setup)"
        );
        eprintln!("skipped: {name} is not installed (run tests/setup)");
    }
    found
}

fn run(tool: &Path, args: &[&str], dir: &Path) -> String {
    let output = Command::new(tool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{} {args:?}:\n{text}",
        tool.display()
    );
    text
}

#[test]
fn the_alert_rules_are_valid_and_fire_when_they_should() {
    let Some(promtool) = prometheus_tool("promtool") else {
        return;
    };
    let dir = repo("deploy/prometheus");
    let checked = run(&promtool, &["check", "rules", "alerts.yaml"], &dir);
    assert!(checked.contains("SUCCESS: 13 rules found"), "{checked}");
    let tested = run(&promtool, &["test", "rules", "alerts.test.yaml"], &dir);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn the_prometheus_rule_carries_the_alert_rules_unchanged() {
    let read = |path: &str| -> serde_yaml::Value {
        serde_yaml::from_str(&std::fs::read_to_string(repo(path)).unwrap()).unwrap()
    };
    let rules = read("deploy/prometheus/alerts.yaml");
    let resource = read("deploy/kubernetes/monitoring/prometheusrule.yaml");
    assert_eq!(resource["kind"], "PrometheusRule");
    assert_eq!(resource["spec"], rules);
    let kustomization = read("deploy/kubernetes/monitoring/kustomization.yaml");
    let listed: Vec<&str> = kustomization["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|entry| entry.as_str().unwrap())
        .collect();
    assert_eq!(listed, ["prometheusrule.yaml", "podmonitor.yaml"]);
}

/// Every PromQL expression of the dashboard, with its panel's title.
fn dashboard_expressions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo("deploy/grafana/dedupe-proxy.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut expressions = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let title = panel["title"].as_str().unwrap().to_owned();
            expressions.push((title, target["expr"].as_str().unwrap().to_owned()));
        }
    }
    expressions
}

/// The alert rules' expressions, with their names.
fn alert_expressions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo("deploy/prometheus/alerts.yaml")).unwrap();
    let rules: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    rules["groups"][0]["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|rule| {
            (
                rule["alert"].as_str().unwrap().to_owned(),
                rule["expr"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// A dashboard expression as Prometheus evaluates it once Grafana has filled in its
/// variables.
fn as_grafana_sends_it(expression: &str) -> String {
    expression
        .replace("$route", ".*")
        .replace("$__rate_interval", "1m")
        .replace("$__range", "5m")
}

/// The metric names an expression reads: `dedupe_` identifiers.
fn metric_names(expression: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expression;
    while let Some(at) = rest.find("dedupe_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

/// The sample names a scrape of the proxy holds: each family, with `_total` for counters
/// and `_bucket`, `_sum`, `_count` for histograms, as the exposition writes them.
fn exported_names(scrape: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in scrape.lines() {
        let Some(declaration) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (family, kind) = declaration.split_once(' ').unwrap();
        match kind {
            "counter" => names.insert(format!("{family}_total")),
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{family}{suffix}"));
                }
                true
            }
            _ => names.insert(family.to_owned()),
        };
    }
    names
}

/// A configuration with a route of each kind the metrics have series for: a signed one
/// (signature refusals), one with `order:` (order checks) and a queued one with a target.
fn observed_config(upstream: std::net::SocketAddr, dir: &Path) -> PathBuf {
    let path = dir.join("config.yaml");
    let text = format!(
        r#"listen: 127.0.0.1:0
upstream: http://{upstream}
admin: {{ listen: 127.0.0.1:0 }}
store: {{ sled: {{ path: "{}" }} }}
routes:
  - name: hooks
    match: {{ method: POST, path: /hooks }}
    key: "{{json:/id}}"
    order: {{ entity: "{{json:/o}}", version: "{{json:/v}}" }}
  - name: signed
    match: {{ method: POST, path: /signed }}
    key: "{{json:/id}}"
    verify: {{ hmac: {{ secret_env: OBSERVED_SECRET, header: X-Signature }} }}
  - name: queued
    match: {{ method: POST, path: /queued }}
    key: "{{json:/id}}"
    delivery: queued
    queue: {{ target: 1m }}
"#,
        dir.join("data").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_and_alert_expression_names_a_metric_the_proxy_exports() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let binary = Binary::start_with_env(
        &observed_config(upstream.addr, dir.path()),
        &[("OBSERVED_SECRET", "s3cret")],
    );
    let scrape = scrape(binary.admin).await;
    let exported = exported_names(&scrape);
    let mut read = BTreeSet::new();
    for (what, expression) in dashboard_expressions()
        .into_iter()
        .chain(alert_expressions())
    {
        let names = metric_names(&expression);
        assert!(!names.is_empty(), "{what}: `{expression}` reads no metric");
        for name in names {
            assert!(
                exported.contains(&name),
                "{what}: `{name}` is not exported; the proxy exports {exported:?}"
            );
            read.insert(name);
        }
    }
    // The dashboard and the alerts between them read every metric but the histogram's
    // sum and count.
    let unread: Vec<&String> = exported.difference(&read).collect();
    assert_eq!(
        unread,
        [
            "dedupe_queue_delivery_seconds_sum",
            "dedupe_upstream_duration_seconds_count",
            "dedupe_upstream_duration_seconds_sum"
        ],
        "read by no panel or alert"
    );
}

/// A Prometheus server on a free loopback port, scraping `target` every second and
/// evaluating the alert rules; stopped when dropped.
struct Prometheus {
    child: Child,
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(binary: &Path, target: std::net::SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        let rules = repo("deploy/prometheus/alerts.yaml");
        std::fs::write(
            &config,
            format!(
                "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\nrule_files: [\"{}\"]\nscrape_configs:\n  - job_name: dedupe\n    static_configs: [{{ targets: [\"{target}\"] }}]\n",
                rules.display()
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Prometheus {
            child,
            addr,
            _dir: dir,
        }
    }

    /// The `data` of an instant query's answer.
    async fn query(&self, expression: &str) -> serde_json::Value {
        let path = format!("/api/v1/query?query={}", percent(expression));
        let reply = send(self.addr, "GET", &path, &[], "").await;
        let answer = reply.json();
        assert_eq!(
            answer["status"], "success",
            "`{expression}`: {}",
            reply.body
        );
        answer["data"].clone()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_the_binary_and_evaluates_the_dashboard_and_alerts() {
    let Some(server) = prometheus_tool("prometheus") else {
        return;
    };
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let binary = Binary::start_with_env(
        &observed_config(upstream.addr, dir.path()),
        &[("OBSERVED_SECRET", "s3cret")],
    );
    let prometheus = Prometheus::start(&server, binary.admin);
    for id in ["e1", "e2", "e1"] {
        let body = format!(r#"{{"id":"{id}","o":"x","v":1}}"#);
        post_json(binary.addr, "/hooks", &body).await;
    }
    let probe = prometheus.addr;
    eventually(
        Duration::from_secs(30),
        "Prometheus listens",
        || async move { tokio::net::TcpStream::connect(probe).await.is_ok() },
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "Prometheus scrapes the proxy",
        || async move {
            let path = format!(
                "/api/v1/query?query={}",
                percent(r#"dedupe_requests_total{outcome="duplicate"}"#)
            );
            let reply = send(probe, "GET", &path, &[], "").await;
            reply.status == 200
                && reply.json()["data"]["result"]
                    .as_array()
                    .is_some_and(|found| !found.is_empty())
        },
    )
    .await;
    // Rates need two samples in their window.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let up = prometheus.query(r#"up{job="dedupe"}"#).await;
    assert_eq!(up["result"][0]["value"][1], "1", "{up}");
    let forwarded = prometheus
        .query(r#"sum(dedupe_requests_total{route="hooks",outcome="forwarded"})"#)
        .await;
    assert_eq!(forwarded["result"][0]["value"][1], "2", "{forwarded}");
    for (panel, expression) in dashboard_expressions() {
        let data = prometheus.query(&as_grafana_sends_it(&expression)).await;
        let result = data["result"].as_array().unwrap();
        assert!(!result.is_empty(), "{panel}: `{expression}` found nothing");
    }
    // Every rule evaluates without an error, and none fires on a healthy proxy.
    let started = std::time::Instant::now();
    let rules = loop {
        let reply = send(prometheus.addr, "GET", "/api/v1/rules", &[], "").await;
        let rules: Vec<(String, String, String)> = reply.json()["data"]["groups"][0]["rules"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|rule| {
                let field = |name: &str| rule[name].as_str().unwrap_or("").to_owned();
                (field("name"), field("health"), field("state"))
            })
            .collect();
        if rules.len() == 13 && rules.iter().all(|(_, health, _)| health == "ok") {
            break rules;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "rules not all evaluated: {rules:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for (name, _, state) in &rules {
        assert_eq!(state, "inactive", "{name}");
    }
}

/// The PodMonitor scrapes what each workload runs: its selector matches every pod
/// template's labels, and each has a dedupe-proxy container whose admin port has the name
/// the PodMonitor scrapes.
#[test]
fn the_pod_monitor_finds_every_workloads_admin_port() {
    let read = |path: &str| -> serde_yaml::Value {
        serde_yaml::from_str(&std::fs::read_to_string(repo(path)).unwrap()).unwrap()
    };
    let monitor = read("deploy/kubernetes/monitoring/podmonitor.yaml");
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .unwrap()
        .clone();
    let port = monitor["spec"]["podMetricsEndpoints"][0]["port"].clone();
    assert_eq!(port, "admin");
    for workload in [
        "deploy/kubernetes/sidecar/deployment.yaml",
        "deploy/kubernetes/persistent/statefulset.yaml",
        "deploy/kubernetes/replicated/deployment.yaml",
    ] {
        let workload_yaml = read(workload);
        let template = &workload_yaml["spec"]["template"];
        for (name, value) in &selector {
            assert_eq!(&template["metadata"]["labels"][name], value, "{workload}");
        }
        let scraped = template["spec"]["containers"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter(|container| container["name"] == "dedupe-proxy")
            .flat_map(|container| container["ports"].as_sequence().unwrap())
            .any(|declared| declared["name"] == port && declared["containerPort"] == 9091);
        assert!(
            scraped,
            "{workload} has no dedupe-proxy port `admin` on 9091"
        );
    }
}

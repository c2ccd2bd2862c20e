//! The container image and the Kubernetes manifests, checked without a Docker engine or a
//! cluster: the kustomizations load, the manifests agree with the configuration they
//! carry (ports, probes, mounts, grace), and the binary is started with exactly the
//! arguments, environment and configuration they give it, probed as the kubelet would,
//! and stopped with the image's stop signal. (`deploy/validate` checks the schemas.)

use crate::support;

use std::path::Path;
use std::time::Duration;

use serde_yaml::Value;
use support::*;

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| Value::deserialize(document).unwrap())
        .collect()
}

use serde::Deserialize;

/// Every resource a kustomization directory brings in, following `../base` and files,
/// with its `patches` applied (these replace a ConfigMap's data, by kind and name).
fn kustomize(dir: &Path) -> Vec<Value> {
    let kustomization = &documents(&dir.join("kustomization.yaml"))[0];
    let mut resources = Vec::new();
    for entry in kustomization["resources"].as_sequence().expect("resources") {
        let path = dir.join(entry.as_str().unwrap());
        assert!(
            path.exists(),
            "{} lists {} which does not exist",
            dir.display(),
            path.display()
        );
        if path.is_dir() {
            resources.extend(kustomize(&path));
        } else {
            resources.extend(documents(&path));
        }
    }
    for patch in kustomization["patches"].as_sequence().into_iter().flatten() {
        let path = dir.join(patch["path"].as_str().expect("a patch file"));
        for patch in documents(&path) {
            assert_eq!(
                patch["kind"], "ConfigMap",
                "only ConfigMap data patches are understood here"
            );
            let target = resources
                .iter_mut()
                .find(|r| {
                    r["kind"] == patch["kind"] && r["metadata"]["name"] == patch["metadata"]["name"]
                })
                .unwrap_or_else(|| panic!("{} patches nothing", path.display()));
            for (key, value) in patch["data"].as_mapping().unwrap() {
                target["data"][key.as_str().unwrap()] = value.clone();
            }
        }
    }
    resources
}

fn of_kind<'a>(resources: &'a [Value], kinds: &[&str]) -> &'a Value {
    resources
        .iter()
        .find(|resource| kinds.contains(&resource["kind"].as_str().unwrap_or("")))
        .unwrap_or_else(|| panic!("no {kinds:?}"))
}

fn port_of(address: &str) -> u64 {
    address.rsplit(':').next().unwrap().parse().unwrap()
}

/// What a manifest says about the dedupe-proxy container, checked for consistency.
struct Pod {
    args: Vec<String>,
    env: Vec<(String, String)>,
    config_text: String,
    config_mount: String,
    /// The data volume's mount, when the store is on it (sled).
    data_mount: Option<String>,
    grace_seconds: u64,
}

fn pod(variant: &str) -> Pod {
    pod_of(
        variant,
        &kustomize(&repo(&format!("deploy/kubernetes/{variant}"))),
    )
}

/// The chart's resources as `helm template` renders them with its `ci/<values>-values.yaml`
/// and the application on the pod's own port (as the kustomizations have it); `None`
/// where helm is not installed.
fn chart(values: &str) -> Option<Vec<Value>> {
    chart_with(values, "upstream=http://127.0.0.1:8080")
}

/// The chart rendered with `ci/<values>-values.yaml` and `set` (`name=value`).
fn chart_with(values: &str, set: &str) -> Option<Vec<Value>> {
    if !installed("Helm", "helm", &["version"]) {
        return None;
    }
    let chart = repo("deploy/helm/dedupe-proxy");
    let output = std::process::Command::new("helm")
        .args(["template", "dedupe-proxy"])
        .arg(&chart)
        .arg("--values")
        .arg(chart.join(format!("ci/{values}-values.yaml")))
        .args(["--set-string", set])
        .output()
        .unwrap();
    let rendered = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let documents = serde_yaml::Deserializer::from_str(&rendered)
        .map(|document| Value::deserialize(document).unwrap())
        .filter(|document| !document.is_null());
    Some(documents.collect())
}

fn pod_of(variant: &str, resources: &[Value]) -> Pod {
    let workload = of_kind(resources, &["Deployment", "StatefulSet"]);
    let config_map = of_kind(resources, &["ConfigMap"]);
    let service = of_kind(resources, &["Service"]);
    let spec = &workload["spec"]["template"]["spec"];
    let container = spec["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "dedupe-proxy")
        .expect("a dedupe-proxy container");
    let config_text = config_map["data"]["config.yaml"]
        .as_str()
        .unwrap()
        .to_owned();
    let config: Value = serde_yaml::from_str(&config_text).unwrap();

    let ports: Vec<(String, u64)> = container["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["containerPort"].as_u64().unwrap(),
            )
        })
        .collect();
    let port = |name: &str| ports.iter().find(|(n, _)| n == name).map(|(_, p)| *p);
    assert_eq!(
        port("http"),
        Some(port_of(config["listen"].as_str().unwrap())),
        "{variant}: listen"
    );
    assert_eq!(
        port("admin"),
        Some(port_of(config["admin"]["listen"].as_str().unwrap())),
        "{variant}: admin"
    );
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"], "http",
        "{variant}: the Service targets the proxy"
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(
            container[probe]["httpGet"]["path"], path,
            "{variant}: {probe}"
        );
        assert_eq!(
            container[probe]["httpGet"]["port"], "admin",
            "{variant}: {probe}"
        );
    }

    let security = &container["securityContext"];
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"][0], "ALL");
    assert!(container["resources"]["limits"]["memory"].is_string());

    let mounts = container["volumeMounts"].as_sequence().unwrap();
    let mount = |name: &str| {
        mounts
            .iter()
            .find(|m| m["name"] == name)
            .map(|m| m["mountPath"].as_str().unwrap().to_owned())
    };
    let config_mount = mount("config").expect("a config mount");
    let data_mount = mount("data");
    let args: Vec<String> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let config_arg = args
        .iter()
        .skip_while(|a| *a != "--config")
        .nth(1)
        .expect("--config");
    assert_eq!(
        config_arg,
        &format!("{config_mount}/config.yaml"),
        "{variant}: the config file is the ConfigMap's"
    );
    assert!(args.windows(2).any(|w| w == ["--log-format", "json"]));
    match config["store"]["sled"]["path"].as_str() {
        Some(store_path) => {
            let data_mount = data_mount
                .as_deref()
                .expect("a sled store needs a data volume");
            assert!(
                store_path.starts_with(&format!("{data_mount}/")),
                "{variant}: the store is on the data volume"
            );
        }
        None => assert!(
            data_mount.is_none(),
            "{variant}: a shared store needs no data volume"
        ),
    }

    let grace_seconds = spec["terminationGracePeriodSeconds"].as_u64().unwrap();
    let shutdown_grace =
        humantime::parse_duration(config["shutdown_grace"].as_str().unwrap()).unwrap();
    assert!(
        Duration::from_secs(grace_seconds) > shutdown_grace + Duration::from_secs(5),
        "{variant}: grace"
    );

    let env = container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| {
            let value = match e["value"].as_str() {
                Some(value) => value.to_owned(),
                None => match e["valueFrom"]["secretKeyRef"]["key"].as_str() {
                    Some("admin-token") => "token-from-the-secret".to_owned(),
                    Some("redis-url") => REDIS_URL.to_owned(),
                    Some("database-url" | "database-direct-url") => POSTGRES_URL.to_owned(),
                    other => panic!("{variant}: an unexpected secret {other:?}"),
                },
            };
            (e["name"].as_str().unwrap().to_owned(), value)
        })
        .collect();
    Pod {
        args,
        env,
        config_text,
        config_mount,
        data_mount,
        grace_seconds,
    }
}

#[test]
fn the_sidecar_keeps_keys_on_an_empty_dir_and_the_statefulset_on_a_claim() {
    let sidecar = kustomize(&repo("deploy/kubernetes/sidecar"));
    let volumes = &of_kind(&sidecar, &["Deployment"])["spec"]["template"]["spec"]["volumes"];
    assert!(
        volumes
            .as_sequence()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "data" && v["emptyDir"].is_mapping())
    );
    let persistent = kustomize(&repo("deploy/kubernetes/persistent"));
    let claims = &of_kind(&persistent, &["StatefulSet"])["spec"]["volumeClaimTemplates"];
    assert_eq!(claims[0]["metadata"]["name"], "data");
}

/// Starts the binary as the manifest does, with its mount paths and ports mapped into
/// this test (ports 0, directories in a temp dir, the upstream a test server), probes it
/// as the kubelet would, delivers an event, and stops it with SIGTERM.
async fn run_as_deployed(variant: &str) {
    run_as(variant, pod(variant)).await;
}

async fn run_as(variant: &str, pod: Pod) {
    let upstream = Upstream::start().await;
    let root = tempfile::tempdir().unwrap();
    let (etc, data) = (root.path().join("etc"), root.path().join("data"));
    std::fs::create_dir_all(&etc).unwrap();
    let config = pod
        .config_text
        .replace(
            &format!("{}/", pod.data_mount.as_deref().unwrap_or("/nowhere")),
            &format!("{}/", data.display()),
        )
        .replace("0.0.0.0:8081", "127.0.0.1:0")
        .replace("0.0.0.0:9091", "127.0.0.1:0")
        .replace(
            "http://127.0.0.1:8080",
            &format!("http://{}", upstream.addr),
        );
    std::fs::write(etc.join("config.yaml"), config).unwrap();
    let args: Vec<String> = pod
        .args
        .iter()
        .map(|arg| arg.replace(&pod.config_mount, &etc.display().to_string()))
        .collect();
    let env: Vec<(String, String)> = pod.env.clone();
    let mut proxy = tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        Binary::spawn(&args, &env)
    })
    .await
    .unwrap();
    for path in ["/healthz", "/readyz"] {
        let probe = send(proxy.admin, "GET", path, &[], "").await;
        assert!(
            (200..400).contains(&probe.status),
            "{variant}: {path} answered {}",
            probe.status
        );
    }
    let token = [("authorization", "Bearer token-from-the-secret")];
    assert_eq!(
        send(proxy.admin, "GET", "/v1/routes", &token, "")
            .await
            .status,
        200
    );
    // A fresh event: a shared store outlives this test.
    let event = format!("evt_k8s_{:x}", rand::random::<u64>());
    let body = format!(r#"{{"id":"{event}"}}"#);
    let reply = post_json(proxy.addr, "/webhooks/stripe", &body).await;
    assert_eq!(reply.dedupe(), "forwarded");
    let forget = format!("/v1/keys/stripe/{event}");
    assert_eq!(
        send(proxy.admin, "DELETE", &forget, &token, "")
            .await
            .status,
        204
    );
    proxy.signal("TERM");
    let exit = proxy.wait(Duration::from_secs(pod.grace_seconds));
    assert_eq!(
        exit.code(),
        Some(0),
        "{variant}: log:\n{}",
        proxy.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_deployment_runs_as_written() {
    run_as_deployed("sidecar").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_statefulset_runs_as_written() {
    run_as_deployed("persistent").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replicated_deployment_on_redis_runs_as_written() {
    if !support::service_available("Redis", 6379).await {
        return;
    }
    let resources = kustomize(&repo("deploy/kubernetes/replicated"));
    assert!(
        of_kind(&resources, &["Deployment"])["spec"]["replicas"]
            .as_u64()
            .unwrap()
            > 1
    );
    run_as_deployed("replicated").await;
}

/// The instructions of the runtime stage of the Dockerfile, by keyword.
fn dockerfile_runtime() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo("Dockerfile")).unwrap();
    let runtime = text.rsplit("\nFROM ").next().unwrap();
    runtime
        .lines()
        .filter(|line| !line.trim_start().starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| line.split_once(' '))
        .map(|(keyword, rest)| (keyword.to_owned(), rest.trim().to_owned()))
        .collect()
}

/// What the build stage of the Dockerfile copies in (each `COPY`'s sources, as written).
fn dockerfile_build_copies() -> Vec<String> {
    let text = std::fs::read_to_string(repo("Dockerfile")).unwrap();
    let build = text.rsplit_once("\nFROM ").unwrap().0;
    build
        .lines()
        .filter_map(|line| line.trim().strip_prefix("COPY "))
        .flat_map(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            words[..words.len() - 1]
                .iter()
                .map(|source| source.trim_end_matches('/').to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The places `text` names after `opening` (up to the next `"`).
fn quoted_after<'a>(text: &'a str, opening: &str) -> Vec<&'a str> {
    text.match_indices(opening)
        .map(|(at, _)| {
            let rest = &text[at + opening.len()..];
            &rest[..rest.find('"').unwrap()]
        })
        .collect()
}

/// Every file the release build reads besides `src/`: what `include_str!` and
/// `include_bytes!` name outside unit tests, and the manifest's path dependencies.
fn read_by_the_build() -> Vec<String> {
    let root = repo("").canonicalize().unwrap();
    let mut read = Vec::new();
    let mut pending = vec![repo("src")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            // A file's unit tests come last, and are not in the release build.
            let text = text.split("#[cfg(test)]").next().unwrap();
            for opening in ["include_str!(\"", "include_bytes!(\""] {
                for named in quoted_after(text, opening) {
                    let file = path.parent().unwrap().join(named).canonicalize();
                    let file = file.unwrap_or_else(|e| panic!("{}: {named}: {e}", path.display()));
                    read.push(file.strip_prefix(&root).unwrap().display().to_string());
                }
            }
        }
    }
    let manifest = std::fs::read_to_string(repo("Cargo.toml")).unwrap();
    // The crate itself is a path dependency of its own tests (`path = "."`).
    for dependency in quoted_after(&manifest, "path = \"") {
        if dependency != "." {
            read.push(dependency.trim_start_matches("./").to_owned());
        }
    }
    read.sort();
    read.dedup();
    read
}

#[test]
fn the_image_build_copies_every_file_the_build_reads() {
    let copied = dockerfile_build_copies();
    assert!(copied.contains(&"src".to_owned()), "{copied:?}");
    let read = read_by_the_build();
    assert!(
        read.iter().any(|file| file.starts_with("examples/")),
        "{read:?}"
    );
    assert!(read.contains(&"vendor/sled".to_owned()), "{read:?}");
    let missing: Vec<&String> = read
        .iter()
        .filter(|file| !file.starts_with("src/"))
        .filter(|file| {
            !copied
                .iter()
                .any(|source| *file == source || file.starts_with(&format!("{source}/")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the Dockerfile's build stage does not copy {missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_its_command_as_a_non_root_user_and_stops_on_sigterm() {
    let instructions = dockerfile_runtime();
    let get = |keyword: &str| {
        instructions
            .iter()
            .find(|(k, _)| k == keyword)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {keyword}"))
    };
    assert_eq!(get("USER"), "65532:65532", "a non-root user");
    assert_eq!(get("STOPSIGNAL"), "SIGTERM");
    assert_eq!(get("VOLUME"), r#"["/data"]"#);
    let entrypoint: Vec<String> = serde_json::from_str(&get("ENTRYPOINT")).unwrap();
    let command: Vec<String> = serde_json::from_str(&get("CMD")).unwrap();
    assert_eq!(entrypoint, ["/usr/local/bin/dedupe-proxy"]);
    let config_copy = instructions
        .iter()
        .find(|(k, v)| k == "COPY" && v.starts_with("config/container.yaml "))
        .map(|(_, v)| v.split_whitespace().nth(1).unwrap().to_owned())
        .expect("the default configuration is copied in");
    assert!(
        command.contains(&config_copy),
        "CMD reads the copied configuration"
    );

    let config_text = std::fs::read_to_string(repo("config/container.yaml")).unwrap();
    let config: Value = serde_yaml::from_str(&config_text).unwrap();
    let exposed: Vec<u64> = get("EXPOSE")
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(
        exposed,
        [
            port_of(config["listen"].as_str().unwrap()),
            port_of(config["admin"]["listen"].as_str().unwrap())
        ]
    );
    assert!(
        config["store"]["sled"]["path"]
            .as_str()
            .unwrap()
            .starts_with("/data/")
    );

    let upstream = Upstream::start().await;
    let root = tempfile::tempdir().unwrap();
    let local_config = root.path().join("config.yaml");
    let mapped = config_text
        .replace("/data/", &format!("{}/", root.path().display()))
        .replace("0.0.0.0:8081", "127.0.0.1:0")
        // All interfaces, as in the image (on a free port): the admin API's exposure is the
        // image's.
        .replace("0.0.0.0:9091", "0.0.0.0:0")
        .replace(
            "http://127.0.0.1:8080",
            &format!("http://{}", upstream.addr),
        );
    std::fs::write(&local_config, mapped).unwrap();
    let args: Vec<String> = command
        .iter()
        .map(|arg| arg.replace(&config_copy, &local_config.display().to_string()))
        .collect();
    let mut proxy = tokio::task::spawn_blocking(move || Binary::spawn(&args, &[]))
        .await
        .unwrap();
    assert_eq!(
        send(proxy.admin, "GET", "/readyz", &[], "").await.status,
        200
    );
    assert_eq!(
        post_json(proxy.addr, "/webhooks/stripe", r#"{"id":"evt_img"}"#)
            .await
            .dedupe(),
        "forwarded"
    );
    // No token in the image's default: key removal and reload are not open to the network.
    assert_eq!(
        send(proxy.admin, "DELETE", "/v1/keys/stripe/evt_img", &[], "")
            .await
            .status,
        403
    );
    assert_eq!(
        send(proxy.admin, "GET", "/metrics", &[], "").await.status,
        200
    );
    proxy.signal("TERM");
    assert_eq!(proxy.wait(Duration::from_secs(30)).code(), Some(0));
}

/// The Helm chart on sled: one replica, a StatefulSet whose keys live on a volume claim,
/// started as rendered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_on_sled_runs_as_rendered() {
    let Some(resources) = chart("sled") else {
        return;
    };
    let workload = of_kind(&resources, &["StatefulSet"]);
    assert_eq!(workload["spec"]["replicas"], 1);
    // Providers reach the proxy's port alone: the admin port stays on the pod.
    let ports = &of_kind(&resources, &["Service"])["spec"]["ports"];
    assert_eq!(ports.as_sequence().unwrap().len(), 1, "{ports:?}");
    assert_eq!(ports[0]["targetPort"], "http");
    assert_eq!(
        workload["spec"]["volumeClaimTemplates"][0]["metadata"]["name"],
        "data"
    );
    run_as("chart, sled", pod_of("chart, sled", &resources)).await;
}

/// The chart on Redis: a Deployment of three replicas sharing the store, rolled one at a
/// time and drained one at a time, started as rendered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_on_redis_runs_as_rendered() {
    if !support::service_available("Redis", 6379).await {
        return;
    }
    let Some(resources) = chart("redis") else {
        return;
    };
    let workload = of_kind(&resources, &["Deployment"]);
    assert_eq!(workload["spec"]["replicas"], 3);
    assert_eq!(
        of_kind(&resources, &["PodDisruptionBudget"])["spec"]["maxUnavailable"],
        1
    );
    assert!(!resources.iter().any(|r| r["kind"] == "StatefulSet"));
    run_as("chart, redis", pod_of("chart, redis", &resources)).await;
}

/// The chart on PostgreSQL with `directUrl`: `url` and `direct_url` from the Secret (both
/// the server itself here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_on_postgres_runs_as_rendered() {
    if !support::service_available("PostgreSQL", 5432).await {
        return;
    }
    let Some(resources) = chart("postgres") else {
        return;
    };
    let config = of_kind(&resources, &["ConfigMap"])["data"]["config.yaml"]
        .as_str()
        .unwrap();
    assert!(
        config.contains("direct_url_env: DATABASE_DIRECT_URL"),
        "{config}"
    );
    run_as("chart, postgres", pod_of("chart, postgres", &resources)).await;
}

/// A store the chart does not know stops the rendering, naming the ones it does.
#[test]
fn the_chart_refuses_a_store_it_does_not_know() {
    if !installed("Helm", "helm", &["version"]) {
        return;
    }
    let output = std::process::Command::new("helm")
        .args(["template", "dedupe-proxy"])
        .arg(repo("deploy/helm/dedupe-proxy"))
        .args(["--set", "store.kind=mongo"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(said.contains("one of sled, redis, postgres"), "{said}");
}

/// The sidecar as values for an application's own chart runs the same container as the
/// sidecar kustomization: same image, arguments, environment, ports, probes and mounts.
#[test]
fn the_sidecar_values_run_the_sidecar_kustomizations_container() {
    let values = &documents(&repo("deploy/helm/sidecar-values.yaml"))[0];
    let shown = &values["sidecars"][0];
    let sidecar = kustomize(&repo("deploy/kubernetes/sidecar"));
    let spec = &of_kind(&sidecar, &["Deployment"])["spec"]["template"]["spec"];
    let container = spec["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "dedupe-proxy")
        .unwrap();
    for field in [
        "image",
        "args",
        "env",
        "ports",
        "livenessProbe",
        "readinessProbe",
        "securityContext",
    ] {
        assert_eq!(shown[field], container[field], "{field}");
    }
    let mounts = |container: &Value| -> Vec<String> {
        let mounts = container["volumeMounts"].as_sequence().unwrap().iter();
        mounts
            .map(|m| m["mountPath"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(mounts(shown), mounts(container));
    let volumes: Vec<&str> = values["extraVolumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|volume| volume["name"].as_str().unwrap())
        .collect();
    for mount in shown["volumeMounts"].as_sequence().unwrap() {
        assert!(
            volumes.contains(&mount["name"].as_str().unwrap()),
            "{mount:?}"
        );
    }
}

/// A value the chart writes into config.yaml stays one value, whatever it holds: an
/// upstream with `#`, `: ` and a line break does not add keys to the configuration.
#[test]
fn the_chart_writes_its_values_into_the_configuration_as_values() {
    let upstream = "http://app:8080/in#x: y\nadmin: {}";
    let Some(resources) = chart_with("sled", &format!("upstream={upstream}")) else {
        return;
    };
    let text = of_kind(&resources, &["ConfigMap"])["data"]["config.yaml"]
        .as_str()
        .unwrap();
    let config: Value = serde_yaml::from_str(text).unwrap();
    assert_eq!(config["upstream"], upstream, "{text}");
    assert_eq!(config["admin"]["token_env"], "DEDUPE_ADMIN_TOKEN", "{text}");
}

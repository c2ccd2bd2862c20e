//! The admin port's endpoints: which one a request's path names, and the methods it
//! takes (`HEAD` wherever `GET` is, as HTTP asks). A known path asked with another method
//! is answered 405 with `Allow`, an unknown one 404.

use http::Method;

/// An endpoint of the admin port: a probe, one of the API's under `/v1/`, the console's
/// files, or `/mcp`.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Endpoint<'a> {
    Probe(Probe),
    Api(Api<'a>),
    /// `/` (which sends the browser on to the console) and the console's files.
    Console(super::console::Asset),
    /// `/mcp`: the Model Context Protocol, each tool an `Api` request.
    Mcp,
}

/// The paths whose POSTs change nothing, which a read-only caller may send: `/mcp` (its
/// tools are limited instead) and a dry run.
pub(super) const READ_ONLY_POSTS: [&str; 2] = ["/mcp", "/v1/try"];

/// The endpoints that answer from the start, without the token.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Probe {
    Health,
    Ready,
    Metrics,
}

/// The API under `/v1/`, which the token guards and which answers once the store is open;
/// the parts its path names are still percent-encoded.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Api<'a> {
    /// `/v1/overview`: what the console's first page shows, and who asks.
    Overview,
    Routes,
    Reload,
    /// `/v1/scopes`: every scope, its keys counted by state.
    Scopes,
    /// `/v1/scopes/{scope}/clear`.
    ClearScope {
        scope: &'a str,
    },
    Keys,
    Key {
        route: &'a str,
        key: &'a str,
    },
    /// `/v1/keys/{route}/{key}/resolve`: a key that itself ends in `/resolve` is named
    /// with its slash escaped (`%2F`).
    Resolve {
        route: &'a str,
        key: &'a str,
    },
    Entity {
        route: &'a str,
        entity: &'a str,
    },
    /// `/v1/queue`: every queued route's counts.
    Queue,
    /// `/v1/queue/{route}/pause` and `/resume`.
    Pause {
        route: &'a str,
        paused: bool,
    },
    /// `/v1/queue/{route}/dead`: dead letters, filtered.
    Dead {
        route: &'a str,
    },
    /// `/v1/queue/{route}/replays`: a bulk replay of the dead letters a filter picks.
    Replays {
        route: &'a str,
    },
    /// `/v1/queue/{route}/jobs/{key}`, and with `/replay` after it.
    Job {
        route: &'a str,
        key: &'a str,
        replay: bool,
    },
    /// `/v1/replays/{id}`: a bulk replay's progress.
    Replay {
        id: &'a str,
    },
    /// `/v1/try`: a dry run of a request against the running routes; a POST that changes
    /// nothing.
    Try,
    /// `/v1/deliveries`: the delivery log, filtered.
    Deliveries,
    /// `/v1/deliveries/tail`: the entries stored from now on, as events.
    DeliveriesTail,
    /// `/v1/deliveries/{id}`: one entry.
    Delivery {
        id: &'a str,
    },
}

impl<'a> Endpoint<'a> {
    /// The endpoint `path` names, if any.
    pub(super) fn parse(path: &'a str) -> Option<Endpoint<'a>> {
        let api = match path {
            "/healthz" => return Some(Endpoint::Probe(Probe::Health)),
            "/readyz" => return Some(Endpoint::Probe(Probe::Ready)),
            "/metrics" => return Some(Endpoint::Probe(Probe::Metrics)),
            "/mcp" => return Some(Endpoint::Mcp),
            _ if path == "/" || path.starts_with("/console") => {
                return super::console::Asset::named(path).map(Endpoint::Console);
            }
            "/v1/overview" => Api::Overview,
            "/v1/routes" => Api::Routes,
            "/v1/reload" => Api::Reload,
            "/v1/keys" => Api::Keys,
            "/v1/scopes" => Api::Scopes,
            "/v1/queue" => Api::Queue,
            "/v1/deliveries" => Api::Deliveries,
            "/v1/deliveries/tail" => Api::DeliveriesTail,
            "/v1/try" => Api::Try,
            _ if path.starts_with("/v1/queue/") => queue(&path["/v1/queue/".len()..])?,
            _ if path.starts_with("/v1/deliveries/") => {
                let id = &path["/v1/deliveries/".len()..];
                (!id.is_empty() && !id.contains('/')).then_some(Api::Delivery { id })?
            }
            _ if path.starts_with("/v1/scopes/") => {
                let scope = path["/v1/scopes/".len()..].strip_suffix("/clear")?;
                (!scope.is_empty() && !scope.contains('/')).then_some(Api::ClearScope { scope })?
            }
            _ if path.starts_with("/v1/replays/") => {
                let id = &path["/v1/replays/".len()..];
                (!id.is_empty() && !id.contains('/')).then_some(Api::Replay { id })?
            }
            _ => {
                if let Some(rest) = path.strip_prefix("/v1/keys/") {
                    let (route, key) = named(rest)?;
                    match key.strip_suffix("/resolve").filter(|key| !key.is_empty()) {
                        Some(key) => Api::Resolve { route, key },
                        None => Api::Key { route, key },
                    }
                } else {
                    let (route, entity) = named(path.strip_prefix("/v1/entities/")?)?;
                    Api::Entity { route, entity }
                }
            }
        };
        Some(Endpoint::Api(api))
    }

    /// The methods the endpoint takes, as `Allow` lists them.
    pub(super) fn allow(&self) -> &'static str {
        match self {
            Endpoint::Probe(_) | Endpoint::Api(Api::Routes | Api::Keys | Api::Queue) => "GET, HEAD",
            Endpoint::Console(_) | Endpoint::Api(Api::Overview) => "GET, HEAD",
            Endpoint::Api(Api::Scopes) => "GET, HEAD",
            Endpoint::Api(
                Api::Dead { .. } | Api::Deliveries | Api::DeliveriesTail | Api::Delivery { .. },
            ) => "GET, HEAD",
            Endpoint::Api(
                Api::Reload
                | Api::ClearScope { .. }
                | Api::Resolve { .. }
                | Api::Pause { .. }
                | Api::Replays { .. }
                | Api::Try
                | Api::Job { replay: true, .. },
            )
            | Endpoint::Mcp => "POST",
            Endpoint::Api(Api::Key { .. }) => "GET, HEAD, DELETE, PATCH",
            Endpoint::Api(Api::Entity { .. } | Api::Job { .. } | Api::Replay { .. }) => {
                "GET, HEAD, DELETE"
            }
        }
    }

    /// Whether the endpoint takes `method`.
    pub(super) fn takes(&self, method: &Method) -> bool {
        self.allow()
            .split(", ")
            .any(|allowed| allowed == method.as_str())
    }
}

/// What follows `/v1/queue/`.
fn queue(rest: &str) -> Option<Api<'_>> {
    let (route, action) = rest
        .split_once('/')
        .filter(|(route, _)| !route.is_empty())?;
    Some(match action {
        "pause" => Api::Pause {
            route,
            paused: true,
        },
        "resume" => Api::Pause {
            route,
            paused: false,
        },
        "dead" => Api::Dead { route },
        "replays" => Api::Replays { route },
        _ => {
            let key = action.strip_prefix("jobs/").filter(|key| !key.is_empty())?;
            match key.strip_suffix("/replay").filter(|key| !key.is_empty()) {
                Some(key) => Api::Job {
                    route,
                    key,
                    replay: true,
                },
                None => Api::Job {
                    route,
                    key,
                    replay: false,
                },
            }
        }
    })
}

/// `{route}/{name}` split at the first slash, both non-empty.
fn named(rest: &str) -> Option<(&str, &str)> {
    rest.split_once('/')
        .filter(|(route, name)| !route.is_empty() && !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_endpoints() {
        assert_eq!(
            Endpoint::parse("/metrics"),
            Some(Endpoint::Probe(Probe::Metrics))
        );
        let api = |path| match Endpoint::parse(path) {
            Some(Endpoint::Api(api)) => api,
            other => panic!("{path}: {other:?}"),
        };
        assert_eq!(
            api("/v1/keys/stripe/evt_1"),
            Api::Key {
                route: "stripe",
                key: "evt_1"
            }
        );
        assert_eq!(
            api("/v1/keys/stripe/a/b/resolve"),
            Api::Resolve {
                route: "stripe",
                key: "a/b"
            }
        );
        assert_eq!(
            api("/v1/keys/stripe/resolve"),
            Api::Key {
                route: "stripe",
                key: "resolve"
            }
        );
        assert_eq!(
            api("/v1/queue/github/jobs/a/b/replay"),
            Api::Job {
                route: "github",
                key: "a/b",
                replay: true
            }
        );
        assert_eq!(
            api("/v1/queue/github/jobs/replay"),
            Api::Job {
                route: "github",
                key: "replay",
                replay: false
            }
        );
        assert_eq!(api("/v1/queue/github/dead"), Api::Dead { route: "github" });
        assert_eq!(api("/v1/replays/7"), Api::Replay { id: "7" });
        assert_eq!(api("/v1/scopes"), Api::Scopes);
        assert_eq!(api("/v1/overview"), Api::Overview);
        use crate::admin::console::Asset;
        for (path, asset) in [
            ("/", Asset::Root),
            ("/console", Asset::Page),
            ("/console/", Asset::Page),
            ("/console/app.js", Asset::Script),
            ("/console/app.css", Asset::Style),
        ] {
            assert_eq!(Endpoint::parse(path), Some(Endpoint::Console(asset)));
        }
        assert_eq!(
            api("/v1/scopes/a%2Fb/clear"),
            Api::ClearScope { scope: "a%2Fb" }
        );
        assert_eq!(api("/v1/deliveries/12-3"), Api::Delivery { id: "12-3" });
        assert_eq!(api("/v1/deliveries/tail"), Api::DeliveriesTail);
        for unknown in [
            "/v1/queue/github",
            "/v1/queue//pause",
            "/v1/queue/github/jobs/",
            "/v1/queue/github/other",
            "/v1/replays/",
            "/v1/replays/1/2",
            "/v1/deliveries/",
            "/v1/deliveries/1-2/x",
            "/v1/scopes/",
            "/v1/scopes/a",
            "/v1/scopes//clear",
            "/v1/scopes/a/b/clear",
            "/v1/scopes/a/clear/",
            "/v1",
            "/console/other.js",
            "/console/app.js/",
            "/consoles",
            "//",
            "/v1/keys/",
            "/v1/keys/stripe",
            "/v1/keys//k",
            "/metrics/",
        ] {
            assert_eq!(Endpoint::parse(unknown), None, "{unknown}");
        }
    }

    /// The paths open to anyone change nothing: the read-only rule (`access`) leaves them
    /// to this.
    #[test]
    fn the_paths_open_to_anyone_take_only_get_and_head() {
        for path in [
            "/healthz",
            "/readyz",
            "/metrics",
            "/",
            "/console/",
            "/console/app.js",
        ] {
            let endpoint = Endpoint::parse(path).unwrap();
            assert_eq!(endpoint.allow(), "GET, HEAD", "{path}");
        }
    }

    #[test]
    fn head_goes_wherever_get_does() {
        let key = Endpoint::parse("/v1/keys/r/k").unwrap();
        assert!(key.takes(&Method::HEAD) && key.takes(&Method::DELETE));
        assert!(key.takes(&Method::PATCH));
        assert!(!key.takes(&Method::POST));
        assert!(!Endpoint::Api(Api::Reload).takes(&Method::GET));
    }
}

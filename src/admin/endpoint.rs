//! The admin port's endpoints: which one a request's path names, and the methods it
//! takes (`HEAD` wherever `GET` is, as HTTP asks). A known path asked with another method
//! is answered 405 with `Allow`, an unknown one 404.

use http::Method;

/// An endpoint of the admin port, with the parts its path names still percent-encoded.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Endpoint<'a> {
    Health,
    Ready,
    Metrics,
    Routes,
    Reload,
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
}

impl<'a> Endpoint<'a> {
    /// The endpoint `path` names, if any.
    pub(super) fn parse(path: &'a str) -> Option<Endpoint<'a>> {
        let endpoint = match path {
            "/healthz" => Endpoint::Health,
            "/readyz" => Endpoint::Ready,
            "/metrics" => Endpoint::Metrics,
            "/v1/routes" => Endpoint::Routes,
            "/v1/reload" => Endpoint::Reload,
            "/v1/keys" => Endpoint::Keys,
            _ => {
                if let Some(rest) = path.strip_prefix("/v1/keys/") {
                    let (route, key) = named(rest)?;
                    match key.strip_suffix("/resolve").filter(|key| !key.is_empty()) {
                        Some(key) => Endpoint::Resolve { route, key },
                        None => Endpoint::Key { route, key },
                    }
                } else {
                    let (route, entity) = named(path.strip_prefix("/v1/entities/")?)?;
                    Endpoint::Entity { route, entity }
                }
            }
        };
        Some(endpoint)
    }

    /// The methods the endpoint takes, as `Allow` lists them.
    pub(super) fn allow(&self) -> &'static str {
        match self {
            Endpoint::Health
            | Endpoint::Ready
            | Endpoint::Metrics
            | Endpoint::Routes
            | Endpoint::Keys => "GET, HEAD",
            Endpoint::Reload | Endpoint::Resolve { .. } => "POST",
            Endpoint::Key { .. } | Endpoint::Entity { .. } => "GET, HEAD, DELETE",
        }
    }

    /// Whether the endpoint takes `method`.
    pub(super) fn takes(&self, method: &Method) -> bool {
        self.allow()
            .split(", ")
            .any(|allowed| allowed == method.as_str())
    }

    /// Whether the endpoint is of the API under `/v1/`, which the token guards and which
    /// answers only once the store is open.
    pub(super) fn is_api(&self) -> bool {
        !matches!(self, Endpoint::Health | Endpoint::Ready | Endpoint::Metrics)
    }
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
        assert_eq!(Endpoint::parse("/metrics"), Some(Endpoint::Metrics));
        assert_eq!(
            Endpoint::parse("/v1/keys/stripe/evt_1"),
            Some(Endpoint::Key {
                route: "stripe",
                key: "evt_1"
            })
        );
        assert_eq!(
            Endpoint::parse("/v1/keys/stripe/a/b/resolve"),
            Some(Endpoint::Resolve {
                route: "stripe",
                key: "a/b"
            })
        );
        assert_eq!(
            Endpoint::parse("/v1/keys/stripe/resolve"),
            Some(Endpoint::Key {
                route: "stripe",
                key: "resolve"
            })
        );
        for unknown in [
            "/",
            "/v1",
            "/v1/keys/",
            "/v1/keys/stripe",
            "/v1/keys//k",
            "/metrics/",
        ] {
            assert_eq!(Endpoint::parse(unknown), None, "{unknown}");
        }
    }

    #[test]
    fn head_goes_wherever_get_does() {
        let key = Endpoint::parse("/v1/keys/r/k").unwrap();
        assert!(key.takes(&Method::HEAD) && key.takes(&Method::DELETE));
        assert!(!key.takes(&Method::POST));
        assert!(!Endpoint::Reload.takes(&Method::GET));
    }
}

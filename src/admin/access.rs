//! Who may use the admin port: the Host and Origin rules that keep a web page the operator
//! opens from driving it, checked in front of everything it serves ([`Rules::check`]); and
//! the bearer token each endpoint's role needs, then a `POST`'s type ([`Rules::admit`]),
//! checked for the endpoint the route table found (under `/v1/` and at `/mcp`, an unknown
//! path or method asks for the token too, before its `404` or `405`).
//!
//! A page on another site can make the operator's browser send requests to the admin port
//! (a form posted to `http://127.0.0.1:9091/v1/reload`), or rebind its own name to the
//! port's address so that its scripts read the answers (DNS rebinding). So:
//!
//! - a request must name the port by an address (the one it reached, a loopback one, or a
//!   wildcard listener's `0.0.0.0`), by `localhost`, or by a name in `admin.hosts`: a
//!   rebound name is none of these. Health and readiness are exempt: they tell nothing
//!   and change nothing, and a load balancer's probe may name the port otherwise;
//! - a request that changes something must come from no page or from the port's own
//!   origin (`Sec-Fetch-Site`, else `Origin` against `Host`, as Go's
//!   `CrossOriginProtection` decides), and a `POST`, the one such method a page can send
//!   without asking first, must carry a JSON body's type or an `Authorization` header,
//!   which no page can send to another origin without the port's consent (never given).

use std::net::{IpAddr, SocketAddr};

use http::header::{AUTHORIZATION, CONTENT_TYPE, HOST, ORIGIN};
use http::{HeaderMap, Method, Request, Uri, Version};
use subtle::ConstantTimeEq;

use crate::response::AdminRefusal;
use crate::values::Secret;

/// Who may use `/v1/*` and `/mcp`.
pub enum Access {
    /// Whoever presents the operator's bearer token; with the viewer's, reads only.
    Token {
        operator: Secret,
        viewer: Option<Secret>,
    },
    /// Anyone: the listener is on a loopback address.
    Local,
    /// No one: the listener is reachable from the network and has no token.
    Closed,
}

/// What an endpoint asks of its caller (the route table gives each one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: the probes and the console's files, which tell nothing secret and change
    /// nothing.
    Anyone,
    /// A token, the viewer's or the operator's: a read, or a `POST` that changes nothing.
    Viewer,
    /// The operator's token: a change.
    Operator,
}

/// What a request that passed the rules may do, and the credential it showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Read and change: the operator's token, or any caller on a loopback listener
    /// without one.
    Operator { credential: &'static str },
    /// Read only: the viewer's token.
    Viewer,
    /// No credential asked: the probes and the console's files, which change nothing.
    Anyone,
}

impl Role {
    /// The credential, as the log and `/v1/overview` name it.
    pub fn credential(self) -> &'static str {
        match self {
            Role::Operator { credential } => credential,
            Role::Viewer => "viewer_token",
            Role::Anyone => "none",
        }
    }

    pub fn may_change(self) -> bool {
        matches!(self, Role::Operator { .. })
    }
}

/// The rules every admin request meets.
pub struct Rules {
    pub access: Access,
    /// `admin.hosts`: other names the port may be reached by, lowercase, without a
    /// trailing dot.
    pub hosts: Vec<String>,
}

impl Rules {
    /// Checks a request that came to `local` against the rules every request meets,
    /// before it is routed: the Host it names, and the page it comes from.
    pub fn check<B>(&self, request: &Request<B>, local: SocketAddr) -> Result<(), AdminRefusal> {
        let probe = matches!(*request.method(), Method::GET | Method::HEAD)
            && matches!(request.uri().path(), "/healthz" | "/readyz");
        if !probe {
            self.check_host(request.version(), request.uri(), request.headers(), local)?;
        }
        if !request.method().is_safe() {
            check_origin(request.headers())?;
        }
        Ok(())
    }

    /// What a request (its method and headers) may do at an endpoint that needs `need`,
    /// or the refusal to answer with: the credentials first, then a `POST`'s type.
    pub fn admit(
        &self,
        need: Need,
        method: &Method,
        headers: &HeaderMap,
    ) -> Result<Role, AdminRefusal> {
        let role = match need {
            Need::Anyone => Role::Anyone,
            Need::Viewer => self.role(headers)?,
            Need::Operator => match self.role(headers)? {
                Role::Viewer => return Err(AdminRefusal::ReadOnly),
                role => role,
            },
        };
        if *method == Method::POST && !has_json_or_credentials(headers) {
            return Err(AdminRefusal::JsonRequired);
        }
        Ok(role)
    }

    /// What the credentials in `headers` allow on `/v1/*` and `/mcp`.
    fn role(&self, headers: &HeaderMap) -> Result<Role, AdminRefusal> {
        match &self.access {
            Access::Closed => Err(AdminRefusal::Closed),
            Access::Local => Ok(Role::Operator {
                credential: "loopback",
            }),
            Access::Token { operator, viewer } => {
                // Both compared, so that the time taken tells nothing of which one matched.
                let is_operator = bearer_matches(headers, operator);
                let is_viewer = viewer
                    .as_ref()
                    .is_some_and(|viewer| bearer_matches(headers, viewer));
                if is_operator {
                    Ok(Role::Operator {
                        credential: "token",
                    })
                } else if is_viewer {
                    Ok(Role::Viewer)
                } else {
                    Err(AdminRefusal::Unauthorized)
                }
            }
        }
    }

    /// The request names the port by its own address, `localhost`, or a configured name,
    /// once: two `Host` lines, or an absolute-form target naming another host than `Host`,
    /// are refused as the provider port refuses them ([`crate::target::host`]). A request
    /// naming no host comes from no browser.
    fn check_host(
        &self,
        version: Version,
        uri: &Uri,
        headers: &HeaderMap,
        local: SocketAddr,
    ) -> Result<(), AdminRefusal> {
        let named = match crate::target::host(version, uri, headers) {
            Ok(named) => named,
            Err(crate::target::TargetError::HostCount(0)) => None,
            Err(refused) => return Err(AdminRefusal::BadRequest(refused.to_string())),
        };
        let Some(named) = named else {
            return Ok(());
        };
        let (name, _) = crate::target::split_port(named);
        let allowed = match name
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            // `0.0.0.0` is a wildcard listener's own address, which Linux connects to.
            Ok(ip) => {
                same_ip(ip, local.ip())
                    || ip.is_loopback()
                    || ip.is_unspecified()
                    || self.hosts.contains(&ip.to_canonical().to_string())
            }
            Err(_) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                name == "localhost" || name.ends_with(".localhost") || self.hosts.contains(&name)
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(AdminRefusal::HostNotAllowed(named.to_owned()))
        }
    }
}

/// Two addresses of one interface, an IPv4 one written as IPv6 (`::ffff:a.b.c.d`) too.
fn same_ip(a: IpAddr, b: IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

/// A request that changes something comes from no page, or from the port's own origin.
fn check_origin(headers: &HeaderMap) -> Result<(), AdminRefusal> {
    if let Some(site) = headers.get("sec-fetch-site") {
        return match site.as_bytes() {
            b"same-origin" | b"none" => Ok(()),
            _ => Err(AdminRefusal::CrossOrigin),
        };
    }
    let Some(origin) = headers.get(ORIGIN) else {
        return Ok(());
    };
    let origin_authority = origin
        .to_str()
        .ok()
        .and_then(|origin| origin.parse::<Uri>().ok())
        .and_then(|origin| origin.authority().map(|a| a.as_str().to_ascii_lowercase()));
    let host = headers
        .get(HOST)
        .and_then(|host| host.to_str().ok())
        .map(str::to_ascii_lowercase);
    match (origin_authority, host) {
        (Some(origin), Some(host)) if origin == host => Ok(()),
        _ => Err(AdminRefusal::CrossOrigin),
    }
}

/// Whether a request carries what a page cannot send to another origin unasked: a JSON
/// body's type, or credentials in `Authorization`.
fn has_json_or_credentials(headers: &HeaderMap) -> bool {
    let json = headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"));
    json || headers.contains_key(AUTHORIZATION)
}

/// `Authorization: Bearer <token>`, compared in constant time: their digests, so that
/// the time taken tells nothing of the token's length either.
fn bearer_matches(headers: &HeaderMap, token: &Secret) -> bool {
    use sha2::{Digest, Sha256};
    let presented = headers
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or("");
    let presented = Sha256::digest(presented.as_bytes());
    let expected = Sha256::digest(token.expose().as_bytes());
    presented.as_slice().ct_eq(expected.as_slice()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(hosts: &[&str]) -> Rules {
        Rules {
            access: Access::Local,
            hosts: hosts.iter().map(|host| (*host).to_owned()).collect(),
        }
    }

    fn request(method: &str, path: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder().method(method).uri(path);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    const LOCAL: &str = "10.1.2.3:9091";

    /// Both rules, as an operator's endpoint applies them.
    fn checked(rules: &Rules, request: &Request<()>) -> Result<(), AdminRefusal> {
        rules.check(request, LOCAL.parse().unwrap())?;
        let need = Need::Operator;
        rules
            .admit(need, request.method(), request.headers())
            .map(|_| ())
    }

    #[test]
    fn the_viewers_token_reads_and_changes_nothing_the_operators_does_both() {
        let rules = Rules {
            access: Access::Token {
                operator: Secret::new("operator-token".into()),
                viewer: Some(Secret::new("viewer-token".into())),
            },
            hosts: Vec::new(),
        };
        let admit = |need: Need, token: &str| {
            let bearer = format!("Bearer {token}");
            let asked = request("GET", "/", &[("authorization", &bearer)]);
            rules.admit(need, &Method::GET, asked.headers())
        };
        assert_eq!(admit(Need::Viewer, "viewer-token"), Ok(Role::Viewer));
        assert_eq!(
            admit(Need::Operator, "viewer-token"),
            Err(AdminRefusal::ReadOnly)
        );
        let operator = Role::Operator {
            credential: "token",
        };
        assert_eq!(admit(Need::Operator, "operator-token"), Ok(operator));
        assert_eq!(admit(Need::Viewer, "operator-token"), Ok(operator));
        assert_eq!(admit(Need::Anyone, ""), Ok(Role::Anyone));
        for wrong in ["viewer-tokem", "", "operator-token "] {
            for need in [Need::Viewer, Need::Operator] {
                assert_eq!(
                    admit(need, wrong),
                    Err(AdminRefusal::Unauthorized),
                    "{wrong}"
                );
            }
        }
    }

    #[test]
    fn the_port_answers_to_its_own_address_localhost_and_configured_names() {
        let rules = rules(&["admin.internal", "10.96.0.5"]);
        for host in [
            "10.96.0.5:9091",
            "10.1.2.3:9091",
            "10.1.2.3",
            "127.0.0.1:9091",
            "[::1]:8080",
            "[::ffff:10.1.2.3]:9091",
            "localhost:8080",
            "app.localhost",
            "Admin.Internal.:9091",
            "0.0.0.0:9091",
        ] {
            let get = request("GET", "/v1/routes", &[("host", host)]);
            assert!(checked(&rules, &get).is_ok(), "{host}");
        }
        for host in [
            "evil.example:9091",
            "10.1.2.4:9091",
            "admin.internal.evil",
            "localhost.evil",
        ] {
            let get = request("GET", "/metrics", &[("host", host)]);
            assert!(
                matches!(checked(&rules, &get), Err(AdminRefusal::HostNotAllowed(_))),
                "{host}"
            );
            let probe = request("GET", "/healthz", &[("host", host)]);
            assert!(checked(&rules, &probe).is_ok(), "probes are exempt: {host}");
        }
    }

    /// The provider port's reading of a host: one `Host` line, and an absolute-form target
    /// naming the same host as `Host`.
    #[test]
    fn a_host_named_twice_is_refused() {
        let rules = rules(&[]);
        let twice = request(
            "GET",
            "/v1/routes",
            &[("host", "127.0.0.1:9091"), ("host", "evil.example")],
        );
        assert!(matches!(
            checked(&rules, &twice),
            Err(AdminRefusal::BadRequest(_))
        ));
        let absolute = request(
            "GET",
            "http://evil.example/v1/routes",
            &[("host", "127.0.0.1:9091")],
        );
        assert!(matches!(
            checked(&rules, &absolute),
            Err(AdminRefusal::BadRequest(_))
        ));
        let alone = request("GET", "http://evil.example/v1/routes", &[]);
        assert!(matches!(
            checked(&rules, &alone),
            Err(AdminRefusal::HostNotAllowed(_))
        ));
    }

    #[test]
    fn a_change_must_come_from_no_page_or_the_ports_own_origin() {
        let rules = rules(&[]);
        let host = ("host", "127.0.0.1:9091");
        let json = ("content-type", "application/json");
        let ok = [
            vec![host, json],
            vec![host, json, ("origin", "http://127.0.0.1:9091")],
            vec![host, json, ("sec-fetch-site", "same-origin")],
            vec![host, ("authorization", "Bearer x")],
            vec![host, ("content-type", "Application/JSON; charset=utf-8")],
        ];
        for headers in ok {
            let post = request("POST", "/v1/reload", &headers);
            assert!(checked(&rules, &post).is_ok(), "{headers:?}");
        }
        let refused = [
            vec![host],
            vec![host, ("content-type", "text/plain")],
            vec![host, ("content-type", "application/x-www-form-urlencoded")],
            vec![host, json, ("origin", "http://evil.example")],
            vec![host, json, ("origin", "null")],
            vec![host, json, ("origin", "http://127.0.0.1:9092")],
            vec![host, json, ("sec-fetch-site", "cross-site")],
            vec![host, json, ("sec-fetch-site", "same-site")],
        ];
        for headers in refused {
            let post = request("POST", "/v1/reload", &headers);
            assert!(checked(&rules, &post).is_err(), "{headers:?}");
        }
        let delete = request(
            "DELETE",
            "/v1/keys/a/b",
            &[host, ("origin", "http://evil.example")],
        );
        assert!(matches!(
            checked(&rules, &delete),
            Err(AdminRefusal::CrossOrigin)
        ));
        let delete = request("DELETE", "/v1/keys/a/b", &[host]);
        assert!(
            checked(&rules, &delete).is_ok(),
            "DELETE is never sent cross-site unasked"
        );
    }
}

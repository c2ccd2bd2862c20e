//! Signature verification: a route's `verify:` checks a delivery's raw body and headers
//! against the provider's signature before anything is claimed or forwarded. One file
//! per scheme, all behind [`Scheme`]; every scheme takes several secrets (rotation) and
//! compares in constant time.
//!
//! A check runs in two steps, the cheap one first: a scheme reads its headers and refuses
//! what needs no hashing to refuse (a missing or malformed header, more signatures than
//! [`MAX_SIGNATURES`], a stale header timestamp), leaving a [`Pending`] check: a message
//! prefix and the signatures to compare. Every scheme signs that prefix followed by the
//! raw body, so [`Pending::check`] hashes the body once per secret (or per public key and
//! signature, for Ed25519), whatever the headers hold, and only then reads a timestamp
//! the body carries (Linear's). [`SignatureWork`] runs the large checks on threads apart
//! from the workers, at most half the cores at once, so that forged deliveries cannot
//! starve the other routes or the admin port.
//!
//! The configuration side (`verify:`, one field of `VerifyFile` per scheme) is here too,
//! since each scheme decides how its secrets are read; presets are `src/preset.rs`.

mod github;
mod hmac_header;
mod linear;
mod paddle;
mod scheme;
mod shopify;
mod slack;
mod standard_webhooks;
mod stripe;

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

pub use github::Github;
pub use hmac_header::{Encoding, HmacHeader};
pub use linear::Linear;
pub use paddle::Paddle;
pub use shopify::Shopify;
pub use slack::Slack;
pub use standard_webhooks::StandardWebhooks;
pub use stripe::Stripe;

pub(crate) use scheme::HmacSha256;
pub use scheme::{MAX_PASSES, Pending, Scheme, Secrets, Settings, Signed, VerifyError};

/// Where signature checks run. A check that costs little (at most [`INLINE_BYTES`]
/// hashed, and no Ed25519 check, whose curve arithmetic alone costs about 50 µs) runs on
/// the worker that read the delivery. A costlier one runs on a blocking thread, one at a
/// time per route and at most half the workers' number at once in all: however many
/// large forged deliveries arrive, the other half of the cores serve everything else, and
/// a route's forgeries queue behind each other, not in front of another route's
/// deliveries. A check waiting for its turn holds its request's place, which
/// `limits.max_requests` bounds.
pub(crate) struct SignatureWork {
    turns: Arc<Semaphore>,
    /// Each route's one turn, by route name.
    routes: parking_lot::Mutex<std::collections::HashMap<String, Arc<Semaphore>>>,
}

/// The most bytes hashed inline by one check: about a tenth of a millisecond of work.
pub(crate) const INLINE_BYTES: usize = 64 << 10;

impl SignatureWork {
    /// For a proxy whose connections run on `workers` workers.
    pub fn new(workers: usize) -> SignatureWork {
        SignatureWork {
            turns: Arc::new(Semaphore::new((workers / 2).max(1))),
            routes: parking_lot::Mutex::default(),
        }
    }

    /// Checks `pending` against `body` for `route`, inline or apart as its cost says.
    pub async fn check(
        &self,
        route: &str,
        pending: Pending,
        body: &Bytes,
    ) -> Result<(), VerifyError> {
        let hashed = pending
            .passes()
            .saturating_mul(body.len() + pending.prefix.len());
        if hashed <= INLINE_BYTES && pending.asymmetric_checks() == 0 {
            return pending.check(body);
        }
        let route_turn = Arc::clone(
            self.routes
                .lock()
                .entry(route.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(1))),
        );
        // Neither semaphore is ever closed: a turn always comes.
        let _route_turn = route_turn.acquire_owned().await.ok();
        let _turn = Arc::clone(&self.turns).acquire_owned().await.ok();
        let body = body.clone();
        match tokio::task::spawn_blocking(move || pending.check(&body)).await {
            Ok(checked) => checked,
            // A check that panicked is a bug, handled as any other panic of a request.
            Err(failed) => std::panic::resume_unwind(failed.into_panic()),
        }
    }
}

/// The Unix time in seconds, as signature timestamps are judged against it.
pub fn unix_now() -> i64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX)
}

/// A route's signature check: one scheme, with its secrets.
#[derive(Clone)]
pub struct Verify(Arc<dyn Scheme>);

impl Verify {
    pub fn new(scheme: impl Scheme + 'static) -> Verify {
        Verify(Arc::new(scheme))
    }

    /// The checks that need no hashing; see [`Scheme::prepare`].
    pub fn prepare(&self, delivery: Signed<'_>, now: i64) -> Result<Pending, VerifyError> {
        self.0.prepare(delivery, now)?.bounded()
    }

    /// The header a configured check reads its signature from.
    pub(crate) fn signature_header(&self) -> Option<&http::HeaderName> {
        self.0.signature_header()
    }

    /// The scheme's name, as `verify:` spells it.
    pub(crate) fn scheme_name(&self) -> &'static str {
        self.0.name()
    }

    /// Whether the scheme signs a timestamp, whose age it judges.
    pub(crate) fn is_timestamped(&self) -> bool {
        self.0.is_timestamped()
    }

    /// The secrets it checks with.
    pub fn secrets(&self) -> &Secrets {
        self.0.secrets()
    }

    /// The scheme and its secrets' variables, for messages: `stripe with STRIPE_SECRET`.
    pub(crate) fn describe(&self) -> String {
        let names: Vec<&str> = self
            .secrets()
            .0
            .iter()
            .map(|env| env.variable.as_str())
            .collect();
        format!("{} with {}", self.scheme_name(), names.join(", "))
    }

    /// The headers, besides the body, that a valid signature vouches for (lowercase).
    pub(crate) fn signed_headers(&self) -> &'static [&'static str] {
        self.0.signed_headers()
    }
}

/// Two checks are the same if they are one scheme with the same settings.
impl PartialEq for Verify {
    fn eq(&self, other: &Verify) -> bool {
        self.scheme_name() == other.scheme_name() && self.0.settings() == other.0.settings()
    }
}

impl Eq for Verify {}

impl fmt::Debug for Verify {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{} {}", self.scheme_name(), self.0.settings())
    }
}

/// As `verify:` is written: `{stripe: {secret_env: ..., tolerance: ...}}`.
impl Serialize for Verify {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(self.scheme_name(), &self.0.settings())?;
        map.end()
    }
}

/// `verify:` as written: `none`, or exactly one scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum VerifySetting {
    /// `verify: none`: no check, even if a preset would add one.
    Off,
    On(Verify),
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct VerifyFile {
    /// Stripe's `Stripe-Signature` (`t=...,v1=...`).
    stripe: Option<stripe::StripeFile>,
    /// GitHub's `X-Hub-Signature-256`.
    github: Option<github::GithubFile>,
    /// Standard Webhooks (and Svix): `webhook-signature` over id, timestamp and body.
    standard_webhooks: Option<standard_webhooks::StandardWebhooksFile>,
    /// Shopify's `X-Shopify-Hmac-Sha256`.
    shopify: Option<shopify::ShopifyFile>,
    /// Slack's `X-Slack-Signature` (`v0=`) with its timestamp.
    slack: Option<slack::SlackFile>,
    /// Paddle's `Paddle-Signature` (`ts=...;h1=...`).
    paddle: Option<paddle::PaddleFile>,
    /// Linear's `Linear-Signature`, with the `webhookTimestamp` of the body it signs.
    linear: Option<linear::LinearFile>,
    /// A generic HMAC-SHA256 of the body in a header of your choice.
    hmac: Option<hmac_header::HmacFile>,
}

impl VerifyFile {
    fn into_verify(self) -> Result<Verify, String> {
        let mut chosen: Vec<Verify> = [
            self.stripe.map(|file| Ok(Verify::new(Stripe::new(file)))),
            self.github.map(|file| Ok(Verify::new(Github::new(file)))),
            (self.standard_webhooks).map(|file| StandardWebhooks::new(file).map(Verify::new)),
            self.shopify.map(|file| Ok(Verify::new(Shopify::new(file)))),
            self.slack.map(|file| Ok(Verify::new(Slack::new(file)))),
            self.paddle.map(|file| Ok(Verify::new(Paddle::new(file)))),
            self.linear.map(|file| Ok(Verify::new(Linear::new(file)))),
            self.hmac.map(|file| Ok(Verify::new(HmacHeader::new(file)))),
        ]
        .into_iter()
        .flatten()
        .collect::<Result<_, String>>()?;
        match chosen.len() {
            1 => Ok(chosen.remove(0)),
            0 => Err("`verify` needs a scheme: stripe, github, standard_webhooks, shopify, slack, paddle, linear or hmac (or `verify: none`)".into()),
            _ => Err("`verify` takes exactly one scheme".into()),
        }
    }
}

impl schemars::JsonSchema for VerifySetting {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Verify".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let schemes = generator.subschema_for::<VerifyFile>();
        schemars::json_schema!({
            "description": "the signature check: `none`, or a map with exactly one scheme",
            "anyOf": [{ "const": "none" }, schemes],
        })
    }
}

impl<'de> Deserialize<'de> for VerifySetting {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SettingVisitor;

        impl<'de> Visitor<'de> for SettingVisitor {
            type Value = VerifySetting;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`none` or a map with one scheme, like `stripe: { secret_env: NAME }`")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<VerifySetting, E> {
                match text {
                    "none" => Ok(VerifySetting::Off),
                    other => Err(E::custom(format!(
                        "`verify: {other}` is not understood; write `none` or a scheme"
                    ))),
                }
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<VerifySetting, A::Error> {
                let file =
                    VerifyFile::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                file.into_verify()
                    .map(VerifySetting::On)
                    .map_err(de::Error::custom)
            }
        }

        deserializer.deserialize_any(SettingVisitor)
    }
}

impl Serialize for VerifySetting {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            VerifySetting::Off => serializer.serialize_str("none"),
            VerifySetting::On(verify) => verify.serialize(serializer),
        }
    }
}

#[cfg(test)]
mod tests {
    use hmac::{KeyInit, Mac};

    use super::scheme::*;
    use super::*;
    use crate::values::EnvSecret;

    #[test]
    fn a_pending_check_accepts_any_secret_and_signature() {
        let keys: Arc<[Vec<u8>]> = vec![b"old".to_vec(), b"new".to_vec()].into();
        let signed: Tag = <HmacSha256 as KeyInit>::new_from_slice(b"new")
            .unwrap()
            .chain_update(b"a.b")
            .finalize()
            .into_bytes()
            .into();
        let pending = Pending::hmac("h", b"a.".to_vec(), &keys, vec![[0; 32], signed]);
        assert_eq!(pending.check(b"b"), Ok(()));
        assert_eq!(pending.check(b"c"), Err(VerifyError::NoMatch));
        assert_eq!(pending.passes(), 2);
        let old_only: Arc<[Vec<u8>]> = vec![b"old".to_vec()].into();
        let pending = Pending::hmac("h", b"a.".to_vec(), &old_only, vec![signed]);
        assert_eq!(pending.check(b"b"), Err(VerifyError::NoMatch));
    }

    #[test]
    fn every_refusal_code_is_listed() {
        let every = |error: &VerifyError| match error {
            VerifyError::MissingHeader(_)
            | VerifyError::Malformed(_)
            | VerifyError::IdMismatch(_)
            | VerifyError::Stale(_)
            | VerifyError::TooMany(_)
            | VerifyError::NoMatch
            | VerifyError::BodyTimestamp(_) => error.code(),
        };
        for error in [
            VerifyError::MissingHeader("h"),
            VerifyError::Malformed("h"),
            VerifyError::IdMismatch("h"),
            VerifyError::Stale("5m".into()),
            VerifyError::TooMany("h"),
            VerifyError::NoMatch,
            VerifyError::BodyTimestamp("f"),
        ] {
            assert!(VerifyError::CODES.contains(&every(&error)), "{error:?}");
        }
    }

    fn secret(variable: &str, value: &str) -> EnvSecret {
        EnvSecret {
            variable: variable.into(),
            secret: crate::values::Secret::new(value.into()),
        }
    }

    fn headers(pairs: &[(&str, String)]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    /// Headers with more signatures than are checked are refused before any hashing, and
    /// signatures of a length no HMAC-SHA256 has cost nothing either.
    #[test]
    fn cheap_refusals_come_before_any_hashing() {
        let secrets = Secrets(vec![secret("S", "shh")]);
        let stripe = Verify::new(Stripe::preset(secrets.clone()));
        let hex = "ab".repeat(32);
        let list = |n: usize| {
            let signatures: String = (0..n).map(|_| format!(",v1={hex}")).collect();
            headers(&[("stripe-signature", format!("t=1000{signatures}"))])
        };
        let pending = stripe
            .prepare(Signed::headers_only(&list(MAX_SIGNATURES)), 1000)
            .unwrap();
        assert_eq!(
            pending.passes(),
            1,
            "one HMAC, whatever the number of signatures"
        );
        assert_eq!(
            stripe
                .prepare(Signed::headers_only(&list(MAX_SIGNATURES + 1)), 1000)
                .unwrap_err(),
            VerifyError::TooMany("stripe-signature")
        );
        assert_eq!(
            stripe
                .prepare(Signed::headers_only(&list(700)), 1000)
                .unwrap_err()
                .code(),
            "malformed_signature"
        );
        let odd = headers(&[(
            "stripe-signature",
            format!("t=1000,v1={}", "ab".repeat(4096)),
        )]);
        assert_eq!(
            stripe
                .prepare(Signed::headers_only(&odd), 1000)
                .unwrap_err(),
            VerifyError::Malformed("stripe-signature")
        );
        let github = Verify::new(Github::preset(secrets));
        let long = headers(&[(
            "x-hub-signature-256",
            format!("sha256={}", "ab".repeat(30_000)),
        )]);
        assert_eq!(
            github.prepare(Signed::headers_only(&long), 0).unwrap_err(),
            VerifyError::Malformed("x-hub-signature-256")
        );
    }

    #[test]
    fn a_route_takes_a_few_secrets_not_many() {
        let list = |n: usize| {
            let names: Vec<&str> = std::iter::repeat_n("PATH", n).collect();
            serde_yaml::from_str::<Secrets>(&format!("[{}]", names.join(", ")))
        };
        assert!(list(MAX_SECRETS).is_ok());
        let error = list(MAX_SECRETS + 1).unwrap_err().to_string();
        assert!(error.contains("at most 4"), "{error}");
    }

    #[test]
    fn tolerance_works_both_ways() {
        let five_minutes = default_tolerance();
        assert!(within_tolerance(1000, 1300, &five_minutes).is_ok());
        assert!(within_tolerance(1300, 1000, &five_minutes).is_ok());
        assert!(matches!(
            within_tolerance(1000, 1301, &five_minutes),
            Err(VerifyError::Stale(_))
        ));
        assert!(matches!(
            within_tolerance(1301, 1000, &five_minutes),
            Err(VerifyError::Stale(_))
        ));
    }
}

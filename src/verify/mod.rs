//! Signature verification: a route's `verify:` checks a delivery's raw body and headers
//! against the provider's signature before anything is claimed or forwarded. One file
//! per scheme, all behind [`Scheme`]; every scheme takes several secrets (rotation) and
//! compares in constant time (the RustCrypto `hmac` verify).
//!
//! The configuration side (`verify:` and presets) is here too, since each scheme decides
//! how its secrets are read.

mod github;
mod hmac_header;
mod paddle;
mod shopify;
mod slack;
mod standard_webhooks;
mod stripe;

use std::fmt;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::values::{EnvSecret, HumanDuration};

pub use github::Github;
pub use hmac_header::{Encoding, HmacHeader};
pub use paddle::Paddle;
pub use shopify::Shopify;
pub use slack::Slack;
pub use standard_webhooks::StandardWebhooks;
pub use stripe::Stripe;

/// Why a delivery's signature was refused; the proxy answers 401 naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the {0} header is missing")]
    MissingHeader(&'static str),
    #[error("the {0} header is malformed")]
    Malformed(&'static str),
    /// Another spelling of the signed message ID names a different message.
    #[error("the {0} header differs from the signed message ID")]
    IdMismatch(&'static str),
    #[error("the signature's timestamp is more than {0} away from now")]
    Stale(String),
    #[error("no signature matches the body with any configured secret")]
    NoMatch,
}

impl VerifyError {
    /// Every code [`VerifyError::code`] gives.
    pub const CODES: [&'static str; 4] = [
        "missing_signature",
        "malformed_signature",
        "stale_signature",
        "signature_mismatch",
    ];

    /// The `error` code of the 401 answer.
    pub fn code(&self) -> &'static str {
        match self {
            VerifyError::MissingHeader(_) => "missing_signature",
            VerifyError::Malformed(_) | VerifyError::IdMismatch(_) => "malformed_signature",
            VerifyError::Stale(_) => "stale_signature",
            VerifyError::NoMatch => "signature_mismatch",
        }
    }
}

/// What every signature scheme does.
pub trait Scheme {
    /// Checks a delivery; `now` is the Unix time in seconds.
    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), VerifyError>;
}

/// A route's signature check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verify {
    Stripe(Stripe),
    Github(Github),
    StandardWebhooks(StandardWebhooks),
    Shopify(Shopify),
    Slack(Slack),
    Paddle(Paddle),
    Hmac(HmacHeader),
}

impl Verify {
    pub fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), VerifyError> {
        let scheme: &dyn Scheme = match self {
            Verify::Stripe(scheme) => scheme,
            Verify::Github(scheme) => scheme,
            Verify::StandardWebhooks(scheme) => scheme,
            Verify::Shopify(scheme) => scheme,
            Verify::Slack(scheme) => scheme,
            Verify::Paddle(scheme) => scheme,
            Verify::Hmac(scheme) => scheme,
        };
        scheme.verify(headers, body, now)
    }

    /// The scheme's name, as `verify:` spells it.
    pub fn scheme_name(&self) -> &'static str {
        match self {
            Verify::Stripe(_) => "stripe",
            Verify::Github(_) => "github",
            Verify::StandardWebhooks(_) => "standard_webhooks",
            Verify::Shopify(_) => "shopify",
            Verify::Slack(_) => "slack",
            Verify::Paddle(_) => "paddle",
            Verify::Hmac(_) => "hmac",
        }
    }

    /// The secrets it checks with.
    pub fn secrets(&self) -> &Secrets {
        match self {
            Verify::Stripe(scheme) => &scheme.secret_env,
            Verify::Github(scheme) => &scheme.secret_env,
            Verify::StandardWebhooks(scheme) => &scheme.secret_env,
            Verify::Shopify(scheme) => &scheme.secret_env,
            Verify::Slack(scheme) => &scheme.secret_env,
            Verify::Paddle(scheme) => &scheme.secret_env,
            Verify::Hmac(scheme) => &scheme.secret_env,
        }
    }

    /// The scheme and its secrets' variables, for messages: `stripe with STRIPE_SECRET`.
    pub fn describe(&self) -> String {
        let names: Vec<&str> = self
            .secrets()
            .0
            .iter()
            .map(|env| env.variable.as_str())
            .collect();
        format!("{} with {}", self.scheme_name(), names.join(", "))
    }

    /// The headers, besides the body, that a valid signature vouches for (lowercase).
    pub fn signed_headers(&self) -> &'static [&'static str] {
        match self {
            Verify::StandardWebhooks(_) => standard_webhooks::SIGNED_ID_HEADERS,
            Verify::Stripe(_)
            | Verify::Github(_)
            | Verify::Shopify(_)
            | Verify::Slack(_)
            | Verify::Paddle(_)
            | Verify::Hmac(_) => &[],
        }
    }
}

/// One secret or several (during a rotation), each named by an environment variable.
#[derive(Clone, PartialEq, Eq)]
pub struct Secrets(pub Vec<EnvSecret>);

impl Secrets {
    pub fn from_env(variable: &str) -> Result<Secrets, String> {
        Ok(Secrets(vec![variable.parse()?]))
    }

    /// The secrets' bytes, as most schemes use them.
    fn raw(&self) -> Vec<Vec<u8>> {
        self.0
            .iter()
            .map(|env| env.secret.expose().as_bytes().to_vec())
            .collect()
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|env| env.variable.as_str()).collect();
        write!(f, "Secrets({names:?})")
    }
}

/// Printed as the variables' names, never their values.
impl Serialize for Secrets {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let names: Vec<&str> = self.0.iter().map(|env| env.variable.as_str()).collect();
        names.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Secrets {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OneOrMany;

        impl<'de> Visitor<'de> for OneOrMany {
            type Value = Secrets;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an environment variable's name, or a list of them")
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<Secrets, E> {
                Secrets::from_env(name).map_err(E::custom)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Secrets, A::Error> {
                let mut secrets = Vec::new();
                while let Some(secret) = seq.next_element()? {
                    secrets.push(secret);
                }
                if secrets.is_empty() {
                    return Err(de::Error::custom(
                        "`secret_env` needs at least one variable",
                    ));
                }
                Ok(Secrets(secrets))
            }
        }

        deserializer.deserialize_any(OneOrMany)
    }
}

/// `verify:` as written: `none`, or exactly one scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifySetting {
    /// `verify: none`: no check, even if a preset would add one.
    Off,
    On(Verify),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VerifyFile {
    stripe: Option<stripe::StripeFile>,
    github: Option<github::GithubFile>,
    standard_webhooks: Option<standard_webhooks::StandardWebhooksFile>,
    shopify: Option<shopify::ShopifyFile>,
    slack: Option<slack::SlackFile>,
    paddle: Option<paddle::PaddleFile>,
    hmac: Option<hmac_header::HmacFile>,
}

impl VerifyFile {
    fn into_verify(self) -> Result<Verify, String> {
        let mut chosen = Vec::new();
        if let Some(file) = self.stripe {
            chosen.push(Verify::Stripe(Stripe::new(file)));
        }
        if let Some(file) = self.github {
            chosen.push(Verify::Github(Github::new(file)));
        }
        if let Some(file) = self.standard_webhooks {
            chosen.push(Verify::StandardWebhooks(StandardWebhooks::new(file)?));
        }
        if let Some(file) = self.shopify {
            chosen.push(Verify::Shopify(Shopify::new(file)));
        }
        if let Some(file) = self.slack {
            chosen.push(Verify::Slack(Slack::new(file)));
        }
        if let Some(file) = self.paddle {
            chosen.push(Verify::Paddle(Paddle::new(file)));
        }
        if let Some(file) = self.hmac {
            chosen.push(Verify::Hmac(HmacHeader::new(file)));
        }
        match chosen.len() {
            1 => Ok(chosen.remove(0)),
            0 => Err("`verify` needs a scheme: stripe, github, standard_webhooks, shopify, slack, paddle or hmac (or `verify: none`)".into()),
            _ => Err("`verify` takes exactly one scheme".into()),
        }
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

fn default_tolerance() -> HumanDuration {
    HumanDuration(Duration::from_secs(300))
}

// ------------------------------------------------------------------ shared helpers

type HmacSha256 = Hmac<Sha256>;

/// Whether any secret's HMAC-SHA256 of `message` (given in parts) equals any candidate,
/// each comparison in constant time.
fn any_hmac_matches(secrets: &[Vec<u8>], message: &[&[u8]], candidates: &[Vec<u8>]) -> bool {
    secrets.iter().any(|secret| {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(secret)
            .expect("HMAC takes a key of any length");
        for part in message {
            mac.update(part);
        }
        candidates
            .iter()
            .any(|candidate| mac.clone().verify_slice(candidate).is_ok())
    })
}

/// The layout of a signature header of `key=value` items carrying a Unix timestamp and
/// one or more hex HMAC-SHA256 signatures of `"{timestamp}{joiner}{raw body}"`: Stripe's
/// `t=..,v1=..` and Paddle's `ts=..;h1=..`.
struct TimestampedHex {
    header: &'static str,
    separator: char,
    timestamp: &'static str,
    signature: &'static str,
    joiner: &'static [u8],
}

impl TimestampedHex {
    fn verify(
        &self,
        keys: &[Vec<u8>],
        tolerance: &HumanDuration,
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<(), VerifyError> {
        let value = header(headers, self.header)?;
        let mut timestamp = None;
        let mut signatures = Vec::new();
        for item in value.split(self.separator) {
            match item.trim().split_once('=') {
                Some((name, text)) if name == self.timestamp => {
                    timestamp = Some((text, parse_timestamp(text, self.header)?));
                }
                Some((name, hex)) if name == self.signature => {
                    signatures.extend(decode_hex(hex));
                }
                _ => {}
            }
        }
        let (text, timestamp) = timestamp.ok_or(VerifyError::Malformed(self.header))?;
        if signatures.is_empty() {
            return Err(VerifyError::Malformed(self.header));
        }
        within_tolerance(timestamp, now, tolerance)?;
        if any_hmac_matches(keys, &[text.as_bytes(), self.joiner, body], &signatures) {
            Ok(())
        } else {
            Err(VerifyError::NoMatch)
        }
    }
}

/// A header's value as text, or why it cannot be read.
fn header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, VerifyError> {
    headers
        .get(name)
        .ok_or(VerifyError::MissingHeader(name))?
        .to_str()
        .map_err(|_| VerifyError::Malformed(name))
}

/// Refuses a timestamp further than `tolerance` from `now`, in the past or the future.
fn within_tolerance(
    timestamp: i64,
    now: i64,
    tolerance: &HumanDuration,
) -> Result<(), VerifyError> {
    let allowed = i64::try_from(tolerance.0.as_secs()).unwrap_or(i64::MAX);
    if now.abs_diff(timestamp) > allowed.unsigned_abs() {
        return Err(VerifyError::Stale(tolerance.to_string()));
    }
    Ok(())
}

fn parse_timestamp(text: &str, header_name: &'static str) -> Result<i64, VerifyError> {
    text.trim()
        .parse()
        .map_err(|_| VerifyError::Malformed(header_name))
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    hex::decode(text.trim()).ok()
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    BASE64.decode(text.trim()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matching_accepts_any_secret_and_candidate() {
        let secrets = vec![b"old".to_vec(), b"new".to_vec()];
        let mac = <HmacSha256 as KeyInit>::new_from_slice(b"new")
            .unwrap()
            .chain_update(b"a.b")
            .finalize()
            .into_bytes()
            .to_vec();
        assert!(any_hmac_matches(
            &secrets,
            &[b"a.", b"b"],
            &[vec![0; 32], mac.clone()]
        ));
        assert!(!any_hmac_matches(&secrets[..1], &[b"a.b"], &[mac]));
    }

    #[test]
    fn every_refusal_code_is_listed() {
        let every = |error: &VerifyError| match error {
            VerifyError::MissingHeader(_)
            | VerifyError::Malformed(_)
            | VerifyError::IdMismatch(_)
            | VerifyError::Stale(_)
            | VerifyError::NoMatch => error.code(),
        };
        for error in [
            VerifyError::MissingHeader("h"),
            VerifyError::Malformed("h"),
            VerifyError::IdMismatch("h"),
            VerifyError::Stale("5m".into()),
            VerifyError::NoMatch,
        ] {
            assert!(VerifyError::CODES.contains(&every(&error)), "{error:?}");
        }
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

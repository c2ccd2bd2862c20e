//! What every signature scheme shares: the [`Scheme`] each one implements, the check it
//! prepares from a delivery ([`Pending`]), the secrets it checks with, why a
//! check fails, the bounds on signatures, passes and secrets, and the helpers that read
//! signature headers and timestamps.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::{Signature, VerifyingKey};
use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderName};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::values::{EnvSecret, HumanDuration};

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
    /// More signatures than anyone sends, which would only cost hashing to refuse.
    #[error("the {0} header carries more signatures than are checked")]
    TooMany(&'static str),
    #[error("no signature matches the body with any configured secret")]
    NoMatch,
    /// A signed body whose timestamp field is missing or not a time.
    #[error("the body's {0} is missing or not a time")]
    BodyTimestamp(&'static str),
}

/// The most signatures a delivery may carry: a provider rotating its secret sends two.
pub(crate) const MAX_SIGNATURES: usize = 8;

/// The most a delivery's check may cost, in passes of HMAC over its body: one per
/// secret, and [`ED25519_PASSES`] per Ed25519 public key and `v1a` signature. A delivery
/// that would cost more is refused: at most 4 secrets, or 2 Ed25519 checks (a rotation,
/// whether of keys or of signatures).
pub const MAX_PASSES: usize = 8;

/// What one Ed25519 check costs in HMAC passes: it hashes the body with SHA-512 (about
/// 4 ms per MiB on the test machine, an HMAC-SHA256 pass about 1.1 ms).
pub const ED25519_PASSES: usize = 4;

/// The most public keys a route may check with: two checks of one signature each.
pub(crate) const MAX_PUBLIC_KEYS: usize = MAX_PASSES / ED25519_PASSES;

/// The most secrets a route may check with: a rotation needs two.
pub(crate) const MAX_SECRETS: usize = 4;

impl VerifyError {
    /// Every code [`VerifyError::code`] gives.
    pub(crate) const CODES: [&'static str; 4] = [
        "missing_signature",
        "malformed_signature",
        "stale_signature",
        "signature_mismatch",
    ];

    /// The `error` code of the 401 answer.
    pub fn code(&self) -> &'static str {
        match self {
            VerifyError::MissingHeader(_) => "missing_signature",
            VerifyError::Malformed(_)
            | VerifyError::IdMismatch(_)
            | VerifyError::TooMany(_)
            | VerifyError::BodyTimestamp(_) => "malformed_signature",
            VerifyError::Stale(_) => "stale_signature",
            VerifyError::NoMatch => "signature_mismatch",
        }
    }
}

/// What a delivery gives a scheme to check: its headers and its raw body.
#[derive(Clone, Copy)]
pub struct Signed<'a> {
    pub headers: &'a HeaderMap,
    pub body: &'a [u8],
}

#[cfg(test)]
impl<'a> Signed<'a> {
    /// A delivery with an empty body, for the checks of headers alone.
    pub(crate) fn headers_only(headers: &'a HeaderMap) -> Signed<'a> {
        Signed { headers, body: b"" }
    }
}

/// A signature scheme: one file of `verify/` each. Only what differs between schemes is
/// required; the rest has the answer most schemes give, and a scheme overrides it (as a
/// scheme that signs an ID header does `signed_headers`).
pub trait Scheme: Settings + fmt::Debug + Send + Sync {
    /// As `verify:` spells it.
    fn name(&self) -> &'static str;

    /// The secrets it checks with.
    fn secrets(&self) -> &Secrets;

    /// Reads the delivery's signature and makes every check that needs no hashing
    /// (presence, format, the number of signatures, a signed header timestamp's
    /// tolerance; `now` is the Unix time in seconds): what remains is the [`Pending`]
    /// check of the body. It runs on the worker, before the signature is known good: it
    /// must not parse the body (a forger would choose what it costs); a timestamp inside
    /// the body goes in [`Pending`]'s `body_timestamp`, judged once a signature matches.
    fn prepare(&self, delivery: Signed<'_>, now: i64) -> Result<Pending, VerifyError>;

    /// Whether the scheme signs a timestamp, whose age it judges.
    fn is_timestamped(&self) -> bool {
        false
    }

    /// The headers, besides the body, that a valid signature vouches for (lowercase).
    fn signed_headers(&self) -> &'static [&'static str] {
        &[]
    }

    /// A signature header whose name is configured (a provider's is named in words the
    /// delivery log refuses anyway).
    fn signature_header(&self) -> Option<&HeaderName> {
        None
    }
}

/// A scheme's settings as configured, for `check`'s listing and for comparing two
/// routes' checks: any scheme that serializes has them.
pub trait Settings {
    fn settings(&self) -> serde_json::Value;
}

impl<T: serde::Serialize> Settings for T {
    fn settings(&self) -> serde_json::Value {
        // Plain settings always serialize; a failure must not make two checks compare
        // equal.
        serde_json::to_value(self).expect("a scheme's settings serialize")
    }
}

/// An HMAC-SHA256 signature.
pub(crate) type Tag = [u8; 32];

/// A delivery's signatures, found well-formed and in time, to be compared with the
/// message they sign: `prefix` followed by the raw body.
#[derive(Debug, Clone)]
pub struct Pending {
    /// The header the signatures came in, for a refusal's message.
    pub(crate) header: &'static str,
    pub(crate) prefix: Vec<u8>,
    pub(crate) keys: Arc<[Vec<u8>]>,
    pub(crate) tags: Vec<Tag>,
    pub(crate) public: Arc<[VerifyingKey]>,
    pub(crate) signatures: Vec<Signature>,
    /// A timestamp inside the signed body, judged once a signature matches.
    pub(crate) body_timestamp: Option<BodyTimestamp>,
}

/// A timestamp a provider signs inside the JSON body (Linear's `webhookTimestamp`), in
/// milliseconds since the epoch. It is judged after a signature matches, so that a
/// forgery costs no parse, and on the thread that hashed the body.
#[derive(Debug, Clone)]
pub(crate) struct BodyTimestamp {
    /// The top-level field that holds it.
    pub(crate) field: &'static str,
    /// The Unix time in seconds to judge it against.
    pub(crate) now: i64,
    pub(crate) tolerance: HumanDuration,
}

impl BodyTimestamp {
    fn judge(&self, body: &[u8]) -> Result<(), VerifyError> {
        let missing = || VerifyError::BodyTimestamp(self.field);
        let mut deserializer = serde_json::Deserializer::from_slice(body);
        let value = de::DeserializeSeed::deserialize(TopField(self.field), &mut deserializer)
            .map_err(|_| missing())?
            .ok_or_else(missing)?;
        let millis = match value.as_i64() {
            Some(millis) => millis,
            None => match value.as_f64() {
                Some(millis) if millis.is_finite() && millis.abs() < 9.0e18 => millis as i64,
                _ => return Err(missing()),
            },
        };
        within_tolerance(millis.div_euclid(1000), self.now, &self.tolerance)
    }
}

/// One top-level field of a JSON object, the rest passed over unread.
struct TopField<'a>(&'a str);

impl<'de> de::DeserializeSeed<'de> for TopField<'_> {
    type Value = Option<serde_json::Number>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TopField<'_> {
    type Value = Option<serde_json::Number>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == self.0 {
                found = map.next_value::<serde_json::Value>()?.as_number().cloned();
            } else {
                map.next_value::<de::IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

impl Pending {
    /// HMAC-SHA256 signatures, from `header`, of `prefix` and the body, keyed with `keys`.
    pub(crate) fn hmac(
        header: &'static str,
        prefix: Vec<u8>,
        keys: &Arc<[Vec<u8>]>,
        tags: Vec<Tag>,
    ) -> Pending {
        Pending {
            header,
            prefix,
            keys: Arc::clone(keys),
            tags,
            public: Arc::new([]),
            signatures: Vec::new(),
            body_timestamp: None,
        }
    }

    /// What checking it costs, in HMAC passes over the body: one per secret (each
    /// computes one HMAC, compared with every signature), and [`ED25519_PASSES`] per
    /// public key and signature.
    pub fn passes(&self) -> usize {
        let symmetric = if self.tags.is_empty() {
            0
        } else {
            self.keys.len()
        };
        symmetric + ED25519_PASSES * self.asymmetric_checks()
    }

    pub(crate) fn asymmetric_checks(&self) -> usize {
        self.public.len() * self.signatures.len()
    }

    /// Refuses a check that would cost more than [`MAX_PASSES`].
    pub(crate) fn bounded(self) -> Result<Pending, VerifyError> {
        if self.passes() > MAX_PASSES {
            return Err(VerifyError::TooMany(self.header));
        }
        Ok(self)
    }

    /// Whether any signature matches `prefix` and `body` under any secret or key, each
    /// comparison in constant time.
    pub fn check(&self, body: &[u8]) -> Result<(), VerifyError> {
        let symmetric = !self.tags.is_empty()
            && self.keys.iter().any(|key| {
                let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key)
                    .expect("HMAC takes a key of any length");
                mac.update(&self.prefix);
                mac.update(body);
                let computed: Tag = mac.finalize().into_bytes().into();
                self.tags.iter().any(|tag| bool::from(computed.ct_eq(tag)))
            });
        if !(symmetric || self.asymmetric_matches(body)) {
            return Err(VerifyError::NoMatch);
        }
        self.judge_body_timestamp(body)
    }

    /// Judges the timestamp inside the body, if the scheme signs one there: after a
    /// signature matched, or (a dry run without the secret) instead of comparing it.
    pub(crate) fn judge_body_timestamp(&self, body: &[u8]) -> Result<(), VerifyError> {
        match &self.body_timestamp {
            Some(timestamp) => timestamp.judge(body),
            None => Ok(()),
        }
    }

    pub(crate) fn asymmetric_matches(&self, body: &[u8]) -> bool {
        if self.public.is_empty() || self.signatures.is_empty() {
            return false;
        }
        let message = [self.prefix.as_slice(), body].concat();
        self.public.iter().any(|key| {
            self.signatures
                .iter()
                .any(|signature| key.verify_strict(&message, signature).is_ok())
        })
    }
}

/// One secret or several (during a rotation), each named by an environment variable.
#[derive(Clone, PartialEq, Eq)]
pub struct Secrets(pub Vec<EnvSecret>);

impl Secrets {
    pub(crate) fn from_env(variable: &str) -> Result<Secrets, String> {
        Ok(Secrets(vec![variable.parse()?]))
    }

    /// The secrets' bytes, as most schemes use them.
    pub(crate) fn raw(&self) -> Arc<[Vec<u8>]> {
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

/// One variable's name, or a list of them.
impl schemars::JsonSchema for Secrets {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Secrets".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let name = generator.subschema_for::<EnvSecret>();
        schemars::json_schema!({
            "description": "the environment variable holding the secret, or a list of them during a rotation",
            "anyOf": [name, { "type": "array", "items": name, "minItems": 1, "maxItems": MAX_SECRETS }],
        })
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
                if secrets.len() > MAX_SECRETS {
                    return Err(de::Error::custom(format!(
                        "`secret_env` takes at most {MAX_SECRETS} variables (a rotation needs two); each one is another pass over every body"
                    )));
                }
                Ok(Secrets(secrets))
            }
        }

        deserializer.deserialize_any(OneOrMany)
    }
}

pub(crate) fn default_tolerance() -> HumanDuration {
    HumanDuration(Duration::from_secs(300))
}

// ------------------------------------------------------------------ shared helpers

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// An HMAC-SHA256 signature written in hex, or `None` if the text cannot be one (its
/// length is checked before anything is decoded).
pub(crate) fn hex_tag(text: &str) -> Option<Tag> {
    let text = text.trim();
    let mut tag = [0; 32];
    (text.len() == 64 && hex::decode_to_slice(text, &mut tag).is_ok()).then_some(tag)
}

/// An HMAC-SHA256 signature written in base64, or `None` if the text cannot be one.
pub(crate) fn base64_tag(text: &str) -> Option<Tag> {
    let text = text.trim();
    if text.len() > 44 {
        return None;
    }
    BASE64.decode(text).ok()?.try_into().ok()
}

/// The layout of a signature header of `key=value` items carrying a Unix timestamp and
/// one or more hex HMAC-SHA256 signatures of `"{timestamp}{joiner}{raw body}"`: Stripe's
/// `t=..,v1=..` and Paddle's `ts=..;h1=..`.
pub(crate) struct TimestampedHex {
    pub(crate) header: &'static str,
    pub(crate) separator: char,
    pub(crate) timestamp: &'static str,
    pub(crate) signature: &'static str,
    pub(crate) joiner: &'static [u8],
}

impl TimestampedHex {
    pub(crate) fn prepare(
        &self,
        keys: &Arc<[Vec<u8>]>,
        tolerance: &HumanDuration,
        headers: &HeaderMap,
        now: i64,
    ) -> Result<Pending, VerifyError> {
        let value = header(headers, self.header)?;
        let mut timestamp = None;
        let mut written = 0;
        let mut tags = Vec::new();
        for item in value.split(self.separator) {
            match item.trim().split_once('=') {
                Some((name, text)) if name == self.timestamp => {
                    timestamp = Some((text, parse_timestamp(text, self.header)?));
                }
                Some((name, hex)) if name == self.signature => {
                    written += 1;
                    if written > MAX_SIGNATURES {
                        return Err(VerifyError::TooMany(self.header));
                    }
                    tags.extend(hex_tag(hex));
                }
                _ => {}
            }
        }
        let (text, timestamp) = timestamp.ok_or(VerifyError::Malformed(self.header))?;
        if tags.is_empty() {
            return Err(VerifyError::Malformed(self.header));
        }
        within_tolerance(timestamp, now, tolerance)?;
        let prefix = [text.as_bytes(), self.joiner].concat();
        Ok(Pending::hmac(self.header, prefix, keys, tags))
    }
}

/// A header's value as text, or why it cannot be read.
pub(crate) fn header<'a>(
    headers: &'a HeaderMap,
    name: &'static str,
) -> Result<&'a str, VerifyError> {
    headers
        .get(name)
        .ok_or(VerifyError::MissingHeader(name))?
        .to_str()
        .map_err(|_| VerifyError::Malformed(name))
}

/// Refuses a timestamp further than `tolerance` from `now`, in the past or the future.
pub(crate) fn within_tolerance(
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

pub(crate) fn parse_timestamp(text: &str, header_name: &'static str) -> Result<i64, VerifyError> {
    text.trim()
        .parse()
        .map_err(|_| VerifyError::Malformed(header_name))
}

pub(crate) fn decode_base64(text: &str) -> Option<Vec<u8>> {
    BASE64.decode(text.trim()).ok()
}

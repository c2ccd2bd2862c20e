//! Standard Webhooks (and Svix, which uses the same scheme with `svix-` header names):
//! `webhook-id`, `webhook-timestamp` and `webhook-signature`, the latter a space-separated
//! list of `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{raw body}">` entries, keyed with
//! the base64 key of a `whsec_` secret; `v1a,<base64 Ed25519 signature>` entries are
//! checked against `whpk_` public keys. The timestamp must be within the tolerance (the
//! reference libraries use 5 minutes).

use std::sync::Arc;

use ed25519_dalek::{Signature, VerifyingKey};
use serde::{Deserialize, Serialize};

use super::scheme::{
    ED25519_PASSES, MAX_PUBLIC_KEYS, MAX_SIGNATURES, Pending, Scheme, Secrets, Signed, VerifyError,
    base64_tag, decode_base64, default_tolerance, header, parse_timestamp, within_tolerance,
};
use crate::values::HumanDuration;

/// The header names, in the Standard Webhooks spelling and in Svix's.
const HEADER_SETS: [[&str; 3]; 2] = [
    ["webhook-id", "webhook-timestamp", "webhook-signature"],
    ["svix-id", "svix-timestamp", "svix-signature"],
];

/// The message ID headers: the signature covers the ID, and a delivery carrying both must
/// give one ID in both, so a key read from either is the ID that was verified.
pub(super) const SIGNED_ID_HEADERS: &[&str] = &["webhook-id", "svix-id"];

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct StandardWebhooksFile {
    /// The environment variable holding the secret, or a list of them while it rotates.
    pub(super) secret_env: Secrets,
    #[serde(default = "default_tolerance")]
    tolerance: HumanDuration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StandardWebhooks {
    pub(super) secret_env: Secrets,
    tolerance: HumanDuration,
    #[serde(skip)]
    symmetric: Arc<[Vec<u8>]>,
    #[serde(skip)]
    public: Arc<[VerifyingKey]>,
}

impl StandardWebhooks {
    /// Decodes the secrets: `whsec_<base64>` (or bare base64) for HMAC, `whpk_<base64>`
    /// for Ed25519 public keys.
    pub(super) fn new(file: StandardWebhooksFile) -> Result<StandardWebhooks, String> {
        let mut symmetric = Vec::new();
        let mut public = Vec::new();
        for env in &file.secret_env.0 {
            if env.secret.is_stand_in() {
                continue;
            }
            let secret = env.secret.expose();
            let invalid = || {
                format!(
                    "the secret in {} is not a base64 `whsec_` (or `whpk_`) secret",
                    env.variable
                )
            };
            if let Some(encoded) = secret.strip_prefix("whpk_") {
                let bytes: [u8; 32] = decode_base64(encoded)
                    .and_then(|bytes| bytes.try_into().ok())
                    .ok_or_else(invalid)?;
                public.push(VerifyingKey::from_bytes(&bytes).map_err(|_| invalid())?);
            } else {
                let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
                symmetric.push(
                    decode_base64(encoded)
                        .filter(|key| !key.is_empty())
                        .ok_or_else(invalid)?,
                );
            }
        }
        if public.len() > MAX_PUBLIC_KEYS {
            return Err(format!(
                "at most {MAX_PUBLIC_KEYS} `whpk_` public keys (an Ed25519 check costs as much as {ED25519_PASSES} secrets)"
            ));
        }
        Ok(StandardWebhooks {
            secret_env: file.secret_env,
            tolerance: file.tolerance,
            symmetric: symmetric.into(),
            public: public.into(),
        })
    }

    pub fn preset(secret_env: Secrets) -> Result<StandardWebhooks, String> {
        StandardWebhooks::new(StandardWebhooksFile {
            secret_env,
            tolerance: default_tolerance(),
        })
    }
}

/// The longest base64 an Ed25519 signature (64 bytes) takes.
const SIGNATURE_BASE64_MAX: usize = 88;

impl Scheme for StandardWebhooks {
    fn name(&self) -> &'static str {
        "standard_webhooks"
    }

    fn secrets(&self) -> &Secrets {
        &self.secret_env
    }

    fn is_timestamped(&self) -> bool {
        true
    }

    fn signed_headers(&self) -> &'static [&'static str] {
        SIGNED_ID_HEADERS
    }

    fn prepare(&self, delivery: Signed<'_>, now: i64) -> Result<Pending, VerifyError> {
        let headers = delivery.headers;
        let [id_name, timestamp_name, signature_name] = HEADER_SETS
            .into_iter()
            .find(|[id, _, _]| headers.contains_key(*id))
            .unwrap_or(HEADER_SETS[0]);
        let id = header(headers, id_name)?;
        // Checking one spelling's signature must not let the other spelling's ID through
        // unchecked: a signed delivery resent with a fresh `svix-id` would be a new key.
        for other in SIGNED_ID_HEADERS {
            if headers.get_all(*other).iter().any(|value| value != id) {
                return Err(VerifyError::IdMismatch(other));
            }
        }
        let text = header(headers, timestamp_name)?;
        let timestamp = parse_timestamp(text, timestamp_name)?;
        let list = header(headers, signature_name)?;
        let mut written = 0;
        let mut tags = Vec::new();
        let mut signatures = Vec::new();
        for entry in list.split_whitespace() {
            let (version, encoded) = match entry.split_once(',') {
                Some((version @ ("v1" | "v1a"), encoded)) => (version, encoded),
                _ => continue,
            };
            written += 1;
            if written > MAX_SIGNATURES {
                return Err(VerifyError::TooMany(signature_name));
            }
            if version == "v1" {
                tags.extend(base64_tag(encoded));
            } else if encoded.len() <= SIGNATURE_BASE64_MAX {
                signatures.extend(
                    decode_base64(encoded).and_then(|bytes| Signature::from_slice(&bytes).ok()),
                );
            }
        }
        if tags.is_empty() && signatures.is_empty() {
            return Err(VerifyError::Malformed(signature_name));
        }
        within_tolerance(timestamp, now, &self.tolerance)?;
        let prefix = [id.as_bytes(), b".", text.as_bytes(), b"."].concat();
        Pending {
            public: Arc::clone(&self.public),
            signatures,
            ..Pending::hmac(signature_name, prefix, &self.symmetric, tags)
        }
        .bounded()
    }
}

#[cfg(test)]
mod tests {
    use super::super::scheme::{ED25519_PASSES, MAX_PASSES};
    use super::*;
    use crate::values::EnvSecret;
    use http::HeaderMap;

    fn with_secret(secret: &str) -> Result<StandardWebhooks, String> {
        let env = EnvSecret {
            variable: "TEST".into(),
            secret: crate::values::Secret::new(secret.into()),
        };
        StandardWebhooks::new(StandardWebhooksFile {
            secret_env: Secrets(vec![env]),
            tolerance: default_tolerance(),
        })
    }

    /// The example in the Standard Webhooks specification.
    #[test]
    fn the_specification_example_verifies() {
        let scheme = with_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            "webhook-id",
            "msg_p5jXN8AQM9LWM0D4loKWxJek".parse().unwrap(),
        );
        headers.insert("webhook-timestamp", "1614265330".parse().unwrap());
        headers.insert(
            "webhook-signature",
            "v1,bm9ldHZhbGlk v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
                .parse()
                .unwrap(),
        );
        let body = br#"{"test": 2432232314}"#;
        let verify = |body: &[u8], now| {
            scheme
                .prepare(
                    Signed {
                        headers: &headers,
                        body,
                    },
                    now,
                )?
                .check(body)
        };
        assert_eq!(verify(body, 1614265330), Ok(()));
        assert_eq!(verify(b"{}", 1614265330), Err(VerifyError::NoMatch));
        assert!(matches!(
            verify(body, 1614265330 + 301),
            Err(VerifyError::Stale(_))
        ));
    }

    /// RFC 8032's first test vector: a valid public key and signature (of the empty
    /// message), so that a check of them hashes the whole message.
    const PUBLIC: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
    const SIGNATURE: &str = "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b";

    fn with_public_keys(count: usize) -> StandardWebhooks {
        use base64::Engine;
        let public = base64::engine::general_purpose::STANDARD.encode(hex::decode(PUBLIC).unwrap());
        let secrets = (0..count)
            .map(|n| EnvSecret {
                variable: format!("KEY_{n}"),
                secret: crate::values::Secret::new(format!("whpk_{public}")),
            })
            .collect();
        StandardWebhooks::new(StandardWebhooksFile {
            secret_env: Secrets(secrets),
            tolerance: default_tolerance(),
        })
        .unwrap()
    }

    fn signed_with(entries: usize) -> HeaderMap {
        use base64::Engine;
        let signature =
            base64::engine::general_purpose::STANDARD.encode(hex::decode(SIGNATURE).unwrap());
        let list = vec![format!("v1a,{signature}"); entries].join(" ");
        let mut headers = HeaderMap::new();
        headers.insert("webhook-id", "msg_1".parse().unwrap());
        headers.insert("webhook-timestamp", "1000".parse().unwrap());
        headers.insert("webhook-signature", list.parse().unwrap());
        headers
    }

    /// The attack that cost 77 ms: 700 Ed25519 signatures on a large body. Refused before
    /// any hashing; the most a delivery can cost is two Ed25519 checks (a rotation of
    /// keys or of signatures), and a route takes no more keys than that.
    #[test]
    fn public_key_checks_are_few_whatever_the_header_holds() {
        let one_key = with_public_keys(1);
        assert_eq!(
            one_key
                .prepare(Signed::headers_only(&signed_with(700)), 1000)
                .unwrap_err(),
            VerifyError::TooMany("webhook-signature")
        );
        let pending = one_key
            .prepare(Signed::headers_only(&signed_with(2)), 1000)
            .unwrap();
        assert_eq!(pending.passes(), MAX_PASSES);
        assert_eq!(pending.check(b"{}"), Err(VerifyError::NoMatch));
        assert_eq!(
            one_key
                .prepare(Signed::headers_only(&signed_with(3)), 1000)
                .unwrap_err(),
            VerifyError::TooMany("webhook-signature")
        );
        let two_keys = with_public_keys(2);
        assert!(
            two_keys
                .prepare(Signed::headers_only(&signed_with(1)), 1000)
                .is_ok()
        );
        assert_eq!(
            two_keys
                .prepare(Signed::headers_only(&signed_with(2)), 1000)
                .unwrap_err(),
            VerifyError::TooMany("webhook-signature")
        );
    }

    #[test]
    fn a_route_takes_at_most_two_public_keys() {
        use base64::Engine;
        let public = base64::engine::general_purpose::STANDARD.encode(hex::decode(PUBLIC).unwrap());
        let secrets = (0..3)
            .map(|n| EnvSecret {
                variable: format!("KEY_{n}"),
                secret: crate::values::Secret::new(format!("whpk_{public}")),
            })
            .collect();
        let error = StandardWebhooks::new(StandardWebhooksFile {
            secret_env: Secrets(secrets),
            tolerance: default_tolerance(),
        })
        .unwrap_err();
        assert!(error.contains("at most 2"), "{error}");
    }

    /// Secrets and public keys together count: a check never costs more than MAX_PASSES
    /// HMAC passes, an Ed25519 check counting as ED25519_PASSES.
    #[test]
    fn secrets_and_public_keys_share_one_bound() {
        use base64::Engine;
        let public = base64::engine::general_purpose::STANDARD.encode(hex::decode(PUBLIC).unwrap());
        let secret = |n: usize, value: String| EnvSecret {
            variable: format!("S_{n}"),
            secret: crate::values::Secret::new(value),
        };
        let mixed = StandardWebhooks::new(StandardWebhooksFile {
            secret_env: Secrets(vec![
                secret(0, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()),
                secret(1, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()),
                secret(2, format!("whpk_{public}")),
            ]),
            tolerance: default_tolerance(),
        })
        .unwrap();
        let mut headers = signed_with(1);
        let tag = base64::engine::general_purpose::STANDARD.encode([0xAB; 32]);
        let list = format!(
            "v1,{tag} {}",
            headers["webhook-signature"].to_str().unwrap()
        );
        headers.insert("webhook-signature", list.parse().unwrap());
        assert_eq!(
            mixed
                .prepare(Signed::headers_only(&headers), 1000)
                .unwrap()
                .passes(),
            2 + ED25519_PASSES
        );
        let two = format!(
            "{list} {}",
            signed_with(1)["webhook-signature"].to_str().unwrap()
        );
        headers.insert("webhook-signature", two.parse().unwrap());
        assert_eq!(
            mixed
                .prepare(Signed::headers_only(&headers), 1000)
                .unwrap_err(),
            VerifyError::TooMany("webhook-signature")
        );
    }

    #[test]
    fn secrets_must_be_base64() {
        assert!(
            with_secret("whsec_not base64!")
                .unwrap_err()
                .contains("TEST")
        );
        assert!(with_secret("whpk_AAAA").is_err());
    }
}

//! Standard Webhooks (and Svix, which uses the same scheme with `svix-` header names):
//! `webhook-id`, `webhook-timestamp` and `webhook-signature`, the latter a space-separated
//! list of `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{raw body}">` entries, keyed with
//! the base64 key of a `whsec_` secret; `v1a,<base64 Ed25519 signature>` entries are
//! checked against `whpk_` public keys. The timestamp must be within the tolerance (the
//! reference libraries use 5 minutes).

use ed25519_dalek::{Signature, VerifyingKey};
use http::HeaderMap;
use serde::{Deserialize, Serialize};

use super::{
    Scheme, Secrets, VerifyError, any_hmac_matches, decode_base64, default_tolerance, header,
    parse_timestamp, within_tolerance,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StandardWebhooksFile {
    pub(super) secret_env: Secrets,
    #[serde(default = "default_tolerance")]
    tolerance: HumanDuration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StandardWebhooks {
    pub(super) secret_env: Secrets,
    tolerance: HumanDuration,
    #[serde(skip)]
    symmetric: Vec<Vec<u8>>,
    #[serde(skip)]
    public: Vec<VerifyingKey>,
}

impl StandardWebhooks {
    /// Decodes the secrets: `whsec_<base64>` (or bare base64) for HMAC, `whpk_<base64>`
    /// for Ed25519 public keys.
    pub(super) fn new(file: StandardWebhooksFile) -> Result<StandardWebhooks, String> {
        let mut symmetric = Vec::new();
        let mut public = Vec::new();
        for env in &file.secret_env.0 {
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
        Ok(StandardWebhooks {
            secret_env: file.secret_env,
            tolerance: file.tolerance,
            symmetric,
            public,
        })
    }

    pub fn preset(secret_env: Secrets) -> Result<StandardWebhooks, String> {
        StandardWebhooks::new(StandardWebhooksFile {
            secret_env,
            tolerance: default_tolerance(),
        })
    }
}

impl Scheme for StandardWebhooks {
    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), VerifyError> {
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
        let mut hmacs = Vec::new();
        let mut ed25519 = Vec::new();
        for entry in list.split_whitespace() {
            match entry.split_once(',') {
                Some(("v1", encoded)) => hmacs.extend(decode_base64(encoded)),
                Some(("v1a", encoded)) => {
                    ed25519.extend(
                        decode_base64(encoded).and_then(|bytes| Signature::from_slice(&bytes).ok()),
                    );
                }
                _ => {}
            }
        }
        if hmacs.is_empty() && ed25519.is_empty() {
            return Err(VerifyError::Malformed(signature_name));
        }
        within_tolerance(timestamp, now, &self.tolerance)?;
        let message = [id.as_bytes(), b".", text.as_bytes(), b".", body];
        let signed_message = message.concat();
        let symmetric_ok = any_hmac_matches(&self.symmetric, &message, &hmacs);
        let public_ok = || {
            self.public.iter().any(|key| {
                ed25519
                    .iter()
                    .any(|signature| key.verify_strict(&signed_message, signature).is_ok())
            })
        };
        if symmetric_ok || public_ok() {
            Ok(())
        } else {
            Err(VerifyError::NoMatch)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::EnvSecret;

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
        assert_eq!(scheme.verify(&headers, body, 1614265330), Ok(()));
        assert_eq!(
            scheme.verify(&headers, b"{}", 1614265330),
            Err(VerifyError::NoMatch)
        );
        assert!(matches!(
            scheme.verify(&headers, body, 1614265330 + 301),
            Err(VerifyError::Stale(_))
        ));
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

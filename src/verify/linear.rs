//! Linear: `Linear-Signature: <hex>`, the HMAC-SHA256 of the raw body keyed with the
//! webhook's signing secret. The time it was sent is inside the signed body
//! (`webhookTimestamp`, milliseconds since the epoch), and must be within the tolerance
//! (Linear's SDK allows 60 s); it is read once the signature matches.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::scheme::{
    BodyTimestamp, Pending, Scheme, Secrets, Signed, VerifyError, header, hex_tag,
};
use crate::values::HumanDuration;

const SIGNATURE: &str = "linear-signature";

/// The body's field that holds when the delivery was sent.
const TIMESTAMP_FIELD: &str = "webhookTimestamp";

fn default_linear_tolerance() -> HumanDuration {
    HumanDuration(std::time::Duration::from_secs(60))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LinearFile {
    /// The environment variable holding the secret, or a list of them while it rotates.
    pub(super) secret_env: Secrets,
    /// How far `webhookTimestamp` may be from now (default `1m`, as Linear's SDK).
    #[serde(default = "default_linear_tolerance")]
    tolerance: HumanDuration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Linear {
    pub(super) secret_env: Secrets,
    tolerance: HumanDuration,
    #[serde(skip)]
    keys: Arc<[Vec<u8>]>,
}

impl Linear {
    pub(super) fn new(file: LinearFile) -> Linear {
        Linear {
            keys: file.secret_env.raw(),
            secret_env: file.secret_env,
            tolerance: file.tolerance,
        }
    }

    pub fn preset(secret_env: Secrets) -> Linear {
        Linear::new(LinearFile {
            secret_env,
            tolerance: default_linear_tolerance(),
        })
    }
}

impl Scheme for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn secrets(&self) -> &Secrets {
        &self.secret_env
    }

    fn is_timestamped(&self) -> bool {
        true
    }

    fn prepare(&self, delivery: Signed<'_>, now: i64) -> Result<Pending, VerifyError> {
        let tag = hex_tag(header(delivery.headers, SIGNATURE)?)
            .ok_or(VerifyError::Malformed(SIGNATURE))?;
        Ok(Pending {
            body_timestamp: Some(BodyTimestamp {
                field: TIMESTAMP_FIELD,
                now,
                tolerance: self.tolerance,
            }),
            ..Pending::hmac(SIGNATURE, Vec::new(), &self.keys, vec![tag])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::{EnvSecret, Secret};
    use hmac::{KeyInit, Mac};

    fn linear() -> Linear {
        Linear::preset(Secrets(vec![EnvSecret {
            variable: "LINEAR_WEBHOOK_SECRET".into(),
            secret: Secret::new("lin_wh_test".into()),
        }]))
    }

    fn signed(body: &str) -> http::HeaderMap {
        let mut mac = super::super::HmacSha256::new_from_slice(b"lin_wh_test").unwrap();
        mac.update(body.as_bytes());
        let mut headers = http::HeaderMap::new();
        let hex = hex::encode(mac.finalize().into_bytes());
        headers.insert(SIGNATURE, hex.parse().unwrap());
        headers
    }

    fn checked(body: &str, headers: &http::HeaderMap, now: i64) -> Result<(), VerifyError> {
        let delivery = Signed {
            headers,
            body: body.as_bytes(),
        };
        linear().prepare(delivery, now)?.check(body.as_bytes())
    }

    proptest::proptest! {
        /// Whatever a signed body holds (the fuzz target cannot sign, so cannot reach the
        /// body's parse), judging it ends in an answer, never a panic.
        #[test]
        fn any_signed_body_is_judged_without_a_panic(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256), now in proptest::prelude::any::<i64>()) {
            let text = String::from_utf8_lossy(&body).into_owned();
            let _ = checked(&text, &signed(&text), now);
            let stamped = format!(r#"{{"webhookTimestamp":{}}}"#, String::from_utf8_lossy(&body));
            let _ = checked(&stamped, &signed(&stamped), now);
        }

        /// Every number a signed body may hold, whole or not, against every clock.
        #[test]
        fn any_number_and_any_clock_are_judged_without_a_panic(whole in proptest::prelude::any::<i64>(), real in proptest::prelude::any::<f64>(), now in proptest::prelude::any::<i64>()) {
            for number in [whole.to_string(), format!("{real:e}"), format!("{real}")] {
                let body = format!(r#"{{"webhookTimestamp":{number}}}"#);
                let _ = checked(&body, &signed(&body), now);
            }
        }
    }

    #[test]
    fn the_timestamp_in_the_signed_body_is_judged_after_the_signature() {
        let body =
            r#"{"action":"create","data":{"webhookTimestamp":1},"webhookTimestamp":1796126400123}"#;
        let headers = signed(body);
        assert_eq!(checked(body, &headers, 1_796_126_430), Ok(()));
        assert_eq!(
            checked(body, &headers, 1_796_126_300),
            Err(VerifyError::Stale("1m".into()))
        );
        // A second signature header is not read: a forged one first refuses the delivery.
        let mut forged_first = http::HeaderMap::new();
        forged_first.append(SIGNATURE, "ab".repeat(32).parse().unwrap());
        forged_first.append(SIGNATURE, headers[SIGNATURE].clone());
        assert_eq!(
            checked(body, &forged_first, 1_796_126_430),
            Err(VerifyError::NoMatch)
        );
        // A forgery is refused for its signature, its body not read as JSON.
        let forged = "not json at all";
        assert_eq!(
            checked(forged, &headers, 1_796_126_430),
            Err(VerifyError::NoMatch)
        );
        for body in [
            r#"{"action":"create"}"#,
            r#"{"webhookTimestamp":"1796126400123"}"#,
            r#"{"webhookTimestamp":1e400}"#,
            "[1796126400123]",
            "",
        ] {
            assert_eq!(
                checked(body, &signed(body), 1_796_126_430),
                Err(VerifyError::BodyTimestamp(TIMESTAMP_FIELD)),
                "{body}"
            );
        }
    }
}

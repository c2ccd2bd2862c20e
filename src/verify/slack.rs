//! Slack: `X-Slack-Signature: v0=<hex>`, the HMAC-SHA256 of
//! `"v0:{X-Slack-Request-Timestamp}:{raw body}"` keyed with the app's signing secret;
//! the timestamp within 5 minutes (as Slack's SDKs check).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::scheme::{
    Pending, Scheme, Secrets, Signed, VerifyError, default_tolerance, header, hex_tag,
    parse_timestamp, within_tolerance,
};
use crate::values::HumanDuration;

const SIGNATURE: &str = "x-slack-signature";
const TIMESTAMP: &str = "x-slack-request-timestamp";

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SlackFile {
    /// The environment variable holding the secret, or a list of them while it rotates.
    pub(super) secret_env: Secrets,
    #[serde(default = "default_tolerance")]
    tolerance: HumanDuration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Slack {
    pub(super) secret_env: Secrets,
    tolerance: HumanDuration,
    #[serde(skip)]
    keys: Arc<[Vec<u8>]>,
}

impl Slack {
    pub(super) fn new(file: SlackFile) -> Slack {
        Slack {
            keys: file.secret_env.raw(),
            secret_env: file.secret_env,
            tolerance: file.tolerance,
        }
    }

    pub fn preset(secret_env: Secrets) -> Slack {
        Slack::new(SlackFile {
            secret_env,
            tolerance: default_tolerance(),
        })
    }
}

impl Scheme for Slack {
    fn name(&self) -> &'static str {
        "slack"
    }

    fn secrets(&self) -> &Secrets {
        &self.secret_env
    }

    fn is_timestamped(&self) -> bool {
        true
    }

    fn prepare(&self, delivery: Signed<'_>, now: i64) -> Result<Pending, VerifyError> {
        let headers = delivery.headers;
        let text = header(headers, TIMESTAMP)?;
        let timestamp = parse_timestamp(text, TIMESTAMP)?;
        let tag = header(headers, SIGNATURE)?
            .strip_prefix("v0=")
            .and_then(hex_tag)
            .ok_or(VerifyError::Malformed(SIGNATURE))?;
        within_tolerance(timestamp, now, &self.tolerance)?;
        let prefix = [b"v0:", text.as_bytes(), b":"].concat();
        Ok(Pending::hmac(SIGNATURE, prefix, &self.keys, vec![tag]))
    }
}

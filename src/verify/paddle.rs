//! Paddle Billing: `Paddle-Signature: ts=<unix>;h1=<hex>[;h1=<hex>...]`, the HMAC-SHA256
//! of `"{ts}:{raw body}"` keyed with the notification destination's secret key. Paddle's
//! Node SDK accepts a `ts` at most 5 s old, the default tolerance here.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::scheme::{Pending, Scheme, Secrets, Signed, TimestampedHex, VerifyError};
use crate::values::HumanDuration;

const SIGNATURE: &str = "paddle-signature";

fn default_paddle_tolerance() -> HumanDuration {
    HumanDuration(Duration::from_secs(5))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PaddleFile {
    /// The environment variable holding the secret, or a list of them while it rotates.
    pub(super) secret_env: Secrets,
    #[serde(default = "default_paddle_tolerance")]
    tolerance: HumanDuration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Paddle {
    pub(super) secret_env: Secrets,
    tolerance: HumanDuration,
    #[serde(skip)]
    keys: Arc<[Vec<u8>]>,
}

impl Paddle {
    pub(super) fn new(file: PaddleFile) -> Paddle {
        Paddle {
            keys: file.secret_env.raw(),
            secret_env: file.secret_env,
            tolerance: file.tolerance,
        }
    }

    pub fn preset(secret_env: Secrets) -> Paddle {
        Paddle::new(PaddleFile {
            secret_env,
            tolerance: default_paddle_tolerance(),
        })
    }
}

/// The header's layout.
const LAYOUT: TimestampedHex = TimestampedHex {
    header: SIGNATURE,
    separator: ';',
    timestamp: "ts",
    signature: "h1",
    joiner: b":",
};

impl Scheme for Paddle {
    fn name(&self) -> &'static str {
        "paddle"
    }

    fn secrets(&self) -> &Secrets {
        &self.secret_env
    }

    fn is_timestamped(&self) -> bool {
        true
    }

    fn prepare(&self, delivery: Signed<'_>, now: i64) -> Result<Pending, VerifyError> {
        let headers = delivery.headers;
        LAYOUT.prepare(&self.keys, &self.tolerance, headers, now)
    }
}

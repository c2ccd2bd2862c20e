//! Paddle Billing: `Paddle-Signature: ts=<unix>;h1=<hex>[;h1=<hex>...]`, the HMAC-SHA256
//! of `"{ts}:{raw body}"` keyed with the notification destination's secret key. Paddle's
//! Node SDK accepts a `ts` at most 5 s old, the default tolerance here.

use std::time::Duration;

use http::HeaderMap;
use serde::{Deserialize, Serialize};

use super::{
    Scheme, Secrets, VerifyError, any_hmac_matches, decode_hex, header, parse_timestamp,
    within_tolerance,
};
use crate::config::values::HumanDuration;

const SIGNATURE: &str = "paddle-signature";

fn default_paddle_tolerance() -> HumanDuration {
    HumanDuration(Duration::from_secs(5))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PaddleFile {
    secret_env: Secrets,
    #[serde(default = "default_paddle_tolerance")]
    tolerance: HumanDuration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Paddle {
    secret_env: Secrets,
    tolerance: HumanDuration,
    #[serde(skip)]
    keys: Vec<Vec<u8>>,
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

impl Scheme for Paddle {
    fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), VerifyError> {
        let value = header(headers, SIGNATURE)?;
        let mut timestamp = None;
        let mut signatures = Vec::new();
        for item in value.split(';') {
            match item.trim().split_once('=') {
                Some(("ts", text)) => timestamp = Some((text, parse_timestamp(text, SIGNATURE)?)),
                Some(("h1", hex)) => signatures.extend(decode_hex(hex)),
                _ => {}
            }
        }
        let (text, timestamp) = timestamp.ok_or(VerifyError::Malformed(SIGNATURE))?;
        if signatures.is_empty() {
            return Err(VerifyError::Malformed(SIGNATURE));
        }
        within_tolerance(timestamp, now, &self.tolerance)?;
        if any_hmac_matches(&self.keys, &[text.as_bytes(), b":", body], &signatures) {
            Ok(())
        } else {
            Err(VerifyError::NoMatch)
        }
    }
}

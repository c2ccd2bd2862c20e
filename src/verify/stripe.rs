//! Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...]`, the HMAC-SHA256 of
//! `"{t}.{raw body}"` keyed with the endpoint's signing secret (`whsec_...`, used as it
//! is); `t` must be within the tolerance (Stripe's libraries use 300 s). Several `v1`
//! entries appear while a secret rotates.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::scheme::{
    Pending, Scheme, Secrets, Signed, TimestampedHex, VerifyError, default_tolerance,
};
use crate::values::HumanDuration;

const SIGNATURE: &str = "stripe-signature";

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct StripeFile {
    /// The environment variable holding the secret, or a list of them while it rotates.
    pub(super) secret_env: Secrets,
    #[serde(default = "default_tolerance")]
    tolerance: HumanDuration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stripe {
    pub(super) secret_env: Secrets,
    tolerance: HumanDuration,
    #[serde(skip)]
    keys: Arc<[Vec<u8>]>,
}

impl Stripe {
    pub(super) fn new(file: StripeFile) -> Stripe {
        Stripe {
            keys: file.secret_env.raw(),
            secret_env: file.secret_env,
            tolerance: file.tolerance,
        }
    }

    pub fn preset(secret_env: Secrets) -> Stripe {
        Stripe::new(StripeFile {
            secret_env,
            tolerance: default_tolerance(),
        })
    }
}

/// The header's layout.
const LAYOUT: TimestampedHex = TimestampedHex {
    header: SIGNATURE,
    separator: ',',
    timestamp: "t",
    signature: "v1",
    joiner: b".",
};

impl Scheme for Stripe {
    fn name(&self) -> &'static str {
        "stripe"
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

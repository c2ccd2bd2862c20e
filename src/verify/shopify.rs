//! Shopify: `X-Shopify-Hmac-Sha256: <base64>`, the HMAC-SHA256 of the raw body keyed with
//! the app's client secret. No timestamp is signed.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::scheme::{Pending, Scheme, Secrets, Signed, VerifyError, base64_tag, header};

const SIGNATURE: &str = "x-shopify-hmac-sha256";

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ShopifyFile {
    /// The environment variable holding the secret, or a list of them while it rotates.
    pub(super) secret_env: Secrets,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shopify {
    pub(super) secret_env: Secrets,
    #[serde(skip)]
    keys: Arc<[Vec<u8>]>,
}

impl Shopify {
    pub(super) fn new(file: ShopifyFile) -> Shopify {
        Shopify {
            keys: file.secret_env.raw(),
            secret_env: file.secret_env,
        }
    }

    pub fn preset(secret_env: Secrets) -> Shopify {
        Shopify::new(ShopifyFile { secret_env })
    }
}

impl Scheme for Shopify {
    fn name(&self) -> &'static str {
        "shopify"
    }

    fn secrets(&self) -> &Secrets {
        &self.secret_env
    }

    fn prepare(&self, delivery: Signed<'_>, _now: i64) -> Result<Pending, VerifyError> {
        let headers = delivery.headers;
        let tag =
            base64_tag(header(headers, SIGNATURE)?).ok_or(VerifyError::Malformed(SIGNATURE))?;
        Ok(Pending::hmac(SIGNATURE, Vec::new(), &self.keys, vec![tag]))
    }
}

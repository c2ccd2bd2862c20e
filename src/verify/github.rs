//! GitHub: `X-Hub-Signature-256: sha256=<hex>`, the HMAC-SHA256 of the raw body keyed
//! with the webhook's secret. GitHub signs no timestamp, so a captured delivery can be
//! replayed; its key is then a duplicate.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::scheme::{Pending, Scheme, Secrets, Signed, VerifyError, header, hex_tag};

const SIGNATURE: &str = "x-hub-signature-256";

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct GithubFile {
    /// The environment variable holding the secret, or a list of them while it rotates.
    pub(super) secret_env: Secrets,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Github {
    pub(super) secret_env: Secrets,
    #[serde(skip)]
    keys: Arc<[Vec<u8>]>,
}

impl Github {
    pub(super) fn new(file: GithubFile) -> Github {
        Github {
            keys: file.secret_env.raw(),
            secret_env: file.secret_env,
        }
    }

    pub fn preset(secret_env: Secrets) -> Github {
        Github::new(GithubFile { secret_env })
    }
}

impl Scheme for Github {
    fn name(&self) -> &'static str {
        "github"
    }

    fn secrets(&self) -> &Secrets {
        &self.secret_env
    }

    fn prepare(&self, delivery: Signed<'_>, _now: i64) -> Result<Pending, VerifyError> {
        let headers = delivery.headers;
        let value = header(headers, SIGNATURE)?;
        let tag = value
            .strip_prefix("sha256=")
            .and_then(hex_tag)
            .ok_or(VerifyError::Malformed(SIGNATURE))?;
        Ok(Pending::hmac(SIGNATURE, Vec::new(), &self.keys, vec![tag]))
    }
}

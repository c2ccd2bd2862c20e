//! GitHub: `X-Hub-Signature-256: sha256=<hex>`, the HMAC-SHA256 of the raw body keyed
//! with the webhook's secret. GitHub signs no timestamp, so a captured delivery can be
//! replayed; its key is then a duplicate.

use http::HeaderMap;
use serde::{Deserialize, Serialize};

use super::{Scheme, Secrets, VerifyError, any_hmac_matches, decode_hex, header};

const SIGNATURE: &str = "x-hub-signature-256";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GithubFile {
    pub(super) secret_env: Secrets,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Github {
    pub(super) secret_env: Secrets,
    #[serde(skip)]
    keys: Vec<Vec<u8>>,
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
    fn verify(&self, headers: &HeaderMap, body: &[u8], _now: i64) -> Result<(), VerifyError> {
        let value = header(headers, SIGNATURE)?;
        let signature = value
            .strip_prefix("sha256=")
            .and_then(decode_hex)
            .ok_or(VerifyError::Malformed(SIGNATURE))?;
        if any_hmac_matches(&self.keys, &[body], &[signature]) {
            Ok(())
        } else {
            Err(VerifyError::NoMatch)
        }
    }
}

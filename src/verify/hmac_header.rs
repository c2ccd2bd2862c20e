//! A generic HMAC: the HMAC-SHA256 of the raw body keyed with a shared secret, in a named
//! header, hex or base64, after an optional prefix (`sha256=`, say). For the many
//! in-house and smaller senders that sign this way; no timestamp is signed.

use std::sync::Arc;

use http::header::HeaderName;
use serde::{Deserialize, Serialize, Serializer};

use super::scheme::{Pending, Scheme, Secrets, Signed, VerifyError, base64_tag, hex_tag};

/// How the signature is written in its header.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    #[default]
    Hex,
    Base64,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct HmacFile {
    /// The environment variable holding the secret, or a list of them while it rotates.
    pub(super) secret_env: Secrets,
    /// The header carrying the signature: an HMAC-SHA256 of the raw body.
    header: crate::values::HeaderNameValue,
    /// How the signature is written: `hex` (the default) or `base64`.
    #[serde(default)]
    encoding: Encoding,
    /// Text before the signature in the header, like `sha256=`.
    #[serde(default)]
    prefix: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HmacHeader {
    pub(super) secret_env: Secrets,
    #[serde(serialize_with = "header_name")]
    header: HeaderName,
    encoding: Encoding,
    prefix: String,
    #[serde(skip)]
    keys: Arc<[Vec<u8>]>,
}

fn header_name<S: Serializer>(name: &HeaderName, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(name.as_str())
}

impl HmacHeader {
    pub(super) fn new(file: HmacFile) -> HmacHeader {
        HmacHeader {
            keys: file.secret_env.raw(),
            secret_env: file.secret_env,
            header: file.header.0,
            encoding: file.encoding,
            prefix: file.prefix,
        }
    }
}

impl Scheme for HmacHeader {
    fn name(&self) -> &'static str {
        "hmac"
    }

    fn secrets(&self) -> &Secrets {
        &self.secret_env
    }

    fn signature_header(&self) -> Option<&HeaderName> {
        Some(&self.header)
    }

    fn prepare(&self, delivery: Signed<'_>, _now: i64) -> Result<Pending, VerifyError> {
        let headers = delivery.headers;
        // The header's name is configured, so the error names it as written.
        let value = headers
            .get(&self.header)
            .ok_or(VerifyError::MissingHeader("signature"))?
            .to_str()
            .map_err(|_| VerifyError::Malformed("signature"))?;
        let encoded = value
            .strip_prefix(self.prefix.as_str())
            .ok_or(VerifyError::Malformed("signature"))?;
        let tag = match self.encoding {
            Encoding::Hex => hex_tag(encoded),
            Encoding::Base64 => base64_tag(encoded),
        }
        .ok_or(VerifyError::Malformed("signature"))?;
        Ok(Pending::hmac(
            "signature",
            Vec::new(),
            &self.keys,
            vec![tag],
        ))
    }
}

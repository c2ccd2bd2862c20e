//! Presets: a known provider's event key and signature check in one line of YAML
//! (`preset: stripe`), or (`idempotency_key`) what a route in front of your own API needs:
//! its key, fingerprint, answers and error format. A route's own settings win over the
//! preset's; a provider preset's check reads the provider's usual secret variable, and
//! `verify: none` turns it off. Sources are in `docs/configuration.md`.

use serde::{Deserialize, Serialize};

use crate::key::KeyTemplate;
use crate::verify::{Github, Paddle, Secrets, Shopify, Slack, StandardWebhooks, Stripe, Verify};

/// What a delivery's fingerprint (the hash a duplicate's is compared with) covers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FingerprintScope {
    /// The body: a webhook provider resends the same body to the same URL.
    #[default]
    Body,
    /// The method, the path and the body: a client's request under an Idempotency-Key,
    /// which the draft says is another request if any of them changes.
    Request,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    Stripe,
    Github,
    Shopify,
    StandardWebhooks,
    Svix,
    Slack,
    Twilio,
    Paddle,
    /// Not a provider: a route in front of your own API, keyed by the client's
    /// `Idempotency-Key` header (draft-ietf-httpapi-idempotency-key-header).
    IdempotencyKey,
}

impl Preset {
    /// The provider's stable event ID.
    pub fn key(self) -> KeyTemplate {
        let template = match self {
            // The event object's ID, the same on every retry and resend.
            Preset::Stripe => "{json:/id}",
            // Repeated on redelivery, shared by the hooks of one event: keys stay scoped
            // to the route (one route per hook).
            Preset::Github => "{header:X-GitHub-Delivery}",
            Preset::Shopify => "{header:X-Shopify-Event-Id}",
            Preset::StandardWebhooks => "{header:webhook-id}",
            Preset::Svix => "{header:svix-id}",
            // Inside the event_callback wrapper.
            Preset::Slack => "{json:/event_id}",
            Preset::Twilio => "{header:I-Twilio-Idempotency-Token}",
            // The event's ID, not the per-delivery notification ID.
            Preset::Paddle => "{json:/event_id}",
            // The client (its credential, hashed), then its key, a Structured Field
            // string (`Idempotency-Key: "8e03978e-40d5"`): one client cannot read or
            // block another's answer by sending its key.
            Preset::IdempotencyKey => "{header-hash:Authorization}:{sf-string:Idempotency-Key}",
        };
        template.parse().expect("preset templates are valid")
    }

    /// The environment variable the preset's signature check reads its secret from.
    pub fn secret_env(self) -> Option<&'static str> {
        match self {
            Preset::Stripe => Some("STRIPE_WEBHOOK_SECRET"),
            Preset::Github => Some("GITHUB_WEBHOOK_SECRET"),
            Preset::Shopify => Some("SHOPIFY_WEBHOOK_SECRET"),
            Preset::StandardWebhooks => Some("WEBHOOK_SECRET"),
            Preset::Svix => Some("SVIX_WEBHOOK_SECRET"),
            Preset::Slack => Some("SLACK_SIGNING_SECRET"),
            Preset::Paddle => Some("PADDLE_WEBHOOK_SECRET"),
            // Twilio signs the full public URL, which a proxy behind an ingress cannot
            // know for sure; its check is left to the application.
            Preset::Twilio => None,
            // Your clients authenticate to your API as they always do.
            Preset::IdempotencyKey => None,
        }
    }

    /// The provider's signature check, reading its secret now.
    pub fn verify(self) -> Result<Option<Verify>, String> {
        let Some(variable) = self.secret_env() else {
            return Ok(None);
        };
        let secrets = Secrets::from_env(variable).map_err(|error| {
            format!("preset `{}` checks signatures with a secret from {variable}: {error} (or write `verify: none`)", self.name())
        })?;
        let verify = match self {
            Preset::Stripe => Verify::Stripe(Stripe::preset(secrets)),
            Preset::Github => Verify::Github(Github::preset(secrets)),
            Preset::Shopify => Verify::Shopify(Shopify::preset(secrets)),
            Preset::StandardWebhooks | Preset::Svix => {
                Verify::StandardWebhooks(StandardWebhooks::preset(secrets)?)
            }
            Preset::Slack => Verify::Slack(Slack::preset(secrets)),
            Preset::Paddle => Verify::Paddle(Paddle::preset(secrets)),
            Preset::Twilio | Preset::IdempotencyKey => {
                unreachable!("no secret variable")
            }
        };
        Ok(Some(verify))
    }

    /// What a duplicate's fingerprint covers: the request, for a client of an API, who
    /// may send the same key with another one; the body, for a provider's redelivery.
    pub(crate) fn fingerprint_scope(self) -> FingerprintScope {
        match self {
            Preset::IdempotencyKey => FingerprintScope::Request,
            _ => FingerprintScope::Body,
        }
    }

    /// Whether the proxy's refusals are RFC 9457 problems: what an API's clients expect
    /// (the draft's examples), where a webhook provider reads only the status.
    pub(crate) fn problem_details(self) -> bool {
        self == Preset::IdempotencyKey
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Preset::Stripe => "stripe",
            Preset::Github => "github",
            Preset::Shopify => "shopify",
            Preset::StandardWebhooks => "standard_webhooks",
            Preset::Svix => "svix",
            Preset::Slack => "slack",
            Preset::Twilio => "twilio",
            Preset::Paddle => "paddle",
            Preset::IdempotencyKey => "idempotency_key",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_has_a_valid_key() {
        for preset in [
            Preset::Stripe,
            Preset::Github,
            Preset::Shopify,
            Preset::StandardWebhooks,
            Preset::Svix,
            Preset::Slack,
            Preset::Twilio,
            Preset::Paddle,
            Preset::IdempotencyKey,
        ] {
            let key = preset.key().to_string();
            assert!(key.starts_with('{'), "{key}");
        }
    }
}

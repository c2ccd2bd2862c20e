//! Presets: a known provider's event key and signature check in one line of YAML
//! (`preset: stripe`), or (`idempotency_key`) what a route in front of your own API needs:
//! its key, fingerprint, answers and error format. A route's own settings win over the
//! preset's; a provider preset's check reads the provider's usual secret variable, and
//! `verify: none` turns it off. Sources are in `docs/configuration.md`.
//!
//! [`PRESETS`] is the one list of them: everything the rest of the code asks of a
//! provider (its headers, its sample delivery, whether its bodies share an envelope) is
//! an entry's field, so a new provider is an entry here and, if it signs in a new way, a
//! scheme in `verify/`.

use std::sync::LazyLock;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::key::KeyTemplate;
use crate::verify::{
    Github, Linear, Paddle, Secrets, Shopify, Slack, StandardWebhooks, Stripe, Verify,
};

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

/// Makes a preset's signature check with the secrets read from its variable.
pub type MakeCheck = fn(Secrets) -> Result<Verify, String>;

/// What a preset sets up, and what the rest of the code knows of its provider.
pub struct Provider {
    /// As `preset:` and `try --sample` spell it.
    pub name: &'static str,
    /// The provider's stable event ID, as a key template.
    pub key: &'static str,
    /// The signature check: the variable it reads its secrets from, and the check made
    /// with them; none where the check is left to the application.
    pub check: Option<(&'static str, MakeCheck)>,
    /// Headers that carry the signature: a dry run of a route that checks none points
    /// them out.
    pub signature_headers: &'static [&'static str],
    /// Headers that name the delivery or the event and carry no secret: the admin API
    /// shows their values.
    pub id_headers: &'static [&'static str],
    /// The beginnings of the provider's own header names: a key that reads one the
    /// sample lacks is warned of.
    pub header_prefixes: &'static [&'static str],
    /// Whether every event comes in one JSON envelope, which the sample shows: a field a
    /// letter away from one of the sample's is a typo.
    pub envelope: bool,
    /// A delivery, signed by the provider's SDK or published algorithm with a test secret
    /// (`examples/deliveries/`), for `try --sample` and the checks of a route's templates.
    pub sample: Option<&'static str>,
    /// A route in front of your own API rather than a provider's: a duplicate's
    /// fingerprint covers the request (method, path and body), the refusals are RFC 9457
    /// problems, and a key's answers are the draft's (`config/file.rs` sets them).
    pub for_api: bool,
}

/// The fields an entry leaves out: no signature check, no headers of its own, no
/// envelope, no sample.
const DEFAULTS: Provider = Provider {
    name: "",
    key: "",
    check: None,
    signature_headers: &[],
    id_headers: &[],
    header_prefixes: &[],
    envelope: false,
    sample: None,
    for_api: false,
};

/// Every preset.
pub const PRESETS: &[Provider] = &[
    Provider {
        name: "stripe",
        // The event object's ID, the same on every retry and resend.
        key: "{json:/id}",
        check: Some(("STRIPE_WEBHOOK_SECRET", |secrets| {
            Ok(Verify::new(Stripe::preset(secrets)))
        })),
        signature_headers: &["stripe-signature"],
        header_prefixes: &["stripe-"],
        envelope: true,
        sample: Some(include_str!("../examples/deliveries/stripe.http")),
        ..DEFAULTS
    },
    Provider {
        name: "github",
        // Repeated on redelivery, shared by the hooks of one event: keys stay scoped to
        // the route (one route per hook).
        key: "{header:X-GitHub-Delivery}",
        check: Some(("GITHUB_WEBHOOK_SECRET", |secrets| {
            Ok(Verify::new(Github::preset(secrets)))
        })),
        signature_headers: &["x-hub-signature-256"],
        id_headers: &["x-github-event", "x-github-delivery", "x-github-hook-id"],
        header_prefixes: &["x-github-"],
        envelope: true,
        sample: Some(include_str!("../examples/deliveries/github.http")),
        ..DEFAULTS
    },
    Provider {
        name: "shopify",
        key: "{header:X-Shopify-Event-Id}",
        check: Some(("SHOPIFY_WEBHOOK_SECRET", |secrets| {
            Ok(Verify::new(Shopify::preset(secrets)))
        })),
        signature_headers: &["x-shopify-hmac-sha256"],
        id_headers: &[
            "x-shopify-topic",
            "x-shopify-event-id",
            "x-shopify-shop-domain",
            "x-shopify-webhook-id",
        ],
        header_prefixes: &["x-shopify-"],
        // Each topic's body is its resource's own.
        envelope: false,
        sample: Some(include_str!("../examples/deliveries/shopify.http")),
        ..DEFAULTS
    },
    Provider {
        name: "standard_webhooks",
        key: "{header:webhook-id}",
        check: Some(("WEBHOOK_SECRET", |secrets| {
            Ok(Verify::new(StandardWebhooks::preset(secrets)?))
        })),
        signature_headers: &["webhook-signature"],
        id_headers: &["webhook-id", "webhook-timestamp"],
        header_prefixes: &["webhook-"],
        // The payload is the sender's own.
        envelope: false,
        sample: Some(include_str!(
            "../examples/deliveries/standard_webhooks.http"
        )),
        ..DEFAULTS
    },
    Provider {
        name: "svix",
        key: "{header:svix-id}",
        check: Some(("SVIX_WEBHOOK_SECRET", |secrets| {
            Ok(Verify::new(StandardWebhooks::preset(secrets)?))
        })),
        signature_headers: &["svix-signature"],
        id_headers: &["svix-id", "svix-timestamp"],
        header_prefixes: &["svix-"],
        envelope: false,
        sample: Some(include_str!("../examples/deliveries/svix.http")),
        ..DEFAULTS
    },
    Provider {
        name: "slack",
        // Inside the event_callback wrapper.
        key: "{json:/event_id}",
        check: Some(("SLACK_SIGNING_SECRET", |secrets| {
            Ok(Verify::new(Slack::preset(secrets)))
        })),
        signature_headers: &["x-slack-signature"],
        header_prefixes: &["x-slack-"],
        envelope: true,
        sample: Some(include_str!("../examples/deliveries/slack.http")),
        ..DEFAULTS
    },
    Provider {
        name: "twilio",
        key: "{header:I-Twilio-Idempotency-Token}",
        // Twilio signs the full public URL, which a proxy behind an ingress cannot know
        // for sure; its check is left to the application.
        check: None,
        header_prefixes: &["x-twilio-", "i-twilio-"],
        sample: Some(include_str!("../examples/deliveries/twilio.http")),
        ..DEFAULTS
    },
    Provider {
        name: "paddle",
        // The event's ID, not the per-delivery notification ID.
        key: "{json:/event_id}",
        check: Some(("PADDLE_WEBHOOK_SECRET", |secrets| {
            Ok(Verify::new(Paddle::preset(secrets)))
        })),
        signature_headers: &["paddle-signature"],
        header_prefixes: &["paddle-"],
        envelope: true,
        sample: Some(include_str!("../examples/deliveries/paddle.http")),
        ..DEFAULTS
    },
    Provider {
        name: "linear",
        // A delivery's ID, the same on each retry of it.
        key: "{header:Linear-Delivery}",
        check: Some(("LINEAR_WEBHOOK_SECRET", |secrets| {
            Ok(Verify::new(Linear::preset(secrets)))
        })),
        signature_headers: &["linear-signature"],
        id_headers: &["linear-delivery", "linear-event"],
        header_prefixes: &["linear-"],
        envelope: true,
        sample: Some(include_str!("../examples/deliveries/linear.http")),
        ..DEFAULTS
    },
    // Not a provider: a route in front of your own API, keyed by the client's
    // `Idempotency-Key` header (draft-ietf-httpapi-idempotency-key-header). Your clients
    // authenticate to your API as they always do.
    Provider {
        name: "idempotency_key",
        // The client (its credential, hashed), then its key, a Structured Field string
        // (`Idempotency-Key: "8e03978e-40d5"`): one client cannot read or block another's
        // answer by sending its key.
        key: "{header-hash:Authorization}:{sf-string:Idempotency-Key}",
        for_api: true,
        ..DEFAULTS
    },
];

/// The presets' names, in [`PRESETS`]' order.
static NAMES: LazyLock<Vec<&'static str>> =
    LazyLock::new(|| PRESETS.iter().map(|preset| preset.name).collect());

/// A route's preset: one entry of [`PRESETS`].
#[derive(Clone, Copy)]
pub struct Preset(&'static Provider);

impl Preset {
    /// The preset `name` spells, if there is one.
    pub fn named(name: &str) -> Option<Preset> {
        PRESETS
            .iter()
            .find(|preset| preset.name == name)
            .map(Preset)
    }

    /// Every preset, in [`PRESETS`]' order.
    pub fn all() -> impl Iterator<Item = Preset> {
        PRESETS.iter().map(Preset)
    }

    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// Everything the preset says of its provider.
    pub fn provider(self) -> &'static Provider {
        self.0
    }

    /// The provider's stable event ID.
    pub fn key(self) -> KeyTemplate {
        self.0.key.parse().expect("preset templates are valid")
    }

    /// The environment variable the preset's signature check reads its secret from.
    pub fn secret_env(self) -> Option<&'static str> {
        self.0.check.map(|(variable, _)| variable)
    }

    /// The provider's signature check, reading its secret now.
    pub fn verify(self) -> Result<Option<Verify>, String> {
        let Some((variable, check)) = self.0.check else {
            return Ok(None);
        };
        let secrets = Secrets::from_env(variable).map_err(|error| {
            format!("preset `{}` checks signatures with a secret from {variable}: {error} (or write `verify: none`)", self.name())
        })?;
        check(secrets).map(Some)
    }

    /// What a duplicate's fingerprint covers: the request, for a client of an API, who
    /// may send the same key with another one; the body, for a provider's redelivery.
    pub(crate) fn fingerprint_scope(self) -> FingerprintScope {
        match self.0.for_api {
            true => FingerprintScope::Request,
            false => FingerprintScope::Body,
        }
    }

    /// Whether the proxy's refusals are RFC 9457 problems: what an API's clients expect
    /// (the draft's examples), where a webhook provider reads only the status.
    pub(crate) fn problem_details(self) -> bool {
        self.0.for_api
    }

    /// Each preset's sample delivery, by the preset's name.
    pub fn samples() -> impl Iterator<Item = (&'static str, &'static str)> {
        PRESETS
            .iter()
            .filter_map(|preset| Some((preset.name, preset.sample?)))
    }

    /// The headers any preset's provider names a delivery or an event with.
    pub(crate) fn is_id_header(name: &str) -> bool {
        PRESETS
            .iter()
            .any(|preset| preset.id_headers.contains(&name))
    }

    /// The first provider signature header among `has`'s, if any.
    pub(crate) fn signature_header_in(has: impl Fn(&str) -> bool) -> Option<&'static str> {
        PRESETS
            .iter()
            .flat_map(|preset| preset.signature_headers)
            .copied()
            .find(|name| has(name))
    }
}

impl PartialEq for Preset {
    fn eq(&self, other: &Preset) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Preset {}

impl std::fmt::Debug for Preset {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

impl Serialize for Preset {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Preset {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Preset, D::Error> {
        // Refused inside the visit, so that the error carries the name's own place.
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = Preset;
            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("a preset's name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Preset, E> {
                Preset::named(name).ok_or_else(|| E::unknown_variant(name, &NAMES))
            }
        }
        deserializer.deserialize_str(Name)
    }
}

impl schemars::JsonSchema for Preset {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Preset".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A known provider's event key and signature check (or, `idempotency_key`, a route in front of your own API).",
            "type": "string",
            "enum": *NAMES,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_has_a_valid_key_and_a_name_of_its_own() {
        for preset in Preset::all() {
            let key = preset.key().to_string();
            assert!(key.starts_with('{'), "{key}");
            assert_eq!(Preset::named(preset.name()), Some(preset));
        }
        let mut names = NAMES.clone();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PRESETS.len(), "two presets share a name");
    }

    use crate::route::logging::LoggedHeader;

    /// What the admin API shows (`id_headers`) never carries a signature or a secret;
    /// a provider whose signature is checked names the headers that carry it.
    #[test]
    fn the_headers_a_preset_shows_carry_no_secret() {
        let signature_headers: Vec<&str> = (PRESETS.iter())
            .flat_map(|preset| preset.signature_headers)
            .copied()
            .collect();
        for preset in PRESETS {
            for header in preset.id_headers {
                assert!(!signature_headers.contains(header), "{header}");
                assert!(header.parse::<LoggedHeader>().is_ok(), "{header}");
            }
            // The delivery log refuses a signature header by its name alone.
            for header in preset.signature_headers {
                assert!(header.parse::<LoggedHeader>().is_err(), "{header}");
            }
            if preset.check.is_some() {
                assert!(!preset.signature_headers.is_empty(), "{}", preset.name);
            }
            assert_eq!(preset.sample.is_none(), preset.for_api, "{}", preset.name);
        }
    }
}

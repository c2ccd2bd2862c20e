//! A route's templates checked against its provider's own delivery (the sample shipped
//! for `dedupe-proxy try`): a key, `order` entity or version that reads nothing from it
//! where the delivery has a header, form field or envelope field one letter away is a
//! typo, refused with what was likely meant. A name further off may be a field of another
//! event type, and is left alone; so are the JSON fields of providers whose bodies are
//! each event's own (Shopify's resources, Standard Webhooks' payloads).

use crate::http_file;
use crate::key::{Delivery, KeyTemplate};

/// The providers whose deliveries share one JSON envelope, which the sample shows.
const ENVELOPES: [&str; 4] = ["stripe", "github", "slack", "paddle"];

/// Refuses the first of `templates` (each with the setting it is written in) that misses
/// what `provider`'s delivery has, if any; `provider` is a sample's name.
pub(super) fn check(provider: &str, templates: &[(&str, &KeyTemplate)]) -> Result<(), String> {
    let Ok(text) = http_file::sample(provider) else {
        return Ok(());
    };
    let written = http_file::parse(text.as_bytes()).expect("the samples are valid messages");
    let request = &written.request;
    let delivery = Delivery {
        headers: request.headers(),
        query: request.uri().query(),
        body: request.body(),
    };
    for (setting, template) in templates {
        let json = ENVELOPES.contains(&provider);
        if let Some((part, meant)) = template.near_misses(&delivery, json).into_iter().next() {
            return Err(format!(
                "`{setting}` reads {part}, which a {provider} delivery does not have; did you mean {meant}?"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(provider: &str, template: &str) -> Result<(), String> {
        let template: KeyTemplate = template.parse().unwrap();
        check(provider, &[("key", &template)])
    }

    #[test]
    fn fields_of_other_event_types_and_unknown_providers_are_left_alone() {
        for (provider, template) in [
            ("stripe", "{json:/data/object/metadata/order_id}"),
            ("stripe", "{json:/type}:{json:/data/object/id}"),
            ("github", "{header:X-GitHub-Hook-Installation-Target-ID}"),
            ("github", "{json:/installation/id}"),
            ("slack", "{json:/event/channel}"),
            ("hmac", "{json:/idd}"),
            ("svix", "{header:svix-idd}"),
            // A field two letters from a sample's, and a header one word off.
            ("stripe", "{json:/data/object/account}"),
            ("github", "{json:/member/id}"),
            ("shopify", "{header:X-Shopify-Order-Id}"),
            ("shopify", "{json:/idd}"),
            ("standard_webhooks", "{json:/data/account}"),
        ] {
            assert_eq!(checked(provider, template), Ok(()), "{provider} {template}");
        }
    }

    #[test]
    fn a_near_miss_names_what_was_meant() {
        for (provider, template, meant) in [
            (
                "stripe",
                "{json:/data/object/amont}",
                "{json:/data/object/amount}",
            ),
            ("slack", "{json:/Event_ID}", "{json:/event_id}"),
            ("paddle", "{json:/evnt_id}", "{json:/event_id}"),
            (
                "shopify",
                "{header:X-Shopify-Event-ID}x{header:X-Shopify-Evnt-Id}",
                "{header:x-shopify-event-id}",
            ),
            (
                "standard_webhooks",
                "{sf-string:webhook-idd}",
                "{sf-string:webhook-id}",
            ),
        ] {
            let error = checked(provider, template).unwrap_err();
            assert!(
                error.ends_with(&format!("did you mean {meant}?")),
                "{error}"
            );
        }
    }
}

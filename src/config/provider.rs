//! A route's templates checked against its provider's own delivery (the sample shipped
//! for `dedupe-proxy try`): a key, `order` entity or version that reads nothing from it
//! where the delivery has a header, form field or envelope field one letter away is a
//! typo, refused with what was likely meant. A name further off may be a field of another
//! event type, and is left alone; so are the JSON fields of providers whose bodies are
//! each event's own (Shopify's resources, Standard Webhooks' payloads).

use crate::http_file;
use crate::key::{Delivery, KeyTemplate};
use crate::preset::Preset;
use crate::route::Route;

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
    let json = Preset::named(provider).is_some_and(|preset| preset.provider().envelope);
    for (setting, template) in templates {
        if let Some((part, meant)) = template.near_misses(&delivery, json).into_iter().next() {
            return Err(format!(
                "`{setting}` reads {part}, which a {provider} delivery does not have; did you mean {meant}?"
            ));
        }
    }
    Ok(())
}

/// Warnings for the headers `route`'s templates read that look like its provider's own (its
/// prefix) but that its provider's delivery does not carry: a header further off than a
/// typo, which may be real all the same, so only said.
pub(super) fn unsent_headers(route: &Route) -> Vec<String> {
    let provider = match (&route.preset, &route.verify) {
        (Some(preset), _) => preset.name(),
        (None, Some(verify)) => verify.scheme_name(),
        (None, None) => return Vec::new(),
    };
    let (Some(preset), Ok(text)) = (Preset::named(provider), http_file::sample(provider)) else {
        return Vec::new();
    };
    let written = http_file::parse(text.as_bytes()).expect("the samples are valid messages");
    let carried = written.request.headers();
    let mut templates = vec![("key", &route.key)];
    if let Some(order) = &route.order {
        templates.push(("order.entity", &order.entity));
        templates.push(("order.version", &order.version));
    }
    let mut warnings = Vec::new();
    for (setting, template) in templates {
        for name in template.header_names() {
            let provider_like = (preset.provider().header_prefixes.iter())
                .any(|prefix| name.as_str().starts_with(prefix));
            if provider_like && !carried.contains_key(name) {
                warnings.push(format!(
                    "route `{}`: `{setting}` reads the header {name}, which a {provider} delivery does not carry (`dedupe-proxy try --sample {provider}` shows one): every delivery may lack the key",
                    route.name
                ));
            }
        }
    }
    warnings
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
            // A field two letters from a sample's, and a header one word off.
            ("stripe", "{json:/data/object/account}"),
            ("github", "{json:/member/id}"),
            ("shopify", "{header:X-Shopify-Order-Id}"),
            ("shopify", "{json:/idd}"),
            ("standard_webhooks", "{json:/data/account}"),
        ] {
            assert_eq!(checked(provider, template), Ok(()), "{provider} {template}");
        }
        // Svix has a sample of its own now: its headers are known.
        let typo = checked("svix", "{header:svix-idd}").unwrap_err();
        assert!(typo.contains("did you mean {header:svix-id}"), "{typo}");
    }

    #[test]
    fn a_header_in_the_providers_own_names_that_it_never_sends_is_warned_about() {
        let config = |key: &str| {
            let text = format!(
                "upstream: http://127.0.0.1:1\nroutes:\n  - {{ name: g, match: {{ path: /g }}, preset: github, verify: none, key: \"{key}\" }}\n"
            );
            crate::config::Config::parse(&text, std::path::Path::new("t.yaml"), &Default::default())
                .unwrap()
        };
        let warned = config("{header:X-GitHub-Hook-Guid}").warnings;
        assert!(
            warned.iter().any(|warning| warning.contains(
                "reads the header x-github-hook-guid, which a github delivery does not carry"
            )),
            "{warned:?}"
        );
        for quiet in [
            "{header:X-GitHub-Hook-Installation-Target-ID}",
            "{header:X-Request-Id}",
        ] {
            let warnings = config(quiet).warnings;
            assert!(
                !warnings
                    .iter()
                    .any(|warning| warning.contains("does not carry")),
                "{quiet}: {warnings:?}"
            );
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

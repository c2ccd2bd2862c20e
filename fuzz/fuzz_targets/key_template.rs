//! Fuzzes key templates: parsing any text, printing it back, and extracting a key from
//! any header, query and body. Input: template \0 header value \0 query \0 body.
#![no_main]

use dedupe_proxy::key::{Delivery, KeyError, KeyTemplate, MAX_KEY_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(4, |byte| *byte == 0);
    let (template, header, query, body) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let Ok(text) = std::str::from_utf8(template) else {
        return;
    };
    let Ok(template) = text.parse::<KeyTemplate>() else {
        return;
    };
    assert_eq!(template.to_string(), text);
    let mut headers = http::HeaderMap::new();
    if let Ok(value) = http::HeaderValue::from_bytes(header) {
        headers.insert("x-id", value);
    }
    let query = String::from_utf8_lossy(query);
    let delivery = Delivery {
        headers: &headers,
        query: Some(&query),
        body,
    };
    match template.extract(&delivery) {
        Ok(key) => assert!(key.len() <= MAX_KEY_BYTES),
        Err(KeyError::TooLong(length)) => assert!(length > MAX_KEY_BYTES),
        Err(KeyError::Missing { .. }) => {}
    }
});

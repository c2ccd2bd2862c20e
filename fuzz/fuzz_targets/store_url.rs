//! Fuzzes the masking of store URLs, in every form a driver takes: any text masks without
//! a panic; and a URL, a query or a libpq `key=value` string built around any password
//! (escaped as its form needs) never shows that password once masked.
#![no_main]

use dedupe_proxy::config::ServerUrl;
use dedupe_proxy::values::Secret;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = ServerUrl::Written(Secret::new(text.to_owned())).masked();
    let _ = ServerUrl::Written(Secret::new(text.to_owned())).passwords();

    if text.chars().count() < 4 {
        return;
    }
    let encoded =
        percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string();
    let quoted = format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"));
    for (template, written) in [
        ("postgres://app:{}@db.internal:5432/app", &encoded),
        ("postgres://app@db.internal/app?sslmode=disable&password={}", &encoded),
        ("redis://:{}@cache.internal:6379/0", &encoded),
        ("host=db.internal user=app password={} dbname=app", &quoted),
    ] {
        // A password that is a piece of the form's own text could not be told apart.
        if template.contains(written.as_str()) || template.contains(text) {
            continue;
        }
        let form = template.replace("{}", written);
        let url = ServerUrl::Written(Secret::new(form.clone()));
        let shown = url.masked();
        assert!(!shown.contains(written.as_str()), "{form} → {shown}");
        assert!(
            url.passwords().iter().any(|password| password == text),
            "{form}: {:?}",
            url.passwords()
        );
    }
});

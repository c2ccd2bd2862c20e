//! Fuzzes configuration loading: any text is a configuration or an error that names the
//! file, line and column (one line each, when several are found); never a panic.
#![no_main]

use std::path::Path;

use dedupe_proxy::config::{Config, Overrides};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::parse(text, Path::new("fuzz.yaml"), &Overrides::default()) {
        Ok(config) => {
            serde_yaml::to_string(&config).expect("a configuration serializes");
        }
        // One line per error found, each located.
        Err(error) => assert!(error.to_string().lines().all(|line| line.starts_with("fuzz.yaml:"))),
    }
});

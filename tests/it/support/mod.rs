//! Test support, one file a part: the scripted upstream (`upstream.rs`), the in-process
//! proxy (`proxy.rs`), a client (`client.rs`), the binary launcher (`binary.rs`), raw
//! sockets (`raw.rs`), the extra servers (`servers.rs`), a store that fails on demand
//! (`failing_store.rs`), metrics as scraped (`metrics.rs`), and small helpers
//! (`files.rs`, `records.rs`), the stores the contract tests open (`stores.rs`), and the
//! power-loss simulator (`power_cut.rs`). Every test module takes it with `use
//! crate::support;` and `use support::*;`.
#![allow(dead_code)]

mod binary;
mod client;
mod failing_store;
mod files;
mod metrics;
pub mod power_cut;
mod proxy;
mod raw;
mod records;
mod servers;
mod stores;
mod upstream;

// Not every part is used by every test module.
#[allow(unused_imports)]
pub use {
    binary::*, client::*, failing_store::*, files::*, metrics::*, proxy::*, raw::*, records::*,
    servers::*, stores::*, upstream::*,
};

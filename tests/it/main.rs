//! The integration tests, built as one binary: a module per area (each file opens with
//! what it covers) and `support`, what they share. One binary compiles and links the
//! crate's generic code once, where a binary per file did it forty-odd times.
//! `cargo test --test it flow::` runs one area, `cargo test --test it -- NAME` the tests
//! whose path contains NAME.

mod support;

mod admin;
mod bypass;
mod charts;
mod cli;
mod config_errors;
mod config_schema;
mod conformance;
mod console;
mod crash;
mod delivery_log;
mod demo;
mod deploy;
mod descriptors;
mod docs;
mod dry_run;
mod faults;
mod flow;
mod forgeries;
mod held;
mod hostile;
mod http2;
mod idempotency_key;
mod key_memory;
mod leases;
mod log_contract;
mod log_lines;
mod mcp;
mod module_map;
mod observability;
mod openapi;
mod operations;
mod order;
mod postgres_sessions;
mod promises;
mod properties;
mod queue_contract;
mod queued;
mod queued_crashes;
mod readme;
mod replays;
mod replicas;
mod secrets;
mod signatures;
mod sled_store;
mod stable_storage;
mod store_failures;
mod store_management;
mod store_tls;
mod telemetry;
mod upstream_oddities;
mod viewer;
mod waiting;

//! dedupe-proxy: a reverse proxy that makes each webhook event reach an application's
//! success path once, although providers deliver at least once.
//!
//! # Architecture
//!
//! ```text
//! provider ──HTTP──▶ server ──▶ proxy ──▶ upstream ──HTTP──▶ application
//!                                 │  └──▶ queue (workers) ──▶ upstream ──▶ application
//!                                 └──▶ store (ClaimStore and DeliveryQueue: sled | Redis | PostgreSQL)
//! admin port ──▶ admin (health, readiness, metrics, routes, reload, keys, queue)
//! ```
//!
//! - [`config`] reads the YAML file and resolves every route's settings ([`values`] are
//!   their typed values); [`route`] is a route as it runs and the table that finds it;
//!   `target` checks a request's Host and gives the path's normal form routes match on;
//!   [`key`] extracts keys; [`verify`] checks signatures; `preset` knows the major
//!   providers; `order` reads an event's entity and version for the stale-event guard.
//! - `proxy` is the lifecycle of one delivery: match, check (read, verify, key), claim,
//!   compare with the entity's newest version (`order:`), forward, finish; or, with
//!   `delivery: queued`, store the request as a job and acknowledge it.
//! - `queue` delivers the queued jobs in the background: per route, within its
//!   concurrency and rate, each attempt ending delivered, due again later, or dead.
//! - [`store`] holds claims: absent → in_flight → done (or held, for an operator),
//!   atomically, owner-checked, on sled (embedded) or shared by replicas on Redis or
//!   PostgreSQL, each entity's newest done version, and the queued jobs; `waiting` keeps
//!   the duplicates that wait for an outcome.
//! - `delivery_log` records what became of each request, off the request path, in the
//!   store's log ([`store::log`]), and reads it back for the admin API.
//! - `upstream` holds the pooled clients, one per worker; `response` writes every
//!   answer the proxy makes.
//! - `server` accepts connections within [`config::Limits`] and hands each to one of
//!   the `workers` (a single-threaded runtime per core); `admin` serves the admin
//!   port; `metrics` names every metric; `reload` applies a changed configuration;
//!   `shutdown` waits for signals.
//!
//! # A delivery's life
//!
//! A delivery on a matched route has its body read (bounded), its signature checked, its
//! key extracted and claimed. Only an unclaimed key is forwarded, in a task that outlives
//! the sender's connection. An upstream success marks the key done before the sender
//! hears of it; any failure releases the claim so the provider's retry runs the work
//! (with `on_ambiguous: hold`, a failure after which the app may have done the work holds
//! the key for an operator instead). A done key's duplicate is answered at once; an
//! in-flight or held key's gets 409 and `Retry-After`. On a route with `order:`, an event
//! older than one already done about the same entity is forwarded marked `Dedupe-Stale`,
//! or skipped. On a route with `delivery: queued`, the claimed delivery is stored as a job
//! and its key marked done before the sender gets `202`; the workers deliver it with
//! retries, and dead letters wait for an operator. The background tasks sweep expired
//! records and count held keys.
//!
//! [`start`] brings the proxy up and returns an [`App`]; [`App::shutdown`] drains it.
//! `app::run` does both around a shutdown signal, for the binary ([`cli::process`]).
//!
//! Seven modules are public, for the binary, the integration tests and the fuzz targets;
//! the rest are the proxy's own. With the `testing` feature (this crate's tests and fuzz
//! targets only) an eighth, `testing`, reaches the private items they exercise.

#![forbid(unsafe_code)]

mod admin;
mod app;
mod background;
mod body;
pub mod cli;
pub mod config;
mod cursor_mark;
mod delivery_log;
mod descriptors;
mod dry_run;
mod dsn;
mod frame_budget;
mod http_file;
pub mod key;
mod log_text;
mod method_override;
mod metrics;
mod misleading;
mod order;
mod preset;
mod proxy;
mod queue;
mod redact;
mod reload;
mod response;
pub mod route;
mod server;
mod shutdown;
pub mod store;
mod target;
mod telemetry;
mod upstream;
pub mod values;
pub mod verify;
mod waiting;
mod workers;

#[cfg(feature = "testing")]
pub mod testing;

pub use app::{App, StartError, start, start_with_store};

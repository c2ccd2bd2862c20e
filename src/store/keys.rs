//! The names things are stored under: an event's key, a body a replay guard recorded, an
//! entity's newest version, and what a version is. Apart from the store's contract, so
//! that the modules that make these names (`order`) need nothing else of the store.

use serde::{Deserialize, Serialize};

/// A SHA-256 digest of a delivery's body (with the `idempotency_key` preset, of its
/// method, target and body): what a duplicate's is compared with.
pub type Fingerprint = [u8; 32];

/// The full store key of an event: its route's namespace and its extracted key.
pub(crate) fn store_key(namespace: &str, key: &str) -> String {
    // Namespaces are `[a-z0-9_-]+`, so the first `:` always ends the namespace. Joined
    // by hand: `format!` cost a delivery more than the join
    // (docs/performance.md, "The hot path, lean again").
    [namespace, ":", key].concat()
}

/// The store key under which a route's replay guard records a body: `#` cannot appear in
/// a namespace, so no event key can ever be this one.
pub(crate) fn body_key(namespace: &str, fingerprint: &Fingerprint) -> String {
    format!("{namespace}#body:{}", hex::encode(fingerprint))
}

/// The store key of an entity's record (a route's `order:` guard): `#` cannot appear in a
/// namespace, so no event key can be this one.
pub fn entity_key(namespace: &str, entity: &str) -> String {
    format!("{namespace}#entity:{entity}")
}

/// An event's version under a route's `order:` guard (made in `crate::order`): the text
/// the event carried, and its sort key. Versions compare by their sort keys, byte by byte;
/// every sort key has the same length, and only digits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    pub sort_key: String,
    pub text: String,
}

//! The marks that bind a listing's cursor to the listing that gave it (the keys of a
//! scope, a clearing, the delivery log under one filter): an HMAC-SHA256 under a key no
//! client knows, so that no one can write a cursor the proxy never gave. The key is drawn
//! at start, or derived from the operator's admin token, so that replicas sharing the
//! token read each other's cursors.

use std::sync::OnceLock;

use hmac::{KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::verify::HmacSha256;

static KEY: OnceLock<[u8; 32]> = OnceLock::new();

/// Derives the key from the operator's token; a mark already made keeps the drawn key.
pub(crate) fn share_key(token: &[u8]) {
    let mut hasher = Sha256::new();
    hasher.update(b"dedupe-proxy cursor mark\n");
    hasher.update(token);
    let _ = KEY.set(hasher.finalize().into());
}

/// The mark of `parts` (the listing's filter and the store's cursor), 16 hex digits.
pub(crate) fn mark(parts: &[&str]) -> String {
    let key = KEY.get_or_init(rand::random);
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes any key");
    for part in parts {
        mac.update(&(part.len() as u64).to_be_bytes());
        mac.update(part.as_bytes());
    }
    hex::encode(&mac.finalize().into_bytes()[..8])
}

/// Whether `mark` is the mark of `parts`, compared in constant time.
pub(crate) fn is_mark_of(given: &str, parts: &[&str]) -> bool {
    use subtle::ConstantTimeEq;
    bool::from(given.as_bytes().ct_eq(mark(parts).as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_tell_apart_what_plain_joining_would_not() {
        assert_eq!(mark(&["a", "b"]), mark(&["a", "b"]));
        assert_ne!(mark(&["a\nb", ""]), mark(&["a", "b\n"]));
        assert_ne!(mark(&["ab", "c"]), mark(&["a", "bc"]));
        // Unkeyed, a client could compute the mark: the first 8 bytes of SHA-256.
        let unkeyed = hex::encode(&Sha256::digest(b"a\nb")[..8]);
        assert_ne!(mark(&["a", "b"]), unkeyed);
    }
}

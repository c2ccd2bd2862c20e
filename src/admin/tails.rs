//! The live tails of the delivery log running on this admin port: their places, at most
//! [`TAILS_MAX`] at once and half of them per credential, and what ends them all when the
//! proxy closes.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::places::{Full, Place, Places};

/// Live tails at once at most: the admin port has 64 connections in all.
pub(super) const TAILS_MAX: usize = 8;

/// The tails running now, and what ends them (each clone shares them).
#[derive(Clone)]
pub(super) struct Tails {
    places: Arc<Places>,
    closing: CancellationToken,
}

impl Default for Tails {
    fn default() -> Self {
        Tails {
            places: Arc::new(Places::new(TAILS_MAX, TAILS_MAX / 2)),
            closing: CancellationToken::new(),
        }
    }
}

impl Tails {
    /// A place for one more tail of `credential`, if one is free.
    pub(super) fn take(&self, credential: &'static str) -> Result<Place, Full> {
        self.places.take(credential)
    }

    /// Cancelled when the proxy closes.
    pub(super) fn closing(&self) -> CancellationToken {
        self.closing.clone()
    }

    /// Ends every tail, and starts none from now on.
    pub(super) fn close(&self) {
        self.closing.cancel();
        self.places.close();
    }
}

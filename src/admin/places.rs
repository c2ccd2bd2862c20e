//! Places for what holds a connection long on the admin port (a request whose body is
//! being read, a live tail), bounded in all and per credential (the token, the viewer's
//! token, loopback), so that no credential's clients can take every place, and the
//! port's other connections stay free for the probes.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// `all` places, of which one credential may hold `each`.
pub(super) struct Places {
    all: Arc<Semaphore>,
    each: usize,
    by_credential: Mutex<HashMap<&'static str, Arc<Semaphore>>>,
}

/// A place taken, given back when dropped.
pub(super) struct Place {
    _all: OwnedSemaphorePermit,
    _own: OwnedSemaphorePermit,
}

/// Why no place was given.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Full {
    /// Every place is taken.
    All,
    /// The credential holds its share.
    Credential,
}

impl Places {
    pub(super) fn new(all: usize, each: usize) -> Places {
        Places {
            all: Arc::new(Semaphore::new(all)),
            each,
            by_credential: Mutex::default(),
        }
    }

    /// A place for `credential` (`Role::credential`), if one is free for it.
    pub(super) fn take(&self, credential: &'static str) -> Result<Place, Full> {
        let own = Arc::clone(
            self.by_credential
                .lock()
                .entry(credential)
                .or_insert_with(|| Arc::new(Semaphore::new(self.each))),
        );
        let own = own.try_acquire_owned().map_err(|_| Full::Credential)?;
        let all = Arc::clone(&self.all)
            .try_acquire_owned()
            .map_err(|_| Full::All)?;
        Ok(Place {
            _all: all,
            _own: own,
        })
    }

    /// Gives no place from now on.
    pub(super) fn close(&self) {
        self.all.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_credential_holds_its_share_and_no_more() {
        let places = Places::new(3, 2);
        let first = places.take("viewer_token").unwrap();
        let _second = places.take("viewer_token").unwrap();
        assert_eq!(places.take("viewer_token").err(), Some(Full::Credential));
        let _third = places.take("token").unwrap();
        assert_eq!(places.take("token").err(), Some(Full::All));
        drop(first);
        assert!(places.take("viewer_token").is_ok());
    }
}

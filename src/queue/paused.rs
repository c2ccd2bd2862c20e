//! Which queued routes are paused, as this replica knows it: read again from the store
//! every refresh (other replicas pause and resume too), changed here at once by this
//! replica's own pause or resume. A read of the store that began before such a change may
//! not hold it, so it is not applied: the next refresh reads again.

use std::collections::HashSet;

use parking_lot::RwLock;

/// The paused routes.
#[derive(Default)]
pub(crate) struct Paused {
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    routes: HashSet<String>,
    /// Bumped by every change made here, so that a read begun before it is known.
    changes: u64,
}

/// When a read of the store began, for [`Paused::read`].
#[derive(Clone, Copy)]
pub(crate) struct ReadBegun(u64);

impl Paused {
    /// Whether `route` is paused.
    pub(crate) fn contains(&self, route: &str) -> bool {
        self.state.read().routes.contains(route)
    }

    /// Taken before the store is read for [`Paused::read`].
    pub(crate) fn begin_read(&self) -> ReadBegun {
        ReadBegun(self.state.read().changes)
    }

    /// The store says `routes` are paused, in a read that began at `begun`: kept unless
    /// this replica paused or resumed a route since. Returns whether it was kept.
    pub(crate) fn read(&self, begun: ReadBegun, routes: Vec<String>) -> bool {
        let mut state = self.state.write();
        if state.changes != begun.0 {
            return false;
        }
        state.routes = routes.into_iter().collect();
        true
    }

    /// This replica paused or resumed `route` (the store already says so).
    pub(crate) fn set(&self, route: &str, paused: bool) {
        let mut state = self.state.write();
        state.changes += 1;
        if paused {
            state.routes.insert(route.to_owned());
        } else {
            state.routes.remove(route);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refresh reads the store, the operator pauses a route meanwhile, and the refresh
    /// ends: the pause stands (it once was undone until the next refresh, and a paused
    /// route delivered a job in between).
    #[test]
    fn a_read_begun_before_a_pause_does_not_undo_it() {
        let paused = Paused::default();
        let begun = paused.begin_read();
        paused.set("hooks", true);
        assert!(!paused.read(begun, Vec::new()));
        assert!(paused.contains("hooks"));
        // The next read sees the store as it is.
        let begun = paused.begin_read();
        assert!(paused.read(begun, vec!["hooks".into(), "other".into()]));
        assert!(paused.contains("other"));
        // A resume is not undone either.
        let begun = paused.begin_read();
        paused.set("other", false);
        paused.read(begun, vec!["hooks".into(), "other".into()]);
        assert!(!paused.contains("other"));
        // A read with no change meanwhile takes another replica's resume.
        let begun = paused.begin_read();
        paused.read(begun, Vec::new());
        assert!(!paused.contains("hooks"));
    }
}

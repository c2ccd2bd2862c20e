//! Which queued routes are paused, as this replica knows it: read again from the store
//! every refresh (other replicas pause and resume too), changed here at once by this
//! replica's own pause or resume. A read of the store that began before such a change may
//! not hold it, so the change is applied again over what that read found.

use std::collections::{HashMap, HashSet};

use parking_lot::RwLock;

/// The paused routes.
#[derive(Default)]
pub(crate) struct Paused {
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    routes: HashSet<String>,
    /// Numbers this replica's own changes, so that a read knows which came after it began.
    changes: u64,
    /// Each route's latest change made here (its number, and whether it paused), until a
    /// read begun after it is applied. Only configured routes are ever paused, so it
    /// stays small.
    made_here: HashMap<String, (u64, bool)>,
}

/// When a read of the store began, for [`Paused::replace_from_store`].
#[derive(Clone, Copy)]
pub(crate) struct ReadBegun(u64);

impl Paused {
    /// Whether `route` is paused.
    pub(crate) fn contains(&self, route: &str) -> bool {
        self.state.read().routes.contains(route)
    }

    /// Taken before the store is read for [`Paused::replace_from_store`].
    pub(crate) fn begin_read(&self) -> ReadBegun {
        ReadBegun(self.state.read().changes)
    }

    /// The store says `routes` are paused, in a read that began at `begun`: they replace
    /// what was known, with this replica's changes made since the read began applied over
    /// them. Returns the routes this made resumed (another replica resumed them), whose
    /// loops sleep until woken.
    pub(crate) fn replace_from_store(&self, begun: ReadBegun, routes: Vec<String>) -> Vec<String> {
        let mut state = self.state.write();
        let mut paused: HashSet<String> = routes.into_iter().collect();
        state.made_here.retain(|route, (change, pauses)| {
            let later = *change > begun.0;
            if later && *pauses {
                paused.insert(route.clone());
            } else if later {
                paused.remove(route);
            }
            later
        });
        let resumed = (state.routes.iter())
            .filter(|route| !paused.contains(*route))
            .cloned()
            .collect();
        state.routes = paused;
        resumed
    }

    /// This replica paused or resumed `route`. Called only once the store says so: a
    /// read begun after this call must find it there.
    pub(crate) fn set_here(&self, route: &str, pauses: bool) {
        let mut state = self.state.write();
        state.changes += 1;
        let change = state.changes;
        state.made_here.insert(route.to_owned(), (change, pauses));
        if pauses {
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
    /// route delivered in between).
    #[test]
    fn a_read_begun_before_a_pause_does_not_undo_it() {
        let paused = Paused::default();
        let begun = paused.begin_read();
        paused.set_here("hooks", true);
        paused.replace_from_store(begun, Vec::new());
        assert!(paused.contains("hooks"));
        // A read begun after the pause finds it in the store, and is taken as it is.
        let begun = paused.begin_read();
        paused.replace_from_store(begun, Vec::new());
        assert!(
            !paused.contains("hooks"),
            "another replica resumed it since"
        );
    }

    #[test]
    fn a_read_begun_before_a_resume_does_not_undo_it() {
        let paused = Paused::default();
        paused.set_here("hooks", true);
        let begun = paused.begin_read();
        paused.set_here("hooks", false);
        paused.replace_from_store(begun, vec!["hooks".into()]);
        assert!(!paused.contains("hooks"));
    }

    /// Changes made here to one route do not hold back what other replicas did to others:
    /// however often an operator pauses and resumes here, every read is applied.
    #[test]
    fn a_read_takes_other_replicas_changes_whatever_is_changed_here() {
        let paused = Paused::default();
        let begun = paused.begin_read();
        paused.set_here("hooks", true);
        paused.set_here("hooks", false);
        paused.set_here("hooks", true);
        paused.replace_from_store(begun, vec!["other".into()]);
        assert!(paused.contains("other"), "paused by another replica");
        assert!(paused.contains("hooks"), "the latest change made here");
        let begun = paused.begin_read();
        let resumed = paused.replace_from_store(begun, vec!["hooks".into()]);
        assert!(!paused.contains("other"), "resumed by another replica");
        assert_eq!(
            resumed,
            ["other"],
            "said resumed, so that its loop is woken"
        );
        assert!(
            paused.state.read().made_here.is_empty(),
            "nothing kept once read"
        );
    }
}

//! How full each queued route is, as this replica knows it: the store's count, taken every
//! refresh, plus the jobs this replica accepted since that count began. An acceptance
//! takes a place first, under one lock, so that a burst between two counts cannot take a
//! route past `max_queued` on one replica (other replicas' jobs show at the next count).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// Every route's fill.
#[derive(Default)]
pub(crate) struct Fill {
    routes: Mutex<HashMap<String, RouteFill>>,
}

#[derive(Default)]
struct RouteFill {
    /// Jobs held (dead letters included): counted, plus places taken since. `None`
    /// before the first count.
    held: Option<u64>,
    /// Places taken since the start, so that a count can tell which came after it began.
    taken: u64,
    /// Places taken whose job is not yet stored or given up: a count that begins now may
    /// not see them.
    unsettled: u64,
}

/// Why no place was given.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NoPlace {
    /// The route holds `max_queued` jobs.
    Full,
    /// The route was never counted.
    Uncounted,
}

impl Fill {
    /// A place for one more job of `route`, which may hold `max`.
    pub(crate) fn take(self: &Arc<Self>, route: &str, max: u64) -> Result<Place, NoPlace> {
        let mut routes = self.routes.lock();
        let fill = routes.entry(route.to_owned()).or_default();
        let held = fill.held.ok_or(NoPlace::Uncounted)?;
        if held >= max {
            return Err(NoPlace::Full);
        }
        fill.held = Some(held + 1);
        fill.taken += 1;
        fill.unsettled += 1;
        Ok(Place {
            fill: Arc::clone(self),
            route: route.to_owned(),
            kept: false,
        })
    }

    /// Whether `route` was counted since the start.
    pub(crate) fn is_counted(&self, route: &str) -> bool {
        self.routes
            .lock()
            .get(route)
            .is_some_and(|fill| fill.held.is_some())
    }

    /// Places whose jobs a count that starts now sees, per route (those taken and settled
    /// so far): given back to [`Fill::counted`] with that count.
    pub(crate) fn before_count(&self, route: &str) -> u64 {
        self.routes
            .lock()
            .get(route)
            .map_or(0, |fill| fill.taken - fill.unsettled)
    }

    /// The store counted `held` jobs of `route`, in a count that began when
    /// [`Fill::before_count`] said `taken_before`: places taken since, or unsettled then,
    /// may or may not be in it, and are added (an estimate over, never under, until the
    /// next count).
    pub(crate) fn counted(&self, route: &str, held: u64, taken_before: u64) {
        let mut routes = self.routes.lock();
        let fill = routes.entry(route.to_owned()).or_default();
        fill.held = Some(held + fill.taken.saturating_sub(taken_before));
    }

    /// The jobs `route` holds as last counted and taken since.
    #[cfg(test)]
    fn held(&self, route: &str) -> Option<u64> {
        self.routes.lock().get(route).and_then(|fill| fill.held)
    }
}

/// A place taken for a job: given back when dropped, unless the job was stored.
pub(crate) struct Place {
    fill: Arc<Fill>,
    route: String,
    kept: bool,
}

impl Place {
    /// The job was stored: it holds the place until a count sees it go.
    pub(crate) fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(fill) = self.fill.routes.lock().get_mut(&self.route) {
            fill.unsettled -= 1;
            if !self.kept {
                fill.held = fill.held.map(|held| held.saturating_sub(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_taken_up_to_the_limit_and_given_back_unless_kept() {
        let fill = Arc::new(Fill::default());
        assert_eq!(fill.take("r", 2).err(), Some(NoPlace::Uncounted));
        let before = fill.before_count("r");
        fill.counted("r", 0, before);
        let first = fill.take("r", 2).unwrap();
        let second = fill.take("r", 2).unwrap();
        assert_eq!(fill.take("r", 2).err(), Some(NoPlace::Full));
        first.keep();
        drop(second);
        assert_eq!(fill.held("r"), Some(1));
        // A count that began before a place was taken adds it; one after sees it.
        let before = fill.before_count("r");
        fill.take("r", 2).unwrap().keep();
        fill.counted("r", 1, before);
        assert_eq!(fill.held("r"), Some(2));
        assert_eq!(fill.take("r", 2).err(), Some(NoPlace::Full));
    }

    /// A place taken before a count began whose job is stored after the store counted
    /// is in neither number unless it is added: it is.
    #[test]
    fn a_job_stored_while_the_store_counts_is_not_lost() {
        let fill = Arc::new(Fill::default());
        fill.counted("r", 0, fill.before_count("r"));
        let place = fill.take("r", 1).unwrap();
        let before = fill.before_count("r");
        // The store counts: the job is not stored yet.
        place.keep();
        fill.counted("r", 0, before);
        assert_eq!(fill.take("r", 1).err(), Some(NoPlace::Full));
    }
}

//! The embedded store's queue indexes, kept in memory: where each job's record is (its
//! seq), and for each route its jobs by due time, the times they were received, its
//! dead letters by time of death, and its lanes in the order stored, with the route's
//! counts. Rebuilt from the records whenever the database opens; changed after each
//! write of a record, under that job's lock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use crate::store::Millis;

/// Where a job is filed: what of a job the indexes need.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(super) struct Filing {
    pub(super) key: Arc<str>,
    /// Its record's key in the tree `jobs_by_seq`.
    pub(super) seq: u64,
    pub(super) state: State,
    pub(super) received_at: Millis,
    /// Its lane and place in it, if it has one.
    pub(super) lane: Option<(Arc<str>, u64)>,
    /// When the done record its key keeps expires, if it keeps one.
    pub(super) done_until: Option<Millis>,
}

/// Where a job stands, for the indexes and the counts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum State {
    /// Due at that time; attempted this round or not (`retrying`).
    Due { at: Millis, retrying: bool },
    /// Dead since that time.
    Dead { since: Millis },
}

/// What a route's queue holds, by count.
#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Counts {
    pub(super) waiting: u64,
    pub(super) retrying: u64,
    pub(super) dead: u64,
}

#[derive(Default)]
struct RouteIndex {
    /// Due time, seq, key: of the jobs due at one time, the first stored comes first.
    due: BTreeSet<(Millis, u64, Arc<str>)>,
    /// How many jobs that are not dead were received at each time.
    received: BTreeMap<Millis, u64>,
    dead: BTreeSet<(Millis, Arc<str>)>,
    /// The jobs of each lane that are not dead: lane, place, key. A lane's jobs share
    /// one copy of its name.
    lanes: BTreeSet<(Arc<str>, u64, Arc<str>)>,
    counts: Counts,
}

impl RouteIndex {
    fn is_empty(&self) -> bool {
        self.due.is_empty() && self.dead.is_empty()
    }

    fn file(&mut self, filing: &Filing) {
        let key = Arc::clone(&filing.key);
        match filing.state {
            State::Dead { since } => {
                self.dead.insert((since, key));
                self.counts.dead += 1;
            }
            State::Due { at, retrying } => {
                self.due.insert((at, filing.seq, key));
                *self.received.entry(filing.received_at).or_default() += 1;
                if let Some((lane, place)) = &filing.lane {
                    let first = (Arc::clone(lane), 0, Arc::from(""));
                    let name = match self.lanes.range(first..).next() {
                        Some((name, _, _)) if name == lane => Arc::clone(name),
                        _ => Arc::clone(lane),
                    };
                    self.lanes.insert((name, *place, Arc::clone(&filing.key)));
                }
                match retrying {
                    true => self.counts.retrying += 1,
                    false => self.counts.waiting += 1,
                }
            }
        }
    }

    fn unfile(&mut self, filing: &Filing) {
        let key = Arc::clone(&filing.key);
        match filing.state {
            State::Dead { since } => {
                self.dead.remove(&(since, key));
                self.counts.dead = self.counts.dead.saturating_sub(1);
            }
            State::Due { at, retrying } => {
                self.due.remove(&(at, filing.seq, key));
                if let Some(count) = self.received.get_mut(&filing.received_at) {
                    *count -= 1;
                    if *count == 0 {
                        self.received.remove(&filing.received_at);
                    }
                }
                if let Some((lane, place)) = &filing.lane {
                    let filed = (Arc::clone(lane), *place, Arc::clone(&filing.key));
                    self.lanes.remove(&filed);
                }
                let count = match retrying {
                    true => &mut self.counts.retrying,
                    false => &mut self.counts.waiting,
                };
                *count = count.saturating_sub(1);
            }
        }
    }
}

/// Every route's indexes, each job's seq, and the keys whose jobs keep a done record.
#[derive(Default)]
pub(super) struct Indexes {
    routes: HashMap<String, RouteIndex>,
    seqs: HashMap<Arc<str>, u64>,
    /// In key order, with when each done record expires: for claims, listings and counts
    /// without reading the records.
    done: BTreeMap<Arc<str>, Millis>,
}

impl Indexes {
    /// Files a job changed from `before` to `after` (either absent: stored or removed).
    pub(super) fn refile(&mut self, route: &str, before: Option<&Filing>, after: Option<&Filing>) {
        if before == after {
            return;
        }
        if !self.routes.contains_key(route) {
            self.routes.insert(route.to_owned(), RouteIndex::default());
        }
        let index = self.routes.get_mut(route).expect("inserted above");
        if let Some(before) = before {
            index.unfile(before);
            self.seqs.remove(&before.key);
            self.done.remove(&before.key);
        }
        if let Some(after) = after {
            index.file(after);
            self.seqs.insert(Arc::clone(&after.key), after.seq);
            if let Some(until) = after.done_until {
                self.done.insert(Arc::clone(&after.key), until);
            }
        }
        if index.is_empty() {
            self.routes.remove(route);
        }
    }

    /// The seq of the record of the job of `key`, if one is stored.
    pub(super) fn seq(&self, key: &str) -> Option<u64> {
        self.seqs.get(key).copied()
    }

    /// The seq of the job of `key` if it keeps a done record live at `now`.
    pub(super) fn done(&self, key: &str, now: Millis) -> Option<u64> {
        let seq = self.seq(key)?;
        self.done
            .get(key)
            .is_some_and(|&until| until > now)
            .then_some(seq)
    }

    /// How many jobs keep a done record, expired or not.
    pub(super) fn done_count(&self) -> usize {
        self.done.len()
    }

    /// Up to `wanted` keys starting with `prefix`, after `after`, in key order, whose jobs
    /// keep a done record live at `now`, looking at `examined_max` keys at most. The
    /// second part is the last key looked at, when that bound cut the look short.
    pub(super) fn done_keys(
        &self,
        prefix: &str,
        after: Option<&str>,
        now: Millis,
        wanted: usize,
        examined_max: usize,
    ) -> (Vec<Arc<str>>, Option<Arc<str>>) {
        let from = match after {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        let mut found = Vec::new();
        let in_scope = (self.done.range::<str, _>((from, Bound::Unbounded)))
            .take_while(|(key, _)| key.starts_with(prefix));
        for (examined, (key, &until)) in in_scope.enumerate() {
            if found.len() == wanted {
                break;
            }
            if until > now {
                found.push(Arc::clone(key));
            }
            if examined + 1 == examined_max && found.len() < wanted {
                return (found, Some(Arc::clone(key)));
            }
        }
        (found, None)
    }

    /// Up to `limit` keys of `route`'s jobs due at `now` or before, the earliest first
    /// (and of those due at once, the first stored).
    pub(super) fn due(&self, route: &str, now: Millis, limit: usize) -> Vec<Arc<str>> {
        let Some(index) = self.routes.get(route) else {
            return Vec::new();
        };
        index
            .due
            .iter()
            .take_while(|(at, _, _)| *at <= now)
            .take(limit)
            .map(|(_, _, key)| Arc::clone(key))
            .collect()
    }

    /// Up to `limit` of `route`'s dead letters, when each died and its key, in the order
    /// they died, after the one that died at `after` (its time and key).
    pub(super) fn dead(
        &self,
        route: &str,
        after: Option<(Millis, &str)>,
        limit: usize,
    ) -> Vec<(Millis, Arc<str>)> {
        let Some(index) = self.routes.get(route) else {
            return Vec::new();
        };
        let start = match after {
            Some((died, key)) => Bound::Excluded((died, Arc::from(key))),
            None => Bound::Unbounded,
        };
        index
            .dead
            .range((start, Bound::Unbounded))
            .take(limit)
            .cloned()
            .collect()
    }

    /// The key of the first job of `route`'s lane `lane` that is not dead.
    pub(super) fn lane_head(&self, route: &str, lane: &str) -> Option<Arc<str>> {
        let index = self.routes.get(route)?;
        let lane: Arc<str> = Arc::from(lane);
        let first = (Arc::clone(&lane), 0, Arc::from(""));
        let (head_lane, _, key) = index.lanes.range(first..).next()?;
        (*head_lane == lane).then(|| Arc::clone(key))
    }

    /// Every lane that holds a job that is not dead: its route and name.
    pub(super) fn lanes(&self) -> Vec<(String, Arc<str>)> {
        let mut lanes = Vec::new();
        for (route, index) in &self.routes {
            let mut last: Option<&Arc<str>> = None;
            for (lane, _, _) in &index.lanes {
                if last != Some(lane) {
                    lanes.push((route.clone(), Arc::clone(lane)));
                    last = Some(lane);
                }
            }
        }
        lanes
    }

    /// `route`'s counts, and when its oldest job that is not dead was received.
    pub(super) fn counts(&self, route: &str) -> (Counts, Option<Millis>) {
        match self.routes.get(route) {
            Some(index) => (index.counts, index.received.keys().next().copied()),
            None => (Counts::default(), None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job due at `at`, stored under the seq `at` (the order of most of these tests).
    fn due(key: &str, at: Millis, received_at: Millis) -> Filing {
        Filing {
            key: Arc::from(key),
            seq: at,
            state: State::Due {
                at,
                retrying: false,
            },
            received_at,
            lane: None,
            done_until: None,
        }
    }

    #[test]
    fn done_keys_are_listed_in_order_past_expired_ones_within_a_bound() {
        let mut indexes = Indexes::default();
        for (n, until) in [(1, 50), (2, 200), (3, 50), (4, 200), (5, 200)] {
            let filing = Filing {
                done_until: Some(until),
                ..due(&format!("r:{n}"), n, n)
            };
            indexes.refile("r", None, Some(&filing));
        }
        indexes.refile("r", None, Some(&due("r:6", 6, 6)));
        indexes.refile("r", None, Some(&due("s:1", 7, 7)));
        let keys =
            |found: Vec<Arc<str>>| found.iter().map(|key| key.to_string()).collect::<Vec<_>>();
        let (found, cut) = indexes.done_keys("r:", None, 100, 10, 1000);
        assert_eq!(
            (keys(found), cut),
            (vec!["r:2".into(), "r:4".into(), "r:5".into()], None)
        );
        let (found, cut) = indexes.done_keys("r:", Some("r:2"), 100, 1, 1000);
        assert_eq!((keys(found), cut), (vec!["r:4".to_owned()], None));
        // Two looked at, the second expired: cut short there, to go on after it.
        let (found, cut) = indexes.done_keys("r:", Some("r:1"), 100, 10, 2);
        assert_eq!(
            (keys(found), cut.as_deref()),
            (vec!["r:2".to_owned()], Some("r:3"))
        );
        assert_eq!(indexes.done("r:2", 100), Some(2));
        assert_eq!(indexes.done("r:1", 100), None, "expired");
        assert_eq!(indexes.done("r:6", 100), None, "keeps none");
        assert_eq!(indexes.done_count(), 5);
        // A removed job's done record goes with it.
        let leaving = Filing {
            done_until: Some(200),
            ..due("r:2", 2, 2)
        };
        indexes.refile("r", Some(&leaving), None);
        assert_eq!((indexes.done("r:2", 100), indexes.done_count()), (None, 4));
    }

    #[test]
    fn a_job_moves_between_indexes_and_leaves_nothing_behind() {
        let mut indexes = Indexes::default();
        let first = due("r:a", 10, 5);
        let second = due("r:b", 20, 3);
        indexes.refile("r", None, Some(&first));
        indexes.refile("r", None, Some(&second));
        assert_eq!(indexes.due("r", 15, 10), [Arc::from("r:a")]);
        assert_eq!(indexes.seq("r:b"), Some(20));
        assert_eq!(indexes.due("r", 20, 10).len(), 2);
        assert_eq!(indexes.due("r", 20, 1), [Arc::from("r:a")]);
        assert_eq!(indexes.counts("r").1, Some(3));

        let dead = Filing {
            state: State::Dead { since: 30 },
            ..second.clone()
        };
        indexes.refile("r", Some(&second), Some(&dead));
        let (counts, oldest) = indexes.counts("r");
        assert_eq!((counts.waiting, counts.dead, oldest), (1, 1, Some(5)));
        assert_eq!(indexes.dead("r", None, 10), [(30, Arc::from("r:b"))]);
        assert!(indexes.dead("r", Some((30, "r:b")), 10).is_empty());

        indexes.refile("r", Some(&first), None);
        indexes.refile("r", Some(&dead), None);
        assert_eq!(indexes.seq("r:a"), None);
        assert!(indexes.routes.is_empty(), "an emptied route is forgotten");
        assert!(indexes.seqs.is_empty(), "no seq is left behind");
    }

    #[test]
    fn of_jobs_due_at_once_the_first_stored_comes_first() {
        let mut indexes = Indexes::default();
        let later = Filing {
            seq: 9,
            ..due("r:a", 20, 3)
        };
        let earlier = Filing {
            seq: 4,
            ..due("r:z", 20, 3)
        };
        indexes.refile("r", None, Some(&later));
        indexes.refile("r", None, Some(&earlier));
        indexes.refile("r", None, Some(&due("r:m", 10, 3)));
        let keys = [Arc::from("r:m"), Arc::from("r:z"), Arc::from("r:a")];
        assert_eq!(indexes.due("r", 20, 10), keys);
    }

    #[test]
    fn a_lane_head_is_its_first_place_and_no_other_lanes() {
        let mut indexes = Indexes::default();
        let laned = |key: &str, lane: &str, place: u64| Filing {
            lane: Some((Arc::from(lane), place)),
            ..due(key, 1, 1)
        };
        indexes.refile("r", None, Some(&laned("r:2", "A", 7)));
        indexes.refile("r", None, Some(&laned("r:1", "A", 3)));
        indexes.refile("r", None, Some(&laned("r:3", "AB", 1)));
        assert_eq!(indexes.lane_head("r", "A"), Some(Arc::from("r:1")));
        assert_eq!(indexes.lane_head("r", "AB"), Some(Arc::from("r:3")));
        assert_eq!(indexes.lane_head("r", "B"), None);
        assert_eq!(indexes.lane_head("other", "A"), None);
        assert_eq!(indexes.lanes().len(), 2);
        let names: Vec<&Arc<str>> = indexes.routes["r"]
            .lanes
            .iter()
            .filter(|(lane, _, _)| &**lane == "A")
            .map(|(lane, _, _)| lane)
            .collect();
        assert!(Arc::ptr_eq(names[0], names[1]), "one copy of a lane's name");
    }
}

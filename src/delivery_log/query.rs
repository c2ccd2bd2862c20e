//! Reading the delivery log back: a [`Filter`] from a query string, pages newest first
//! with a cursor bound to their filter.
//!
//! A page reads at most about [`EXAMINED_MAX`] entries (each read of the store counts as
//! [`READ_BATCH`], whatever it found): one whose filter matches few of a large log, or
//! that meets a run of entries that do not read, ends early, with a cursor to go on from
//! (as Redis's key listing does).

use crate::cursor_mark;
use crate::store::log::{DeliveryLog, Fate, LogId, LoggedDelivery};
use crate::store::{Millis, StoreError, parse_rfc3339};

/// Entries one page shows at most, and without `limit`.
pub const LIMIT_MAX: usize = 500;
pub const LIMIT_DEFAULT: usize = 50;

/// Entries one page reads at most.
pub const EXAMINED_MAX: usize = 20_000;

/// Entries read from the store at a time.
const READ_BATCH: usize = 256;

/// A status, or a class of them (`5xx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatusMatch {
    Exactly(u16),
    Class(u16),
}

impl StatusMatch {
    fn parse(text: &str) -> Option<StatusMatch> {
        let bytes = text.as_bytes();
        match bytes {
            [class @ b'1'..=b'5', b'x' | b'X', b'x' | b'X'] => {
                Some(StatusMatch::Class(u16::from(class - b'0')))
            }
            [b'1'..=b'5', b'0'..=b'9', b'0'..=b'9'] => text.parse().ok().map(StatusMatch::Exactly),
            _ => None,
        }
    }

    fn admits(self, status: u16) -> bool {
        match self {
            StatusMatch::Exactly(wanted) => status == wanted,
            StatusMatch::Class(class) => status / 100 == class,
        }
    }
}

/// What an outcome filter names: a fate, or one of the marks beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutcomeTerm {
    Fate(Fate),
    Waited,
    Replayed,
}

/// Which entries a listing or a tail shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    route: Option<String>,
    key: Option<String>,
    key_prefix: Option<String>,
    outcomes: Vec<OutcomeTerm>,
    status: Option<StatusMatch>,
    upstream_status: Option<StatusMatch>,
    since: Option<Millis>,
    until: Option<Millis>,
    /// The query as written, less `limit` and `cursor`, which the cursor is bound to.
    canonical: String,
}

/// A listing's request: its filter, where it starts and how many it shows.
#[derive(Debug)]
pub struct Listing {
    pub filter: Filter,
    pub before: Option<LogId>,
    pub limit: usize,
}

impl Filter {
    /// The listing `query` asks for; a message naming what is wrong otherwise.
    pub fn parse(query: Option<&str>, paged: bool) -> Result<Listing, String> {
        let mut filter = Filter::default();
        let (mut limit, mut cursor) = (LIMIT_DEFAULT, None);
        let mut canonical: Vec<(String, String)> = Vec::new();
        for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            let value = value.into_owned();
            match &*name {
                "limit" if paged => {
                    limit = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=LIMIT_MAX).contains(n))
                        .ok_or_else(|| format!("limit must be a number from 1 to {LIMIT_MAX}"))?;
                    continue;
                }
                "cursor" if paged => {
                    cursor = Some(value);
                    continue;
                }
                "route" => filter.route = Some(value.clone()),
                "key" => filter.key = Some(value.clone()),
                "key_prefix" => filter.key_prefix = Some(value.clone()),
                "outcome" => filter.outcomes = outcomes(&value)?,
                "status" => filter.status = Some(status(&name, &value)?),
                "upstream_status" => filter.upstream_status = Some(status(&name, &value)?),
                "since" => filter.since = Some(parse_rfc3339(&name, &value)?),
                "until" => filter.until = Some(parse_rfc3339(&name, &value)?),
                other => return Err(format!("unknown query parameter `{other}`")),
            }
            canonical.push((name.into_owned(), value));
        }
        canonical.sort();
        filter.canonical = format!("{canonical:?}");
        let before = cursor
            .map(|cursor| filter.read_cursor(&cursor))
            .transpose()?;
        Ok(Listing {
            filter,
            before,
            limit,
        })
    }

    /// Whether `entry` is one the filter shows.
    pub fn admits(&self, entry: &LoggedDelivery) -> bool {
        let text_is = |wanted: &Option<String>, found: &Option<String>| {
            wanted.is_none() || wanted.as_deref() == found.as_deref()
        };
        text_is(&self.route, &entry.route)
            && text_is(&self.key, &entry.key)
            && self.key_prefix.as_ref().is_none_or(|prefix| {
                entry
                    .key
                    .as_ref()
                    .is_some_and(|key| key.starts_with(prefix.as_str()))
            })
            && (self.outcomes.is_empty()
                || self.outcomes.iter().any(|term| match term {
                    OutcomeTerm::Fate(fate) => entry.fate == *fate,
                    OutcomeTerm::Waited => entry.waited,
                    OutcomeTerm::Replayed => entry.replayed,
                }))
            && self.status.is_none_or(|wanted| wanted.admits(entry.status))
            && self.upstream_status.is_none_or(|wanted| {
                entry
                    .upstream_status
                    .is_some_and(|status| wanted.admits(status))
            })
            && self.since.is_none_or(|since| entry.at >= since)
            && self.until.is_none_or(|until| entry.at < until)
    }

    /// The cursor of a page that ended at `id`: the id and a mark of it and the filter,
    /// so that a cursor given with another filter (or made up) is refused rather than
    /// misread.
    fn cursor(&self, id: LogId) -> String {
        let id = id.to_string();
        format!(
            "{id}.{}",
            cursor_mark::mark(&["delivery log", &self.canonical, &id])
        )
    }

    fn read_cursor(&self, cursor: &str) -> Result<LogId, String> {
        let bad = || format!("`{cursor}` is not a cursor of the delivery log");
        let (id, mark) = cursor.rsplit_once('.').ok_or_else(bad)?;
        let parsed = id.parse::<LogId>().map_err(|_| bad())?;
        if !cursor_mark::is_mark_of(mark, &["delivery log", &self.canonical, id]) {
            return Err(format!(
                "the cursor `{cursor}` was made for another filter, or by no page: ask again with the filter of the page it came from"
            ));
        }
        Ok(parsed)
    }
}

fn outcomes(text: &str) -> Result<Vec<OutcomeTerm>, String> {
    text.split(',')
        .map(|term| match term {
            WAITED => Ok(OutcomeTerm::Waited),
            REPLAYED => Ok(OutcomeTerm::Replayed),
            _ => Fate::parse(term).map(OutcomeTerm::Fate).ok_or_else(|| {
                let names = OUTCOME_NAMES.join(", ");
                format!("outcome `{term}` is not one of {names}")
            }),
        })
        .collect()
}

fn status(name: &str, text: &str) -> Result<StatusMatch, String> {
    StatusMatch::parse(text)
        .ok_or_else(|| format!("{name} `{text}` is not a status (like 502) or a class (like 5xx)"))
}

/// The marks an `outcome` filter takes beside the fates.
const WAITED: &str = "waited";
const REPLAYED: &str = "replayed";

/// Every name an `outcome` filter takes: the fates, then the marks.
pub const OUTCOME_NAMES: [&str; Fate::ALL.len() + 2] = {
    let mut names = [""; Fate::ALL.len() + 2];
    let mut at = 0;
    while at < Fate::ALL.len() {
        names[at] = Fate::ALL[at].as_str();
        at += 1;
    }
    names[at] = WAITED;
    names[at + 1] = REPLAYED;
    names
};

/// One page of a listing, newest first, and the cursor of the next (none after the last).
pub struct Page {
    pub entries: Vec<(LogId, LoggedDelivery)>,
    pub next: Option<String>,
}

/// Reads the page `listing` asks for.
pub async fn page(log: &dyn DeliveryLog, listing: &Listing) -> Result<Page, StoreError> {
    let mut entries = Vec::new();
    let (mut before, mut examined) = (listing.before, 0);
    loop {
        let read = log.read(before, READ_BATCH).await?;
        // A read counts as its share whatever it found: one past entries that do not
        // read finds fewer.
        examined += READ_BATCH;
        for (id, entry) in read.entries {
            before = Some(id);
            if listing.filter.admits(&entry) {
                entries.push((id, entry));
                if entries.len() == listing.limit {
                    return Ok(Page {
                        entries,
                        next: before.map(|id| listing.filter.cursor(id)),
                    });
                }
            }
        }
        let Some(more_before) = read.more_before else {
            return Ok(Page {
                entries,
                next: None,
            });
        };
        before = Some(more_before);
        // A page that read its share: more may follow.
        if examined >= EXAMINED_MAX {
            return Ok(Page {
                entries,
                next: before.map(|id| listing.filter.cursor(id)),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Range;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A log of `count` entries with ids `n-0`, of which those in `unreadable` do not
    /// read; a read looks at `limit + 1` entries at most, as the shared stores' reads
    /// look at `limit + 1` batches.
    struct Numbered {
        count: u64,
        unreadable: Range<u64>,
        reads: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl DeliveryLog for Numbered {
        async fn append(&self, _: &[LoggedDelivery]) -> Result<Vec<LogId>, StoreError> {
            unreachable!("a listing writes nothing")
        }

        async fn read(
            &self,
            before: Option<LogId>,
            limit: usize,
        ) -> Result<crate::store::log::LogRead, StoreError> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            let (mut next, mut looked) = (before.map_or(self.count, |id| id.0), 0);
            let mut entries = Vec::new();
            while next > 0 && entries.len() < limit && looked <= limit {
                next -= 1;
                looked += 1;
                if !self.unreadable.contains(&next) {
                    let entry = LoggedDelivery::sample(&next.to_string(), next, 0);
                    entries.push((LogId(next, 0), entry));
                }
            }
            let more_before = (next > 0).then_some(LogId(next, 0));
            Ok(crate::store::log::LogRead {
                entries,
                more_before,
            })
        }

        async fn get(&self, _: LogId) -> Result<Option<LoggedDelivery>, StoreError> {
            Ok(None)
        }

        async fn trim(&self, _: Millis, _: u64) -> Result<u64, StoreError> {
            Ok(0)
        }
    }

    #[tokio::test]
    async fn a_page_reads_on_past_entries_that_do_not_read() {
        let log = Numbered {
            count: 5_000,
            unreadable: 4_000..5_000,
            reads: AtomicUsize::new(0),
        };
        let listing = Filter::parse(Some("limit=3"), true).unwrap();
        let found = page(&log, &listing).await.unwrap();
        let ids: Vec<_> = found.entries.iter().map(|(id, _)| id.0).collect();
        assert_eq!(ids, [3_999, 3_998, 3_997]);
        assert!(found.next.is_some());
    }

    #[tokio::test]
    async fn a_page_whose_filter_matches_nothing_reads_its_share_and_says_where_to_go_on() {
        let log = Numbered {
            count: 1_000_000,
            unreadable: 0..0,
            reads: AtomicUsize::new(0),
        };
        let listing = Filter::parse(Some("route=nowhere"), true).unwrap();
        let found = page(&log, &listing).await.unwrap();
        assert!(found.entries.is_empty());
        let reads = log.reads.load(Ordering::Relaxed);
        assert_eq!(reads, EXAMINED_MAX.div_ceil(READ_BATCH));
        let next = Filter::parse(
            Some(&format!("route=nowhere&cursor={}", found.next.unwrap())),
            true,
        )
        .unwrap();
        assert_eq!(
            next.before,
            Some(LogId(1_000_000 - (reads * READ_BATCH) as u64, 0))
        );
        // The end of the log: no cursor.
        let short = Numbered { count: 700, ..log };
        assert_eq!(page(&short, &listing).await.unwrap().next, None);
    }

    #[test]
    fn statuses_and_classes_read_and_nothing_else() {
        assert_eq!(StatusMatch::parse("502"), Some(StatusMatch::Exactly(502)));
        assert_eq!(StatusMatch::parse("5xx"), Some(StatusMatch::Class(5)));
        for bad in ["", "5", "50", "5000", "6xx", "099", "x5x", "+20", "٥٠٢"] {
            assert_eq!(StatusMatch::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_cursor_is_refused_with_another_filter_and_read_with_its_own() {
        let first = Filter::parse(Some("route=stripe&outcome=duplicate"), true).unwrap();
        let cursor = first.filter.cursor(LogId(7, 3));
        let same = Filter::parse(
            Some(&format!(
                "outcome=duplicate&route=stripe&cursor={cursor}&limit=5"
            )),
            true,
        )
        .unwrap();
        assert_eq!(same.before, Some(LogId(7, 3)));
        assert_eq!(same.limit, 5);
        let other = Filter::parse(Some(&format!("route=github&cursor={cursor}")), true);
        assert!(other.unwrap_err().contains("another filter"));
        for bad in ["x", "7-3", "7-3.zz", ".", "7.3.abc"] {
            let error =
                Filter::parse(Some(&format!("route=stripe&cursor={bad}")), true).unwrap_err();
            assert!(error.contains("cursor"), "{bad}: {error}");
        }
    }

    #[test]
    fn malformed_filters_are_named() {
        for (query, says) in [
            ("outcome=maybe", "outcome `maybe`"),
            ("status=abc", "status `abc`"),
            ("since=yesterday", "since `yesterday`"),
            ("limit=0", "limit"),
            ("limit=501", "limit"),
            ("colour=red", "`colour`"),
        ] {
            let error = Filter::parse(Some(query), true).unwrap_err();
            assert!(error.contains(says), "{query}: {error}");
        }
        assert!(
            Filter::parse(Some("limit=5"), false).is_err(),
            "a tail has no pages"
        );
    }
}

//! Listing a namespace's keys on sled (`GET /v1/keys`): the open keys (in flight, held)
//! from the map in memory and the done keys whose queued jobs keep their done records,
//! together in key order, then the done keys filed, from a walk of the records.
//!
//! A page's cursor says which part it ended in: `o.` and the hex of the last open key
//! listed, or `d.` and where the walk stopped (`d.` alone: from the first record).

use std::ops::ControlFlow;

use super::epochs::{Epochs, Position};
use crate::store::{KeyState, Millis, Page, StateFilter, StoreError, page};

/// Records one page's walk looks at, at most: about 10 ms of decoding, so a page of a
/// scope with few done keys in a large store ends early, with a cursor to go on from.
const EXAMINED_MAX: usize = 50_000;

/// Where a listing stands.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Cursor {
    /// Among the open keys and the queued jobs' done keys, after this one.
    Open(Option<String>),
    /// Among the done records, after this one.
    Done(Option<Position>),
}

impl Cursor {
    pub(super) fn encode(&self) -> String {
        match self {
            Cursor::Open(after) => format!("o.{}", hex::encode(after.as_deref().unwrap_or(""))),
            Cursor::Done(None) => "d.".to_owned(),
            Cursor::Done(Some(position)) => format!("d.{}", position.encode()),
        }
    }

    pub(super) fn decode(text: &str) -> Option<Cursor> {
        if let Some(key) = text.strip_prefix("o.") {
            let key = String::from_utf8(hex::decode(key).ok()?).ok()?;
            return Some(Cursor::Open((!key.is_empty()).then_some(key)));
        }
        match text.strip_prefix("d.")? {
            "" => Some(Cursor::Done(None)),
            position => Some(Cursor::Done(Some(Position::decode(position)?))),
        }
    }
}

/// Keys found for a page, each with its state.
pub(super) type Found = Vec<(String, KeyState)>;

pub(super) fn not_a_cursor(text: &str) -> StoreError {
    StoreError::BadRequest(format!("`{text}` is not a listing cursor"))
}

/// Up to `limit` of the `found` keys held in memory or done by their queued jobs (live,
/// each with its state), in `state` if given; the next page, if any, starts among them.
/// `cut`: the last key the look for queued ones reached, when it was cut short; the page
/// ends there, and the next goes on from it.
pub(super) fn open_keys(
    mut found: Found,
    state: Option<StateFilter>,
    limit: usize,
    cut: Option<String>,
) -> Page {
    found.retain(|(key, found)| {
        state.is_none_or(|state| state.admits(found)) && cut.as_ref().is_none_or(|cut| key <= cut)
    });
    found.sort_by(|a, b| a.0.cmp(&b.0));
    let mut page = page(found, limit);
    let next = page.next.take().or(cut);
    page.next = next.map(|last| Cursor::Open(Some(last)).encode());
    page
}

/// Up to `wanted` live done keys starting with `listed`, walking from `from`, and the
/// cursor to go on from (none once the walk is over).
pub(super) fn done_keys(
    epochs: &Epochs,
    now: Millis,
    listed: &str,
    from: Option<Position>,
    wanted: usize,
) -> sled::Result<(Found, Option<String>)> {
    if wanted == 0 {
        return Ok((Vec::new(), Some(Cursor::Done(from).encode())));
    }
    let mut found = Vec::new();
    let stopped = epochs.walk(now, from, EXAMINED_MAX, |name, record| {
        if name.starts_with(listed) {
            found.push((name.to_owned(), KeyState::Done(record)));
        }
        if found.len() == wanted {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    let next = stopped.map(|position| Cursor::Done(Some(position)).encode());
    Ok((found, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_written() {
        for cursor in [
            Cursor::Open(None),
            Cursor::Open(Some("stripe:evt.1:x".into())),
            Cursor::Done(None),
        ] {
            assert_eq!(Cursor::decode(&cursor.encode()), Some(cursor));
        }
        for bad in ["", "o", "o.zz", "d.1", "x.", "o.ff"] {
            assert_eq!(Cursor::decode(bad), None, "{bad}");
        }
    }
}

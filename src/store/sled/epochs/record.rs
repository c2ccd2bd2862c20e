//! A done record on disk: the salted hash that names it and its compact encoding.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::window::Window;
use crate::store::{DoneRecord, Fingerprint, Millis, RecordedResponse, StoreError};

/// A done record's key in its tree: the first 16 bytes of the SHA-256 of the store's
/// salt followed by the store key.
pub(in crate::store::sled) type RecordKey = [u8; RECORD_KEY_LEN];

pub(super) const RECORD_KEY_LEN: usize = 16;

/// Where a data directory keeps its salt, in sled's default tree.
const SALT_KEY: &[u8] = b"record-key-salt";

/// A record key under `salt`. The salt is random per data directory and never leaves it,
/// so a sender cannot choose keys that collide in a window's index (a table slowed on
/// purpose would slow every claim) or in a bucket of an earlier version's tree, or that
/// share a record key; the hash's output is never shown, so a salt prefix keys it as well as an
/// HMAC would.
pub(super) fn record_key(salt: &[u8], store_key: &str) -> RecordKey {
    let digest = Sha256::new()
        .chain_update(salt)
        .chain_update(store_key.as_bytes())
        .finalize();
    let mut key = [0; RECORD_KEY_LEN];
    key.copy_from_slice(&digest[..RECORD_KEY_LEN]);
    key
}

/// The data directory's salt, or a new one for a directory without trees. A directory
/// with trees but no salt was written by a development build before salts: its records
/// could not be found under a salt, so it is refused rather than read as empty (which
/// would run every done event again).
pub(super) fn salt(db: &sled::Db) -> Result<Vec<u8>, StoreError> {
    let failed = |error: sled::Error| StoreError::Backend(error.to_string());
    if let Some(salt) = db.get(SALT_KEY).map_err(failed)? {
        return Ok(salt.to_vec());
    }
    if db.tree_names().len() > 1 {
        return Err(StoreError::Backend(
            "it holds done records without a record-key salt, written by a development build before salts; move it aside to start with an empty store"
                .into(),
        ));
    }
    let salt: [u8; 16] = rand::random();
    db.insert(SALT_KEY, &salt).map_err(failed)?;
    db.flush().map_err(failed)?;
    Ok(salt.to_vec())
}

/// A done record as stored, its times as small differences, which take fewer bytes, and
/// last its store key (`name`), so that listing and clearing can tell whose it is. Records
/// of earlier versions end before the name: as `Stored<()>` (a unit takes no bytes) every
/// record reads, and an earlier version reads a named one, since postcard leaves the bytes
/// after the last field it knows unread.
#[derive(Serialize, Deserialize)]
struct Stored<Name> {
    /// `window.end - expires_at`, less than the window's width.
    expires_before_end: Millis,
    /// `expires_at - completed_at` (the retention), as [`compact_duration`] writes it.
    kept_for: u64,
    /// `completed_at - claimed_at`
    took: Millis,
    upstream_status: u16,
    fingerprint: Fingerprint,
    #[serde(with = "crate::store::recorded_response")]
    response: Option<RecordedResponse>,
    name: Name,
}

/// A duration in milliseconds, in whole seconds when it is (as retentions usually are):
/// `seconds << 1`, else `milliseconds << 1 | 1`.
fn compact_duration(ms: Millis) -> u64 {
    if ms.is_multiple_of(1000) {
        (ms / 1000) << 1
    } else {
        ms.saturating_mul(2) | 1
    }
}

fn full_duration(compact: u64) -> Millis {
    if compact & 1 == 0 {
        (compact >> 1).saturating_mul(1000)
    } else {
        compact >> 1
    }
}

pub(super) fn encode(record: &DoneRecord, window: Window, name: &str) -> Vec<u8> {
    let stored = Stored {
        expires_before_end: window.end.saturating_sub(record.expires_at),
        kept_for: compact_duration(record.expires_at.saturating_sub(record.completed_at)),
        took: record.completed_at.saturating_sub(record.claimed_at),
        upstream_status: record.upstream_status,
        fingerprint: record.fingerprint,
        response: record.response.clone(),
        name,
    };
    // Sized for a record without a replayed answer: one allocation instead of four.
    postcard::to_extend(&stored, Vec::with_capacity(64 + name.len()))
        .expect("a record always serializes")
}

/// Decodes a done record of `window`; an undecodable one is treated as absent (and
/// logged) rather than blocking its key forever, since refusing the key would lose the
/// event.
pub(super) fn decode(key: &[u8], bytes: &[u8], window: Window) -> Option<DoneRecord> {
    match postcard::from_bytes::<Stored<()>>(bytes) {
        Ok(stored) => Some(stored.record(window).0),
        Err(error) => {
            tracing::warn!(key = %hex::encode(key), %error, "unreadable done record, treating it as absent");
            None
        }
    }
}

/// Decodes a done record of `window` with its store key, which records written before
/// names were kept lack (`None`).
pub(super) fn decode_named(
    key: &[u8],
    bytes: &[u8],
    window: Window,
) -> Option<(DoneRecord, Option<String>)> {
    match postcard::from_bytes::<Stored<String>>(bytes) {
        Ok(stored) => {
            let (record, name) = stored.record(window);
            Some((record, Some(name)))
        }
        Err(_) => decode(key, bytes, window).map(|record| (record, None)),
    }
}

impl<Name> Stored<Name> {
    fn record(self, window: Window) -> (DoneRecord, Name) {
        let expires_at = window.end.saturating_sub(self.expires_before_end);
        let completed_at = expires_at.saturating_sub(full_duration(self.kept_for));
        let record = DoneRecord {
            claimed_at: completed_at.saturating_sub(self.took),
            completed_at,
            expires_at,
            upstream_status: self.upstream_status,
            fingerprint: self.fingerprint,
            response: self.response,
        };
        (record, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opens `path`, waiting for the previous handle's flusher thread, which lets go of
    /// the directory's lock a moment after the handle is dropped.
    fn open_when_free(path: &std::path::Path) -> sled::Db {
        for _ in 0..250 {
            match sled::open(path) {
                Err(error) if error.to_string().contains("could not acquire lock") => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                opened => return opened.unwrap(),
            }
        }
        panic!("{} stayed locked", path.display());
    }

    #[test]
    fn a_new_directory_gets_a_salt_of_its_own_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = salt(&open_when_free(dir.path())).unwrap();
        assert_eq!(first.len(), 16);
        assert_eq!(
            salt(&open_when_free(dir.path())).unwrap(),
            first,
            "kept across opens"
        );
        let other = tempfile::tempdir().unwrap();
        assert_ne!(salt(&sled::open(other.path()).unwrap()).unwrap(), first);
        assert_ne!(record_key(&first, "k"), record_key(b"", "k"));
    }

    #[test]
    fn a_directory_with_trees_but_no_salt_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::open(dir.path()).unwrap();
        db.open_tree("epoch.1024.2048.2").unwrap();
        let error = salt(&db).unwrap_err().to_string();
        assert!(error.contains("without a record-key salt"), "{error}");
        assert_eq!(db.get(SALT_KEY).unwrap(), None, "no salt is adopted");
    }

    #[test]
    fn records_read_back_as_written() {
        let record = DoneRecord {
            claimed_at: 1_800_000_000_000,
            completed_at: 1_800_000_000_250,
            expires_at: 1_800_604_800_250,
            upstream_status: 202,
            fingerprint: [9; 32],
            response: Some(RecordedResponse {
                status: 202,
                headers: vec![(
                    "content-type".into(),
                    bytes::Bytes::from_static(b"application/json"),
                )],
                body: bytes::Bytes::from_static(b"{}"),
            }),
        };
        let week = 7 * 86_400_000;
        let window = Window::holding(record.expires_at, week);
        let bytes = encode(&record, window, "stripe:evt_1");
        assert_eq!(decode(b"k", &bytes, window), Some(record.clone()));
        assert_eq!(
            decode_named(b"k", &bytes, window),
            Some((record.clone(), Some("stripe:evt_1".to_owned())))
        );
        let plain = DoneRecord {
            response: None,
            ..record.clone()
        };
        // 44 bytes for a record kept a week, where the record as it is would take 53, and
        // its name after them with its length first.
        assert_eq!(encode(&plain, window, "").len(), 45);
        assert_eq!(encode(&plain, window, "stripe:evt_1").len(), 45 + 12);
        assert_eq!(
            decode(b"k", b"\xff", window),
            None,
            "unreadable reads as absent"
        );
        // A retention that is not whole seconds, in a narrow window.
        let odd = DoneRecord {
            expires_at: record.completed_at + 1_500,
            ..record
        };
        let window = Window::holding(odd.expires_at, 1_500);
        assert_eq!(
            decode(b"k", &encode(&odd, window, "a:b"), window),
            Some(odd)
        );
    }

    #[test]
    fn records_without_a_name_still_read_and_read_as_unnamed() {
        let record = DoneRecord {
            claimed_at: 1_800_000_000_000,
            completed_at: 1_800_000_000_000,
            expires_at: 1_800_000_060_000,
            upstream_status: 200,
            fingerprint: [3; 32],
            response: None,
        };
        let window = Window::holding(record.expires_at, 60_000);
        // As versions before names wrote it: the same fields, nothing after the answer.
        let earlier = encode(&record, window, "");
        let earlier = &earlier[..earlier.len() - 1];
        assert_eq!(decode(b"k", earlier, window), Some(record.clone()));
        assert_eq!(decode_named(b"k", earlier, window), Some((record, None)));
    }
}

//! A queued job's record on disk: the job, its place in the queue, and the done record
//! its key gets once the job leaves the queue.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::index::{Filing, State};
use crate::store::queue::Job;
use crate::store::{DoneRecord, Millis, StoreError};

/// The most bytes postcard writes for a length (a varint of up to 2^28).
const LENGTH_BYTES: usize = 4;
/// Room for a record's fields besides its request's, as most are: the key, route and
/// lane, the times, counts, a few attempts, the done record.
const OTHER_FIELDS_BYTES: usize = 512;

/// A job as the tree `jobs_by_seq` keeps it, under its seq.
#[derive(Serialize, Deserialize)]
pub(super) struct Record {
    pub(super) due_at: Millis,
    pub(super) token: u64,
    pub(super) takes: u32,
    /// Its place in its lane (`job.lane`), if it has one.
    pub(super) lane_place: u64,
    pub(super) job: Job,
    /// The key's done record, kept here while the job is queued (the queue answers for
    /// the key), filed with the other done records as the job leaves. `None` in a record
    /// an earlier version wrote: it filed the done record at the acceptance.
    pub(super) done: Option<DoneRecord>,
}

/// A record as versions before the done record was kept in it wrote it.
#[derive(Deserialize)]
struct EarlierRecord {
    due_at: Millis,
    token: u64,
    takes: u32,
    lane_place: u64,
    job: Job,
}

impl Record {
    pub(super) fn encode(&self) -> Result<Vec<u8>, StoreError> {
        // Sized once for the request, its bytes with room for each length written before
        // them and for the other fields, rather than grown by doubling as it is written.
        let request = &self.job.request;
        let headers: usize = request
            .headers
            .iter()
            .map(|(name, value)| name.len() + value.len() + 2 * LENGTH_BYTES)
            .sum();
        let capacity = OTHER_FIELDS_BYTES + request.target.len() + headers + request.body.len();
        postcard::to_extend(self, Vec::with_capacity(capacity))
            .map_err(|error| StoreError::of("sled", error))
    }

    /// Reads a record, also one an earlier version wrote (it ends where the done record
    /// would begin, so it never reads as a record of this version).
    pub(super) fn read(bytes: &[u8]) -> Result<Record, StoreError> {
        postcard::from_bytes(bytes)
            .or_else(|error| {
                // Only a record that ends before its done record can be an earlier one.
                if error != postcard::Error::DeserializeUnexpectedEnd {
                    return Err(error);
                }
                postcard::from_bytes(bytes).map(|earlier: EarlierRecord| Record {
                    due_at: earlier.due_at,
                    token: earlier.token,
                    takes: earlier.takes,
                    lane_place: earlier.lane_place,
                    job: earlier.job,
                    done: None,
                })
            })
            .map_err(|error| StoreError::of("sled", format!("an unreadable queued job: {error}")))
    }

    /// The key's done record, while it is live at `now`.
    pub(super) fn live_done(&self, now: Millis) -> Option<&DoneRecord> {
        self.done.as_ref().filter(|done| done.expires_at > now)
    }

    /// Where the indexes file it, stored under `seq`.
    pub(super) fn filing(&self, seq: u64) -> Filing {
        let job = &self.job;
        let state = match job.dead {
            Some((since, _)) => State::Dead { since },
            None => State::Due {
                at: self.due_at,
                retrying: job.attempts_this_round() > 0,
            },
        };
        Filing {
            key: Arc::from(job.key.as_str()),
            seq,
            state,
            received_at: job.received_at,
            lane: job
                .lane
                .as_deref()
                .map(|lane| (Arc::from(lane), self.lane_place)),
            done_until: self.done.as_ref().map(|done| done.expires_at),
        }
    }
}

/// A stored record as the queue reads it at open: a job taken when the process stopped
/// is due now (its attempt was cut off); and whether it was taken. `None` for a record
/// that does not read, which is left alone.
pub(super) fn read_at_open(bytes: &[u8], now: Millis) -> Option<(Record, bool)> {
    let mut record = match Record::read(bytes) {
        Ok(record) => record,
        Err(error) => {
            tracing::error!(%error, "an unreadable queued job is left alone");
            return None;
        }
    };
    let taken = record.token != 0 && record.job.dead.is_none();
    if taken {
        record.token = 0;
        record.due_at = now;
    }
    Some((record, taken))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::queue::QueuedRequest;

    fn job() -> Job {
        Job::new(
            "ns:evt_1".into(),
            "payments".into(),
            1_800_000_000_000,
            QueuedRequest {
                method: "POST".into(),
                target: "/hook".into(),
                headers: vec![(
                    "content-type".into(),
                    bytes::Bytes::from_static(b"application/json"),
                )],
                body: bytes::Bytes::from_static(b"{\"id\":\"evt_1\"}"),
            },
        )
    }

    #[test]
    fn a_record_an_earlier_version_wrote_reads_without_a_done_record() {
        #[derive(Serialize)]
        struct Earlier<'a> {
            due_at: Millis,
            token: u64,
            takes: u32,
            lane_place: u64,
            job: &'a Job,
        }
        let job = job();
        let earlier = Earlier {
            due_at: 5,
            token: 7,
            takes: 2,
            lane_place: 0,
            job: &job,
        };
        let record = Record::read(&postcard::to_stdvec(&earlier).unwrap()).unwrap();
        assert_eq!((record.due_at, record.token, record.takes), (5, 7, 2));
        assert_eq!(record.job, job);
        assert!(record.done.is_none());

        let done = DoneRecord {
            claimed_at: 1,
            completed_at: 2,
            expires_at: 3,
            upstream_status: 2,
            fingerprint: [9; 32],
            response: None,
        };
        let current = Record {
            done: Some(done.clone()),
            ..record
        };
        let read = Record::read(&current.encode().unwrap()).unwrap();
        assert_eq!(read.done, Some(done));
        assert_eq!(read.live_done(2).map(|done| done.expires_at), Some(3));
        assert!(read.live_done(3).is_none(), "expired");
        assert!(Record::read(b"\x01").is_err());
    }
}

//! One worker's lane: its connections, and its claims and done marks, each sent many to
//! a statement (`batch.rs`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use deadpool_postgres::{Object, Pool};
use tokio_postgres::types::ToSql;

use super::batch::{Batched, Queue};
use super::connection::batch_query;
use super::record::{live_state, unsigned};
use super::statements::Statements;
use crate::store::{Fingerprint, KeyState, StoreError};

/// One worker's connections, and its queues of claims and of done marks, each sent in
/// batches (`batch.rs`).
pub(super) struct Lane {
    pub(super) pool: Pool,
    pub(super) claims: Queue<ClaimMany>,
    pub(super) finishes: Queue<FinishMany>,
}

impl Lane {
    /// Starts the lane's queues on the current runtime.
    pub(super) fn start(pool: Pool, statements: &Arc<Statements>, timeout: Duration) -> Lane {
        Lane {
            claims: Queue::start(
                pool.clone(),
                ClaimMany {
                    statements: Arc::clone(statements),
                    timeout,
                },
            ),
            finishes: Queue::start(
                pool.clone(),
                FinishMany {
                    statements: Arc::clone(statements),
                    timeout,
                },
            ),
            pool,
        }
    }
}

/// A claim waiting for its batch.
pub(super) struct ClaimRequest {
    pub(super) key: String,
    pub(super) owner: String,
    pub(super) lease_ms: i64,
    pub(super) fingerprint: Fingerprint,
}

/// What a claim in a batch found.
pub(super) enum Found {
    /// Claimed, at the database's `now`.
    Claimed {
        now: i64,
    },
    Live(KeyState),
    /// A live record stopped the insert but was gone, or not yet visible, when read.
    Vanished,
}

/// Claims a batch of keys, and reads the live record of each key it could not claim, in
/// one statement.
pub(super) struct ClaimMany {
    statements: Arc<Statements>,
    timeout: Duration,
}

#[async_trait]
impl Batched for ClaimMany {
    type Request = ClaimRequest;
    type Answer = Found;

    fn key(request: &ClaimRequest) -> &str {
        &request.key
    }

    /// A key claimed, or found live, by an earlier request of the batch is so for the
    /// repeats too.
    fn repeat(first: &ClaimRequest, answer: &Found) -> Option<Found> {
        match answer {
            Found::Claimed { now } => Some(Found::Live(KeyState::InFlight {
                claimed_at: unsigned(*now),
                lease_until: unsigned(now.saturating_add(first.lease_ms)),
                fingerprint: first.fingerprint,
            })),
            Found::Live(state) => Some(Found::Live(state.clone())),
            Found::Vanished => None,
        }
    }

    async fn run(
        &self,
        client: &Object,
        requests: Vec<&ClaimRequest>,
    ) -> Result<Vec<Found>, StoreError> {
        let keys: Vec<&str> = requests.iter().map(|r| r.key.as_str()).collect();
        let owners: Vec<&str> = requests.iter().map(|r| r.owner.as_str()).collect();
        let leases: Vec<i64> = requests.iter().map(|r| r.lease_ms).collect();
        let hashes: Vec<&[u8]> = requests.iter().map(|r| r.fingerprint.as_slice()).collect();
        let params: [&(dyn ToSql + Sync); 4] = [&keys, &owners, &leases, &hashes];
        let rows = batch_query(client, &self.statements.claim_many, &params, self.timeout).await?;
        Ok(rows
            .iter()
            .map(|row| {
                if row.get("claimed") {
                    Found::Claimed {
                        now: row.get("now"),
                    }
                } else {
                    live_state(row).map_or(Found::Vanished, Found::Live)
                }
            })
            .collect())
    }

    /// Claims made, or perhaps made, for callers that will not use them are given back at
    /// once, in one statement (a release matches the owner, so one never written releases
    /// nothing): left, each would turn the provider's retries away as in flight until its
    /// lease ended.
    async fn unanswered(&self, client: &Object, requests: Vec<(ClaimRequest, Option<Found>)>) {
        let (keys, owners): (Vec<&str>, Vec<&str>) = requests
            .iter()
            .filter(|(_, answer)| matches!(answer, None | Some(Found::Claimed { .. })))
            .map(|(request, _)| (request.key.as_str(), request.owner.as_str()))
            .unzip();
        if keys.is_empty() {
            return;
        }
        let params: [&(dyn ToSql + Sync); 2] = [&keys, &owners];
        if let Err(error) =
            batch_query(client, &self.statements.release_many, &params, self.timeout).await
        {
            tracing::warn!(%error, claims = keys.len(), "giving back claims whose callers were gone failed; they end with their lease");
        }
    }
}

/// A done mark waiting for its batch.
pub(super) struct FinishRequest {
    pub(super) key: String,
    pub(super) owner: String,
    pub(super) retention_ms: i64,
    pub(super) upstream_status: i32,
    pub(super) response_status: Option<i32>,
    pub(super) content_type: Option<String>,
    pub(super) body: Option<Bytes>,
    pub(super) headers: Option<Vec<u8>>,
    pub(super) announce: bool,
}

/// Marks a batch of owned keys done in one statement; answers whether each was still its
/// owner's.
pub(super) struct FinishMany {
    statements: Arc<Statements>,
    timeout: Duration,
}

#[async_trait]
impl Batched for FinishMany {
    type Request = FinishRequest;
    type Answer = bool;

    fn key(request: &FinishRequest) -> &str {
        &request.key
    }

    /// Another owner's done mark for the same key needs its own statement.
    fn repeat(_: &FinishRequest, _: &bool) -> Option<bool> {
        None
    }

    async fn run(
        &self,
        client: &Object,
        requests: Vec<&FinishRequest>,
    ) -> Result<Vec<bool>, StoreError> {
        let keys: Vec<&str> = requests.iter().map(|r| r.key.as_str()).collect();
        let owners: Vec<&str> = requests.iter().map(|r| r.owner.as_str()).collect();
        let retentions: Vec<i64> = requests.iter().map(|r| r.retention_ms).collect();
        let statuses: Vec<i32> = requests.iter().map(|r| r.upstream_status).collect();
        let response_statuses: Vec<Option<i32>> =
            requests.iter().map(|r| r.response_status).collect();
        let content_types: Vec<Option<&str>> =
            requests.iter().map(|r| r.content_type.as_deref()).collect();
        let bodies: Vec<Option<&[u8]>> = requests.iter().map(|r| r.body.as_deref()).collect();
        let announce: Vec<bool> = requests.iter().map(|r| r.announce).collect();
        let headers: Vec<Option<&[u8]>> = requests.iter().map(|r| r.headers.as_deref()).collect();
        let params: [&(dyn ToSql + Sync); 9] = [
            &keys,
            &owners,
            &retentions,
            &statuses,
            &response_statuses,
            &content_types,
            &bodies,
            &announce,
            &headers,
        ];
        let rows = batch_query(client, &self.statements.finish_many, &params, self.timeout).await?;
        // One request per key in a batch, so the key says which were finished.
        let finished: HashSet<String> = rows.iter().map(|row| row.get(0)).collect();
        Ok(keys.iter().map(|key| finished.contains(*key)).collect())
    }
}

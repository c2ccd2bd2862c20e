//! Group commit toward PostgreSQL: the claims (and, apart, the done marks) that one
//! worker's deliveries make while the previous statements are on their way travel
//! together in the next one, one round trip and one commit for all of them.
//!
//! A queue takes jobs on a bounded channel. Its task waits for a first job, then for a
//! free connection of the worker's pool, then takes every job that arrived meanwhile (up
//! to [`MAX_BATCH`]) and runs them on that connection in a task of their own, so that the
//! pool bounds the statements in flight. With a free connection waiting, a lone job goes
//! at once: batching costs no latency when there is nothing to batch. (`tokio`'s
//! `recv_many` and deadpool do the queueing and pooling; what is left is the order below.)

use std::sync::Arc;

use async_trait::async_trait;
use deadpool_postgres::{Object, Pool};
use tokio::sync::{mpsc, oneshot};

use crate::store::StoreError;

/// The most jobs one statement carries.
pub const MAX_BATCH: usize = 64;

/// Jobs waiting for a statement, per queue; a caller beyond it waits for room.
const QUEUE_ROOM: usize = 1024;

/// A request and where its answer goes.
pub struct Job<Request, Answer> {
    pub request: Request,
    pub reply: oneshot::Sender<Result<Answer, StoreError>>,
}

/// A statement that carries a batch of requests. One statement never carries two
/// requests for one key (PostgreSQL refuses to change a row twice in one `INSERT ... ON
/// CONFLICT`), and its requests are in key order, so that two statements that share keys
/// lock them in the same order and cannot deadlock.
#[async_trait]
pub trait Batched: Send + Sync + 'static {
    type Request: Send + 'static;
    type Answer: Send + 'static;

    /// The key a request changes.
    fn key(request: &Self::Request) -> &str;

    /// Runs `requests` in one statement on `client`, answering each, in order.
    async fn run(
        &self,
        client: &Object,
        requests: Vec<&Self::Request>,
    ) -> Result<Vec<Self::Answer>, StoreError>;
}

/// A queue of requests, run in batches by a [`Batched`] statement on connections of one
/// pool.
pub struct Queue<Statement: Batched> {
    jobs: mpsc::Sender<Job<Statement::Request, Statement::Answer>>,
}

impl<Statement: Batched> Queue<Statement> {
    /// Starts the queue's task on the current runtime.
    pub fn start(pool: Pool, statement: Statement) -> Queue<Statement> {
        let statement = Arc::new(statement);
        let (jobs, mut waiting) = mpsc::channel(QUEUE_ROOM);
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(MAX_BATCH);
            while waiting.recv_many(&mut batch, MAX_BATCH).await > 0 {
                let connection = pool.get().await;
                // What arrived while waiting for the connection goes too.
                while batch.len() < MAX_BATCH {
                    match waiting.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
                let jobs = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
                match connection {
                    Ok(connection) => {
                        tokio::spawn(run_rounds(Arc::clone(&statement), connection, jobs));
                    }
                    Err(error) => fail(jobs, &StoreError::from(error)),
                }
            }
        });
        Queue { jobs }
    }

    /// Queues `request` and waits for its answer.
    pub async fn call(&self, request: Statement::Request) -> Result<Statement::Answer, StoreError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || StoreError::of("postgres", "the statement queue has stopped");
        self.jobs
            .send(Job { request, reply })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Runs `jobs` on `connection` in rounds of distinct keys, each round one statement.
async fn run_rounds<Statement: Batched>(
    statement: Arc<Statement>,
    connection: Object,
    mut jobs: Vec<Job<Statement::Request, Statement::Answer>>,
) {
    jobs.sort_by(|a, b| Statement::key(&a.request).cmp(Statement::key(&b.request)));
    while !jobs.is_empty() {
        // Sorted, so a key's repeats are neighbours: the first goes now, the others later.
        let (mut round, mut later) = (Vec::with_capacity(jobs.len()), Vec::new());
        for job in jobs {
            let repeat = round.last().is_some_and(|last: &Job<_, _>| {
                Statement::key(&last.request) == Statement::key(&job.request)
            });
            if repeat {
                later.push(job)
            } else {
                round.push(job)
            }
        }
        jobs = later;
        let requests = round.iter().map(|job| &job.request).collect();
        match statement.run(&connection, requests).await {
            Ok(answers) if answers.len() == round.len() => {
                for (job, answer) in round.into_iter().zip(answers) {
                    let _ = job.reply.send(Ok(answer));
                }
            }
            Ok(_) => fail(
                round,
                &StoreError::of("postgres", "a batch answered the wrong number of rows"),
            ),
            Err(error) => fail(round, &error),
        }
    }
}

fn fail<Request, Answer>(jobs: Vec<Job<Request, Answer>>, error: &StoreError) {
    for job in jobs {
        let _ = job.reply.send(Err(error.clone()));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use deadpool_postgres::{PoolConfig, Runtime};
    use parking_lot::Mutex;
    use tokio_postgres::NoTls;

    use super::*;

    /// A statement that runs `SELECT 1` for each round, records the round's keys and
    /// answers each key's length; a round holding the key `fail` fails.
    struct Recorded(Arc<Mutex<Vec<Vec<String>>>>);

    #[async_trait]
    impl Batched for Recorded {
        type Request = String;
        type Answer = usize;

        fn key(request: &String) -> &str {
            request
        }

        async fn run(
            &self,
            client: &Object,
            requests: Vec<&String>,
        ) -> Result<Vec<usize>, StoreError> {
            client.simple_query("SELECT 1").await?;
            self.0
                .lock()
                .push(requests.iter().map(|r| (*r).clone()).collect());
            if requests.iter().any(|r| *r == "fail") {
                return Err(StoreError::of("postgres", "failed on purpose"));
            }
            Ok(requests.iter().map(|r| r.len()).collect())
        }
    }

    /// A pool of one connection to the test database, held by the caller, or `None` when
    /// there is no database outside CI.
    async fn held_pool() -> Option<(Pool, Object)> {
        let mut config = deadpool_postgres::Config::new();
        config.url = Some("postgres://postgres@127.0.0.1:5432/test".into());
        config.pool = Some(PoolConfig::new(1));
        let pool = config.create_pool(Some(Runtime::Tokio1), NoTls).unwrap();
        match pool.get().await {
            Ok(held) => Some((pool, held)),
            Err(error) if std::env::var("CI").is_ok_and(|ci| ci == "true") => {
                panic!("PostgreSQL must be running in CI: {error}")
            }
            Err(error) => {
                eprintln!("skipped: PostgreSQL is not reachable ({error})");
                None
            }
        }
    }

    /// Queues `keys` at once while the pool's only connection is held, then lets it go.
    async fn while_held(
        keys: &[&str],
    ) -> Option<(Vec<Result<usize, StoreError>>, Vec<Vec<String>>)> {
        let (pool, held) = held_pool().await?;
        let rounds = Arc::new(Mutex::new(Vec::new()));
        let queue = Arc::new(Queue::start(pool, Recorded(Arc::clone(&rounds))));
        let calls: Vec<_> = keys
            .iter()
            .map(|key| {
                let (queue, key) = (Arc::clone(&queue), (*key).to_owned());
                tokio::spawn(async move { queue.call(key).await })
            })
            .collect();
        // Every call is queued, and the first waits for the connection, before it is free.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            rounds.lock().is_empty(),
            "nothing ran while the connection was held"
        );
        drop(held);
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.unwrap());
        }
        let rounds = rounds.lock().clone();
        Some((answers, rounds))
    }

    #[tokio::test]
    async fn waiting_requests_share_one_statement_in_key_order_with_repeats_apart() {
        let keys = ["k3", "k1", "k22", "k1", "k0", "k1"];
        let Some((answers, rounds)) = while_held(&keys).await else {
            return;
        };
        let answers: Vec<usize> = answers.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            answers,
            [2, 2, 3, 2, 2, 2],
            "each caller gets its own answer"
        );
        assert_eq!(
            rounds,
            [vec!["k0", "k1", "k22", "k3"], vec!["k1"], vec!["k1"]],
            "one statement for the distinct keys, sorted; each repeat in a later one"
        );
    }

    #[tokio::test]
    async fn a_failed_statement_fails_its_own_requests_only() {
        let Some((answers, rounds)) = while_held(&["a", "fail", "a"]).await else {
            return;
        };
        assert_eq!(rounds, [vec!["a", "fail"], vec!["a"]]);
        assert!(
            matches!(&answers[0], Err(StoreError::Backend(text)) if text.contains("failed on purpose"))
        );
        assert!(matches!(&answers[1], Err(StoreError::Backend(_))));
        assert_eq!(answers[2].as_ref().ok(), Some(&1), "the later round ran");
    }
}

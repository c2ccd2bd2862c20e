//! Group commit toward PostgreSQL: the claims (and, apart, the done marks) that one
//! worker's deliveries make while the previous statements are on their way travel
//! together in the next one, one round trip and one commit for all of them.
//!
//! A queue takes jobs on a bounded channel. Its task waits for a first job, then for a
//! free connection of the worker's pool, then takes every job that arrived meanwhile (up
//! to [`MAX_BATCH`]) and runs them on that connection in a task of their own, so that the
//! pool bounds the statements in flight. With a free connection waiting, a lone job goes
//! at once: batching costs no latency when there is nothing to batch. `tokio`'s
//! `recv_many` and deadpool do the queueing and pooling; this module adds the order: keys
//! sorted, and one request per key in a statement.

use std::sync::Arc;

use async_trait::async_trait;
use deadpool_postgres::{Object, Pool};
use tokio::sync::{mpsc, oneshot};

use crate::store::StoreError;

/// The most jobs one statement carries.
const MAX_BATCH: usize = 64;

/// Jobs waiting for a statement, per queue; a caller beyond it waits for room.
const QUEUE_CAPACITY: usize = 1024;

/// A request and where its answer goes.
struct Job<Request, Answer> {
    request: Request,
    reply: oneshot::Sender<Result<Answer, StoreError>>,
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

    /// The answer for a later request of a key that `first` was answered for in the same
    /// batch, when that answer settles it; `None` sends it in a statement of its own.
    fn repeat(first: &Self::Request, answer: &Self::Answer) -> Option<Self::Answer>;

    /// Runs `requests` in one statement on `client`, answering each, in order.
    async fn run(
        &self,
        client: &Object,
        requests: Vec<&Self::Request>,
    ) -> Result<Vec<Self::Answer>, StoreError>;

    /// Told of the requests whose callers will not act on what the statement did for them:
    /// each with its answer when its caller was gone as it came (it gave up waiting, its
    /// sender hung up), or with none when the statement failed (its timeout passed; it may
    /// still commit). Runs after the round's callers are answered, before the next round.
    async fn unanswered(
        &self,
        _client: &Object,
        _requests: Vec<(Self::Request, Option<Self::Answer>)>,
    ) {
    }
}

/// A queue of requests, run in batches by a [`Batched`] statement on connections of one
/// pool.
pub(crate) struct Queue<B: Batched> {
    jobs: mpsc::Sender<Job<B::Request, B::Answer>>,
}

impl<B: Batched> Queue<B> {
    /// Starts the queue's task on the current runtime.
    pub fn start(pool: Pool, statement: B) -> Queue<B> {
        let statement = Arc::new(statement);
        let (jobs, mut waiting) = mpsc::channel(QUEUE_CAPACITY);
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
    pub(crate) async fn call(&self, request: B::Request) -> Result<B::Answer, StoreError> {
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
async fn run_rounds<B: Batched>(
    statement: Arc<B>,
    connection: Object,
    mut jobs: Vec<Job<B::Request, B::Answer>>,
) {
    jobs.sort_by(|a, b| B::key(&a.request).cmp(B::key(&b.request)));
    while !jobs.is_empty() {
        // A caller that gave up (its timeout, its sender gone) gets no claim it cannot use.
        jobs.retain(|job| !job.reply.is_closed());
        // Sorted, so a key's repeats are neighbours: the first goes now, the others later.
        let (mut round, mut later) = (Vec::with_capacity(jobs.len()), Vec::new());
        for job in jobs {
            let repeat = round
                .last()
                .is_some_and(|last: &Job<_, _>| B::key(&last.request) == B::key(&job.request));
            if repeat {
                later.push(job)
            } else {
                round.push(job)
            }
        }
        let requests = round.iter().map(|job| &job.request).collect();
        let mut unanswered = Vec::new();
        jobs = match statement.run(&connection, requests).await {
            Ok(answers) if answers.len() == round.len() => {
                let later = settle_repeats::<B>(&round, &answers, later);
                for (Job { request, reply }, answer) in round.into_iter().zip(answers) {
                    if let Err(Ok(answer)) = reply.send(Ok(answer)) {
                        unanswered.push((request, Some(answer)));
                    }
                }
                later
            }
            Ok(_) => {
                fail(
                    round,
                    &StoreError::of("postgres", "a batch answered the wrong number of rows"),
                );
                later
            }
            Err(error) => {
                let error = &error;
                for Job { request, reply } in round {
                    let _ = reply.send(Err(error.clone()));
                    unanswered.push((request, None));
                }
                later
            }
        };
        if !unanswered.is_empty() {
            statement.unanswered(&connection, unanswered).await;
        }
    }
}

/// Answers the repeats that their key's answer in `round` settles (a flood of one event
/// ID costs one statement, not one each); returns the others, for a later round.
fn settle_repeats<B: Batched>(
    round: &[Job<B::Request, B::Answer>],
    answers: &[B::Answer],
    repeats: Vec<Job<B::Request, B::Answer>>,
) -> Vec<Job<B::Request, B::Answer>> {
    let mut unsettled = Vec::new();
    let mut first = 0;
    for job in repeats {
        // Both sorted by key: walk `round` forward to the repeat's key.
        while first < round.len() && B::key(&round[first].request) < B::key(&job.request) {
            first += 1;
        }
        // Not from an answer its caller is gone for: that may be undone before the next round.
        let settled = round
            .get(first)
            .filter(|earlier| B::key(&earlier.request) == B::key(&job.request))
            .filter(|earlier| !earlier.reply.is_closed())
            .and_then(|earlier| B::repeat(&earlier.request, &answers[first]));
        match settled {
            Some(answer) => {
                let _ = job.reply.send(Ok(answer));
            }
            None => unsettled.push(job),
        }
    }
    unsettled
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
    /// answers each key's length; a round holding the key `fail` fails. A repeat of a key
    /// that starts with `same` is settled by its first answer, plus 1000.
    struct Recorded(Arc<Mutex<Vec<Vec<String>>>>);

    #[async_trait]
    impl Batched for Recorded {
        type Request = String;
        type Answer = usize;

        fn key(request: &String) -> &str {
            request
        }

        fn repeat(first: &String, answer: &usize) -> Option<usize> {
            first.starts_with("same").then_some(answer + 1000)
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

    /// Queues `keys` at once while the pool's only connection is held, then lets it go;
    /// the callers of the keys in `abandoned` give up before that (their answer: `None`).
    async fn while_held(
        keys: &[&str],
        abandoned: &[&str],
    ) -> Option<(Vec<Option<Result<usize, StoreError>>>, Vec<Vec<String>>)> {
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
        // The test's runtime has one thread: every call task, queued before this one's
        // timer, sends its request, and the queue task takes them and waits for the
        // connection, before the sleep ends, however loaded the machine.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            rounds.lock().is_empty(),
            "nothing ran while the connection was held"
        );
        for (key, call) in keys.iter().zip(&calls) {
            if abandoned.contains(key) {
                call.abort();
            }
        }
        tokio::task::yield_now().await;
        drop(held);
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.ok());
        }
        let rounds = rounds.lock().clone();
        Some((answers, rounds))
    }

    #[tokio::test]
    async fn waiting_requests_share_one_statement_in_key_order_with_repeats_apart() {
        let keys = ["k3", "k1", "k22", "k1", "k0", "k1"];
        let Some((answers, rounds)) = while_held(&keys, &[]).await else {
            return;
        };
        let answers: Vec<usize> = answers.into_iter().map(|a| a.unwrap().unwrap()).collect();
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
        let Some((answers, rounds)) = while_held(&["a", "fail", "a"], &[]).await else {
            return;
        };
        assert_eq!(rounds, [vec!["a", "fail"], vec!["a"]]);
        assert!(
            matches!(&answers[0], Some(Err(StoreError::Backend(text))) if text.contains("failed on purpose"))
        );
        assert!(matches!(&answers[1], Some(Err(StoreError::Backend(_)))));
        assert!(
            matches!(&answers[2], Some(Ok(1))),
            "the later round ran: {:?}",
            answers[2]
        );
    }

    #[tokio::test]
    async fn repeats_that_the_first_answer_settles_take_no_statement() {
        let keys = ["same1", "b", "same1", "same1"];
        let Some((answers, rounds)) = while_held(&keys, &[]).await else {
            return;
        };
        assert_eq!(rounds, [vec!["b", "same1"]], "one statement for all");
        let answers: Vec<usize> = answers.into_iter().map(|a| a.unwrap().unwrap()).collect();
        assert_eq!(answers, [5, 1, 1005, 1005]);
    }

    #[tokio::test]
    async fn a_request_whose_caller_gave_up_is_not_run() {
        let Some((answers, rounds)) = while_held(&["kept", "gone"], &["gone"]).await else {
            return;
        };
        assert_eq!(rounds, [vec!["kept"]]);
        assert!(matches!(answers[0], Some(Ok(4))));
        assert!(answers[1].is_none());
    }
}

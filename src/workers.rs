//! The threads that run connections: one single-threaded tokio runtime per core, each
//! given its share of the accepted connections. A delivery's tasks (the sender's
//! connection, the forward, the upstream connection) then wake one another on one thread,
//! with no work stealing and no cross-thread wake-ups, as nginx's workers do: on tokio's
//! multi-threaded runtime the same deliveries cost more CPU (`docs/performance.md`).

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::task::JoinError;
use tokio_util::sync::CancellationToken;

thread_local! {
    /// Which worker this thread is, if it is one.
    static INDEX: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The index of the worker running the caller, or `None` outside the workers.
pub fn current() -> Option<usize> {
    INDEX.with(Cell::get)
}

/// The number of workers a server starts with unless `--workers` says otherwise: one per
/// core this process may use (`available_parallelism` reads cgroup CPU quotas, so a
/// Kubernetes CPU limit counts; a pod without one gets a worker per core of the node).
pub(crate) fn default_count() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// One `T` for each worker and one for callers outside the workers: a connection (or a
/// pool of them) whose task runs on the worker that opened it, so that using it never
/// wakes another thread.
pub(crate) struct PerWorker<T> {
    outside: T,
    each: Vec<T>,
}

impl<T> PerWorker<T> {
    /// `each[i]` serves worker `i`; `outside` serves every other thread, and a worker
    /// beyond `each`.
    pub fn new(outside: T, each: Vec<T>) -> PerWorker<T> {
        PerWorker { outside, each }
    }

    /// The `T` of the calling thread.
    pub fn get(&self) -> &T {
        current()
            .and_then(|index| self.each.get(index))
            .unwrap_or(&self.outside)
    }
}

/// A set of worker threads; dropping it stops them, with whatever tasks they still run.
pub struct Workers {
    handles: Vec<Handle>,
    next: AtomicUsize,
    stop: CancellationToken,
}

impl Workers {
    /// Starts `count` workers (at least one).
    pub fn start(count: usize) -> std::io::Result<Workers> {
        Workers::start_threads(count.max(1), |index| format!("dedupe-worker-{index}"), true)
    }

    /// One thread apart from the workers, named `name`: what runs there never waits behind
    /// the workers' tasks (the admin port's health probes), and uses the connections kept
    /// for callers outside the workers ([`PerWorker`]).
    pub(crate) fn start_apart(name: &str) -> std::io::Result<Workers> {
        Workers::start_threads(1, |_| name.to_owned(), false)
    }

    fn start_threads(
        count: usize,
        name: impl Fn(usize) -> String,
        indexed: bool,
    ) -> std::io::Result<Workers> {
        // Built before the threads, so that a failure part way stops those started.
        let mut workers = Workers {
            handles: Vec::new(),
            next: AtomicUsize::new(0),
            stop: CancellationToken::new(),
        };
        for index in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            workers.handles.push(runtime.handle().clone());
            let stopped = workers.stop.clone();
            std::thread::Builder::new()
                .name(name(index))
                .spawn(move || {
                    if indexed {
                        INDEX.with(|cell| cell.set(Some(index)));
                    }
                    runtime.block_on(stopped.cancelled());
                })?;
        }
        Ok(workers)
    }

    pub fn count(&self) -> usize {
        self.handles.len()
    }

    /// Runs `future` on worker `index` and hands back its output: how a store opens a
    /// connection that its worker will drive.
    pub async fn run_on<F>(&self, index: usize, future: F) -> Result<F::Output, JoinError>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handles[index % self.handles.len()].spawn(future).await
    }

    /// Runs `future` on the next worker in turn.
    pub fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        self.handles[turn].spawn(future);
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn futures_run_on_the_workers_in_turn() {
        let workers = Workers::start(2).unwrap();
        let (ran, seen) = mpsc::channel();
        for _ in 0..4 {
            let ran = ran.clone();
            workers.spawn(async move {
                let name = std::thread::current().name().map(str::to_owned);
                ran.send((current(), name)).unwrap();
            });
        }
        let mut seen: Vec<_> = (0..4)
            .map(|_| seen.recv_timeout(Duration::from_secs(5)).unwrap())
            .collect();
        seen.sort();
        let worker = |index: usize| (Some(index), Some(format!("dedupe-worker-{index}")));
        assert_eq!(seen, [worker(0), worker(0), worker(1), worker(1)]);
        assert_eq!(current(), None, "the caller is not a worker");
    }

    #[tokio::test]
    async fn each_worker_gets_its_own_and_other_threads_the_outside_one() {
        let workers = Workers::start(3).unwrap();
        let values = std::sync::Arc::new(PerWorker::new("outside", vec!["w0", "w1"]));
        assert_eq!(*values.get(), "outside");
        let mut seen = Vec::new();
        for index in 0..3 {
            let values = std::sync::Arc::clone(&values);
            seen.push(
                workers
                    .run_on(index, async move { *values.get() })
                    .await
                    .unwrap(),
            );
        }
        assert_eq!(
            seen,
            ["w0", "w1", "outside"],
            "a worker beyond the list uses the outside one"
        );
    }

    #[test]
    fn dropping_the_workers_stops_them_and_their_tasks() {
        let workers = Workers::start(1).unwrap();
        let (held, released) = mpsc::channel::<()>();
        workers.spawn(async move {
            let _held = held;
            std::future::pending::<()>().await;
        });
        assert_eq!(
            released.recv_timeout(Duration::from_millis(200)),
            Err(mpsc::RecvTimeoutError::Timeout),
            "the task runs while the workers live"
        );
        drop(workers);
        assert_eq!(
            released.recv_timeout(Duration::from_secs(5)),
            Err(mpsc::RecvTimeoutError::Disconnected),
            "the task was dropped with its worker"
        );
    }
}

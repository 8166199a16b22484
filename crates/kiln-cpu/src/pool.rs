//! A persistent thread pool that runs the chunks of one launch on several cores.
//!
//! [`Pool::run`] runs `f(0) .. f(n-1)` and returns when all have finished. The calling thread
//! takes part: chunks are claimed from an atomic counter by the caller and by any idle worker,
//! so a busy pool never blocks a launch (the caller then simply runs every chunk itself), and
//! launches from several threads at once proceed independently.
//!
//! Workers start at the first launch with chunks to share (a process whose launches are all
//! small starts none), spin for up to a millisecond after their last chunk (a launch that
//! follows soon finds them awake) and then sleep on a condition variable.

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

/// Environment variable overriding the number of threads of the process-wide pool.
pub const THREADS_ENV: &str = "KILN_CPU_THREADS";

/// How long an idle worker spins before it sleeps, and a caller waiting for the last chunks
/// before it parks. A model's kernels follow each other within microseconds, but a kernel that
/// runs on the caller alone (a small elementwise one) can take a few hundred: with 50 µs, the
/// worker slept through it, and the next launch's second chunk waited on its wake-up (on a
/// virtual machine about as long as the chunk, so the caller ran both: some of Inception v2's
/// tiled kernels ran at half speed, at the same call sites every run).
const SPIN: Duration = Duration::from_millis(1);

/// The chunk function with its lifetime erased (see the SAFETY note in [`Pool::run`]).
type ChunkFn = dyn Fn(usize) + Sync;

struct Job {
    f: *const ChunkFn,
    chunks: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    caller: Thread,
}

// SAFETY: `f` points at a `Sync` closure that outlives every use (Pool::run waits for all
// chunks before returning); the other fields are Send + Sync.
unsafe impl Send for Job {}
// SAFETY: as above; `f` is only called through a shared reference.
unsafe impl Sync for Job {}

impl Job {
    fn exhausted(&self) -> bool {
        self.next.load(Ordering::Acquire) >= self.chunks
    }

    /// Claims and runs chunks until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            if i >= self.chunks {
                return;
            }
            // SAFETY: chunk `i` was claimed, so `done` < `chunks` until we count it below,
            // and `Pool::run` keeps the closure alive until `done == chunks`.
            let f = unsafe { &*self.f };
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(i))) {
                lock(&self.panic).get_or_insert(payload);
            }
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.chunks {
                self.caller.unpark();
            }
        }
    }
}

struct State {
    queue: VecDeque<Arc<Job>>,
    sleepers: usize,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Mirrors `state.queue.len()` so spinning workers can look without the lock.
    queued: AtomicUsize,
    shutdown: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// The first job with unclaimed chunks, dropping exhausted ones from the front.
    fn front(&self, st: &mut State) -> Option<Arc<Job>> {
        while st.queue.front().is_some_and(|j| j.exhausted()) {
            st.queue.pop_front();
        }
        self.queued.store(st.queue.len(), Ordering::Release);
        st.queue.front().cloned()
    }

    fn next_job(&self) -> Option<Arc<Job>> {
        let start = Instant::now();
        let mut spins = 0u32;
        while !self.shutdown.load(Ordering::Acquire) {
            if self.queued.load(Ordering::Acquire) > 0
                && let Some(job) = self.front(&mut lock(&self.state))
            {
                return Some(job);
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && start.elapsed() > SPIN {
                break;
            }
            std::hint::spin_loop();
        }
        let mut st = lock(&self.state);
        loop {
            if self.shutdown.load(Ordering::Acquire) {
                return None;
            }
            if let Some(job) = self.front(&mut st) {
                return Some(job);
            }
            st.sleepers += 1;
            st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            st.sleepers -= 1;
        }
    }
}

/// A fixed set of worker threads plus the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    threads: usize,
    /// Started by the first [`Pool::run`] with chunks to share: a process whose launches are
    /// all small (a warm `kiln run` of a few elements) never pays for starting them.
    workers: OnceLock<Vec<JoinHandle<()>>>,
}

impl Pool {
    /// A pool that runs up to `threads` chunks at once (the caller counts as one, so it
    /// has `threads - 1` workers, started when first needed). A worker that cannot be started
    /// leaves its chunks to the others.
    pub fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            state: Mutex::new(State { queue: VecDeque::new(), sleepers: 0 }),
            wake: Condvar::new(),
            queued: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
        });
        Pool { shared, threads: threads.max(1), workers: OnceLock::new() }
    }

    /// The workers, started now if this is the first call.
    fn workers(&self) -> &[JoinHandle<()>] {
        self.workers.get_or_init(|| {
            (1..self.threads)
                .filter_map(|i| {
                    let shared = self.shared.clone();
                    thread::Builder::new()
                        .name(format!("kiln-cpu-{i}"))
                        .spawn(move || {
                            while let Some(job) = shared.next_job() {
                                job.work();
                            }
                        })
                        .ok()
                })
                .collect()
        })
    }

    /// The process-wide pool: `KILN_CPU_THREADS` threads, else one per available core.
    pub fn global() -> &'static Pool {
        static POOL: OnceLock<Pool> = OnceLock::new();
        POOL.get_or_init(|| {
            let from_env = std::env::var(THREADS_ENV).ok().and_then(|v| v.trim().parse::<usize>().ok());
            let n =
                from_env.filter(|n| *n > 0).unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get()));
            Pool::new(n)
        })
    }

    /// How many chunks can run at once (workers + the caller).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(i)` for every `i` in `0..chunks`, each exactly once, on the caller and idle
    /// workers, and returns when all have returned. A panic in any chunk is re-raised here
    /// after every chunk has finished.
    pub fn run(&self, chunks: usize, f: &(dyn Fn(usize) + Sync)) {
        if chunks <= 1 || self.workers().is_empty() {
            (0..chunks).for_each(f);
            return;
        }
        // SAFETY: only the lifetime is erased. The pointer is dereferenced only for claimed
        // chunks, and this function does not return (nor unwind: chunk panics are caught)
        // before `done == chunks`, i.e. before every such call has returned.
        let f: *const ChunkFn = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const ChunkFn>(f) };
        let job = Arc::new(Job {
            f,
            chunks,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
            caller: thread::current(),
        });
        {
            let mut st = lock(&self.shared.state);
            st.queue.push_back(job.clone());
            self.shared.queued.store(st.queue.len(), Ordering::Release);
            for _ in 0..st.sleepers.min(chunks - 1) {
                self.shared.wake.notify_one();
            }
        }
        job.work();
        {
            let mut st = lock(&self.shared.state);
            st.queue.retain(|j| !Arc::ptr_eq(j, &job));
            self.shared.queued.store(st.queue.len(), Ordering::Release);
        }
        let start = Instant::now();
        let mut spins = 0u32;
        while job.done.load(Ordering::Acquire) < chunks {
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) || start.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                // Woken by the worker that finishes the last chunk; spurious wake-ups loop.
                thread::park();
            }
        }
        if let Some(payload) = lock(&job.panic).take() {
            resume_unwind(payload);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        {
            let _st = lock(&self.shared.state);
            self.shared.wake.notify_all();
        }
        for w in self.workers.take().into_iter().flatten() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_chunk_runs_exactly_once() {
        let pool = Pool::new(4);
        for chunks in [0, 1, 2, 3, 7, 64] {
            let hits: Vec<AtomicU64> = (0..chunks).map(|_| AtomicU64::new(0)).collect();
            pool.run(chunks, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "chunks = {chunks}");
        }
    }

    #[test]
    fn concurrent_runs_from_many_threads_are_independent() {
        let pool = Arc::new(Pool::new(3));
        let handles: Vec<_> = (0..6u64)
            .map(|t| {
                let pool = pool.clone();
                thread::spawn(move || {
                    for round in 0..200u64 {
                        let sum = AtomicU64::new(0);
                        pool.run(5, &|i| {
                            sum.fetch_add(t * 1000 + round + i as u64, Ordering::Relaxed);
                        });
                        assert_eq!(sum.load(Ordering::Relaxed), 5 * (t * 1000 + round) + 10);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn a_panicking_chunk_is_reraised_after_all_chunks_finish() {
        let pool = Pool::new(2);
        let finished = AtomicU64::new(0);
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.run(8, &|i| {
                if i == 3 {
                    panic!("chunk 3");
                }
                finished.fetch_add(1, Ordering::Relaxed);
            })
        }));
        assert!(result.is_err());
        assert_eq!(finished.load(Ordering::Relaxed), 7);
        // The pool still works afterwards.
        let n = AtomicU64::new(0);
        pool.run(4, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn workers_start_at_the_first_run_with_chunks_to_share() {
        let pool = Pool::new(3);
        assert_eq!(pool.threads(), 3);
        let n = AtomicU64::new(0);
        pool.run(1, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert!(pool.workers.get().is_none(), "a one-chunk run starts no thread");
        pool.run(6, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(pool.workers.get().map(Vec::len), Some(2));
        assert_eq!(n.load(Ordering::Relaxed), 7);
    }

    #[test]
    fn pool_of_one_runs_inline_and_drop_joins_workers() {
        let pool = Pool::new(1);
        assert_eq!(pool.threads(), 1);
        let me = thread::current().id();
        pool.run(3, &|_| assert_eq!(thread::current().id(), me));
        let pool = Pool::new(3);
        assert_eq!(pool.threads(), 3);
        drop(pool);
    }
}

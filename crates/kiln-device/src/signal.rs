//! Timeline signals: monotonic u64 counters that order work across queues, threads and
//! devices.
//!
//! Contract (every implementation):
//! - `set(v)` never lowers the value (it is a max).
//! - `wait(v, timeout)` returns `Ok` once `value() >= v`, a [`Error::Timeout`] when the
//!   timeout passes first, or the failure error if the signal was failed. No wake-up is lost:
//!   a `set` that happens-before or races with `wait` is always observed.
//! - A wait that is never reached: with a finite timeout, [`Error::Timeout`] (the signal is
//!   *not* failed: the work may still complete, and a later wait may succeed); with
//!   `Duration::MAX`, it blocks until the value is reached or the signal fails. Nothing that
//!   fails leaves such a waiter hanging: a failed command fails its queue's later signals,
//!   a lost or reset device fails every signal of its generation ([`crate::context`]).
//! - A failed wait returns [`Error::SignalFailed`] sharing the original error
//!   ([`Error::root_cause`], [`Error::class`] see through it).
//! - `fail(e)`: every current and later waiter of a value not yet reached gets `e` (as
//!   [`Error::SignalFailed`]), so a failed producer never leaves a consumer hanging. The
//!   first failure wins; the value is frozen at the moment of failure (a later `set` is
//!   ignored), so "reached" and "failed" never change their answer for a given value.
//!
//! [`CpuTimelineSignal`] is the host implementation every backend and the runtime can use;
//! GPU backends wrap it with an event ring ([`crate::ring::RingSignal`]).
//!
//! The interleavings of `set`/`fail` with a parking `wait` are model-checked with loom:
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p kiln-device --release signal`
//! (a separate target dir keeps the normal build's artifacts valid).

use std::any::Any;
use std::fmt::{self, Debug};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// A monotonic u64 counter that orders work across queues, threads and devices (IREE's
/// semaphore); see the module docs for the contract every implementation keeps. Shared as
/// `Arc<dyn TimelineSignal>`: any thread may set, fail or wait.
pub trait TimelineSignal: Send + Sync + Debug + Any {
    /// For checked downcasts to the concrete type.
    fn as_any(&self) -> &dyn Any;

    /// For checked downcasts that keep ownership (queues hold the signal until they ran).
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;

    /// The current value; it only grows, and stops growing once the signal failed.
    fn value(&self) -> u64;

    /// Raises the value to `value` (no effect if it is already higher or the signal failed)
    /// and wakes the waiters it satisfies.
    fn set(&self, value: u64);

    /// Blocks until the value reaches `value`, the timeout passes, or the signal fails.
    /// A zero timeout polls once; `Duration::MAX` waits without limit.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the timeout passes first (the signal is not failed);
    /// [`Error::SignalFailed`] with the original error when the signal was failed before
    /// reaching `value`.
    fn wait(&self, value: u64, timeout: Duration) -> Result<()>;

    /// Marks the signal failed: pending and future waits for unreached values return `error`
    /// (as [`Error::SignalFailed`]). Only the first failure is kept.
    fn fail(&self, error: Error);

    /// The failure, if the signal was failed (the error passed to the first `fail`).
    fn failure(&self) -> Option<Error>;

    /// Whether the value reached `value` (a non-blocking `wait`, that ignores failure: a
    /// failed signal reports the values it reached before failing).
    fn is_reached(&self, value: u64) -> bool {
        self.value() >= value
    }
}

/// The synchronization primitives of this module: std's, or loom's model-checked ones when
/// the unit tests are built with `--cfg loom`.
#[cfg(not(all(loom, test)))]
mod sync {
    pub use std::sync::atomic::{AtomicU64, Ordering};
    pub use std::sync::{Condvar, Mutex, MutexGuard};
    /// Spin before parking (off under loom, where a spin loop only multiplies the states).
    pub const SPIN: bool = true;
}
#[cfg(all(loom, test))]
mod sync {
    pub use loom::sync::atomic::{AtomicU64, Ordering};
    pub use loom::sync::{Condvar, Mutex, MutexGuard};
    pub const SPIN: bool = false;
}

use sync::{AtomicU64, Condvar, Mutex, MutexGuard, Ordering};

/// Bit 63 of the signal word: the signal failed.
const FAILED: u64 = 1 << 63;

/// How long `wait` polls the value before it parks the thread. Waking a parked thread costs
/// ~6-15 µs on a small VM (futex wake plus scheduling); the budget must outlast that, or two
/// threads that signal each other in turn get stuck paying it on every hand-off (each one's
/// spin ends before the other, itself just woken, answers). Short enough that a long wait
/// wastes almost no CPU (and most of it is spent yielding, see [`SpinWait`]).
const SPIN_FOR: Duration = Duration::from_micros(20);

/// Polite busy-waiting before a thread parks: a few pure spins (a hand-off between two
/// running threads takes well under a microsecond), then `yield_now` between polls.
///
/// The yields matter on small machines: the scheduler often wakes a thread onto the core of
/// the thread that woke it, and a waker that then spins on that core would keep the wakee
/// off the CPU until the spin budget runs out (measured on 2 cores: a CPU queue round trip
/// after idling took 36 µs with pure spinning, 18 µs with this). A yield with nobody else
/// runnable returns at once.
#[derive(Debug)]
pub struct SpinWait {
    end: Instant,
    polls: u32,
}

impl SpinWait {
    /// Pure spins before yielding starts (each is a `spin_loop` hint, tens of nanoseconds).
    const PURE_SPINS: u32 = 64;

    /// A budget of `budget` from `start`, cut short by `deadline`.
    pub fn new(start: Instant, budget: Duration, deadline: Option<Instant>) -> Self {
        let end = start.checked_add(budget).unwrap_or(start);
        SpinWait { end: deadline.map_or(end, |d| d.min(end)), polls: 0 }
    }

    /// Pauses once; `false` when the budget is spent and the caller should park.
    pub fn pause(&mut self) -> bool {
        self.polls = self.polls.saturating_add(1);
        if self.polls < Self::PURE_SPINS {
            if self.polls.is_multiple_of(16) && Instant::now() >= self.end {
                return false;
            }
            std::hint::spin_loop();
        } else {
            if Instant::now() >= self.end {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }
}

/// A host timeline signal: one atomic word plus a mutex/condvar pair for parked waiters.
///
/// Values are at most [`CpuTimelineSignal::MAX_VALUE`] (2^63 - 1); `set` clamps larger ones.
/// The value and the failed flag live in one word, so `set` is a single `fetch_max` and a
/// `set` racing with `fail` can never raise the value after the failure became visible.
///
/// No lost wake-ups: a waiter re-checks the word and registers itself while holding the
/// mutex, and every `set` that raises the value (and every `fail`) takes that mutex after
/// changing the word and before notifying, so a waiter is either seen as registered (and
/// notified) or sees the new word. (The seeds' signal notified without ever taking the lock:
/// a waiter between its check and its sleep missed the wake-up.)
pub struct CpuTimelineSignal {
    /// Low 63 bits: the value; bit 63: failed.
    word: AtomicU64,
    parked: Mutex<Parked>,
    wake: Condvar,
}

struct Parked {
    /// Threads inside `Condvar::wait`: `set` skips the notify syscall when there are none.
    waiters: usize,
    /// The first failure; written before the FAILED bit is published. Shared: every waiter
    /// gets the same original error, not a copy or a string.
    failure: Option<Arc<Error>>,
}

impl Default for CpuTimelineSignal {
    fn default() -> Self {
        Self::new()
    }
}

impl Debug for CpuTimelineSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self.word.load(Ordering::Acquire);
        f.debug_struct("CpuTimelineSignal").field("value", &(w & !FAILED)).field("failed", &(w & FAILED != 0)).finish()
    }
}

impl CpuTimelineSignal {
    /// The largest value a signal can hold.
    pub const MAX_VALUE: u64 = FAILED - 1;

    /// A signal at value 0.
    pub fn new() -> Self {
        Self::with_value(0)
    }

    /// A signal starting at `value` (clamped to [`Self::MAX_VALUE`]).
    pub fn with_value(value: u64) -> Self {
        CpuTimelineSignal {
            word: AtomicU64::new(value.min(Self::MAX_VALUE)),
            parked: Mutex::new(Parked { waiters: 0, failure: None }),
            wake: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Parked> {
        // Nothing panics while holding this lock; a poisoned lock still holds consistent data.
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `word` answers a wait for `target`: `Some(true)` reached, `Some(false)` failed.
    fn settled(word: u64, target: u64) -> Option<bool> {
        if word & !FAILED >= target {
            Some(true)
        } else if word & FAILED != 0 {
            Some(false)
        } else {
            None
        }
    }

    fn failed_error(parked: &Parked) -> Error {
        match &parked.failure {
            Some(e) => signal_failed(e),
            None => Error::SignalFailed(Arc::new(Error::Invalid("signal failed without a recorded cause".into()))),
        }
    }

    fn outcome(&self, reached: bool) -> Result<()> {
        if reached { Ok(()) } else { Err(Self::failed_error(&self.lock())) }
    }

    /// The answer for `target` if it is already settled: reached (`Ok`) or failed (`Err`).
    pub(crate) fn poll(&self, target: u64) -> Option<Result<()>> {
        Self::settled(self.word.load(Ordering::Acquire), target).map(|reached| self.outcome(reached))
    }

    /// The timeout error for a wait for `target` that began at `start`.
    pub(crate) fn timeout_error(&self, target: u64, start: Instant) -> Error {
        Error::Timeout {
            target,
            current: self.word.load(Ordering::Acquire) & !FAILED,
            waited_ms: u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Wakes every parked waiter so it re-evaluates its `woken` condition. Callers change
    /// the state that condition reads *before* calling this.
    pub(crate) fn wake_parked(&self) {
        let parked = self.lock().waiters > 0;
        self.notify(parked);
    }

    /// Notifies the condvar if `parked` (read under the lock after the state change), then
    /// yields once.
    ///
    /// The notify comes after the lock is released, and that loses no wake-up: a waiter
    /// counted in `waiters` registered and re-checked the state under the lock before we took
    /// it, so it is already inside `Condvar::wait` (which releases the lock atomically with
    /// going to sleep) and a later notify reaches it; a waiter that registers after we
    /// released the lock re-checks the state and sees the change. (Notifying after the
    /// release also keeps the woken thread from blocking on a lock we still hold.)
    ///
    /// The yield: the scheduler tends to put the woken thread on this core; without it the
    /// wakee waits until this thread blocks or spins out (measured on 2 cores: a parked
    /// waiter woke after ~30 µs, with the yield after ~7 µs). It is only paid when a thread
    /// was actually parked, which already costs a syscall.
    fn notify(&self, parked: bool) {
        if parked {
            self.wake.notify_all();
            std::thread::yield_now();
        }
    }

    /// Waits until `target` is reached (`Ok(true)`), `woken()` holds (`Ok(false)`), the
    /// signal fails, or `deadline` passes (`None`: no limit). `woken` is evaluated while
    /// spinning and under the parking lock, so a state change followed by
    /// [`Self::wake_parked`] is never missed.
    pub(crate) fn wait_until(
        &self,
        target: u64,
        start: Instant,
        deadline: Option<Instant>,
        woken: &dyn Fn() -> bool,
    ) -> Result<bool> {
        if let Some(r) = self.poll(target) {
            return r.map(|()| true);
        }
        if sync::SPIN {
            let mut spin = SpinWait::new(start, SPIN_FOR, deadline);
            while spin.pause() {
                if let Some(reached) = Self::settled(self.word.load(Ordering::Acquire), target) {
                    return self.outcome(reached).map(|()| true);
                }
                if woken() {
                    return Ok(false);
                }
            }
        }
        let mut parked = self.lock();
        loop {
            match Self::settled(self.word.load(Ordering::Acquire), target) {
                Some(true) => return Ok(true),
                Some(false) => return Err(Self::failed_error(&parked)),
                None => {}
            }
            if woken() {
                return Ok(false);
            }
            parked.waiters += 1;
            parked = match deadline {
                None => self.wake.wait(parked).unwrap_or_else(|p| p.into_inner()),
                Some(deadline) => {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    if remaining.is_zero() {
                        parked.waiters -= 1;
                        drop(parked);
                        return Err(self.timeout_error(target, start));
                    }
                    self.wake.wait_timeout(parked, remaining).unwrap_or_else(|p| p.into_inner()).0
                }
            };
            parked.waiters -= 1;
        }
    }
}

/// `e` as the error a waiter of a failed signal gets: [`Error::SignalFailed`] sharing the
/// original error (a failure that is itself a failed signal is not wrapped twice).
pub fn signal_failed(e: &Arc<Error>) -> Error {
    match &**e {
        Error::SignalFailed(cause) => Error::SignalFailed(cause.clone()),
        _ => Error::SignalFailed(e.clone()),
    }
}

impl TimelineSignal for CpuTimelineSignal {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }

    fn value(&self) -> u64 {
        self.word.load(Ordering::Acquire) & !FAILED
    }

    fn set(&self, value: u64) {
        let value = value.min(Self::MAX_VALUE);
        // A failed word is >= 2^63 > value, so fetch_max leaves it (and the value) unchanged.
        let prev = self.word.fetch_max(value, Ordering::AcqRel);
        if value > prev {
            let parked = self.lock().waiters > 0;
            self.notify(parked);
        }
    }

    fn wait(&self, target: u64, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        self.wait_until(target, start, start.checked_add(timeout), &|| false).map(drop)
    }

    fn fail(&self, error: Error) {
        self.fail_shared(Arc::new(error));
    }

    fn failure(&self) -> Option<Error> {
        self.failure_shared().map(|e| (*e).clone())
    }
}

impl CpuTimelineSignal {
    /// [`TimelineSignal::fail`] with an error that is already shared (no copy is made).
    pub fn fail_shared(&self, error: Arc<Error>) {
        let mut parked = self.lock();
        if parked.failure.is_none() {
            parked.failure = Some(error);
        }
        self.word.fetch_or(FAILED, Ordering::AcqRel);
        let waiters = parked.waiters > 0;
        drop(parked);
        self.notify(waiters);
    }

    /// The shared failure, if the signal was failed.
    pub fn failure_shared(&self) -> Option<Arc<Error>> {
        if self.word.load(Ordering::Acquire) & FAILED == 0 {
            return None;
        }
        self.lock().failure.clone()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::thread;

    const LONG: Duration = Duration::from_secs(20);

    #[test]
    fn set_is_monotonic_and_clamped() {
        let s = CpuTimelineSignal::new();
        s.set(5);
        s.set(3);
        assert_eq!(s.value(), 5);
        s.set(u64::MAX);
        assert_eq!(s.value(), CpuTimelineSignal::MAX_VALUE);
        assert!(s.failure().is_none());
    }

    #[test]
    fn wait_for_reached_value_returns_at_once() {
        let s = CpuTimelineSignal::with_value(7);
        s.wait(7, Duration::ZERO).unwrap();
        s.wait(0, Duration::ZERO).unwrap();
        assert!(s.is_reached(6));
    }

    #[test]
    fn timeout_reports_target_and_current() {
        let s = CpuTimelineSignal::with_value(2);
        match s.wait(3, Duration::ZERO) {
            Err(Error::Timeout { target: 3, current: 2, .. }) => {}
            other => panic!("expected a timeout, got {other:?}"),
        }
        match s.wait(4, Duration::from_millis(20)) {
            Err(Error::Timeout { target: 4, current: 2, waited_ms }) => assert!(waited_ms >= 19),
            other => panic!("expected a timeout, got {other:?}"),
        }
    }

    #[test]
    fn cross_thread_set_wakes_a_parked_waiter() {
        let s = Arc::new(CpuTimelineSignal::new());
        let s2 = s.clone();
        let t = thread::spawn(move || s2.wait(3, LONG));
        thread::sleep(Duration::from_millis(20)); // long enough for the waiter to park
        s.set(1);
        s.set(3);
        t.join().unwrap().unwrap();
    }

    /// A `set` publishes the producer's earlier writes to the waiter (release/acquire).
    #[test]
    fn set_orders_memory_before_wait() {
        let (ready, ack) = (Arc::new(CpuTimelineSignal::new()), Arc::new(CpuTimelineSignal::new()));
        let data = Arc::new(AtomicU64::new(0));
        let (r2, a2, d2) = (ready.clone(), ack.clone(), data.clone());
        let t = thread::spawn(move || -> Result<()> {
            for k in 1..=2000u64 {
                d2.store(k, Ordering::Relaxed);
                r2.set(k);
                a2.wait(k, LONG)?;
            }
            Ok(())
        });
        for k in 1..=2000u64 {
            ready.wait(k, LONG).unwrap();
            assert_eq!(data.load(Ordering::Relaxed), k);
            ack.set(k);
        }
        t.join().unwrap().unwrap();
    }

    #[test]
    fn failure_reaches_current_and_later_waiters() {
        let s = Arc::new(CpuTimelineSignal::with_value(1));
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                thread::spawn(move || s.wait(2, LONG))
            })
            .collect();
        thread::sleep(Duration::from_millis(20));
        s.fail(Error::Launch("kernel exploded".into()));
        for w in waiters {
            match w.join().unwrap() {
                Err(Error::SignalFailed(e)) => {
                    assert!(matches!(&*e, Error::Launch(m) if m == "kernel exploded"), "{e}")
                }
                other => panic!("expected the failure, got {other:?}"),
            }
        }
        // A later waiter of an unreached value fails at once, even with a zero timeout.
        assert!(matches!(s.wait(5, Duration::ZERO), Err(Error::SignalFailed(_))));
        // A value reached before the failure stays reached.
        s.wait(1, Duration::ZERO).unwrap();
        // The value is frozen and the first failure is kept.
        s.set(10);
        assert_eq!(s.value(), 1);
        s.fail(Error::Invalid("second".into()));
        assert!(matches!(s.failure(), Some(Error::Launch(m)) if m == "kernel exploded"));
    }

    /// Every waiter gets the original error, typed and shared, not a message string.
    #[test]
    fn failure_keeps_the_typed_root_cause_shared() {
        let s = CpuTimelineSignal::new();
        s.fail(Error::OutOfMemory { device: "CPU".into(), requested: 64, in_use: 0, cached: 0, budget: Some(32) });
        let (Err(Error::SignalFailed(a)), Err(Error::SignalFailed(b))) =
            (s.wait(1, Duration::ZERO), s.wait(2, Duration::ZERO))
        else {
            panic!("expected two failed waits");
        };
        assert!(Arc::ptr_eq(&a, &b), "waiters share one error");
        assert!(matches!(&*a, Error::OutOfMemory { requested: 64, .. }));
        assert_eq!(Error::SignalFailed(a).class(), crate::ErrorClass::OutOfMemory);
    }

    #[test]
    fn signal_failed_is_not_wrapped_twice() {
        let s = CpuTimelineSignal::new();
        s.fail(Error::SignalFailed(Arc::new(Error::Launch("upstream".into()))));
        match s.wait(1, Duration::ZERO) {
            Err(Error::SignalFailed(e)) => assert!(matches!(&*e, Error::Launch(m) if m == "upstream")),
            other => panic!("expected the failure, got {other:?}"),
        }
    }

    /// A pipeline of signals: stage i waits for signal i and sets signal i+1, many values.
    #[test]
    fn stress_pipeline_many_threads_many_signals() {
        const STAGES: usize = 8;
        const VALUES: u64 = 2000;
        let sigs: Arc<Vec<CpuTimelineSignal>> = Arc::new((0..=STAGES).map(|_| CpuTimelineSignal::new()).collect());
        let stages: Vec<_> = (0..STAGES)
            .map(|i| {
                let sigs = sigs.clone();
                thread::spawn(move || -> Result<()> {
                    for k in 1..=VALUES {
                        sigs[i].wait(k, LONG)?;
                        sigs[i + 1].set(k);
                    }
                    Ok(())
                })
            })
            .collect();
        for k in 1..=VALUES {
            sigs[0].set(k);
        }
        sigs[STAGES].wait(VALUES, LONG).unwrap();
        for s in stages {
            s.join().unwrap().unwrap();
        }
    }

    /// Many setters race on one signal with many waiters of random targets; every waiter
    /// returns, and a concurrent failure never strands anyone.
    #[test]
    fn stress_racing_setters_waiters_and_failure() {
        for round in 0..20u64 {
            let s = Arc::new(CpuTimelineSignal::new());
            let waiters: Vec<_> = (0..6u64)
                .map(|w| {
                    let s = s.clone();
                    thread::spawn(move || s.wait(1 + (w * 7 + round) % 50, LONG))
                })
                .collect();
            let setters: Vec<_> = (0..3u64)
                .map(|t| {
                    let s = s.clone();
                    thread::spawn(move || {
                        for v in 0..60u64 {
                            s.set(v * 3 + t);
                        }
                    })
                })
                .collect();
            if round % 2 == 1 {
                s.fail(Error::Invalid("round failed".into()));
            }
            for t in setters {
                t.join().unwrap();
            }
            for w in waiters {
                match w.join().unwrap() {
                    Ok(()) => {}
                    Err(Error::SignalFailed(_)) => assert_eq!(round % 2, 1),
                    Err(e) => panic!("waiter got {e}"),
                }
            }
        }
    }
}

/// Loom models of the races a parking waiter has with `set` and `fail`. A lost wake-up shows
/// up as a deadlock that loom reports.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    const LONG: Duration = Duration::from_secs(3600);

    #[test]
    fn signal_set_races_with_wait() {
        loom::model(|| {
            let s = Arc::new(CpuTimelineSignal::new());
            let s2 = s.clone();
            let t = thread::spawn(move || s2.set(1));
            s.wait(1, LONG).unwrap();
            t.join().unwrap();
            assert_eq!(s.value(), 1);
        });
    }

    #[test]
    fn signal_two_sets_race_with_two_waiters() {
        loom::model(|| {
            let s = Arc::new(CpuTimelineSignal::new());
            let (s1, s2) = (s.clone(), s.clone());
            let a = thread::spawn(move || s1.set(1));
            let b = thread::spawn(move || s2.wait(2, LONG));
            s.set(2);
            s.wait(1, LONG).unwrap();
            b.join().unwrap().unwrap();
            a.join().unwrap();
            assert_eq!(s.value(), 2);
        });
    }

    /// The ring signal's path: a state change plus `wake_parked` releases a parked waiter.
    #[test]
    fn signal_wake_parked_races_with_wait_until() {
        loom::model(|| {
            let s = Arc::new(CpuTimelineSignal::new());
            let flag = Arc::new(AtomicU64::new(0));
            let (s2, f2) = (s.clone(), flag.clone());
            let t = thread::spawn(move || {
                f2.store(1, Ordering::Release);
                s2.wake_parked();
            });
            let woken = || flag.load(Ordering::Acquire) == 1;
            assert!(!s.wait_until(1, Instant::now(), None, &woken).unwrap());
            t.join().unwrap();
        });
    }

    #[test]
    fn signal_fail_races_with_wait() {
        loom::model(|| {
            let s = Arc::new(CpuTimelineSignal::new());
            let s2 = s.clone();
            let t = thread::spawn(move || s2.fail(Error::Invalid("boom".into())));
            match s.wait(1, LONG) {
                Err(Error::SignalFailed(e)) => assert!(e.to_string().contains("boom")),
                other => panic!("expected the failure, got {other:?}"),
            }
            t.join().unwrap();
        });
    }

    #[test]
    fn signal_set_and_fail_race_with_wait() {
        loom::model(|| {
            let s = Arc::new(CpuTimelineSignal::new());
            let (s1, s2) = (s.clone(), s.clone());
            let a = thread::spawn(move || s1.set(1));
            let b = thread::spawn(move || s2.fail(Error::Invalid("boom".into())));
            // Either outcome is allowed; hanging is not. Whichever came first is final.
            let first = s.wait(1, LONG).is_ok();
            a.join().unwrap();
            b.join().unwrap();
            assert_eq!(s.value() >= 1, first);
            assert_eq!(s.wait(1, LONG).is_ok(), first);
        });
    }
}

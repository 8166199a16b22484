//! The timeline signal of GPU backends: a ring of (value, device event) slots in front of a
//! host [`CpuTimelineSignal`]. One generic ring serves OpenCL, CUDA and WebGPU.
//!
//! A queue that signals `value` records a device event after its work and calls
//! [`RingSignal::record`]. The timeline reaches `value` when that event completes, not when
//! it is recorded. A waiter for `target` waits on the event of the smallest recorded value
//! `>= target`; the host side (`set`, `fail`, timeouts, parked waiters) behaves exactly like
//! [`CpuTimelineSignal`], and a failed event fails the signal.

use std::any::Any;
use std::fmt::{self, Debug};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::signal::{CpuTimelineSignal, TimelineSignal, signal_failed};

/// A device event as seen by the ring: the marker a backend records after some work.
pub trait BackendEvent: Send + Sync + Debug + 'static {
    /// Whether the work before the event has finished. Never blocks. An error means the
    /// work failed (the signal is then failed with it).
    ///
    /// # Errors
    /// The failure of the work before the event, or [`Error::Driver`] when the query fails.
    fn is_complete(&self) -> Result<bool>;

    /// Blocks until the work before the event has finished (the driver's own wait).
    ///
    /// # Errors
    /// As [`BackendEvent::is_complete`].
    fn wait(&self) -> Result<()>;
}

/// A fixed-capacity ring of (timeline value, event) slots, newest overwriting oldest.
///
/// Recorded values never decrease, so the newest slot holds the largest value and a value
/// that has been recorded is always covered by some slot. Events are shared (`Arc`): a
/// waiter that looked a slot up keeps its event alive after the slot is overwritten.
#[derive(Debug)]
pub struct EventRing<E> {
    slots: Vec<Option<(u64, Arc<E>)>>,
    /// The slot the next record overwrites.
    next: usize,
    /// The value of the newest slot (0 when empty).
    last: u64,
}

impl<E> EventRing<E> {
    /// Comfortably above typical in-flight depth while bounding the events held.
    pub const DEFAULT_CAPACITY: usize = 64;

    /// An empty ring of `capacity` slots (at least 1).
    pub fn new(capacity: usize) -> Self {
        EventRing { slots: (0..capacity.max(1)).map(|_| None).collect(), next: 0, last: 0 }
    }

    /// How many events the ring holds at most; older ones are dropped as new ones arrive.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Occupied slots.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Whether nothing was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.slots.iter().all(Option::is_none)
    }

    /// The largest recorded value (0 when nothing was recorded).
    pub fn last_value(&self) -> u64 {
        self.last
    }

    /// Stores `event` as the marker of `value` and returns the slot it evicted, if any.
    /// A value below the last recorded one is refused ([`Error::Invalid`]): the timeline
    /// of one signal only moves forward.
    ///
    /// # Errors
    /// [`Error::Invalid`] as above.
    pub fn record(&mut self, value: u64, event: Arc<E>) -> Result<Option<(u64, Arc<E>)>> {
        if value < self.last {
            return Err(Error::Invalid(format!(
                "event recorded for timeline value {value} after value {}; signal values must not decrease",
                self.last
            )));
        }
        let evicted = self.slots[self.next].replace((value, event));
        self.next = (self.next + 1) % self.slots.len();
        self.last = value;
        Ok(evicted)
    }

    /// The slot with the smallest value `>= target`: the earliest event whose completion
    /// implies the timeline reached `target`.
    pub fn find(&self, target: u64) -> Option<(u64, Arc<E>)> {
        self.slots.iter().flatten().filter(|(v, _)| *v >= target).min_by_key(|(v, _)| *v).map(|(v, e)| (*v, e.clone()))
    }

    /// The occupied slots with a value above `floor`, largest value first.
    pub fn above(&self, floor: u64) -> Vec<(u64, Arc<E>)> {
        let mut out: Vec<_> =
            self.slots.iter().flatten().filter(|(v, _)| *v > floor).map(|(v, e)| (*v, e.clone())).collect();
        out.sort_by_key(|s| std::cmp::Reverse(s.0));
        out
    }
}

/// Polling backoff while waiting on an event with a deadline: spin, then yield, then sleep
/// in growing steps up to this bound (it bounds the wake-up delay of a long wait).
const MAX_POLL_SLEEP: Duration = Duration::from_millis(1);
const SPIN_POLLS: u32 = 64;
const YIELD_POLLS: u32 = 256;

/// A [`TimelineSignal`] backed by device events.
///
/// - `record(v, e)`: the device reaches `v` when `e` completes (called by the backend's queue
///   right after it enqueued the event).
/// - `set`/`fail`: host-side, as for [`CpuTimelineSignal`] (a host `set` covers values no
///   event was recorded for; `fail` freezes the value and fails every unreached wait).
/// - `wait(target, timeout)`: returns once `target` is reached by a host `set` or by a
///   completed event. With a finite timeout it polls the event (spin, yield, then short
///   sleeps) and sees host `set`/`fail` while doing so; with `Duration::MAX` it blocks in the
///   driver's wait, and a host `fail` is seen when that event completes. A waiter whose
///   target no event covers yet parks until a `record` covers it, a `set`, or a `fail`.
/// - An event that reports an error fails the signal with that error.
pub struct RingSignal<E: BackendEvent> {
    host: CpuTimelineSignal,
    ring: Mutex<EventRing<E>>,
    /// Mirror of the ring's last value, readable by parked waiters without the ring lock.
    recorded: AtomicU64,
}

impl<E: BackendEvent> Debug for RingSignal<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingSignal")
            .field("value", &self.host.value())
            .field("recorded", &self.recorded.load(Ordering::Acquire))
            .field("failed", &self.host.failure().is_some())
            .finish()
    }
}

impl<E: BackendEvent> Default for RingSignal<E> {
    fn default() -> Self {
        Self::new(EventRing::<E>::DEFAULT_CAPACITY)
    }
}

impl<E: BackendEvent> RingSignal<E> {
    /// A signal at value 0 whose ring holds `capacity` events.
    pub fn new(capacity: usize) -> Self {
        RingSignal { host: CpuTimelineSignal::new(), ring: Mutex::new(EventRing::new(capacity)), recorded: 0.into() }
    }

    fn ring(&self) -> MutexGuard<'_, EventRing<E>> {
        // No driver call or user code runs under this lock; a poisoned ring is still consistent.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that the timeline reaches `value` when `event` completes. Refuses a value
    /// below the last recorded one. An evicted slot whose event already completed still
    /// raises the value, so no completion is forgotten.
    ///
    /// # Errors
    /// [`Error::Invalid`] when `value` is below the last recorded one.
    pub fn record(&self, value: u64, event: E) -> Result<()> {
        self.record_shared(value, Arc::new(event))
    }

    /// [`RingSignal::record`] for an event that is already shared.
    ///
    /// # Errors
    /// As [`RingSignal::record`].
    pub fn record_shared(&self, value: u64, event: Arc<E>) -> Result<()> {
        let evicted = self.ring().record(value, event)?;
        if let Some((v, e)) = evicted {
            self.observe(v, &e);
        }
        self.recorded.fetch_max(value, Ordering::AcqRel);
        self.host.wake_parked();
        Ok(())
    }

    /// The earliest recorded event whose completion means the timeline reached `target`
    /// (what a stream that waits for `target` on the device waits on); `None` when no
    /// recorded event covers `target` yet.
    pub fn event_for(&self, target: u64) -> Option<Arc<E>> {
        self.ring().find(target).map(|(_, e)| e)
    }

    /// Folds the state of the event for `value` into the host value; `true` if completed.
    fn observe(&self, value: u64, event: &E) -> bool {
        match event.is_complete() {
            Ok(true) => {
                self.host.set(value);
                true
            }
            Ok(false) => false,
            Err(e) => {
                self.host.fail(e);
                false
            }
        }
    }

    /// Raises the host value to the largest completed recorded value.
    fn refresh(&self) {
        let candidates = self.ring().above(self.host.value());
        for (v, e) in candidates {
            if self.observe(v, &e) || self.host.failure().is_some() {
                break;
            }
        }
    }

    /// Fails the signal with an event's error; returns what the waiter that saw it gets.
    fn fail_with(&self, e: Error) -> Error {
        let e = Arc::new(e);
        self.host.fail_shared(e.clone());
        // The first failure wins: report the one the signal kept.
        signal_failed(&self.host.failure_shared().unwrap_or(e))
    }

    /// Waits on the event that marks `value >= target`.
    fn wait_event(&self, target: u64, value: u64, event: &E, start: Instant, deadline: Option<Instant>) -> Result<()> {
        let Some(deadline) = deadline else {
            if let Err(e) = event.wait() {
                return Err(self.fail_with(e));
            }
            self.host.set(value);
            return self.host.poll(target).unwrap_or_else(|| Err(self.host.timeout_error(target, start)));
        };
        let mut polls = 0u32;
        let mut sleep = Duration::from_micros(10);
        loop {
            if let Some(r) = self.host.poll(target) {
                return r;
            }
            match event.is_complete() {
                Ok(true) => {
                    self.host.set(value);
                    continue; // the poll above answers: reached, or failed earlier
                }
                Ok(false) => {}
                Err(e) => return Err(self.fail_with(e)),
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.host.timeout_error(target, start));
            }
            polls += 1;
            if polls < SPIN_POLLS {
                std::hint::spin_loop();
            } else if polls < SPIN_POLLS + YIELD_POLLS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(sleep.min(deadline - now));
                sleep = (sleep * 2).min(MAX_POLL_SLEEP);
            }
        }
    }
}

impl<E: BackendEvent> TimelineSignal for RingSignal<E> {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }

    fn value(&self) -> u64 {
        self.refresh();
        self.host.value()
    }

    fn set(&self, value: u64) {
        self.host.set(value);
    }

    fn wait(&self, target: u64, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let deadline = start.checked_add(timeout);
        loop {
            if let Some(r) = self.host.poll(target) {
                return r;
            }
            let found = self.ring().find(target);
            if let Some((value, event)) = found {
                return self.wait_event(target, value, &event, start, deadline);
            }
            // No event covers `target` yet: park until a record covers it, a set or a fail.
            let covered = || self.recorded.load(Ordering::Acquire) >= target;
            if self.host.wait_until(target, start, deadline, &covered)? {
                return Ok(());
            }
        }
    }

    fn fail(&self, error: Error) {
        self.host.fail(error);
    }

    fn failure(&self) -> Option<Error> {
        self.host.failure()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::doubles::FakeEvent;
    use std::thread;

    const LONG: Duration = Duration::from_secs(20);

    fn ev() -> Arc<FakeEvent> {
        Arc::new(FakeEvent::default())
    }

    #[test]
    fn ring_finds_smallest_covering_slot() {
        let mut r = EventRing::new(4);
        for v in [2u64, 4, 6] {
            assert!(r.record(v, Arc::new(v)).unwrap().is_none());
        }
        assert_eq!(r.find(0).map(|s| s.0), Some(2));
        assert_eq!(r.find(3).map(|s| s.0), Some(4));
        assert_eq!(r.find(6).map(|s| *s.1), Some(6));
        assert!(r.find(7).is_none());
        assert_eq!(r.above(2).iter().map(|s| s.0).collect::<Vec<_>>(), vec![6, 4]);
        assert_eq!((r.len(), r.capacity(), r.last_value()), (3, 4, 6));
    }

    #[test]
    fn ring_overwrite_keeps_looked_up_events_alive() {
        let mut r = EventRing::new(2);
        r.record(1, Arc::new("one")).unwrap();
        let held = r.find(1).unwrap().1;
        r.record(2, Arc::new("two")).unwrap();
        let evicted = r.record(3, Arc::new("three")).unwrap().unwrap();
        assert_eq!((evicted.0, *evicted.1), (1, "one"));
        drop(evicted);
        assert_eq!(*held, "one"); // the waiter's clone outlives the slot
        assert_eq!(Arc::strong_count(&held), 1);
        assert_eq!(r.find(1).map(|s| s.0), Some(2));
    }

    #[test]
    fn ring_refuses_a_decreasing_value() {
        let mut r = EventRing::new(2);
        r.record(5, Arc::new(())).unwrap();
        r.record(5, Arc::new(())).unwrap();
        assert!(matches!(r.record(4, Arc::new(())), Err(Error::Invalid(_))));
    }

    #[test]
    fn value_counts_only_completed_events() {
        let s = RingSignal::new(8);
        let (a, b) = (ev(), ev());
        s.record(1, a.clone()).unwrap();
        s.record(2, b.clone()).unwrap();
        assert_eq!(s.value(), 0);
        b.complete(); // completion of 2 implies 1
        assert_eq!(s.value(), 2);
        assert!(s.is_reached(1));
    }

    #[test]
    fn wait_returns_when_the_event_completes() {
        let s = Arc::new(RingSignal::new(8));
        let e = ev();
        s.record(3, e.clone()).unwrap();
        let s2 = s.clone();
        let t = thread::spawn(move || s2.wait(2, LONG));
        thread::sleep(Duration::from_millis(5));
        e.complete();
        t.join().unwrap().unwrap();
        assert_eq!(s.value(), 3);
    }

    #[test]
    fn unbounded_wait_uses_the_driver_wait() {
        let s = Arc::new(RingSignal::new(8));
        let e = ev();
        s.record(1, e.clone()).unwrap();
        let s2 = s.clone();
        let t = thread::spawn(move || s2.wait(1, Duration::MAX));
        thread::sleep(Duration::from_millis(5));
        e.complete();
        t.join().unwrap().unwrap();
        assert_eq!(e.blocking_waits.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_record_wakes_a_waiter_parked_on_an_unrecorded_value() {
        let s = Arc::new(RingSignal::new(8));
        let s2 = s.clone();
        let t = thread::spawn(move || s2.wait(4, LONG));
        thread::sleep(Duration::from_millis(20));
        let e = ev();
        e.complete();
        s.record(4, e).unwrap();
        t.join().unwrap().unwrap();
    }

    #[test]
    fn host_set_and_fail_reach_event_waiters() {
        let s = Arc::new(RingSignal::new(8));
        s.record(5, ev()).unwrap(); // never completes
        let s2 = s.clone();
        let t = thread::spawn(move || s2.wait(5, LONG));
        thread::sleep(Duration::from_millis(5));
        s.set(5);
        t.join().unwrap().unwrap();

        s.record(9, ev()).unwrap();
        let s3 = s.clone();
        let t = thread::spawn(move || s3.wait(9, LONG));
        thread::sleep(Duration::from_millis(5));
        s.fail(Error::Invalid("host gave up".into()));
        assert!(matches!(t.join().unwrap(), Err(Error::SignalFailed(e)) if e.to_string().contains("host gave up")));
        s.wait(5, Duration::ZERO).unwrap();
    }

    #[test]
    fn timeout_when_the_event_never_completes() {
        let s = RingSignal::new(8);
        s.record(1, ev()).unwrap();
        assert!(matches!(s.wait(1, Duration::from_millis(10)), Err(Error::Timeout { target: 1, current: 0, .. })));
        assert!(matches!(s.wait(2, Duration::ZERO), Err(Error::Timeout { target: 2, .. })));
    }

    #[test]
    fn a_broken_event_fails_the_signal() {
        let s = Arc::new(RingSignal::new(8));
        let e = ev();
        s.record(1, e.clone()).unwrap();
        let s2 = s.clone();
        let t = thread::spawn(move || s2.wait(1, LONG));
        thread::sleep(Duration::from_millis(5));
        e.broken.store(true, Ordering::Release);
        assert!(matches!(t.join().unwrap(), Err(Error::SignalFailed(e)) if e.to_string().contains("device fault")));
        assert!(matches!(s.failure(), Some(Error::Driver { .. })));
        assert!(matches!(s.wait(1, Duration::MAX), Err(Error::SignalFailed(_))));
    }

    #[test]
    fn an_evicted_completed_event_still_counts() {
        let s = RingSignal::new(1);
        let e = ev();
        s.record(1, e.clone()).unwrap();
        e.complete();
        s.record(2, ev()).unwrap(); // evicts 1, which completed
        s.wait(1, Duration::ZERO).unwrap();
        assert!(s.wait(2, Duration::ZERO).is_err());
    }

    /// Producers record and complete events while many waiters wait on random values.
    #[test]
    fn stress_record_complete_and_wait() {
        let s = Arc::new(RingSignal::new(4));
        let waiters: Vec<_> = (0..6u64)
            .map(|w| {
                let s = s.clone();
                thread::spawn(move || -> Result<()> {
                    for k in (1 + w..=300).step_by(7) {
                        s.wait(k, LONG)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for k in 1..=300u64 {
            let e = ev();
            s.record(k, e.clone()).unwrap();
            e.complete();
        }
        for w in waiters {
            w.join().unwrap().unwrap();
        }
        assert_eq!(s.value(), 300);
    }
}

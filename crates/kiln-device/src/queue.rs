//! Hardware command queues.
//!
//! Contract (every backend, checked by kiln-conformance):
//! - **Ordering.** A queue is a builder: `wait`, `signal`, `exec`, `copy` and
//!   `memory_barrier` record commands; nothing runs before [`HardwareQueue::submit`], and
//!   `submit` never waits for the work. Commands of one queue run in order; commands of
//!   different queues are ordered only by timeline signals.
//! - **Ownership.** Recorded and submitted commands own what they use (buffers, kernels,
//!   signals) until they finished: the caller may drop its handles right after `submit`.
//! - **Recording errors.** A wrong argument (to `exec`, `copy`, a foreign signal type) is
//!   kept and returned by `submit`, which then submits nothing of that batch; the queue
//!   stays usable.
//! - **Timeout policy (one for all backends).** A queue's `wait` command has no deadline:
//!   it ends when the signal reaches the value or fails. Nothing hangs on a failure: a failed
//!   producer fails its signals, and a lost or reset device fails every signal of its
//!   generation ([`crate::context`]). Deadlines belong to the host: [`TimelineSignal::wait`]
//!   takes one.
//! - **Failure.** A command that fails (a kernel fault, a failed copy, a `wait` on a failed
//!   signal) fails the queue: nothing recorded behind it runs, every `signal` behind it fails
//!   its signal with the error instead of setting it (so every waiter gets the root cause),
//!   and every later `submit` fails its batch's signals and returns
//!   [`Error::QueueFailed`] with the cause. The failure is sticky for the queue's life
//!   (results behind it are unknown) and reported by [`HardwareQueue::failure`] (and
//!   [`DynQueue::failure`]) once the host can see it. Create a new queue to continue; after
//!   a fatal error, [`crate::Device::reset`] first.
//! - **Submit errors.** A submit the driver refuses part-way returns the error and fails the
//!   batch's signals that were not recorded, so no waiter hangs.

use std::any::{Any, type_name};
use std::sync::Arc;
use std::time::Instant;

use kiln_ir::DeviceSpec;

use crate::buffer::Buffer;
use crate::context::Stamp;
use crate::error::{Error, Result};
use crate::kernel::Kernel;
use crate::signal::TimelineSignal;

/// Reads when one profiled command ran, as (start, end) on the host's clock. It blocks until
/// the command completed, and fails when the device kept no times for it.
pub type TimeProbe = Box<dyn FnOnce() -> Result<(Instant, Instant)> + Send>;

/// Work a queue hands to the host in its order ([`HardwareQueue::host`]).
pub type HostCall = Box<dyn FnOnce() -> Result<()> + Send>;

/// Receives the times a queue measured for profiled commands (see [`HardwareQueue::exec_timed`]).
pub trait CommandTimer: Send + Sync {
    /// Called at most once per timed command, when the queue hands the command to the device
    /// (at `submit` or later, on any thread). A command that is never handed over (a failed
    /// submit, a poisoned queue) never reports.
    fn measured(&self, probe: TimeProbe);
}

/// An in-order command queue of one device (IREE's command buffer and queue in one): record
/// commands, then [`HardwareQueue::submit`] them. See the module docs for the ordering,
/// ownership and failure contract every backend keeps. Not `Sync`: one thread records a
/// queue at a time; use one queue per thread and order them with signals.
pub trait HardwareQueue: Send {
    /// The only signal type this queue can wait on and set (its backend's).
    type Signal: TimelineSignal;

    /// Later commands start only after `signal` reaches `value`. Blocks the queue, never the host.
    fn wait(&mut self, signal: &Arc<Self::Signal>, value: u64) -> &mut Self;

    /// Sets `signal` to `value` once every earlier command of this queue has finished.
    /// If an earlier command failed, the signal is failed with that error instead.
    fn signal(&mut self, signal: &Arc<Self::Signal>, value: u64) -> &mut Self;

    /// Runs `kernel` over `bufs` with variable values `vals` (in `var_names` order).
    /// Arguments are checked now; launch sizes are evaluated now from `vals`.
    fn exec(&mut self, kernel: &Kernel, bufs: &[&Buffer], vals: &[i64]) -> &mut Self;

    /// [`HardwareQueue::exec`], and the queue reports to `timer` when the kernel ran: the
    /// host times around the run on a queue that runs programs itself (CPU), the device's own
    /// times on one that enqueues them natively. The default records a plain `exec` and
    /// reports nothing (a queue that cannot measure); kernels are never wrapped for timing.
    fn exec_timed(
        &mut self,
        kernel: &Kernel,
        bufs: &[&Buffer],
        vals: &[i64],
        timer: &Arc<dyn CommandTimer>,
    ) -> &mut Self {
        let _ = timer;
        self.exec(kernel, bufs, vals)
    }

    /// Copies `src` into `dst` (same byte size, either may be on another device).
    fn copy(&mut self, dst: &Buffer, src: &Buffer) -> &mut Self;

    /// [`HardwareQueue::copy`], and the queue reports to `timer` when the copy ran, if it can
    /// measure that. The default records a plain `copy` and reports nothing.
    fn copy_timed(&mut self, dst: &Buffer, src: &Buffer, timer: &Arc<dyn CommandTimer>) -> &mut Self {
        let _ = timer;
        self.copy(dst, src)
    }

    /// Makes every earlier write visible to every later command of any queue that waits on
    /// a signal set after this point.
    fn memory_barrier(&mut self) -> &mut Self;

    /// Runs `call` on a host thread once every earlier command of this queue finished; later
    /// commands start after it returns. It may block (a collective waits for its peers, see
    /// [`crate::collective`]) without blocking the caller of `submit`. Its error fails the
    /// queue as a failed command does; a queue that fails before reaching it drops it uncalled.
    fn host(&mut self, call: HostCall) -> &mut Self;

    /// Hands the recorded batch to the device and returns without waiting. Either way the
    /// queue is empty afterwards and records the next batch.
    ///
    /// # Errors
    /// The batch's first recording error ([`Error::Launch`], [`Error::OutOfBounds`],
    /// [`Error::Buffer`], [`Error::Invalid`], ...), with nothing submitted;
    /// [`Error::QueueFailed`] when an earlier command failed the queue (the batch's signals
    /// are failed); the driver's refusal ([`Error::Driver`]), with the unrecorded signals
    /// failed.
    fn submit(&mut self) -> Result<()>;

    /// Records a recording error from outside the queue (a foreign signal seen by
    /// [`DynQueue`], a stale generation): the next `submit` returns the first recording error
    /// of the batch and submits nothing of it.
    fn reject(&mut self, error: Error) -> &mut Self;

    /// The error that failed this queue (see the module docs), once the host can see it;
    /// `None` while the queue is healthy.
    fn failure(&self) -> Option<Error>;

    /// The device the queue's commands run on; buffers and kernels of other devices are
    /// recording errors (a copy may take one side from elsewhere).
    fn device(&self) -> &DeviceSpec;
}

/// Creates the queues and signals of one device.
pub trait QueueFactory: Send + Sync {
    /// The backend's queue; it takes the factory's signals.
    type Queue: HardwareQueue<Signal = Self::Signal>;
    /// The backend's timeline signal, shared by all queues of the factory.
    type Signal: TimelineSignal;

    /// A new, empty compute queue (it runs kernels and copies). Queues are independent:
    /// order them with signals.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver cannot create a queue (a stream, a worker thread).
    fn create_compute_queue(&self) -> Result<Self::Queue>;

    /// A dedicated copy queue, if the device has one.
    ///
    /// # Errors
    /// [`Error::Driver`] when the device has one but it cannot be created.
    fn create_copy_queue(&self) -> Result<Option<Self::Queue>>;

    /// A new signal at value 0, usable by every queue of this factory (and by the host).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver cannot create the signal's event or fence.
    fn create_signal(&self) -> Result<Arc<Self::Signal>>;

    /// The device the queues run on.
    fn device(&self) -> &DeviceSpec;
}

/// A [`HardwareQueue`] with its type erased, so queues of different backends live in one
/// collection (the runtime's plan, a [`crate::Device`]).
///
/// `wait` and `signal` take any `Arc<dyn TimelineSignal>` and downcast it to the concrete
/// queue's signal type; a signal of another type is a recording error that `submit` returns
/// ([`Error::Invalid`], recorded with [`HardwareQueue::reject`]), never a silently dropped
/// dependency. Every command goes straight to the concrete queue, which buffers the batch
/// (one buffer, not two); a batch that holds a recording error submits nothing. After
/// `submit` (either outcome) the queue is empty and can record the next batch.
pub struct DynQueue {
    inner: Box<dyn ErasedQueue>,
    /// The device generation the queue was created under (queues from a
    /// [`crate::Device`]'s factory): `submit` refuses a stale or lost one.
    stamp: Option<Stamp>,
}

impl std::fmt::Debug for DynQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DynQueue(on {}, signals: {})", self.inner.device(), self.inner.signal_type())
    }
}

impl DynQueue {
    /// Erases `queue`'s type; unbound to a device generation (a [`crate::Device`]'s factory
    /// binds the queues it creates).
    pub fn new<Q: HardwareQueue + 'static>(queue: Q) -> DynQueue {
        DynQueue { inner: Box::new(Erased { queue, signals: Vec::new() }), stamp: None }
    }

    /// This queue bound to a device generation (see [`crate::context`]).
    pub(crate) fn with_stamp(mut self, stamp: Stamp) -> DynQueue {
        self.stamp = Some(stamp);
        self
    }

    /// Whether `signal` is of the type this queue can wait on and signal.
    pub fn accepts(&self, signal: &dyn TimelineSignal) -> bool {
        self.inner.accepts(signal.as_any())
    }

    /// See [`HardwareQueue::wait`]; `signal` must be of this queue's signal type.
    pub fn wait(&mut self, signal: &Arc<dyn TimelineSignal>, value: u64) -> &mut Self {
        self.inner.wait(signal, value);
        self
    }

    /// See [`HardwareQueue::signal`]; `signal` must be of this queue's signal type.
    pub fn signal(&mut self, signal: &Arc<dyn TimelineSignal>, value: u64) -> &mut Self {
        self.inner.signal(signal, value);
        self
    }

    /// See [`HardwareQueue::exec`] (arguments are checked when the batch is submitted).
    pub fn exec(&mut self, kernel: &Kernel, bufs: &[&Buffer], vals: &[i64]) -> &mut Self {
        self.inner.exec(kernel, bufs, vals, None);
        self
    }

    /// See [`HardwareQueue::exec_timed`].
    pub fn exec_timed(
        &mut self,
        kernel: &Kernel,
        bufs: &[&Buffer],
        vals: &[i64],
        timer: &Arc<dyn CommandTimer>,
    ) -> &mut Self {
        self.inner.exec(kernel, bufs, vals, Some(timer));
        self
    }

    /// See [`HardwareQueue::copy`].
    pub fn copy(&mut self, dst: &Buffer, src: &Buffer) -> &mut Self {
        self.inner.copy(dst, src, None);
        self
    }

    /// See [`HardwareQueue::copy_timed`].
    pub fn copy_timed(&mut self, dst: &Buffer, src: &Buffer, timer: &Arc<dyn CommandTimer>) -> &mut Self {
        self.inner.copy(dst, src, Some(timer));
        self
    }

    /// See [`HardwareQueue::memory_barrier`].
    pub fn memory_barrier(&mut self) -> &mut Self {
        self.inner.memory_barrier();
        self
    }

    /// See [`HardwareQueue::host`].
    pub fn host(&mut self, call: HostCall) -> &mut Self {
        self.inner.host(call);
        self
    }

    /// Forwards the batch to the concrete queue and submits it; returns the first recording
    /// error instead (and submits nothing) if there was one.
    ///
    /// # Errors
    /// [`Error::DeviceLost`] / [`Error::DeviceFailed`] for a queue of an ended or failed
    /// device generation (the batch is discarded and its signals failed); the errors of
    /// [`HardwareQueue::submit`], including [`Error::Invalid`] for a signal of a foreign type.
    pub fn submit(&mut self) -> Result<()> {
        let Some(stamp) = &self.stamp else { return self.inner.submit() };
        if let Err(e) = stamp.check("a queue") {
            self.inner.discard(&e);
            return Err(e);
        }
        stamp.observe(self.inner.submit())
    }

    /// See [`HardwareQueue::failure`].
    pub fn failure(&self) -> Option<Error> {
        self.inner.failure()
    }

    /// See [`HardwareQueue::device`].
    pub fn device(&self) -> &DeviceSpec {
        self.inner.device()
    }

    /// The name of the signal type this queue takes (for error messages and logs).
    pub fn signal_type(&self) -> &'static str {
        self.inner.signal_type()
    }
}

trait ErasedQueue: Send {
    fn accepts(&self, signal: &dyn Any) -> bool;
    fn wait(&mut self, signal: &Arc<dyn TimelineSignal>, value: u64);
    fn signal(&mut self, signal: &Arc<dyn TimelineSignal>, value: u64);
    fn exec(&mut self, kernel: &Kernel, bufs: &[&Buffer], vals: &[i64], timer: Option<&Arc<dyn CommandTimer>>);
    fn copy(&mut self, dst: &Buffer, src: &Buffer, timer: Option<&Arc<dyn CommandTimer>>);
    fn memory_barrier(&mut self);
    fn host(&mut self, call: HostCall);
    fn submit(&mut self) -> Result<()>;
    /// Drops the recorded batch without submitting it, failing its signals with `error`
    /// (nothing waits for a batch that will never run).
    fn discard(&mut self, error: &Error);
    fn failure(&self) -> Option<Error>;
    fn device(&self) -> &DeviceSpec;
    fn signal_type(&self) -> &'static str;
}

struct Erased<Q: HardwareQueue> {
    queue: Q,
    /// The signals recorded into the current batch: failed if a stale queue drops it.
    signals: Vec<Arc<Q::Signal>>,
}

impl<Q: HardwareQueue + 'static> Erased<Q> {
    /// `signal` as this queue's signal type, or a recording error in the concrete queue.
    fn downcast(&mut self, signal: &Arc<dyn TimelineSignal>, what: &str) -> Option<Arc<Q::Signal>> {
        match signal.clone().into_any().downcast::<Q::Signal>() {
            Ok(s) => Some(s),
            Err(_) => {
                self.queue.reject(Error::Invalid(format!(
                    "a queue on {} cannot {what} {signal:?}: it takes signals of type {}; create the signal \
                     with this device's queue factory",
                    self.queue.device(),
                    type_name::<Q::Signal>()
                )));
                None
            }
        }
    }
}

impl<Q: HardwareQueue + 'static> ErasedQueue for Erased<Q> {
    fn accepts(&self, signal: &dyn Any) -> bool {
        signal.is::<Q::Signal>()
    }

    fn wait(&mut self, signal: &Arc<dyn TimelineSignal>, value: u64) {
        if let Some(s) = self.downcast(signal, "wait on") {
            self.queue.wait(&s, value);
        }
    }

    fn signal(&mut self, signal: &Arc<dyn TimelineSignal>, value: u64) {
        if let Some(s) = self.downcast(signal, "signal") {
            self.queue.signal(&s, value);
            self.signals.push(s);
        }
    }

    fn exec(&mut self, kernel: &Kernel, bufs: &[&Buffer], vals: &[i64], timer: Option<&Arc<dyn CommandTimer>>) {
        match timer {
            Some(t) => self.queue.exec_timed(kernel, bufs, vals, t),
            None => self.queue.exec(kernel, bufs, vals),
        };
    }

    fn copy(&mut self, dst: &Buffer, src: &Buffer, timer: Option<&Arc<dyn CommandTimer>>) {
        match timer {
            Some(t) => self.queue.copy_timed(dst, src, t),
            None => self.queue.copy(dst, src),
        };
    }

    fn memory_barrier(&mut self) {
        self.queue.memory_barrier();
    }

    fn host(&mut self, call: HostCall) {
        self.queue.host(call);
    }

    fn submit(&mut self) -> Result<()> {
        self.signals.clear();
        self.queue.submit()
    }

    fn discard(&mut self, error: &Error) {
        let _ = self.queue.reject(error.clone()).submit();
        for s in self.signals.drain(..) {
            s.fail(error.clone());
        }
    }

    fn failure(&self) -> Option<Error> {
        self.queue.failure()
    }

    fn device(&self) -> &DeviceSpec {
        self.queue.device()
    }

    fn signal_type(&self) -> &'static str {
        type_name::<Q::Signal>()
    }
}

/// The object-safe face of a [`QueueFactory`], so a [`crate::Device`] can carry its queue
/// factory without naming the backend's types. Every `QueueFactory` is one.
pub trait DynQueueFactory: Send + Sync {
    /// See [`QueueFactory::create_compute_queue`].
    ///
    /// # Errors
    /// As [`QueueFactory::create_compute_queue`]; a [`crate::Device`]'s factory also returns
    /// [`Error::DeviceLost`] / [`Error::DeviceFailed`] for an ended or failed generation.
    fn create_dyn_compute_queue(&self) -> Result<DynQueue>;

    /// A dedicated copy queue, if the device has one.
    ///
    /// # Errors
    /// As [`DynQueueFactory::create_dyn_compute_queue`].
    fn create_dyn_copy_queue(&self) -> Result<Option<DynQueue>>;

    /// A signal the queues of this factory accept.
    ///
    /// # Errors
    /// As [`DynQueueFactory::create_dyn_compute_queue`].
    fn create_dyn_signal(&self) -> Result<Arc<dyn TimelineSignal>>;

    /// See [`QueueFactory::device`] (named apart so the blanket impl does not clash).
    fn dyn_device(&self) -> &DeviceSpec;
}

impl<F> DynQueueFactory for F
where
    F: QueueFactory,
    F::Queue: 'static,
{
    fn create_dyn_compute_queue(&self) -> Result<DynQueue> {
        self.create_compute_queue().map(DynQueue::new)
    }

    fn create_dyn_copy_queue(&self) -> Result<Option<DynQueue>> {
        Ok(self.create_copy_queue()?.map(DynQueue::new))
    }

    fn create_dyn_signal(&self) -> Result<Arc<dyn TimelineSignal>> {
        Ok(self.create_signal()?)
    }

    fn dyn_device(&self) -> &DeviceSpec {
        QueueFactory::device(self)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::ring::{BackendEvent, RingSignal};
    use crate::signal::CpuTimelineSignal;
    use std::sync::Mutex;
    use std::time::Duration;

    /// A queue that logs what reaches it and, on submit, sets/waits signals inline.
    struct LogQueue {
        log: Arc<Mutex<Vec<String>>>,
        pending: Vec<String>,
        signals: Vec<(Arc<CpuTimelineSignal>, u64)>,
        /// Timed commands report when they are handed over, at submit.
        timers: Vec<Arc<dyn CommandTimer>>,
        error: Option<Error>,
        device: DeviceSpec,
    }

    impl HardwareQueue for LogQueue {
        type Signal = CpuTimelineSignal;
        fn wait(&mut self, signal: &Arc<CpuTimelineSignal>, value: u64) -> &mut Self {
            self.pending.push(format!("wait {value} (now {})", signal.value()));
            self
        }
        fn signal(&mut self, signal: &Arc<CpuTimelineSignal>, value: u64) -> &mut Self {
            self.pending.push(format!("signal {value}"));
            self.signals.push((signal.clone(), value));
            self
        }
        fn exec(&mut self, kernel: &Kernel, _bufs: &[&Buffer], _vals: &[i64]) -> &mut Self {
            self.pending.push(format!("exec {}", kernel.spec.name));
            self
        }
        fn copy(&mut self, dst: &Buffer, _src: &Buffer) -> &mut Self {
            self.pending.push(format!("copy {}", dst.len()));
            self
        }
        /// Reports a fixed 1 ms span at submit, as a queue that measures its copies would.
        fn copy_timed(&mut self, dst: &Buffer, _src: &Buffer, timer: &Arc<dyn CommandTimer>) -> &mut Self {
            self.pending.push(format!("timed copy {}", dst.len()));
            self.timers.push(timer.clone());
            self
        }
        fn memory_barrier(&mut self) -> &mut Self {
            self.pending.push("barrier".into());
            self
        }
        fn host(&mut self, _call: HostCall) -> &mut Self {
            self.pending.push("host".into());
            self
        }
        fn reject(&mut self, error: Error) -> &mut Self {
            self.error.get_or_insert(error);
            self
        }
        fn submit(&mut self) -> Result<()> {
            if let Some(e) = self.error.take() {
                self.pending.clear();
                self.signals.clear();
                self.timers.clear();
                return Err(e);
            }
            self.log.lock().unwrap().append(&mut self.pending);
            for timer in self.timers.drain(..) {
                let t = Instant::now();
                timer.measured(Box::new(move || Ok((t, t + Duration::from_millis(1)))));
            }
            for (s, v) in self.signals.drain(..) {
                s.set(v);
            }
            Ok(())
        }
        fn failure(&self) -> Option<Error> {
            None
        }
        fn device(&self) -> &DeviceSpec {
            &self.device
        }
    }

    struct LogFactory {
        log: Arc<Mutex<Vec<String>>>,
    }

    impl QueueFactory for LogFactory {
        type Queue = LogQueue;
        type Signal = CpuTimelineSignal;
        fn create_compute_queue(&self) -> Result<LogQueue> {
            Ok(LogQueue {
                log: self.log.clone(),
                pending: vec![],
                signals: vec![],
                timers: vec![],
                error: None,
                device: DeviceSpec::new("CPU", 0),
            })
        }
        fn create_copy_queue(&self) -> Result<Option<LogQueue>> {
            Ok(None)
        }
        fn create_signal(&self) -> Result<Arc<CpuTimelineSignal>> {
            Ok(Arc::new(CpuTimelineSignal::new()))
        }
        fn device(&self) -> &DeviceSpec {
            static SPEC: DeviceSpec = DeviceSpec::new("CPU", 0);
            &SPEC
        }
    }

    #[derive(Debug)]
    struct NeverEvent;
    impl BackendEvent for NeverEvent {
        fn is_complete(&self) -> Result<bool> {
            Ok(false)
        }
        fn wait(&self) -> Result<()> {
            Ok(())
        }
    }

    /// Memory that is never touched: these queues only log.
    struct NoMemory;
    impl crate::buffer::Allocator for NoMemory {
        fn device(&self) -> &DeviceSpec {
            static SPEC: DeviceSpec = DeviceSpec::new("CPU", 0);
            &SPEC
        }
        fn alloc(&self, bytes: usize) -> Result<crate::buffer::RawPtr> {
            Err(Error::Invalid(format!("test allocator asked for {bytes} B")))
        }
        unsafe fn free(&self, _: crate::buffer::RawPtr, _: usize) {}
        unsafe fn copyin(&self, _: crate::buffer::RawView, _: &[u8]) -> Result<()> {
            Ok(())
        }
        unsafe fn copyout(&self, _: &mut [u8], _: crate::buffer::RawView) -> Result<()> {
            Ok(())
        }
    }

    fn unallocated(len: usize) -> Buffer {
        Buffer::new(Arc::new(NoMemory), kiln_ir::Scalar::F32, len).unwrap()
    }

    fn factory() -> (Arc<dyn DynQueueFactory>, Arc<Mutex<Vec<String>>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        (Arc::new(LogFactory { log: log.clone() }), log)
    }

    #[test]
    fn forwards_wait_and_signal_in_order_at_submit() {
        let (f, log) = factory();
        let mut q = f.create_dyn_compute_queue().unwrap();
        let s = f.create_dyn_signal().unwrap();
        let (a, b) = (unallocated(3), unallocated(3));
        q.wait(&s, 0).copy(&a, &b).memory_barrier().signal(&s, 7);
        assert!(log.lock().unwrap().is_empty(), "nothing reaches the queue before submit");
        assert_eq!(s.value(), 0);
        q.submit().unwrap();
        assert_eq!(*log.lock().unwrap(), ["wait 0 (now 0)", "copy 3", "barrier", "signal 7"]);
        s.wait(7, Duration::ZERO).unwrap();
        assert!(f.create_dyn_copy_queue().unwrap().is_none());
        assert_eq!(f.dyn_device(), &DeviceSpec::new("CPU", 0));
    }

    /// Collects the spans reported to it.
    #[derive(Default)]
    struct Spans(Mutex<Vec<Duration>>);
    impl CommandTimer for Spans {
        fn measured(&self, probe: TimeProbe) {
            let (s, e) = probe().unwrap();
            self.0.lock().unwrap().push(e - s);
        }
    }

    #[test]
    fn timed_commands_reach_the_queue_with_their_timer_at_submit() {
        let (f, log) = factory();
        let mut q = f.create_dyn_compute_queue().unwrap();
        let spans = Arc::new(Spans::default());
        let timer: Arc<dyn CommandTimer> = spans.clone();
        let (a, b) = (unallocated(2), unallocated(2));
        q.copy_timed(&a, &b, &timer).copy(&a, &b);
        assert!(spans.0.lock().unwrap().is_empty(), "nothing is measured before submit");
        q.submit().unwrap();
        assert_eq!(*log.lock().unwrap(), ["timed copy 2", "copy 2"]);
        assert_eq!(*spans.0.lock().unwrap(), [Duration::from_millis(1)], "only the timed copy reports");
    }

    #[test]
    fn a_foreign_signal_fails_submit_and_submits_nothing() {
        let (f, log) = factory();
        let mut q = f.create_dyn_compute_queue().unwrap();
        let own = f.create_dyn_signal().unwrap();
        let foreign: Arc<dyn TimelineSignal> = Arc::new(RingSignal::<NeverEvent>::new(4));
        assert!(q.accepts(&*own) && !q.accepts(&*foreign));
        q.signal(&own, 1).wait(&foreign, 1).signal(&own, 2);
        match q.submit() {
            Err(Error::Invalid(m)) => assert!(m.contains("CpuTimelineSignal") && m.contains("wait on"), "{m}"),
            other => panic!("expected a foreign-signal error, got {other:?}"),
        }
        assert!(log.lock().unwrap().is_empty());
        assert_eq!(own.value(), 0);
        // The queue is usable again after the failed submit.
        q.signal(&own, 3).submit().unwrap();
        assert_eq!(*log.lock().unwrap(), ["signal 3"]);
        assert_eq!(own.value(), 3);
    }
}

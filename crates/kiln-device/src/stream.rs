//! The stream-queue skeleton of GPU-like backends (OpenCL in-order queues, CUDA streams, wgpu's
//! device queue).
//!
//! [`StreamQueue`] implements [`HardwareQueue`] for a backend `B` ([`AccelBackend`]) over the
//! native operations of its stream, [`AccelStream`]: enqueue a kernel, enqueue a copy, record
//! an event, make the stream wait on an event; its events ([`BackendEvent`]) are queried and
//! waited on. Everything else lives here once:
//! recording with argument checks, submit, holding what submitted commands use until they
//! completed (in-flight retirement), host steps on a helper thread, and failure propagation.
//! Its signals are [`RingSignal`]s of the backend's event, so an event is recorded once and a
//! waiting stream finds it with [`RingSignal::event_for`].
//!
//! How each command is enqueued:
//! - `exec`: [`AccelStream::enqueue_kernel`] (arguments were checked when recorded), after
//!   [`Kernel::admit`] (the generation check and launch gate, e.g. fault injection).
//!   A launch that runs a kernel's guarded form ([`crate::guarded`]) is followed by a host
//!   step that checks its fault record once it finished: a guard that fired fails the queue
//!   with [`Error::OutOfBounds`], and nothing behind it runs.
//! - `copy`: [`AccelStream::enqueue_copy`]; when the backend cannot copy natively (another
//!   device), a host step stages it through host memory once every earlier command finished.
//! - `wait`: [`AccelStream::wait_event`] on the signal's event for the value; a host step when
//!   no event covers the value yet, the stream cannot wait on it (another context), or the
//!   signal is of another type ([`StreamQueue::wait_foreign`]).
//! - `signal`: [`AccelStream::record_event`] after every earlier command, recorded into the
//!   signal: the timeline reaches the value when the event completes.
//! - `memory_barrier`: [`AccelStream::barrier`].
//!
//! # Host steps
//! A host step (a host-side wait, a staged copy, a fault check) hands the rest of the batch, and every batch
//! submitted after it, to the queue's helper thread: it performs the step, then enqueues what
//! follows, in order, until the next host step or until nothing is left. `submit` therefore
//! never blocks.
//!
//! # Failure
//! As the [`crate::queue`] contract says: a failed host step fails the queue (nothing behind
//! it runs, every signal behind it fails with the error, later submits return
//! [`Error::QueueFailed`]); a submit refused part-way by the driver returns the error and
//! fails the batch's signals that were not recorded, and the queue stays usable.
//!
//! Buffers and kernels of submitted commands are held until the commands finish. Dropping a
//! queue waits for its enqueued work; a helper thread still waiting on a signal keeps the
//! queue's resources alive until that signal is reached or failed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kiln_ir::DeviceSpec;

use crate::backend::{AccelBackend, AccelStream};
use crate::buffer::{Buffer, RawView};
use crate::error::{Error, Result};
use crate::guarded::FaultWatch;
use crate::kernel::{Kernel, PreparedLaunch};
use crate::program::LaunchDims;
use crate::queue::{CommandTimer, HardwareQueue, HostCall, QueueFactory};
use crate::ring::{BackendEvent, RingSignal};
use crate::signal::TimelineSignal;

/// A command held until it is enqueued.
enum Command<E: BackendEvent> {
    Wait(Arc<dyn TimelineSignal>, u64),
    Signal(Arc<RingSignal<E>>, u64),
    Exec {
        kernel: Kernel,
        bufs: Vec<Buffer>,
        views: Vec<RawView>,
        vals: Vec<i64>,
        dims: LaunchDims,
        timer: Option<Arc<dyn CommandTimer>>,
        /// A guarded launch's fault record: a host step checks it once the kernel ran.
        faults: Option<FaultWatch>,
    },
    Copy {
        dst: Buffer,
        src: Buffer,
        timer: Option<Arc<dyn CommandTimer>>,
    },
    Barrier,
    Host(HostCall),
}

/// Work the host does between two device commands.
enum HostStep<E> {
    Wait(Arc<dyn TimelineSignal>, u64),
    /// Once `after` (an event after everything before) completes: `dst.copy_from(src)`.
    Copy {
        after: E,
        dst: Buffer,
        src: Buffer,
        timer: Option<Arc<dyn CommandTimer>>,
    },
    /// Once `after` (an event after a guarded kernel) completes: fail the queue if the
    /// kernel's guards fired.
    Faults {
        after: E,
        faults: FaultWatch,
    },
    /// Once `after` (an event after everything before) completes: `call()`.
    Call {
        after: E,
        call: HostCall,
    },
}

impl<E: BackendEvent> HostStep<E> {
    /// Performs the step, blocking the calling (helper) thread.
    fn run(self) -> Result<()> {
        match self {
            HostStep::Wait(signal, value) => signal.wait(value, Duration::MAX),
            HostStep::Copy { after, dst, src, timer } => {
                after.wait()?;
                let start = Instant::now();
                dst.copy_from(&src)?;
                if let Some(t) = timer {
                    let end = Instant::now();
                    t.measured(Box::new(move || Ok((start, end))));
                }
                Ok(())
            }
            HostStep::Faults { after, faults } => {
                after.wait()?;
                faults.check()
            }
            HostStep::Call { after, call } => {
                after.wait()?;
                // A panic would end the helper thread with the queue's later work unrun.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(call))
                    .unwrap_or_else(|_| Err(Error::Invalid("a host step panicked".into())))
            }
        }
    }
}

/// What submitted commands still use, released when `until` completes.
struct InFlight<E> {
    until: Arc<E>,
    _buffers: Vec<Buffer>,
    _kernels: Vec<Kernel>,
}

/// Fails the signals among `commands` (which will never run) with `error`.
fn fail_signals<E: BackendEvent>(commands: impl IntoIterator<Item = Command<E>>, error: &Error) {
    for cmd in commands {
        if let Command::Signal(s, _) = cmd {
            s.fail(error.clone());
        }
    }
}

/// The device side of a queue, shared with its helper thread.
struct Inner<B: AccelBackend> {
    ops: B::Stream,
    in_flight: VecDeque<InFlight<B::Event>>,
    /// `Some` while the helper thread runs: the commands it enqueues after its current step.
    deferred: Option<VecDeque<Command<B::Event>>>,
    /// Sticky: the error of a failed host step.
    failure: Option<Error>,
}

impl<B: AccelBackend> Drop for Inner<B> {
    fn drop(&mut self) {
        // Held buffers (dropped after this) must outlive the commands using them.
        let _ = self.ops.synchronize();
    }
}

impl<B: AccelBackend> Inner<B> {
    /// Drops what completed commands held.
    fn retire(&mut self) {
        while self.in_flight.front().is_some_and(|f| !matches!(f.until.is_complete(), Ok(false))) {
            self.in_flight.pop_front();
        }
    }

    /// Enqueues `commands` in order until they run out (`Ok(None)`) or one needs the host
    /// (`Ok(Some(step))`, the commands after it stay in `commands`). On an error the failing
    /// command is consumed and the rest stay in `commands`.
    fn run(&mut self, commands: &mut VecDeque<Command<B::Event>>) -> Result<Option<HostStep<B::Event>>> {
        let mut buffers = Vec::new();
        let mut kernels = Vec::new();
        let mut outcome = Ok(None);
        // The event of the last signal, while nothing was enqueued after it: it also marks
        // the end of the batch's work, so the in-flight record below shares it.
        let mut last_signal: Option<Arc<B::Event>> = None;
        while let Some(cmd) = commands.pop_front() {
            let signalled = matches!(cmd, Command::Signal(..));
            let step = match cmd {
                Command::Wait(s, v) => self.wait(s, v),
                Command::Signal(s, v) => self
                    .ops
                    .record_event()
                    .map(Arc::new)
                    .and_then(|e| {
                        last_signal = Some(e.clone());
                        s.record_shared(v, e)
                    })
                    .map(|()| None),
                Command::Exec { kernel, bufs, views, vals, dims, timer, faults } => {
                    let r = kernel
                        .admit()
                        .and_then(|()| self.ops.enqueue_kernel(&kernel, &views, &vals, &dims, timer.as_ref()));
                    kernels.push(kernel);
                    buffers.extend(bufs);
                    match (r, faults) {
                        (Ok(()), Some(faults)) => {
                            self.ops.record_event().map(|after| Some(HostStep::Faults { after, faults }))
                        }
                        (r, _) => r.map(|()| None),
                    }
                }
                // Nothing to move (drivers refuse zero-byte copies, e.g. OpenCL's
                // CL_INVALID_VALUE): a no-op, as on host queues.
                Command::Copy { src, .. } if src.nbytes() == 0 => Ok(None),
                Command::Copy { dst, src, timer } => {
                    let r = match self.ops.enqueue_copy(&dst, &src, timer.as_ref()) {
                        Ok(true) => Ok(None),
                        Ok(false) => self
                            .ops
                            .record_event()
                            .map(|after| Some(HostStep::Copy { after, dst: dst.clone(), src: src.clone(), timer })),
                        Err(e) => Err(e),
                    };
                    buffers.extend([dst, src]);
                    r
                }
                Command::Barrier => self.ops.barrier().map(|()| None),
                Command::Host(call) => self.ops.record_event().map(|after| Some(HostStep::Call { after, call })),
            };
            if !signalled {
                last_signal = None;
            }
            match step {
                Ok(None) => {}
                other => {
                    outcome = other;
                    break;
                }
            }
        }
        if !buffers.is_empty() || !kernels.is_empty() {
            let until = match last_signal {
                Some(e) => Ok(e),
                None => self.ops.record_event().map(Arc::new),
            };
            match until {
                Ok(until) => self.in_flight.push_back(InFlight { until, _buffers: buffers, _kernels: kernels }),
                Err(e) => {
                    // Without an event, hold the resources until the stream is idle.
                    let _ = self.ops.synchronize();
                    outcome = outcome.and(Err(e));
                }
            }
        }
        self.ops.flush()?;
        outcome
    }

    fn wait(&mut self, signal: Arc<dyn TimelineSignal>, value: u64) -> Result<Option<HostStep<B::Event>>> {
        let event = signal.as_any().downcast_ref::<RingSignal<B::Event>>().and_then(|s| s.event_for(value));
        if let Some(e) = event
            && self.ops.wait_event(&e)?
        {
            return Ok(None);
        }
        if signal.is_reached(value) {
            return Ok(None);
        }
        Ok(Some(HostStep::Wait(signal, value)))
    }
}

/// Locks the shared state; no code panics while holding it, so a poisoned lock is consistent.
fn lock<B: AccelBackend>(inner: &Mutex<Inner<B>>) -> MutexGuard<'_, Inner<B>> {
    inner.lock().unwrap_or_else(|p| p.into_inner())
}

/// The helper thread: performs `step`, then enqueues the deferred commands up to the next
/// host step, until none are left or a step fails (which fails the queue).
fn helper<B: AccelBackend>(inner: Arc<Mutex<Inner<B>>>, mut step: HostStep<B::Event>) {
    loop {
        let result = step.run();
        let mut g = lock(&inner);
        let mut commands = g.deferred.take().unwrap_or_default();
        let next = result.and_then(|()| g.run(&mut commands));
        match next {
            Ok(None) => return,
            Ok(Some(s)) => {
                g.deferred = Some(commands);
                step = s;
            }
            Err(e) => {
                fail_signals(commands, &e);
                g.failure = Some(e);
                return;
            }
        }
    }
}

/// The queue factory of a stream backend: every queue, the copy queue included, owns a new
/// stream of the device (so copies overlap kernels), and every signal is a [`RingSignal`] of
/// the backend's event.
pub struct StreamQueueFactory<B: AccelBackend> {
    spec: DeviceSpec,
    open: Box<dyn Fn() -> Result<B::Stream> + Send + Sync>,
}

impl<B: AccelBackend> StreamQueueFactory<B> {
    /// The factory of device `spec`, whose streams `open` creates.
    pub fn new(
        spec: DeviceSpec,
        open: impl Fn() -> Result<B::Stream> + Send + Sync + 'static,
    ) -> StreamQueueFactory<B> {
        StreamQueueFactory { spec, open: Box::new(open) }
    }
}

impl<B: AccelBackend> QueueFactory for StreamQueueFactory<B> {
    type Queue = StreamQueue<B>;
    type Signal = RingSignal<B::Event>;

    fn create_compute_queue(&self) -> Result<StreamQueue<B>> {
        Ok(StreamQueue::new((self.open)()?))
    }

    fn create_copy_queue(&self) -> Result<Option<StreamQueue<B>>> {
        self.create_compute_queue().map(Some)
    }

    fn create_signal(&self) -> Result<Arc<RingSignal<B::Event>>> {
        Ok(Arc::new(RingSignal::default()))
    }

    fn device(&self) -> &DeviceSpec {
        &self.spec
    }
}

/// An in-order hardware queue over a backend's native stream (see the module docs).
pub struct StreamQueue<B: AccelBackend> {
    spec: DeviceSpec,
    inner: Arc<Mutex<Inner<B>>>,
    batch: Vec<Command<B::Event>>,
    /// The first recording error of the batch; `submit` returns it and submits nothing.
    error: Option<Error>,
}

impl<B: AccelBackend> std::fmt::Debug for StreamQueue<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StreamQueue(on {}, {} recorded)", self.spec, self.batch.len())
    }
}

impl<B: AccelBackend> StreamQueue<B> {
    /// A queue that owns the stream `ops`; dropping the queue waits for the stream's work.
    pub fn new(ops: B::Stream) -> StreamQueue<B> {
        let spec = ops.device().clone();
        let inner = Inner { ops, in_flight: VecDeque::new(), deferred: None, failure: None };
        StreamQueue { spec, inner: Arc::new(Mutex::new(inner)), batch: Vec::new(), error: None }
    }

    fn record(&mut self, command: Result<Command<B::Event>>) -> &mut Self {
        if self.error.is_none() {
            match command {
                Ok(c) => self.batch.push(c),
                Err(e) => self.error = Some(e),
            }
        }
        self
    }

    /// Like [`HardwareQueue::wait`] for a signal of any type (a CPU signal, another
    /// backend's): a host step (see the module docs).
    pub fn wait_foreign(&mut self, signal: &Arc<dyn TimelineSignal>, value: u64) -> &mut Self {
        self.record(Ok(Command::Wait(signal.clone(), value)))
    }

    fn exec_command(
        &self,
        kernel: &Kernel,
        bufs: &[&Buffer],
        vals: &[i64],
        timer: Option<Arc<dyn CommandTimer>>,
    ) -> Result<Command<B::Event>> {
        if let Some(b) = bufs.iter().find(|b| b.device() != &self.spec) {
            return Err(Error::Launch(format!("{b:?} is not on {}; copy it there first", self.spec)));
        }
        let PreparedLaunch { kernel, views, dims, faults } = kernel.prepare(bufs, vals)?;
        lock(&self.inner).ops.check_kernel(&kernel, &dims)?;
        let mut bufs: Vec<Buffer> = bufs.iter().map(|b| (*b).clone()).collect();
        bufs.extend(faults.as_ref().map(|f| f.record().clone()));
        Ok(Command::Exec { kernel, bufs, views, vals: vals.to_vec(), dims, timer, faults })
    }

    fn copy_command(
        &self,
        dst: &Buffer,
        src: &Buffer,
        timer: Option<Arc<dyn CommandTimer>>,
    ) -> Result<Command<B::Event>> {
        if dst.nbytes() != src.nbytes() {
            Err(Error::Buffer(format!("copy of {} bytes into a buffer of {} bytes", src.nbytes(), dst.nbytes())))
        } else if dst.overlaps(src) {
            Err(Error::Buffer("copy between overlapping windows of one buffer".into()))
        } else if dst.device() != &self.spec && src.device() != &self.spec {
            Err(Error::Buffer(format!("a queue on {} copies only to or from its device", self.spec)))
        } else {
            Ok(Command::Copy { dst: dst.clone(), src: src.clone(), timer })
        }
    }
}

impl<B: AccelBackend> HardwareQueue for StreamQueue<B> {
    type Signal = RingSignal<B::Event>;

    fn wait(&mut self, signal: &Arc<Self::Signal>, value: u64) -> &mut Self {
        let s: Arc<dyn TimelineSignal> = signal.clone();
        self.record(Ok(Command::Wait(s, value)))
    }

    fn signal(&mut self, signal: &Arc<Self::Signal>, value: u64) -> &mut Self {
        self.record(Ok(Command::Signal(signal.clone(), value)))
    }

    /// Checks the kernel (a program this stream can launch), the buffers (this device,
    /// dtype, size) and `vals` now, allocating lazily allocated buffers.
    fn exec(&mut self, kernel: &Kernel, bufs: &[&Buffer], vals: &[i64]) -> &mut Self {
        let cmd = self.exec_command(kernel, bufs, vals, None);
        self.record(cmd)
    }

    /// Reports the kernel's device times (see [`AccelStream::enqueue_kernel`]).
    fn exec_timed(
        &mut self,
        kernel: &Kernel,
        bufs: &[&Buffer],
        vals: &[i64],
        timer: &Arc<dyn CommandTimer>,
    ) -> &mut Self {
        let cmd = self.exec_command(kernel, bufs, vals, Some(timer.clone()));
        self.record(cmd)
    }

    /// Either side may be on another device or the host; sizes must match and windows of
    /// one buffer must not overlap.
    fn copy(&mut self, dst: &Buffer, src: &Buffer) -> &mut Self {
        let cmd = self.copy_command(dst, src, None);
        self.record(cmd)
    }

    /// Reports the copy's device times, or its host times when it is staged through the host.
    fn copy_timed(&mut self, dst: &Buffer, src: &Buffer, timer: &Arc<dyn CommandTimer>) -> &mut Self {
        let cmd = self.copy_command(dst, src, Some(timer.clone()));
        self.record(cmd)
    }

    fn memory_barrier(&mut self) -> &mut Self {
        self.record(Ok(Command::Barrier))
    }

    /// A host step (see the module docs).
    fn host(&mut self, call: HostCall) -> &mut Self {
        self.record(Ok(Command::Host(call)))
    }

    fn reject(&mut self, error: Error) -> &mut Self {
        self.record(Err(error))
    }

    fn submit(&mut self) -> Result<()> {
        let batch = std::mem::take(&mut self.batch);
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let mut g = lock(&self.inner);
        if let Some(cause) = g.failure.clone() {
            let e = Error::QueueFailed { device: self.spec.to_string(), cause: Arc::new(cause) };
            fail_signals(batch, &e);
            return Err(e);
        }
        g.retire();
        if let Some(deferred) = g.deferred.as_mut() {
            deferred.extend(batch);
            return Ok(());
        }
        let mut commands: VecDeque<Command<B::Event>> = batch.into();
        match g.run(&mut commands) {
            Ok(None) => Ok(()),
            Ok(Some(step)) => {
                g.deferred = Some(commands);
                let inner = self.inner.clone();
                let name = format!("kiln-{}-queue", self.spec.base_type().to_ascii_lowercase());
                let spawned = std::thread::Builder::new().name(name).spawn(move || helper(inner, step));
                if let Err(e) = spawned {
                    let e = Error::driver("kiln", format!("cannot start the queue's helper thread: {e}"));
                    fail_signals(g.deferred.take().unwrap_or_default(), &e);
                    return Err(e);
                }
                Ok(())
            }
            Err(e) => {
                fail_signals(commands, &e);
                Err(e)
            }
        }
    }

    /// The error that failed this queue, if a host step failed.
    fn failure(&self) -> Option<Error> {
        lock(&self.inner).failure.clone()
    }

    fn device(&self) -> &DeviceSpec {
        &self.spec
    }
}

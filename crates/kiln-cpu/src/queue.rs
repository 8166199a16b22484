//! CPU hardware queues: each queue owns one worker thread that runs its batches in order.
//!
//! Recording (`wait`, `signal`, `exec`, `copy`, `memory_barrier`) only appends to the host
//! side batch; `exec` checks its arguments right away and keeps clones of the buffers, so
//! the memory lives until the command ran. `submit` hands the batch to the worker over a
//! channel and returns. The worker runs commands one after another; a `wait` blocks the
//! worker (never the host) until the signal is reached or fails (the one timeout policy of
//! [`kiln_device::queue`]; [`CpuQueueFactory::with_wait_timeout`] adds an opt-in watchdog).
//!
//! Failure: a command that fails (a kernel error or panic, a failed copy, a `wait` whose
//! signal failed or timed out) *poisons* the queue. Every later command of the queue — in
//! that batch and in every later batch — is skipped, and every later `signal` command fails
//! its signal with the error instead of setting it, so whoever waits downstream gets the
//! root cause instead of hanging. The poison is sticky for the life of the queue, like a
//! sticky device error: the results of skipped work are unknown, so nothing later on this
//! queue can be trusted. Create a new queue to continue. Once the failure is visible to the
//! host, `submit` on a poisoned queue fails the batch's signals at once and returns the error.
//!
//! Latency: the worker spins ~20 µs for the next batch before it parks, and
//! signal waiters spin before they park, so a submit→kernel→signal→host wake round trip
//! takes microseconds, not a thread wake-up (see `examples/queue_latency.rs`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering, fence};
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::queue::{CommandTimer, HostCall};
use kiln_device::signal::SpinWait;
use kiln_device::{
    Buffer, CpuTimelineSignal, Error, FaultWatch, HardwareQueue, Kernel, LaunchDims, PreparedLaunch, QueueFactory,
    RawView, Result, TimelineSignal,
};

/// How long an idle worker polls for the next batch before it parks on the channel.
const WORKER_SPIN: Duration = Duration::from_micros(20);

/// One recorded command; everything it touches is owned so it outlives the caller's handles.
enum Command {
    Wait(Arc<CpuTimelineSignal>, u64),
    Signal(Arc<CpuTimelineSignal>, u64),
    /// Boxed: a launch is several times larger than the other commands.
    Exec(Box<Launch>),
    Copy {
        dst: Buffer,
        src: Buffer,
    },
    Barrier,
    Host(HostCall),
}

/// A recorded kernel launch.
struct Launch {
    kernel: Kernel,
    /// Keeps the memory behind `views` alive until the launch ran.
    _bufs: Vec<Buffer>,
    views: Vec<RawView>,
    vals: Vec<i64>,
    dims: LaunchDims,
    /// A guarded launch's fault record, checked once it ran.
    faults: Option<FaultWatch>,
    /// Receives the host times around the run ([`HardwareQueue::exec_timed`]).
    timer: Option<Arc<dyn CommandTimer>>,
}

/// State shared by a queue's host handle and its worker.
struct Shared {
    /// The error that poisoned the queue (the first failed command).
    failure: Mutex<Option<Error>>,
}

impl Shared {
    fn failure(&self) -> MutexGuard<'_, Option<Error>> {
        // Only plain assignments run under this lock; a poisoned lock still holds valid data.
        self.failure.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A CPU command queue (see the module docs for ordering and failure).
///
/// Dropping the queue discards commands recorded but not submitted; submitted batches still
/// run to completion on the worker, which then exits.
pub struct CpuQueue {
    batch: Vec<Command>,
    /// The first recording error of the batch; `submit` returns it and submits nothing.
    error: Option<Error>,
    to_worker: Sender<Vec<Command>>,
    shared: Arc<Shared>,
    device: DeviceSpec,
}

impl std::fmt::Debug for CpuQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuQueue")
            .field("recorded", &self.batch.len())
            .field("failed", &self.shared.failure().is_some())
            .finish()
    }
}

impl CpuQueue {
    /// A queue with its own worker thread named `kiln-cpu-{role}-{n}`; `wait_timeout` bounds
    /// every `wait` command.
    pub fn new(role: &str, wait_timeout: Duration) -> Result<CpuQueue> {
        Self::on_device(crate::CPU.clone(), role, wait_timeout)
    }

    /// [`CpuQueue::new`] for the CPU device `device` (`CPU:1`, ...).
    pub fn on_device(device: DeviceSpec, role: &str, wait_timeout: Duration) -> Result<CpuQueue> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let (to_worker, from_host) = channel();
        let shared = Arc::new(Shared { failure: Mutex::new(None) });
        let worker = Worker { from_host, shared: shared.clone(), wait_timeout };
        std::thread::Builder::new()
            .name(format!("kiln-cpu-{role}-{}", NEXT.fetch_add(1, Ordering::Relaxed)))
            .spawn(move || worker.run())
            .map_err(|e| Error::driver("CPU", format!("cannot start a queue worker thread: {e}")))?;
        Ok(CpuQueue { batch: Vec::new(), error: None, to_worker, shared, device })
    }

    fn record(&mut self, command: impl FnOnce() -> Result<Command>) -> &mut Self {
        if self.error.is_none() {
            match command() {
                Ok(c) => self.batch.push(c),
                Err(e) => self.error = Some(e),
            }
        }
        self
    }

    fn check_exec(
        kernel: &Kernel,
        bufs: &[&Buffer],
        vals: &[i64],
        timer: Option<&Arc<dyn CommandTimer>>,
    ) -> Result<Command> {
        if kernel.spec.device.base_type() != crate::CPU.base_type() {
            return Err(Error::Launch(format!(
                "kernel `{}` was built for {}; a CPU queue runs CPU kernels only",
                kernel.spec.name, kernel.spec.device
            )));
        }
        let PreparedLaunch { kernel, views, dims, faults } = kernel.prepare(bufs, vals)?;
        Ok(Command::Exec(Box::new(Launch {
            kernel,
            _bufs: bufs.iter().map(|b| (*b).clone()).collect(),
            views,
            vals: vals.to_vec(),
            dims,
            faults,
            timer: timer.cloned(),
        })))
    }

    fn check_copy(dst: &Buffer, src: &Buffer) -> Result<Command> {
        if dst.nbytes() != src.nbytes() {
            return Err(Error::Buffer(format!(
                "queue copy of {} bytes into a buffer of {} bytes",
                src.nbytes(),
                dst.nbytes()
            )));
        }
        if dst.overlaps(src) {
            return Err(Error::Buffer("queue copy between overlapping windows of one buffer".into()));
        }
        Ok(Command::Copy { dst: dst.clone(), src: src.clone() })
    }
}

impl HardwareQueue for CpuQueue {
    type Signal = CpuTimelineSignal;

    fn wait(&mut self, signal: &Arc<CpuTimelineSignal>, value: u64) -> &mut Self {
        self.record(|| Ok(Command::Wait(signal.clone(), value)))
    }

    fn signal(&mut self, signal: &Arc<CpuTimelineSignal>, value: u64) -> &mut Self {
        self.record(|| Ok(Command::Signal(signal.clone(), value)))
    }

    fn exec(&mut self, kernel: &Kernel, bufs: &[&Buffer], vals: &[i64]) -> &mut Self {
        self.record(|| Self::check_exec(kernel, bufs, vals, None))
    }

    /// Reports the host times right before and after the worker ran the kernel.
    fn exec_timed(
        &mut self,
        kernel: &Kernel,
        bufs: &[&Buffer],
        vals: &[i64],
        timer: &Arc<dyn CommandTimer>,
    ) -> &mut Self {
        self.record(|| Self::check_exec(kernel, bufs, vals, Some(timer)))
    }

    fn copy(&mut self, dst: &Buffer, src: &Buffer) -> &mut Self {
        self.record(|| Self::check_copy(dst, src))
    }

    fn memory_barrier(&mut self) -> &mut Self {
        self.record(|| Ok(Command::Barrier))
    }

    /// Runs on the queue's worker thread, in order.
    fn host(&mut self, call: HostCall) -> &mut Self {
        self.record(|| Ok(Command::Host(call)))
    }

    /// Hands the batch to the worker. Returns the batch's recording error (nothing is
    /// submitted), or the queue's poison error (the batch's signals are failed with it).
    fn reject(&mut self, error: Error) -> &mut Self {
        self.record(|| Err(error))
    }

    fn submit(&mut self) -> Result<()> {
        let batch = std::mem::take(&mut self.batch);
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if batch.is_empty() {
            return Ok(());
        }
        if let Some(cause) = self.failure() {
            let e = Error::QueueFailed { device: self.device.to_string(), cause: Arc::new(cause) };
            fail_signals(&batch, &e);
            return Err(e);
        }
        self.to_worker.send(batch).map_err(|lost| {
            // The worker only exits once this sender is gone, so this is unreachable in
            // practice; still, fail the batch's signals rather than drop them silently.
            let e = Error::driver("CPU", "the queue's worker thread is gone");
            fail_signals(&lost.0, &e);
            e
        })
    }

    /// The error that failed this queue, once the worker has hit it.
    fn failure(&self) -> Option<Error> {
        self.shared.failure().clone()
    }

    fn device(&self) -> &DeviceSpec {
        &self.device
    }
}

fn fail_signals(batch: &[Command], error: &Error) {
    for c in batch {
        if let Command::Signal(s, _) = c {
            s.fail(error.clone());
        }
    }
}

struct Worker {
    from_host: Receiver<Vec<Command>>,
    shared: Arc<Shared>,
    wait_timeout: Duration,
}

impl Worker {
    fn run(self) {
        // The poison, kept locally so the hot path takes no lock.
        let mut failed: Option<Error> = None;
        while let Some(batch) = self.next_batch() {
            for command in batch {
                if let Err(e) = self.execute(command, failed.as_ref()) {
                    *self.shared.failure() = Some(e.clone());
                    failed = Some(e);
                }
            }
        }
    }

    /// The next batch: polled for [`WORKER_SPIN`], then a blocking receive. `None` once the
    /// host handle is dropped and every batch ran.
    fn next_batch(&self) -> Option<Vec<Command>> {
        let mut spin = SpinWait::new(Instant::now(), WORKER_SPIN, None);
        loop {
            match self.from_host.try_recv() {
                Ok(batch) => return Some(batch),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) if spin.pause() => {}
                Err(TryRecvError::Empty) => {
                    return self.from_host.recv().ok();
                }
            }
        }
    }

    /// Runs one command unless the queue is poisoned; returns the error that poisons it.
    fn execute(&self, command: Command, failed: Option<&Error>) -> Result<()> {
        if let Some(e) = failed {
            if let Command::Signal(s, _) = command {
                s.fail(e.clone());
            }
            return Ok(());
        }
        match command {
            Command::Wait(s, v) => s.wait(v, self.wait_timeout),
            Command::Signal(s, v) => {
                s.set(v);
                Ok(())
            }
            Command::Exec(launch) => {
                let Launch { kernel, _bufs, views, vals, dims, faults, timer } = *launch;
                // Only a timed launch reads the clock.
                let start = timer.as_ref().map(|_| Instant::now());
                let run = catch_unwind(AssertUnwindSafe(|| {
                    // SAFETY: `Kernel::prepare` validated at record time the buffer count,
                    // device, dtype and size of every view, the variables' bounds, the
                    // launch sizes and every access's bounds; `_bufs` (and `faults`, the
                    // guarded form's extra buffer) hold the allocations alive until this returns.
                    // Conflicting accesses from other queues are ordered by the caller's
                    // signals (the HardwareQueue contract); this queue runs one command at a time.
                    unsafe { kernel.execute(&views, &vals, &dims) }
                }));
                if let (Some(t), Some(start)) = (timer, start) {
                    let end = Instant::now();
                    t.measured(Box::new(move || Ok((start, end))));
                }
                run.unwrap_or_else(|panic| {
                    Err(Error::Launch(format!("kernel `{}` panicked: {}", kernel.spec.name, panic_message(&*panic))))
                })
                .and_then(|()| faults.as_ref().map_or(Ok(()), FaultWatch::check))
            }
            Command::Copy { dst, src } => dst.copy_from(&src),
            Command::Barrier => {
                fence(Ordering::SeqCst);
                Ok(())
            }
            Command::Host(call) => catch_unwind(AssertUnwindSafe(call)).unwrap_or_else(|panic| {
                Err(Error::Invalid(format!("a host step panicked: {}", panic_message(&*panic))))
            }),
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".into()
    }
}

/// Creates CPU queues (each with its own worker thread) and CPU timeline signals.
#[derive(Debug, Clone)]
pub struct CpuQueueFactory {
    device: DeviceSpec,
    wait_timeout: Duration,
}

impl Default for CpuQueueFactory {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuQueueFactory {
    /// Queue `wait` commands without a deadline (the policy of every backend, see
    /// [`kiln_device::queue`]).
    pub fn new() -> Self {
        Self::for_device(crate::CPU.clone())
    }

    /// [`CpuQueueFactory::new`] for the CPU device `device` (`CPU:1`, ...).
    pub fn for_device(device: DeviceSpec) -> Self {
        CpuQueueFactory { device, wait_timeout: Duration::MAX }
    }

    /// Queues created from now on bound their `wait` commands by `timeout`: an opt-in
    /// watchdog for debugging; when it fires the queue fails with [`Error::Timeout`] like any
    /// failed wait.
    pub fn with_wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = timeout;
        self
    }

    pub fn wait_timeout(&self) -> Duration {
        self.wait_timeout
    }
}

impl QueueFactory for CpuQueueFactory {
    type Queue = CpuQueue;
    type Signal = CpuTimelineSignal;

    /// A new compute queue with its own worker; create several to run work concurrently.
    fn create_compute_queue(&self) -> Result<CpuQueue> {
        CpuQueue::on_device(self.device.clone(), "compute", self.wait_timeout)
    }

    /// A queue for copies, so they overlap compute queues' work.
    fn create_copy_queue(&self) -> Result<Option<CpuQueue>> {
        CpuQueue::on_device(self.device.clone(), "copy", self.wait_timeout).map(Some)
    }

    fn create_signal(&self) -> Result<Arc<CpuTimelineSignal>> {
        Ok(Arc::new(CpuTimelineSignal::new()))
    }

    fn device(&self) -> &DeviceSpec {
        &self.device
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::CpuAllocator;
    use crate::testing::{Behaviour, add_one_sink, mock_kernel};
    use kiln_device::kiln_ir::Scalar;
    use kiln_device::{Allocator, DynQueueFactory, RingSignal};
    use std::thread;

    const LONG: Duration = Duration::from_secs(20);

    fn alloc() -> Arc<dyn Allocator> {
        Arc::new(CpuAllocator::new())
    }

    fn buf(data: &[f32]) -> Buffer {
        Buffer::from_slice(alloc(), data).unwrap()
    }

    fn factory() -> CpuQueueFactory {
        CpuQueueFactory::new().with_wait_timeout(LONG)
    }

    fn log() -> Arc<Mutex<Vec<u32>>> {
        Arc::new(Mutex::new(Vec::new()))
    }

    #[test]
    fn runs_in_order_and_nothing_before_submit() {
        let f = factory();
        let mut q = f.create_compute_queue().unwrap();
        let s = f.create_signal().unwrap();
        let log = log();
        let (a, b) = (buf(&[1.0; 4]), buf(&[0.0; 4]));
        for batch in 0..5u32 {
            for k in 0..20u32 {
                q.exec(&mock_kernel(Behaviour::AddOne(batch * 20 + k), &log), &[&a, &b], &[4]);
            }
            q.signal(&s, u64::from(batch) + 1);
            if batch == 0 {
                thread::sleep(Duration::from_millis(5));
                assert!(log.lock().unwrap().is_empty(), "a command ran before submit");
            }
            q.submit().unwrap();
        }
        s.wait(5, LONG).unwrap();
        assert_eq!(*log.lock().unwrap(), (0..100).collect::<Vec<u32>>());
        assert_eq!(b.to_vec::<f32>().unwrap(), vec![2.0; 4]);
    }

    #[test]
    fn exec_then_copy_then_signal() {
        let f = factory();
        let mut q = f.create_compute_queue().unwrap();
        let s = f.create_signal().unwrap();
        let (a, b, c) = (buf(&[1.0, 2.0, 3.0]), buf(&[0.0; 3]), buf(&[0.0; 3]));
        q.exec(&mock_kernel(Behaviour::AddOne(0), &log()), &[&a, &b], &[3]).memory_barrier().copy(&c, &b).signal(&s, 1);
        q.submit().unwrap();
        drop((a, b)); // the queue keeps the buffers alive
        s.wait(1, LONG).unwrap();
        assert_eq!(c.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0]);
    }

    #[test]
    fn a_copy_queue_copies() {
        let f = factory();
        let mut q = f.create_copy_queue().unwrap().unwrap();
        let s = f.create_signal().unwrap();
        let (src, dst) = (buf(&[5.0, 6.0]), buf(&[0.0; 2]));
        q.copy(&dst, &src).signal(&s, 1).submit().unwrap();
        s.wait(1, LONG).unwrap();
        assert_eq!(dst.to_vec::<f32>().unwrap(), vec![5.0, 6.0]);
    }

    /// q2 waits for q1, q1 waits for the host: nothing runs until the host sets the gate.
    #[test]
    fn cross_queue_wait_signal_chain() {
        let f = factory();
        let (mut q1, mut q2) = (f.create_compute_queue().unwrap(), f.create_compute_queue().unwrap());
        let (gate, mid, done) = (f.create_signal().unwrap(), f.create_signal().unwrap(), f.create_signal().unwrap());
        let log = log();
        let (a, b, c) = (buf(&[1.0; 8]), buf(&[0.0; 8]), buf(&[0.0; 8]));
        // Submitted in reverse dependency order on purpose.
        q2.wait(&mid, 1)
            .exec(&mock_kernel(Behaviour::AddOne(2), &log), &[&b, &c], &[8])
            .signal(&done, 1)
            .submit()
            .unwrap();
        q1.wait(&gate, 1)
            .exec(&mock_kernel(Behaviour::AddOne(1), &log), &[&a, &b], &[8])
            .signal(&mid, 1)
            .submit()
            .unwrap();
        thread::sleep(Duration::from_millis(20));
        assert!(log.lock().unwrap().is_empty() && !done.is_reached(1), "ran before its dependency");
        gate.set(1);
        done.wait(1, LONG).unwrap();
        assert_eq!(*log.lock().unwrap(), [1, 2]);
        assert_eq!(c.to_vec::<f32>().unwrap(), vec![3.0; 8]);
    }

    #[test]
    fn a_failing_kernel_fails_later_signals_and_poisons_the_queue() {
        let f = factory();
        let mut q = f.create_compute_queue().unwrap();
        let (before, after, later) =
            (f.create_signal().unwrap(), f.create_signal().unwrap(), f.create_signal().unwrap());
        let log = log();
        let (a, b) = (buf(&[0.0; 2]), buf(&[0.0; 2]));
        q.signal(&before, 1)
            .exec(&mock_kernel(Behaviour::Fail, &log), &[&a, &b], &[2])
            .exec(&mock_kernel(Behaviour::AddOne(9), &log), &[&a, &b], &[2])
            .signal(&after, 1)
            .submit()
            .unwrap();
        before.wait(1, LONG).unwrap();
        match after.wait(1, LONG) {
            Err(Error::SignalFailed(e)) => assert!(matches!(&*e, Error::Launch(m) if m == "injected kernel failure")),
            other => panic!("expected the kernel's failure, got {other:?}"),
        }
        assert!(log.lock().unwrap().is_empty(), "a command after the failure ran");
        // Later batches: their signals fail too, and submit reports the poison.
        match q.signal(&later, 1).submit() {
            Err(e @ Error::QueueFailed { .. }) => {
                assert!(matches!(e.root_cause(), Error::Launch(m) if m.contains("injected")))
            }
            other => panic!("expected the poison error, got {other:?}"),
        }
        assert!(matches!(later.wait(1, LONG), Err(Error::SignalFailed(_))));
        assert!(q.failure().is_some());
    }

    /// After a reset, a queue of the old generation refuses to submit, and nothing waits
    /// forever: the old generation's signals, and the signals of a batch the stale queue
    /// drops, fail with the typed device-lost error.
    #[test]
    fn a_queue_of_a_reset_device_refuses_work_and_fails_its_signals() {
        let dev = crate::open(&crate::CPU).unwrap();
        let f = dev.queues().unwrap();
        let mut q = f.create_dyn_compute_queue().unwrap();
        let old = f.create_dyn_signal().unwrap();
        dev.reset().unwrap();
        let lost = |r: Result<()>| matches!(r, Err(e) if matches!(e.root_cause(), Error::DeviceLost { minted: 0, current: 1, .. }));
        assert!(lost(old.wait(1, Duration::MAX)), "the old generation's signal");
        let fresh = dev.queues().unwrap().create_dyn_signal().unwrap();
        assert!(lost(q.signal(&fresh, 1).submit()), "the stale queue's submit");
        assert!(lost(fresh.wait(1, Duration::MAX)), "a signal of the dropped batch");
        let mut q = dev.queues().unwrap().create_dyn_compute_queue().unwrap();
        let s = dev.queues().unwrap().create_dyn_signal().unwrap();
        q.signal(&s, 1).submit().unwrap();
        s.wait(1, LONG).unwrap();
    }

    /// The failure is reachable through the type-erased queue, under the trait's one name.
    #[test]
    fn the_type_erased_queue_reports_its_failure() {
        let f: Arc<dyn kiln_device::DynQueueFactory> = Arc::new(factory());
        let mut q = f.create_dyn_compute_queue().unwrap();
        let s = f.create_dyn_signal().unwrap();
        let (a, b) = (buf(&[0.0; 2]), buf(&[0.0; 2]));
        assert!(q.failure().is_none());
        q.exec(&mock_kernel(Behaviour::Fail, &log()), &[&a, &b], &[2]).signal(&s, 1).submit().unwrap();
        assert!(s.wait(1, LONG).is_err());
        assert!(matches!(q.failure(), Some(Error::Launch(m)) if m.contains("injected")));
    }

    #[test]
    fn a_panicking_kernel_is_a_failure_not_a_hang() {
        let f = factory();
        let mut q = f.create_compute_queue().unwrap();
        let s = f.create_signal().unwrap();
        let (a, b) = (buf(&[0.0]), buf(&[0.0]));
        q.exec(&mock_kernel(Behaviour::Panic, &log()), &[&a, &b], &[1]).signal(&s, 1).submit().unwrap();
        assert!(matches!(s.wait(1, LONG), Err(Error::SignalFailed(e)) if e.to_string().contains("panicked")));
    }

    /// A failed upstream signal and a wait timeout both propagate downstream.
    #[test]
    fn failed_or_timed_out_waits_propagate() {
        let f = factory().with_wait_timeout(Duration::from_millis(30));
        let (mut q1, mut q2) = (f.create_compute_queue().unwrap(), f.create_compute_queue().unwrap());
        let (up, down, never, out) = (
            f.create_signal().unwrap(),
            f.create_signal().unwrap(),
            f.create_signal().unwrap(),
            f.create_signal().unwrap(),
        );
        q1.wait(&up, 1).signal(&down, 1).submit().unwrap();
        up.fail(Error::Invalid("producer died".into()));
        assert!(
            matches!(down.wait(1, LONG), Err(Error::SignalFailed(e)) if matches!(&*e, Error::Invalid(m) if m == "producer died"))
        );
        q2.wait(&never, 1).signal(&out, 1).submit().unwrap();
        assert!(matches!(out.wait(1, LONG), Err(Error::SignalFailed(e)) if matches!(&*e, Error::Timeout { .. })));
    }

    #[test]
    fn recording_errors_are_returned_by_submit_which_submits_nothing() {
        let f = factory();
        let mut q = f.create_compute_queue().unwrap();
        let s = f.create_signal().unwrap();
        let log = log();
        let (a, b) = (buf(&[0.0; 4]), buf(&[0.0; 4]));
        let k = mock_kernel(Behaviour::AddOne(1), &log);
        q.exec(&k, &[&a], &[4]).signal(&s, 1);
        assert!(matches!(q.submit(), Err(Error::Launch(_))));
        q.exec(&k, &[&a, &b], &[8]); // buffers too small for n = 8
        assert!(matches!(q.submit(), Err(Error::Launch(_))));
        q.copy(&a, &buf(&[0.0; 3]));
        assert!(matches!(q.submit(), Err(Error::Buffer(_))));
        q.signal(&s, 2).submit().unwrap();
        s.wait(2, LONG).unwrap();
        assert!(log.lock().unwrap().is_empty());
    }

    #[test]
    fn dyn_queue_forwards_wait_and_signal() {
        let f: Arc<dyn DynQueueFactory> = Arc::new(factory());
        let mut q = f.create_dyn_compute_queue().unwrap();
        let (gate, done) = (f.create_dyn_signal().unwrap(), f.create_dyn_signal().unwrap());
        let log = log();
        let (a, b) = (buf(&[1.0; 2]), buf(&[0.0; 2]));
        q.wait(&gate, 1)
            .exec(&mock_kernel(Behaviour::AddOne(7), &log), &[&a, &b], &[2])
            .signal(&done, 1)
            .submit()
            .unwrap();
        thread::sleep(Duration::from_millis(20));
        assert!(log.lock().unwrap().is_empty() && !done.is_reached(1), "the wait was not forwarded");
        gate.set(1);
        done.wait(1, LONG).unwrap();
        assert_eq!(*log.lock().unwrap(), [7]);
        assert_eq!(b.to_vec::<f32>().unwrap(), vec![2.0; 2]);
    }

    /// The CPU device's own queues run a really compiled kernel, ordered by a host gate.
    #[test]
    fn device_queues_run_a_compiled_kernel() {
        let device = match crate::open(&crate::CPU) {
            Err(Error::CompilerMissing(why)) => {
                eprintln!("no C compiler, compiled-kernel queue test skipped: {why}");
                return;
            }
            other => other.unwrap(),
        };
        let queues = device.queues().expect("the CPU device has queues");
        let kernel = device.compile(&add_one_sink(), Some("add_one")).unwrap();
        let a = Buffer::from_slice(device.allocator(), &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let (b, c) = (device.buffer(Scalar::F32, 4).unwrap(), device.buffer(Scalar::F32, 4).unwrap());
        let (gate, mid, done) = (
            queues.create_dyn_signal().unwrap(),
            queues.create_dyn_signal().unwrap(),
            queues.create_dyn_signal().unwrap(),
        );
        let mut compute = queues.create_dyn_compute_queue().unwrap();
        let mut copy = queues.create_dyn_copy_queue().unwrap().expect("a CPU copy queue");
        copy.wait(&mid, 1).copy(&c, &b).signal(&done, 1).submit().unwrap();
        compute.wait(&gate, 1).exec(&kernel, &[&a, &b], &[4]).signal(&mid, 1).submit().unwrap();
        gate.set(1);
        done.wait(1, LONG).unwrap();
        assert_eq!(c.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0, 5.0]);
    }

    #[derive(Debug)]
    struct ForeignEvent;
    impl kiln_device::BackendEvent for ForeignEvent {
        fn is_complete(&self) -> Result<bool> {
            Ok(true)
        }
        fn wait(&self) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn dyn_queue_refuses_a_foreign_signal() {
        let f: Arc<dyn DynQueueFactory> = Arc::new(factory());
        let mut q = f.create_dyn_compute_queue().unwrap();
        let own = f.create_dyn_signal().unwrap();
        let foreign: Arc<dyn TimelineSignal> = Arc::new(RingSignal::<ForeignEvent>::new(4));
        q.signal(&foreign, 1).signal(&own, 1);
        assert!(matches!(q.submit(), Err(Error::Invalid(m)) if m.contains("CpuTimelineSignal")));
        assert!(own.wait(1, Duration::from_millis(20)).is_err(), "a batch with a foreign signal ran");
        q.signal(&own, 2).submit().unwrap();
        own.wait(2, LONG).unwrap();
    }

    #[test]
    fn dropping_a_queue_still_runs_submitted_work() {
        let f = factory();
        let s = f.create_signal().unwrap();
        let gate = f.create_signal().unwrap();
        {
            let mut q = f.create_compute_queue().unwrap();
            q.wait(&gate, 1).signal(&s, 1).submit().unwrap();
        }
        gate.set(1);
        s.wait(1, LONG).unwrap();
    }

    /// Queues in a chain pass a token many times: queue i waits for signal i and sets i + 1.
    /// Each queue works on its own buffers, so only the signals order them.
    #[test]
    fn stress_many_queues_and_signals() {
        const QUEUES: usize = 6;
        const ROUNDS: u64 = 200;
        let f = factory();
        let sigs: Vec<_> = (0..=QUEUES).map(|_| f.create_signal().unwrap()).collect();
        let mut queues: Vec<_> = (0..QUEUES).map(|_| f.create_compute_queue().unwrap()).collect();
        let log = log();
        let kernels: Vec<_> = (0..QUEUES).map(|i| mock_kernel(Behaviour::AddOne(i as u32), &log)).collect();
        let bufs: Vec<_> = (0..QUEUES).map(|i| (buf(&[i as f32; 16]), buf(&[0.0; 16]))).collect();
        for k in 1..=ROUNDS {
            for (i, q) in queues.iter_mut().enumerate() {
                q.wait(&sigs[i], k)
                    .exec(&kernels[i], &[&bufs[i].0, &bufs[i].1], &[16])
                    .signal(&sigs[i + 1], k)
                    .submit()
                    .unwrap();
            }
            sigs[0].set(k);
        }
        sigs[QUEUES].wait(ROUNDS, LONG).unwrap();
        let log = log.lock().unwrap();
        assert_eq!(log.len(), QUEUES * ROUNDS as usize);
        // Round k of queue i + 1 ran after round k of queue i: count prefixes.
        let mut seen = [0u64; QUEUES];
        for &tag in log.iter() {
            let i = tag as usize;
            seen[i] += 1;
            assert!(i == 0 || seen[i] <= seen[i - 1], "queue {i} ran ahead of its producer");
        }
        for (i, (_, out)) in bufs.iter().enumerate() {
            assert_eq!(out.to_vec::<f32>().unwrap(), vec![i as f32 + 1.0; 16]);
        }
    }
}

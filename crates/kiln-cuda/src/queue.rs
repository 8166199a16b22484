//! Hardware queues: one CUDA stream per queue, fed by one worker thread.
//!
//! This is the smallest correct queue; it moves onto kiln-device's shared stream-queue
//! skeleton once that exists (issue 10). `submit` hands the recorded batch to the queue's
//! worker thread and returns. The worker, in order:
//! - `wait(signal, v)`: waits on the host until the signal reaches `v` (blocking the queue,
//!   never the submitting thread), then enqueues what follows;
//! - `exec`: `cuLaunchKernel` on the stream;
//! - `copy`: `cuMemcpyDtoDAsync` within the device; any other pair waits for the stream
//!   and copies synchronously through the buffers' allocators;
//! - `signal(signal, v)`: records a CUDA event on the stream into the signal's ring;
//! - at the end of a batch it waits for the stream, then drops the batch's buffers and
//!   kernels, so nothing a queued command uses is freed early.
//!
//! Failure: the first command that fails (a launch the driver refuses, a failed wait, a
//! kernel fault reported by the stream) poisons the queue: every later `signal` of it is
//! failed with that error, so no waiter hangs and no later result counts as valid. CUDA
//! orders a stream's work and makes its writes visible to work ordered after it, so
//! `memory_barrier` needs no command.

use std::sync::Arc;
use std::sync::mpsc::{Sender, channel};
use std::time::{Duration, Instant};

use cudarc::driver::result::{self as cu, stream::StreamKind};
use cudarc::driver::sys;
use kiln_device::BackendEvent;
use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::queue::CommandTimer;
use kiln_device::{Buffer, Error, HardwareQueue, Kernel, LaunchDims, QueueFactory, RawView, Result, TimelineSignal};

use crate::allocator::address;
use crate::signal::{CudaEvent, CudaSignal};
use crate::{CudaDevice, CudaProgram, driver};

/// One recorded command, with everything it uses kept alive.
enum Command {
    Wait(Arc<CudaSignal>, u64),
    Signal(Arc<CudaSignal>, u64),
    Exec {
        kernel: Kernel,
        _bufs: Vec<Buffer>,
        views: Vec<RawView>,
        vals: Vec<i64>,
        dims: LaunchDims,
        timer: Option<Arc<dyn CommandTimer>>,
    },
    Copy {
        dst: Buffer,
        src: Buffer,
    },
}

/// A stream handle that the worker thread owns.
struct Stream(sys::CUstream);

// SAFETY: a stream handle may be used from any thread whose current context owns it.
unsafe impl Send for Stream {}

/// A command queue on one CUDA stream. See the module docs.
pub struct CudaQueue {
    cu: Arc<CudaDevice>,
    batch: Vec<Command>,
    /// The first recording error of the batch; `submit` returns it and submits nothing.
    error: Option<Error>,
    worker: Sender<Vec<Command>>,
}

impl CudaQueue {
    fn new(cu: Arc<CudaDevice>) -> Result<CudaQueue> {
        cu.bind()?;
        let stream = Stream(cu::stream::create(StreamKind::NonBlocking).map_err(|e| driver("cuStreamCreate", e))?);
        let anchor = match Anchor::new(&cu, stream.0) {
            Ok(a) => Arc::new(a),
            Err(e) => {
                // SAFETY: the stream was created above and nothing else uses it.
                let _ = unsafe { cu::stream::destroy(stream.0) };
                return Err(e);
            }
        };
        let (tx, rx) = channel::<Vec<Command>>();
        let device = cu.clone();
        std::thread::Builder::new()
            .name(format!("kiln-{}-queue", cu.spec))
            .spawn(move || {
                let mut worker = Worker { cu: device, stream, anchor, failure: None };
                for batch in rx {
                    worker.run(batch);
                }
            })
            .map_err(|e| Error::Unavailable(format!("cannot start a CUDA queue thread: {e}")))?;
        Ok(CudaQueue { cu, batch: Vec::new(), error: None, worker: tx })
    }

    fn record(&mut self, command: Result<Command>) -> &mut Self {
        match command {
            Ok(c) => self.batch.push(c),
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
        self
    }

    fn exec_command(
        &self,
        kernel: &Kernel,
        bufs: &[&Buffer],
        vals: &[i64],
        timer: Option<Arc<dyn CommandTimer>>,
    ) -> Result<Command> {
        let (views, dims) = kernel.check(bufs, vals)?;
        let program = kernel.program.as_any().and_then(|a| a.downcast_ref::<CudaProgram>());
        if !program.is_some_and(|p| Arc::ptr_eq(p.device(), &self.cu)) {
            return Err(Error::Launch(format!("kernel `{}` was not loaded on {}", kernel.spec.name, self.cu.spec)));
        }
        if let Some(b) = bufs.iter().find(|b| b.device() != &self.cu.spec) {
            return Err(Error::Launch(format!("a buffer is on {}, the queue runs on {}", b.device(), self.cu.spec)));
        }
        let bufs = bufs.iter().map(|b| (*b).clone()).collect();
        Ok(Command::Exec { kernel: kernel.clone(), _bufs: bufs, views, vals: vals.to_vec(), dims, timer })
    }
}

/// A completed timed event of the queue's stream and the host time it completed at: device
/// times of later timed events map to host times through `cuEventElapsedTime` from it.
struct Anchor {
    event: CudaEvent,
    at: Instant,
}

impl Anchor {
    fn new(cu: &Arc<CudaDevice>, stream: sys::CUstream) -> Result<Anchor> {
        let event = CudaEvent::record(cu, stream, true)?;
        event.wait()?;
        Ok(Anchor { event, at: Instant::now() })
    }

    /// The host time at which the completed timed `event` completed.
    fn host_time(&self, event: &CudaEvent) -> Result<Instant> {
        let ms = self.event.elapsed_ms(event)?;
        Ok(self.at + Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }
}

/// The queue's worker thread state.
struct Worker {
    cu: Arc<CudaDevice>,
    stream: Stream,
    /// For mapping device times of `exec_timed` to host times.
    anchor: Arc<Anchor>,
    /// The first failure; the queue is poisoned from then on.
    failure: Option<Error>,
}

impl Worker {
    fn run(&mut self, batch: Vec<Command>) {
        if let Err(e) = self.cu.bind() {
            self.failure.get_or_insert(e);
        }
        let mut enqueued = false;
        for command in &batch {
            if let Command::Signal(signal, value) = command {
                match &self.failure {
                    Some(e) => signal.fail(e.clone()),
                    None => {
                        let recorded =
                            CudaEvent::record(&self.cu, self.stream.0, false).and_then(|ev| signal.record(*value, ev));
                        match recorded {
                            // A value below one already recorded: the timeline never lowers,
                            // so this signal is a no-op, not a failure of the queue.
                            Ok(()) | Err(Error::Invalid(_)) => {}
                            Err(e) => {
                                signal.fail(e.clone());
                                self.failure = Some(e);
                            }
                        }
                    }
                }
                continue;
            }
            if self.failure.is_some() {
                continue;
            }
            enqueued |= matches!(command, Command::Exec { .. } | Command::Copy { .. });
            if let Err(e) = self.step(command) {
                self.failure = Some(e);
            }
        }
        if enqueued {
            // The batch's buffers and kernels are dropped only after the stream drains.
            if let Err(e) = self.sync() {
                self.failure.get_or_insert(e);
            }
        }
        drop(batch);
    }

    fn sync(&self) -> Result<()> {
        // SAFETY: the queue's own stream, in the current context.
        unsafe { cu::stream::synchronize(self.stream.0) }
            .map_err(|e| driver("the queue's work (cuStreamSynchronize)", e))
    }

    fn step(&self, command: &Command) -> Result<()> {
        match command {
            Command::Wait(signal, value) => signal.wait(*value, Duration::MAX),
            Command::Exec { kernel, views, vals, dims, timer, .. } => {
                let program = kernel.program.as_any().and_then(|a| a.downcast_ref::<CudaProgram>());
                let program = program.ok_or_else(|| Error::Launch("not a CUDA kernel".into()))?;
                let start = timer.as_ref().map(|_| CudaEvent::record(&self.cu, self.stream.0, true)).transpose()?;
                // SAFETY: the views were checked at record time and their buffers are held
                // until the stream drains (end of batch); the stream is of this context.
                unsafe { program.enqueue_raw(self.stream.0, views, vals, dims) }?;
                if let (Some(timer), Some(start)) = (timer, start) {
                    let end = CudaEvent::record(&self.cu, self.stream.0, true)?;
                    let anchor = self.anchor.clone();
                    timer.measured(Box::new(move || {
                        end.wait()?;
                        Ok((anchor.host_time(&start)?, anchor.host_time(&end)?))
                    }));
                }
                Ok(())
            }
            Command::Copy { dst, src } if dst.device() == &self.cu.spec && src.device() == &self.cu.spec => {
                let (d, s) = (dst.raw()?, src.raw()?);
                // SAFETY: both windows are live allocations of this device of equal size
                // (checked at record time), held until the stream drains.
                unsafe { cu::memcpy_dtod_async(address(&d), address(&s), s.bytes, self.stream.0) }
                    .map_err(|e| driver("cuMemcpyDtoDAsync", e))
            }
            Command::Copy { dst, src } => {
                self.sync()?;
                dst.copy_from(src)
            }
            Command::Signal(..) => Ok(()),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.cu.bind().is_ok() {
            // SAFETY: the stream is destroyed once, after its last batch drained.
            let _ = unsafe { cu::stream::destroy(self.stream.0) };
        }
    }
}

impl HardwareQueue for CudaQueue {
    type Signal = CudaSignal;

    fn wait(&mut self, signal: &Arc<CudaSignal>, value: u64) -> &mut Self {
        self.record(Ok(Command::Wait(signal.clone(), value)))
    }

    fn signal(&mut self, signal: &Arc<CudaSignal>, value: u64) -> &mut Self {
        self.record(Ok(Command::Signal(signal.clone(), value)))
    }

    fn exec(&mut self, kernel: &Kernel, bufs: &[&Buffer], vals: &[i64]) -> &mut Self {
        let command = self.exec_command(kernel, bufs, vals, None);
        self.record(command)
    }

    /// Reports the kernel's device start and end, from timed CUDA events around it.
    fn exec_timed(
        &mut self,
        kernel: &Kernel,
        bufs: &[&Buffer],
        vals: &[i64],
        timer: &Arc<dyn CommandTimer>,
    ) -> &mut Self {
        let command = self.exec_command(kernel, bufs, vals, Some(timer.clone()));
        self.record(command)
    }

    /// Either side may be on another device or the host; sizes must match.
    fn copy(&mut self, dst: &Buffer, src: &Buffer) -> &mut Self {
        let command = if dst.nbytes() != src.nbytes() {
            Err(Error::Buffer(format!("copy of {} bytes into {} bytes; sizes must match", src.nbytes(), dst.nbytes())))
        } else if dst.overlaps(src) {
            Err(Error::Buffer("copy between overlapping windows of one buffer".into()))
        } else {
            Ok(Command::Copy { dst: dst.clone(), src: src.clone() })
        };
        self.record(command)
    }

    fn memory_barrier(&mut self) -> &mut Self {
        self
    }

    fn submit(&mut self) -> Result<()> {
        let batch = std::mem::take(&mut self.batch);
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if batch.is_empty() {
            return Ok(());
        }
        self.worker
            .send(batch)
            .map_err(|_| Error::Unavailable(format!("the queue thread of {} has stopped", self.cu.spec)))
    }

    fn reject(&mut self, error: Error) -> &mut Self {
        self.record(Err(error))
    }

    fn failure(&self) -> Option<Error> {
        None
    }

    fn device(&self) -> &DeviceSpec {
        &self.cu.spec
    }
}

/// Creates the stream queues and event signals of one CUDA device.
pub struct CudaQueueFactory {
    cu: Arc<CudaDevice>,
}

impl CudaQueueFactory {
    pub fn new(cu: Arc<CudaDevice>) -> CudaQueueFactory {
        CudaQueueFactory { cu }
    }
}

impl QueueFactory for CudaQueueFactory {
    type Queue = CudaQueue;
    type Signal = CudaSignal;

    fn create_compute_queue(&self) -> Result<CudaQueue> {
        CudaQueue::new(self.cu.clone())
    }

    /// Copies get their own stream, so they overlap kernels of the compute queue.
    fn create_copy_queue(&self) -> Result<Option<CudaQueue>> {
        CudaQueue::new(self.cu.clone()).map(Some)
    }

    fn create_signal(&self) -> Result<Arc<CudaSignal>> {
        Ok(Arc::new(CudaSignal::default()))
    }

    fn device(&self) -> &DeviceSpec {
        &self.cu.spec
    }
}

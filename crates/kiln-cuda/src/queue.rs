//! CUDA streams: the native operations behind kiln-device's [`StreamQueue`] skeleton
//! (recording, submit, host steps, in-flight retirement and failure live there; see
//! [`kiln_device::stream`]). Every operation first makes the device's context current on the
//! calling thread (the submitting thread or the queue's helper thread).
//!
//! - `enqueue_kernel`: `cuLaunchKernel` on the stream; the program must be a [`CudaProgram`]
//!   loaded in this stream's context.
//! - `enqueue_copy`: `cuMemcpyDtoDAsync` between two buffers of this device; anything else
//!   (host memory, another device) is staged through the host by the skeleton.
//! - `record_event`: `cuEventRecord` of a new event (without timing) on the stream.
//! - `wait_event`: `cuStreamWaitEvent` on an event of this context (the device orders the
//!   work, the host never blocks); an event of another context is waited for on the host.
//! - `barrier`: nothing: a stream runs its commands in order and each command's writes are
//!   visible to the commands after it.
//! - `flush`: nothing (CUDA hands work to the device at enqueue).
//!
//! # Device times
//! A timed kernel or device copy is bracketed by two timed events; its probe waits for the
//! second and maps both onto the host clock through an *anchor*: a timed event recorded on
//! the empty stream when it was created, whose completion the host observed at a known
//! instant (`cuEventElapsedTime` from the anchor gives the offset).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::result::{self as cu, stream::StreamKind};
use cudarc::driver::sys;
use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::queue::CommandTimer;
use kiln_device::{
    AccelBackend, AccelStream, BackendEvent, Buffer, Error, Kernel, LaunchDims, RawView, Result, StreamQueue,
    StreamQueueFactory,
};

use crate::allocator::address;
use crate::signal::CudaEvent;
use crate::{CudaDevice, CudaProgram, driver};

/// One in-order CUDA queue (compute or copy).
pub type CudaQueue = StreamQueue<Cuda>;

/// A non-blocking `CUstream` of a device's context.
pub struct CudaStream {
    cu: Arc<CudaDevice>,
    stream: sys::CUstream,
    /// For mapping device times of timed commands to host times.
    anchor: Arc<Anchor>,
}

// SAFETY: a stream handle may be used from any thread (the driver API is thread-safe); the
// skeleton calls the operations one at a time, each binding the context first.
unsafe impl Send for CudaStream {}

impl CudaStream {
    fn new(cu: Arc<CudaDevice>) -> Result<CudaStream> {
        cu.bind()?;
        let stream = cu::stream::create(StreamKind::NonBlocking).map_err(|e| driver("cuStreamCreate", e))?;
        match Anchor::new(&cu, stream) {
            Ok(anchor) => Ok(CudaStream { cu, stream, anchor: Arc::new(anchor) }),
            Err(e) => {
                // SAFETY: the stream was created above and nothing else uses it.
                let _ = unsafe { cu::stream::destroy(stream) };
                Err(e)
            }
        }
    }

    /// Runs `enqueue` on the stream; with a `timer`, between two timed events whose span
    /// the timer gets as a probe.
    fn timed(
        &mut self,
        timer: Option<&Arc<dyn CommandTimer>>,
        enqueue: impl FnOnce(sys::CUstream) -> Result<()>,
    ) -> Result<()> {
        self.cu.bind()?;
        let Some(timer) = timer else { return enqueue(self.stream) };
        let start = CudaEvent::record(&self.cu, self.stream, true)?;
        enqueue(self.stream)?;
        let end = CudaEvent::record(&self.cu, self.stream, true)?;
        let anchor = self.anchor.clone();
        timer.measured(Box::new(move || {
            end.wait()?;
            Ok((anchor.host_time(&start)?, anchor.host_time(&end)?))
        }));
        Ok(())
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if self.cu.bind().is_ok() {
            // SAFETY: destroyed once; the skeleton synchronized the stream before dropping it.
            let _ = unsafe { cu::stream::destroy(self.stream) };
        }
    }
}

/// A completed timed event of a stream and the host time it completed at.
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

impl AccelStream for CudaStream {
    type Backend = Cuda;

    fn device(&self) -> &DeviceSpec {
        &self.cu.spec
    }

    fn check_kernel(&self, kernel: &Kernel, launch: &LaunchDims) -> Result<()> {
        let program = kernel.program_as::<CudaProgram>("the CUDA backend")?;
        if !Arc::ptr_eq(program.device(), &self.cu) {
            return Err(Error::Launch(format!(
                "kernel `{}` was loaded in another CUDA context than this queue's (on {})",
                kernel.spec.name, self.cu.spec
            )));
        }
        program.shape(launch).map(drop)
    }

    fn enqueue_kernel(
        &mut self,
        kernel: &Kernel,
        views: &[RawView],
        vals: &[i64],
        dims: &LaunchDims,
        timer: Option<&Arc<dyn CommandTimer>>,
    ) -> Result<()> {
        let program = kernel.program_as::<CudaProgram>("the CUDA backend")?;
        // SAFETY: `views` are live allocations of this context (checked at record time and
        // held by the skeleton until the launch completes); the stream is of this context.
        self.timed(timer, |stream| unsafe { program.enqueue_raw(stream, views, vals, dims) })
    }

    fn enqueue_copy(&mut self, dst: &Buffer, src: &Buffer, timer: Option<&Arc<dyn CommandTimer>>) -> Result<bool> {
        if dst.device() != &self.cu.spec || src.device() != &self.cu.spec {
            return Ok(false);
        }
        let (d, s) = (dst.raw()?, src.raw()?);
        self.timed(timer, |stream| {
            // SAFETY: both windows are live allocations of this device of equal size, not
            // overlapping (checked at record time), held until the copy completes.
            unsafe { cu::memcpy_dtod_async(address(&d), address(&s), s.bytes, stream) }
                .map_err(|e| driver("cuMemcpyDtoDAsync", e))
        })?;
        Ok(true)
    }

    fn record_event(&mut self) -> Result<CudaEvent> {
        self.cu.bind()?;
        CudaEvent::record(&self.cu, self.stream, false)
    }

    fn wait_event(&mut self, event: &CudaEvent) -> Result<bool> {
        if !Arc::ptr_eq(event.device(), &self.cu) {
            return Ok(false);
        }
        self.cu.bind()?;
        // SAFETY: the stream and the event are live handles of the current context.
        unsafe { cu::stream::wait_event(self.stream, event.raw(), sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
            .map_err(|e| driver("cuStreamWaitEvent", e))?;
        Ok(true)
    }

    fn barrier(&mut self) -> Result<()> {
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        Ok(())
    }

    fn synchronize(&mut self) -> Result<()> {
        self.cu.bind()?;
        // SAFETY: the queue's own stream, in the current context.
        unsafe { cu::stream::synchronize(self.stream) }.map_err(|e| driver("the queue's work (cuStreamSynchronize)", e))
    }
}

/// The CUDA backend's identity (see [`kiln_device::backend`]).
pub struct Cuda;

impl AccelBackend for Cuda {
    const NAME: &'static str = "CUDA";
    type Stream = CudaStream;
    type Event = CudaEvent;
}

/// The stream queues and event signals of one CUDA device.
pub type CudaQueueFactory = StreamQueueFactory<Cuda>;

/// The queue factory of `cu`: every queue its own stream, so copies overlap kernels.
pub fn queue_factory(cu: Arc<CudaDevice>) -> CudaQueueFactory {
    StreamQueueFactory::new(cu.spec.clone(), move || CudaStream::new(cu.clone()))
}

//! kiln queues over wgpu's one ordered device queue: the native operations behind
//! kiln-device's [`StreamQueue`] skeleton (recording, submit, host steps, retirement and
//! failure live there; see [`kiln_device::stream`]).
//!
//! - `enqueue_kernel`: one compute pass, submitted at once.
//! - `enqueue_copy`: `copy_buffer_to_buffer` between word-aligned windows of this device;
//!   anything else (host memory, another device, windows that split a word) is staged by the
//!   skeleton through the host, in order.
//! - `record_event`: the index of an (empty) submission after everything enqueued so far.
//! - `wait_event`: nothing to do for an event of this device, since a later submission runs
//!   after it; the skeleton waits on the host for any other.
//! - `barrier`: nothing to do: WebGPU makes one submission's writes visible to the next.
//!
//! Timed commands report the host instant before the submission and the instant the device
//! reported it done (lavapipe offers TIMESTAMP_QUERY, but a per-pass query set would cost
//! more than the kernels it times on a software device).

use std::sync::Arc;
use std::time::Instant;

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::queue::CommandTimer;
use kiln_device::{
    AccelBackend, AccelStream, Buffer, DeviceOf, Error, Kernel, LaunchDims, QueueFactory, RawView, Result, StreamQueue,
};

use crate::WgpuDevice;
use crate::allocator::encode_copy;
use crate::program::WgpuProgram;
use crate::signal::{WgpuEvent, WgpuSignal};

/// A kiln queue of the WebGPU backend.
pub type WgpuQueue = StreamQueue<WebGpu>;

/// The stream of one kiln queue: it submits straight to the device's queue.
pub struct WgpuStream {
    gpu: Arc<WgpuDevice>,
}

impl WgpuStream {
    fn submitted(&self, index: wgpu::SubmissionIndex, start: Instant, timer: Option<&Arc<dyn CommandTimer>>) {
        if let Some(t) = timer {
            let event = WgpuEvent::after(&self.gpu, index);
            t.measured(Box::new(move || Ok((start, event.finished_at()?))));
        }
    }
}

fn webgpu_program(kernel: &Kernel) -> Result<&WgpuProgram> {
    let program: &dyn std::any::Any = kernel.program().as_ref();
    program.downcast_ref::<WgpuProgram>().ok_or_else(|| {
        Error::Launch(format!(
            "kernel `{}` was loaded for {}, not by the WebGPU backend: compile it with a WebGPU device",
            kernel.spec.name, kernel.spec.device
        ))
    })
}

impl AccelStream for WgpuStream {
    type Backend = WebGpu;

    fn device(&self) -> &DeviceSpec {
        &self.gpu.spec
    }

    fn check_kernel(&self, kernel: &Kernel, launch: &LaunchDims) -> Result<()> {
        let program = webgpu_program(kernel)?;
        if !Arc::ptr_eq(program.device(), &self.gpu) {
            return Err(Error::Launch(format!(
                "kernel `{}` was loaded for another wgpu device of {}, this queue runs on {}",
                kernel.spec.name,
                program.device().spec,
                self.gpu.spec
            )));
        }
        program.grid(launch).map(drop)
    }

    fn enqueue_kernel(
        &mut self,
        kernel: &Kernel,
        views: &[RawView],
        vals: &[i64],
        dims: &LaunchDims,
        timer: Option<&Arc<dyn CommandTimer>>,
    ) -> Result<()> {
        self.gpu.check_lost()?;
        let program = webgpu_program(kernel)?;
        let start = Instant::now();
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        program.encode(&mut encoder, views, vals, dims)?;
        let index = self.gpu.submit(Some(encoder))?;
        self.submitted(index, start, timer);
        Ok(())
    }

    fn enqueue_copy(&mut self, dst: &Buffer, src: &Buffer, timer: Option<&Arc<dyn CommandTimer>>) -> Result<bool> {
        let mine = |b: &Buffer| b.device() == &self.gpu.spec;
        if !(mine(dst) && mine(src)) {
            return Ok(false);
        }
        let (d, s) = (dst.raw()?, src.raw()?);
        let word = wgpu::COPY_BUFFER_ALIGNMENT as usize;
        if [d.offset, s.offset, s.bytes].iter().any(|v| v % word != 0) {
            return Ok(false);
        }
        let start = Instant::now();
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        encode_copy(&self.gpu, &mut encoder, d, s)?;
        let index = self.gpu.submit(Some(encoder))?;
        self.submitted(index, start, timer);
        Ok(true)
    }

    fn record_event(&mut self) -> Result<WgpuEvent> {
        self.gpu.check_lost()?;
        WgpuEvent::now(&self.gpu)
    }

    fn wait_event(&mut self, event: &WgpuEvent) -> Result<bool> {
        Ok(Arc::ptr_eq(event.device(), &self.gpu))
    }

    fn barrier(&mut self) -> Result<()> {
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        Ok(())
    }

    fn synchronize(&mut self) -> Result<()> {
        self.gpu.wait(None)
    }
}

/// The WebGPU backend's identity types.
pub struct WebGpu;

impl AccelBackend for WebGpu {
    const NAME: &'static str = "WEBGPU";
    type Device = DeviceOf<WebGpu>;
    type Stream = WgpuStream;
    type Event = WgpuEvent;
    type Error = Error;
}

/// Queues and signals of one wgpu device.
pub struct WgpuQueueFactory {
    gpu: Arc<WgpuDevice>,
}

impl WgpuQueueFactory {
    pub fn new(gpu: Arc<WgpuDevice>) -> WgpuQueueFactory {
        WgpuQueueFactory { gpu }
    }
}

impl QueueFactory for WgpuQueueFactory {
    type Queue = WgpuQueue;
    type Signal = WgpuSignal;

    fn create_compute_queue(&self) -> Result<WgpuQueue> {
        Ok(StreamQueue::new(WgpuStream { gpu: self.gpu.clone() }))
    }

    fn create_copy_queue(&self) -> Result<Option<WgpuQueue>> {
        Ok(Some(StreamQueue::new(WgpuStream { gpu: self.gpu.clone() })))
    }

    fn create_signal(&self) -> Result<Arc<WgpuSignal>> {
        Ok(Arc::new(WgpuSignal::default()))
    }

    fn device(&self) -> &DeviceSpec {
        &self.gpu.spec
    }
}

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
//! Timed kernels on a device with `TIMESTAMP_QUERY` write the compute pass's start and end
//! into a query set; their span is that device duration, ending when the host saw the
//! submission finish (wgpu gives no host reference for the device clock). Timed copies, and
//! kernels on a device without timestamps, span from the submission to its completion.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::queue::CommandTimer;
use kiln_device::{
    AccelBackend, AccelStream, Buffer, Error, Kernel, LaunchDims, RawView, Result, StreamQueue, StreamQueueFactory,
};

use crate::WgpuDevice;
use crate::allocator::{encode_copy, read};
use crate::program::WgpuProgram;
use crate::signal::WgpuEvent;

/// A kiln queue of the WebGPU backend.
pub type WgpuQueue = StreamQueue<WebGpu>;

/// The stream of one kiln queue: it submits straight to the device's queue.
pub struct WgpuStream {
    gpu: Arc<WgpuDevice>,
}

impl WgpuStream {
    fn submitted(
        &self,
        index: wgpu::SubmissionIndex,
        start: Instant,
        timer: Option<&Arc<dyn CommandTimer>>,
        clock: Option<DeviceClock>,
    ) {
        if let Some(t) = timer {
            let event = WgpuEvent::after(&self.gpu, index);
            let gpu = self.gpu.clone();
            t.measured(Box::new(move || {
                let end = event.finished_at()?;
                let Some(clock) = clock else { return Ok((start, end)) };
                let took = clock.duration(&gpu)?;
                Ok((end.checked_sub(took).map_or(start, |s| s.max(start)), end))
            }));
        }
    }
}

/// The start and end timestamps of one compute pass, and where they are resolved to.
struct DeviceClock {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
}

impl DeviceClock {
    fn new(gpu: &WgpuDevice) -> DeviceClock {
        let queries = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("kiln timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        });
        let resolved = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kiln timestamps"),
            size: 16,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        DeviceClock { queries, resolved }
    }

    fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.resolve_query_set(&self.queries, 0..2, &self.resolved, 0);
    }

    /// How long the pass ran on the device (once its submission finished).
    fn duration(&self, gpu: &WgpuDevice) -> Result<Duration> {
        let bytes = read(gpu, &self.resolved, 0, 16)?;
        let tick = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        let ticks = tick(8).saturating_sub(tick(0));
        Ok(Duration::from_nanos((ticks as f64 * f64::from(gpu.queue.get_timestamp_period())) as u64))
    }
}

impl AccelStream for WgpuStream {
    type Backend = WebGpu;

    fn device(&self) -> &DeviceSpec {
        &self.gpu.spec
    }

    fn check_kernel(&self, kernel: &Kernel, launch: &LaunchDims) -> Result<()> {
        let program = kernel.program_as::<WgpuProgram>("the WebGPU backend")?;
        if !Arc::ptr_eq(program.device(), &self.gpu) {
            return Err(Error::Launch(format!(
                "kernel `{}` was loaded for another wgpu device of {}, this queue runs on {}",
                kernel.spec.name,
                program.device().spec,
                self.gpu.spec
            )));
        }
        program.grid(launch).and_then(|(group, ..)| program.pipeline(group)).map(drop)
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
        let program = kernel.program_as::<WgpuProgram>("the WebGPU backend")?;
        let start = Instant::now();
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        let clock = (timer.is_some() && self.gpu.timestamps).then(|| DeviceClock::new(&self.gpu));
        program.encode(&mut encoder, views, vals, dims, clock.as_ref().map(|c| &c.queries))?;
        if let Some(c) = &clock {
            c.resolve(&mut encoder);
        }
        let index = self.gpu.submit(Some(encoder))?;
        self.submitted(index, start, timer, clock);
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
        self.submitted(index, start, timer, None);
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
    type Stream = WgpuStream;
    type Event = WgpuEvent;
}

/// Queues and signals of one wgpu device.
pub type WgpuQueueFactory = StreamQueueFactory<WebGpu>;

/// The queue factory of `gpu`: every queue records into its own command encoders and submits
/// to the device's one wgpu queue.
pub fn queue_factory(gpu: Arc<WgpuDevice>) -> WgpuQueueFactory {
    StreamQueueFactory::new(gpu.spec.clone(), move || Ok(WgpuStream { gpu: gpu.clone() }))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use kiln_device::kiln_ir::{KernelBuilder, Scalar};
    use kiln_device::queue::TimeProbe;
    use kiln_device::{Buffer, DynQueueFactory};

    use super::*;
    use crate::test_device;

    #[derive(Default)]
    struct Probes(Mutex<Vec<TimeProbe>>);
    impl CommandTimer for Probes {
        fn measured(&self, probe: TimeProbe) {
            self.0.lock().unwrap().push(probe);
        }
    }

    /// A timed kernel and a timed copy report spans inside the host interval around them.
    #[test]
    fn timed_commands_report_spans_on_the_host_clock() {
        let Some(dev) = test_device() else { return };
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 1 << 20);
        let (x, y) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
        let i = k.global(0, &n);
        k.store(&y.at(&i), &(x.at(&i).load().sqrt() + 1.0));
        let kernel = dev.compile(&k.finish().unwrap(), Some("timed")).unwrap();
        let factory: Arc<dyn DynQueueFactory> = dev.queues().unwrap();
        let mut q = factory.create_dyn_compute_queue().unwrap();
        let done = factory.create_dyn_signal().unwrap();
        let len = 1 << 16;
        let a = Buffer::from_slice(dev.allocator(), &vec![4.0f32; len]).unwrap();
        let (b, c) = (dev.buffer(Scalar::F32, len).unwrap(), dev.buffer(Scalar::F32, len).unwrap());
        let probes = Arc::new(Probes::default());
        let timer: Arc<dyn CommandTimer> = probes.clone();
        let before = Instant::now();
        q.exec_timed(&kernel, &[&a, &b], &[len as i64], &timer).copy_timed(&c, &b, &timer).signal(&done, 1);
        q.submit().unwrap();
        done.wait(1, Duration::from_secs(30)).unwrap();
        let after = Instant::now();
        assert_eq!(c.to_vec::<f32>().unwrap(), vec![3.0; len]);
        let spans: Vec<(Instant, Instant)> = probes.0.lock().unwrap().drain(..).map(|p| p().unwrap()).collect();
        assert_eq!(spans.len(), 2);
        for (s, e) in spans {
            assert!(before <= s && s <= e && e <= after, "{:?}..{:?} of {:?}", s - before, e - before, after - before);
        }
    }
}

//! In-order OpenCL command queues: the native operations behind kiln-device's
//! [`StreamQueue`] skeleton (recording, submit, host steps, retirement and failure live
//! there; see [`kiln_device::stream`]).
//!
//! - `enqueue_kernel`: the program's kernel (`clEnqueueNDRangeKernel`); the program must be
//!   an [`OpenClProgram`] of this queue's device.
//! - `enqueue_copy`: `clEnqueueCopyBuffer` between two buffers of this device; a non-blocking
//!   `clEnqueueWrite/ReadBuffer` when the other side is host memory; anything else (another
//!   device) is staged through the host by the skeleton.
//! - `record_event`: `clEnqueueMarkerWithWaitList` with an empty list (every earlier command
//!   of the in-order queue).
//! - `wait_event`: `clEnqueueBarrierWithWaitList` on the event when it is of this context.
//!   (A user event in a barrier would let the device wait on a host signal too, but a failed
//!   wait must keep the commands behind it from running, and PoCL 3.1 aborts the process when
//!   a user event completes with an error status: host waits stay on the helper thread.)
//! - `barrier`: `clEnqueueBarrierWithWaitList` (OpenCL makes writes visible at command
//!   boundaries; the barrier keeps the ordering explicit).
//!
//! # Profiling
//! Queues are created with `CL_QUEUE_PROFILING_ENABLE`. Timed kernels and copies hand their
//! timer a probe over the command's event that reads `CL_PROFILING_COMMAND_START/END` once
//! the command completed and places them on the host clock: the host instant taken right
//! before the enqueue call is the reference for the event's `CL_PROFILING_COMMAND_QUEUED`
//! (see [`ClEvent::host_span`]). A staged copy (a host step) is timed on the host.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::queue::CommandTimer;
use kiln_device::{
    AccelBackend, AccelStream, Buffer, Error, Kernel, LaunchDims, RawView, Result, StreamQueue, StreamQueueFactory,
};
use opencl3::command_queue::{
    CommandQueue, enqueue_barrier_with_wait_list, enqueue_copy_buffer, enqueue_marker_with_wait_list,
    enqueue_read_buffer, enqueue_write_buffer,
};
use opencl3::types::{CL_NON_BLOCKING, cl_event};

use crate::allocator::mem;
use crate::program::OpenClProgram;
use crate::signal::ClEvent;
use crate::{ClDevice, driver};

/// One in-order OpenCL command queue (compute or copy).
pub type OpenClQueue = StreamQueue<OpenCl>;

/// An in-order `cl_command_queue` of a device's context.
pub struct ClStream {
    cl: Arc<ClDevice>,
    queue: CommandQueue,
}

impl ClStream {
    fn new(cl: Arc<ClDevice>) -> Result<ClStream> {
        Ok(ClStream { queue: cl.new_queue()?, cl })
    }

    fn event(&self, event: cl_event) -> ClEvent {
        ClEvent::from_raw(event, self.cl.context().get())
    }

    /// Wraps the event of a command enqueued at `reference`; `timer` (if any) gets a probe of
    /// its device times.
    fn enqueued(&self, event: cl_event, reference: Instant, timer: Option<&Arc<dyn CommandTimer>>) {
        let e = self.event(event);
        if let Some(t) = timer {
            t.measured(Box::new(move || e.host_span(reference)));
        }
    }

    /// A barrier holding this queue until `events` complete (all earlier commands if empty).
    fn barrier_on(&mut self, events: &[cl_event]) -> Result<()> {
        let (n, list) = wait_list(events);
        // SAFETY: the queue is live and the wait list holds `n` live events of this context.
        let e = unsafe { enqueue_barrier_with_wait_list(self.queue.get(), n, list) }
            .map_err(|e| driver("clEnqueueBarrierWithWaitList", e))?;
        drop(self.event(e));
        Ok(())
    }
}

impl AccelStream for ClStream {
    type Backend = OpenCl;

    fn device(&self) -> &DeviceSpec {
        &self.cl.spec
    }

    fn check_kernel(&self, kernel: &Kernel, launch: &LaunchDims) -> Result<()> {
        let program = kernel.program_as::<OpenClProgram>("the OpenCL backend")?;
        if !Arc::ptr_eq(program.device(), &self.cl) {
            return Err(Error::Launch(format!(
                "kernel `{}` was loaded for {} (another context), this queue runs on {}",
                kernel.spec.name,
                program.device().spec,
                self.cl.spec
            )));
        }
        program.work_sizes(launch).map(|_| ())
    }

    fn enqueue_kernel(
        &mut self,
        kernel: &Kernel,
        views: &[RawView],
        vals: &[i64],
        dims: &LaunchDims,
        timer: Option<&Arc<dyn CommandTimer>>,
    ) -> Result<()> {
        let program = kernel.program_as::<OpenClProgram>("the OpenCL backend")?;
        let reference = Instant::now();
        // SAFETY: `views` are live cl_mem windows of this context (checked at record time and
        // held by the skeleton until the launch completes); the queue is of this context.
        let event = unsafe { program.enqueue_raw(self.queue.get(), views, vals, dims, &[]) }?;
        self.enqueued(event, reference, timer);
        Ok(())
    }

    fn enqueue_copy(&mut self, dst: &Buffer, src: &Buffer, timer: Option<&Arc<dyn CommandTimer>>) -> Result<bool> {
        let mine = |b: &Buffer| b.device() == &self.cl.spec;
        let (d, s) = (dst.raw()?, src.raw()?);
        let q = self.queue.get();
        let reference = Instant::now();
        let event = if mine(dst) && mine(src) {
            // SAFETY: both windows are live cl_mem ranges of this context with equal sizes
            // (checked at record time); the buffers are held until the copy completes.
            unsafe {
                enqueue_copy_buffer(q, mem(s.base), mem(d.base), s.offset, d.offset, s.bytes, 0, std::ptr::null())
            }
            .map_err(|e| driver("clEnqueueCopyBuffer", e))?
        } else if mine(dst) && src.allocator().is_host() {
            let host = s.host_ptr() as *const c_void;
            // SAFETY: `src` is host memory of `s.bytes` bytes held alive until the command
            // completes; the in-order queue reads it only after every earlier command.
            unsafe {
                enqueue_write_buffer(q, mem(d.base), CL_NON_BLOCKING, d.offset, d.bytes, host, 0, std::ptr::null())
            }
            .map_err(|e| driver("clEnqueueWriteBuffer", e))?
        } else if mine(src) && dst.allocator().is_host() {
            let host = d.host_ptr() as *mut c_void;
            // SAFETY: as above, for the host destination.
            unsafe {
                enqueue_read_buffer(q, mem(s.base), CL_NON_BLOCKING, s.offset, s.bytes, host, 0, std::ptr::null())
            }
            .map_err(|e| driver("clEnqueueReadBuffer", e))?
        } else {
            return Ok(false);
        };
        self.enqueued(event, reference, timer);
        Ok(true)
    }

    fn record_event(&mut self) -> Result<ClEvent> {
        // SAFETY: the queue is live; an empty wait list means "all previous commands".
        let e = unsafe { enqueue_marker_with_wait_list(self.queue.get(), 0, std::ptr::null()) }
            .map_err(|e| driver("clEnqueueMarkerWithWaitList", e))?;
        Ok(self.event(e))
    }

    fn wait_event(&mut self, event: &ClEvent) -> Result<bool> {
        if event.context() != self.cl.context().get() {
            return Ok(false);
        }
        self.barrier_on(&[event.raw()]).map(|()| true)
    }

    fn barrier(&mut self) -> Result<()> {
        self.barrier_on(&[])
    }

    fn flush(&mut self) -> Result<()> {
        self.queue.flush().map_err(|e| driver("clFlush", e))
    }

    fn synchronize(&mut self) -> Result<()> {
        self.queue.finish().map_err(|e| driver("clFinish", e))
    }
}

/// The OpenCL backend's identity (see [`kiln_device::backend`]).
pub struct OpenCl;

impl AccelBackend for OpenCl {
    const NAME: &'static str = "OPENCL";
    type Stream = ClStream;
    type Event = ClEvent;
}

/// The (count, pointer) pair of an OpenCL wait list.
fn wait_list(events: &[cl_event]) -> (u32, *const cl_event) {
    if events.is_empty() { (0, std::ptr::null()) } else { (events.len() as u32, events.as_ptr()) }
}

/// The queues and signals of one OpenCL device.
pub type OpenClQueueFactory = StreamQueueFactory<OpenCl>;

/// The queue factory of `cl`: independent in-order `cl_command_queue`s of its shared context.
/// OpenCL exposes no copy engine; a second in-order queue lets copies overlap kernels.
pub fn queue_factory(cl: Arc<ClDevice>) -> OpenClQueueFactory {
    StreamQueueFactory::new(cl.spec.clone(), move || ClStream::new(cl.clone()))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use kiln_device::kiln_ir::{KernelBuilder, Scalar};
    use kiln_device::{
        Allocator, CpuTimelineSignal, Device, DynQueueFactory, HardwareQueue, QueueFactory, RawPtr, TimelineSignal,
    };
    use std::time::Duration;

    use super::*;
    use crate::{cl_device, test_device};

    const LONG: Duration = Duration::from_secs(30);

    /// `c[i] = a[i] * 2 + 1` over `n` f32.
    fn affine(dev: &Device) -> Kernel {
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 1 << 24);
        let (a, c) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n));
        let i = k.global(0, &n);
        k.store(&c.at(&i), &(a.at(&i).load() * 2.0 + 1.0));
        dev.compile(&k.finish().unwrap(), Some("affine")).unwrap()
    }

    fn setup() -> Option<(Arc<Device>, OpenClQueueFactory, Kernel)> {
        let dev = test_device()?;
        let factory = queue_factory(cl_device(dev.spec()).unwrap());
        let k = affine(&dev);
        Some((dev, factory, k))
    }

    fn f32s(dev: &Device, data: &[f32]) -> Buffer {
        Buffer::from_slice(dev.allocator(), data).unwrap()
    }

    #[test]
    fn exec_then_signal_completes_without_a_host_wait_in_submit() {
        let Some((dev, factory, k)) = setup() else { return };
        let mut q = factory.create_compute_queue().unwrap();
        let s = factory.create_signal().unwrap();
        let (a, c) = (f32s(&dev, &[1.0, 2.0, 3.0]), f32s(&dev, &[0.0; 3]));
        q.exec(&k, &[&a, &c], &[3]).exec(&k, &[&c, &a], &[3]).signal(&s, 1).submit().unwrap();
        s.wait(1, LONG).unwrap();
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![7.0, 11.0, 15.0]);
        assert_eq!(s.value(), 1);
    }

    /// Queue B consumes what queue A produces, ordered only by a signal; both submission
    /// orders (B first: the wait is resolved on the host; A first: a device barrier).
    #[test]
    fn wait_and_signal_across_two_queues() {
        let Some((dev, factory, k)) = setup() else { return };
        for a_first in [false, true] {
            let (mut qa, mut qb) =
                (factory.create_compute_queue().unwrap(), factory.create_copy_queue().unwrap().unwrap());
            let (produced, consumed) = (factory.create_signal().unwrap(), factory.create_signal().unwrap());
            let n = 1 << 16;
            let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let (a, mid, out) = (f32s(&dev, &x), f32s(&dev, &vec![0.0; n]), f32s(&dev, &vec![0.0; n]));
            qa.exec(&k, &[&a, &mid], &[n as i64]).signal(&produced, 1);
            qb.wait(&produced, 1).exec(&k, &[&mid, &out], &[n as i64]).signal(&consumed, 5);
            if a_first {
                qa.submit().unwrap();
                qb.submit().unwrap();
            } else {
                qb.submit().unwrap();
                qa.submit().unwrap();
            }
            consumed.wait(5, LONG).unwrap();
            let want: Vec<f32> = x.iter().map(|v| (v * 2.0 + 1.0) * 2.0 + 1.0).collect();
            assert_eq!(out.to_vec::<f32>().unwrap(), want, "a_first = {a_first}");
        }
    }

    #[test]
    fn a_host_signal_gates_the_queue_and_its_failure_propagates() {
        let Some((dev, factory, k)) = setup() else { return };
        let mut q = factory.create_compute_queue().unwrap();
        let (gate, done) = (Arc::new(CpuTimelineSignal::new()), factory.create_signal().unwrap());
        let (a, c) = (f32s(&dev, &[1.0; 4]), f32s(&dev, &[0.0; 4]));
        let host: Arc<dyn TimelineSignal> = gate.clone();
        q.wait_foreign(&host, 1).exec(&k, &[&a, &c], &[4]).signal(&done, 1).submit().unwrap();
        // Nothing behind the wait can run before the host signal is set.
        assert!(matches!(done.wait(1, Duration::from_millis(50)), Err(Error::Timeout { .. })));
        assert_eq!(c.to_vec::<f32>().unwrap(), vec![0.0; 4]);
        gate.set(1);
        done.wait(1, LONG).unwrap();
        assert_eq!(c.to_vec::<f32>().unwrap(), vec![3.0; 4]);

        // A failed producer: nothing behind the wait runs, the signals behind it fail, and
        // the queue stays poisoned (later batches fail their signals too).
        let (gate, done) = (Arc::new(CpuTimelineSignal::new()), factory.create_signal().unwrap());
        let host: Arc<dyn TimelineSignal> = gate.clone();
        let fresh = f32s(&dev, &[0.0; 4]);
        q.wait_foreign(&host, 1).exec(&k, &[&a, &fresh], &[4]).signal(&done, 1).submit().unwrap();
        let later = factory.create_signal().unwrap();
        q.signal(&later, 1).submit().unwrap(); // queued behind the pending wait
        gate.fail(Error::Launch("producer broke".into()));
        let r = done.wait(1, LONG);
        assert!(matches!(&r, Err(Error::SignalFailed(e)) if e.to_string().contains("producer broke")), "{r:?}");
        assert!(matches!(later.wait(1, LONG), Err(Error::SignalFailed(e)) if e.to_string().contains("producer broke")));
        assert_eq!(fresh.to_vec::<f32>().unwrap(), vec![0.0; 4], "the kernel behind the failed wait ran");
        assert!(q.failure().is_some());
        let after = factory.create_signal().unwrap();
        assert!(matches!(q.signal(&after, 1).submit(), Err(Error::QueueFailed { .. })));
        assert!(matches!(after.wait(1, LONG), Err(Error::SignalFailed(_))));
    }

    #[test]
    fn recording_errors_submit_nothing() {
        let Some((dev, factory, k)) = setup() else { return };
        let mut q = factory.create_compute_queue().unwrap();
        let s = factory.create_signal().unwrap();
        let (a, c) = (f32s(&dev, &[1.0; 4]), f32s(&dev, &[0.0; 4]));
        // Too few buffers: refused at record time; the signal in the batch is never recorded.
        q.exec(&k, &[&a], &[4]).signal(&s, 1);
        assert!(matches!(q.submit(), Err(Error::Launch(_))));
        assert!(matches!(s.wait(1, Duration::ZERO), Err(Error::Timeout { .. })));
        // A size mismatch in a copy.
        assert!(matches!(q.copy(&a, &f32s(&dev, &[0.0; 3])).submit(), Err(Error::Buffer(_))));
        // The queue is usable again afterwards.
        q.exec(&k, &[&a, &c], &[4]).signal(&s, 2).submit().unwrap();
        s.wait(2, LONG).unwrap();
        assert_eq!(c.to_vec::<f32>().unwrap(), vec![3.0; 4]);
    }

    /// An allocator of host (`is_host`) or opaque (`!is_host`) memory on another device.
    struct OtherDevice {
        spec: DeviceSpec,
        host: bool,
        blocks: Mutex<Vec<Box<[u64]>>>,
    }

    impl Allocator for OtherDevice {
        fn device(&self) -> &DeviceSpec {
            &self.spec
        }
        fn alloc(&self, bytes: usize) -> Result<RawPtr> {
            let mut block = vec![0u64; bytes.div_ceil(8)].into_boxed_slice();
            let ptr = RawPtr(block.as_mut_ptr() as *mut c_void);
            self.blocks.lock().unwrap().push(block);
            Ok(ptr)
        }
        unsafe fn free(&self, _ptr: RawPtr, _bytes: usize) {}
        unsafe fn copyin(&self, dst: RawView, src: &[u8]) -> Result<()> {
            // SAFETY: `dst` lies in a block of this allocator with `src.len()` bytes.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.host_ptr(), src.len()) };
            Ok(())
        }
        unsafe fn copyout(&self, dst: &mut [u8], src: RawView) -> Result<()> {
            // SAFETY: as above.
            unsafe { std::ptr::copy_nonoverlapping(src.host_ptr(), dst.as_mut_ptr(), dst.len()) };
            Ok(())
        }
        fn is_host(&self) -> bool {
            self.host
        }
    }

    #[test]
    fn copies_on_the_device_from_host_memory_and_across_devices() {
        let Some((dev, factory, _)) = setup() else { return };
        let mut q = factory.create_copy_queue().unwrap().unwrap();
        let done = factory.create_signal().unwrap();
        for host in [true, false] {
            let other: Arc<dyn Allocator> =
                Arc::new(OtherDevice { spec: DeviceSpec::new("CPU", 0), host, blocks: Mutex::new(Vec::new()) });
            let far = Buffer::from_slice(other.clone(), &[1.0f32, 2.0, 3.0, 4.0, 5.0]).unwrap();
            let (near, near2) = (f32s(&dev, &[0.0; 8]), f32s(&dev, &[0.0; 8]));
            let back = Buffer::from_slice(other, &[0.0f32; 3]).unwrap();
            // far -> near[2..7] -> near2[0..5] -> back (three kinds of copy in one batch).
            q.copy(&near.view(2, 5).unwrap(), &far)
                .copy(&near2.view(0, 5).unwrap(), &near.view(2, 5).unwrap())
                .memory_barrier()
                .copy(&back, &near2.view(1, 3).unwrap())
                .signal(&done, if host { 1 } else { 2 })
                .submit()
                .unwrap();
            done.wait(if host { 1 } else { 2 }, LONG).unwrap();
            assert_eq!(near.to_vec::<f32>().unwrap(), vec![0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.0], "host = {host}");
            assert_eq!(back.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0], "host = {host}");
        }
    }

    /// Keeps the probes queues hand over.
    #[derive(Default)]
    struct Probes(Mutex<Vec<kiln_device::queue::TimeProbe>>);
    impl CommandTimer for Probes {
        fn measured(&self, probe: kiln_device::queue::TimeProbe) {
            self.0.lock().unwrap().push(probe);
        }
    }

    /// A timed kernel, device copy and staged copy each report one span inside the window
    /// from before the submit to after the signal was reached; untimed commands report none.
    #[test]
    fn timed_commands_report_spans_on_the_host_clock() {
        let Some((dev, factory, k)) = setup() else { return };
        let mut q = factory.create_compute_queue().unwrap();
        let done = factory.create_signal().unwrap();
        let probes = Arc::new(Probes::default());
        let timer: Arc<dyn CommandTimer> = probes.clone();
        let n = 1 << 16;
        let (a, c, d) = (f32s(&dev, &vec![1.0; n]), f32s(&dev, &vec![0.0; n]), f32s(&dev, &vec![0.0; n]));
        let other: Arc<dyn Allocator> =
            Arc::new(OtherDevice { spec: DeviceSpec::new("CPU", 0), host: false, blocks: Mutex::new(Vec::new()) });
        let far = Buffer::from_slice(other, &vec![0.0f32; n]).unwrap();
        let before = Instant::now();
        q.exec_timed(&k, &[&a, &c], &[n as i64], &timer)
            .exec(&k, &[&a, &c], &[n as i64])
            .copy_timed(&d, &c, &timer)
            .copy(&d, &c)
            .copy_timed(&far, &d, &timer)
            .signal(&done, 1)
            .submit()
            .unwrap();
        done.wait(1, LONG).unwrap();
        let after = Instant::now();
        assert_eq!(far.to_vec::<f32>().unwrap(), vec![3.0; n]);
        let spans: Vec<(Instant, Instant)> = probes.0.lock().unwrap().drain(..).map(|p| p().unwrap()).collect();
        assert_eq!(spans.len(), 3, "one span per timed command");
        for (i, (s, e)) in spans.iter().enumerate() {
            assert!(before <= *s && s <= e && *e <= after, "span {i}: {:?}..{:?}", *s - before, *e - before);
        }
    }

    #[test]
    fn the_type_erased_queue_forwards_wait_and_signal() {
        let Some((dev, _, k)) = setup() else { return };
        let factory: Arc<dyn DynQueueFactory> = dev.queues().unwrap();
        let (mut q1, mut q2) =
            (factory.create_dyn_compute_queue().unwrap(), factory.create_dyn_compute_queue().unwrap());
        let (s1, s2) = (factory.create_dyn_signal().unwrap(), factory.create_dyn_signal().unwrap());
        let (a, b, c) = (f32s(&dev, &[1.0; 16]), f32s(&dev, &[0.0; 16]), f32s(&dev, &[0.0; 16]));
        q2.wait(&s1, 3).exec(&k, &[&b, &c], &[16]).signal(&s2, 1).submit().unwrap();
        q1.exec(&k, &[&a, &b], &[16]).signal(&s1, 3).submit().unwrap();
        s2.wait(1, LONG).unwrap();
        assert_eq!(c.to_vec::<f32>().unwrap(), vec![7.0; 16]);
        // A foreign signal type is a recording error, not a dropped dependency.
        let cpu: Arc<dyn TimelineSignal> = Arc::new(CpuTimelineSignal::new());
        assert!(matches!(q1.wait(&cpu, 1).submit(), Err(Error::Invalid(_))));
    }
}
